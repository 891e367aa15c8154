// Reading TOML configuration files (toml++) with errors that name the file, the line and the key:
// "daemon.toml:3: unknown key 'prot' in [server]". Shared by the runtime's configuration
// (actors/engine_config.cpp) and the daemon's (net/http/daemon_config.cpp); include only from .cpp files
// that link toml++.
#pragma once

#include <toml++/toml.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>
#include <string>
#include <type_traits>

#include "runtime/error.h"

namespace troupe::actors::config_toml {

[[noreturn]] inline void fail(const std::string& source, const std::string& what, const toml::source_region& where) {
  std::ostringstream os;
  os << source;
  if (where.begin.line > 0) os << ":" << where.begin.line;
  os << ": " << what;
  throw error(os.str());
}

// Every key of `t` must be in `allowed` (a typo must not silently fall back to a default).
inline void check_keys(const toml::table& t, const std::set<std::string>& allowed, const std::string& where,
                       const std::string& source) {
  for (const auto& [k, v] : t) {
    if (!allowed.count(std::string(k.str()))) fail(source, "unknown key '" + std::string(k.str()) + "' in " + where, v.source());
  }
}

// The table `name` of `root` (an empty one when absent).
inline const toml::table& section(const toml::table& root, const char* name, const std::string& source) {
  static const toml::table empty;
  const toml::node* n = root.get(name);
  if (n == nullptr) return empty;
  const toml::table* t = n->as_table();
  if (t == nullptr) fail(source, std::string("[") + name + "] must be a table", n->source());
  return *t;
}

// t[key] as a bool, a string or a non-negative integer (at most `max`); `fallback` when absent.
template <class T>
T get(const toml::table& t, const char* key, T fallback, const std::string& where, const std::string& source,
      uint64_t max = UINT64_MAX) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return fallback;
  if constexpr (std::is_same_v<T, bool>) {
    if (auto v = n->value<bool>()) return *v;
    fail(source, where + "." + key + " must be true or false", n->source());
  } else if constexpr (std::is_same_v<T, std::string>) {
    if (auto v = n->value<std::string>()) return *v;
    fail(source, where + "." + key + " must be a string", n->source());
  } else {
    const uint64_t limit = std::min<uint64_t>(max, static_cast<uint64_t>(std::numeric_limits<T>::max()));
    const auto v = n->value<int64_t>();
    if (!v || *v < 0 || static_cast<uint64_t>(*v) > limit) {
      fail(source, where + "." + key + " must be an integer from 0 to " + std::to_string(limit), n->source());
    }
    return static_cast<T>(*v);
  }
}

// The text of a configuration file; throws error naming it when it cannot be read.
inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) throw error("cannot read config file '" + path.string() + "'");
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

}  // namespace troupe::actors::config_toml
