#include "net/http/daemon_config.h"

#include <algorithm>
#include <fstream>
#include <limits>
#include <set>
#include <sstream>

#include "actors/config_toml.h"
#include "runtime/error.h"

namespace troupe::http {

namespace {

using actors::config_toml::check_keys;
using actors::config_toml::fail;
using actors::config_toml::get;
using actors::config_toml::section;

std::vector<std::string> read_key_file(const std::filesystem::path& p, const std::string& source) {
  std::ifstream in(p);
  if (!in) throw error(source + ": server.api_key_file: cannot read '" + p.string() + "'");
  std::vector<std::string> keys;
  std::string line;
  while (std::getline(in, line)) {
    while (!line.empty() && (line.back() == '\r' || line.back() == ' ' || line.back() == '\t')) line.pop_back();
    size_t b = 0;
    while (b < line.size() && (line[b] == ' ' || line[b] == '\t')) ++b;
    line.erase(0, b);
    if (line.empty() || line[0] == '#') continue;
    keys.push_back(line);
  }
  if (keys.empty()) throw error(source + ": server.api_key_file: '" + p.string() + "' holds no key");
  return keys;
}

}  // namespace

daemon_config parse_daemon_config(std::string_view text, const std::string& source, const std::filesystem::path& base_dir) {
  daemon_config c;
  c.source = source;
  c.engine = actors::parse_engine_config(text, source, {"server", "logging", "cluster"});
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    fail(source, std::string(e.description()), e.source());  // reported above already; kept for safety
  }
  const auto resolve = [&](const std::string& p) {
    const std::filesystem::path fp(p);
    return (fp.is_relative() && !base_dir.empty()) ? (base_dir / fp).lexically_normal().string() : p;
  };
  for (actors::model_settings& m : c.engine.models) m.path = resolve(m.path);

  const toml::table& s = section(root, "server", source);
  check_keys(s,
             {"host", "port", "api_keys", "api_key_file", "http_threads", "io_threads", "max_connections", "header_timeout_s",
              "keep_alive_timeout_s", "keep_alive_max", "queue_limit", "queue_timeout_s", "request_timeout_s",
              "read_timeout_s", "write_timeout_s", "max_body_bytes", "shutdown_grace_s", "models_dir", "memory_budget_mib",
              "load_timeout_s"},
             "[server]", source);
  server_config& sv = c.server;
  sv.host = get<std::string>(s, "host", sv.host, "server", source);
  if (sv.host.empty()) fail(source, "server.host must not be empty", s.get("host")->source());
  sv.port = get<uint16_t>(s, "port", sv.port, "server", source, 65535);
  if (const toml::node* k = s.get("api_keys")) {
    const toml::array* a = k->as_array();
    if (a == nullptr) fail(source, "server.api_keys must be an array of strings", k->source());
    for (const toml::node& e : *a) {
      const auto v = e.value<std::string>();
      if (!v || v->empty()) fail(source, "server.api_keys must be an array of non-empty strings", e.source());
      sv.api_keys.push_back(*v);
    }
  }
  sv.api_key_file = get<std::string>(s, "api_key_file", sv.api_key_file, "server", source);
  if (!sv.api_key_file.empty()) {
    sv.api_key_file = resolve(sv.api_key_file);
    for (std::string& k : read_key_file(sv.api_key_file, source)) sv.api_keys.push_back(std::move(k));
  }
  constexpr uint64_t u32 = std::numeric_limits<uint32_t>::max();
  sv.http_threads = get<uint32_t>(s, "http_threads", sv.http_threads, "server", source, 4096);
  sv.io_threads = get<uint32_t>(s, "io_threads", sv.io_threads, "server", source, 64);
  sv.max_connections = get<uint32_t>(s, "max_connections", sv.max_connections, "server", source, 1u << 20);
  sv.header_timeout_s = get<uint32_t>(s, "header_timeout_s", sv.header_timeout_s, "server", source, 3600);
  sv.keep_alive_timeout_s = get<uint32_t>(s, "keep_alive_timeout_s", sv.keep_alive_timeout_s, "server", source, 3600);
  sv.keep_alive_max = get<uint32_t>(s, "keep_alive_max", sv.keep_alive_max, "server", source, u32);
  if (sv.io_threads == 0 || sv.max_connections == 0 || sv.header_timeout_s == 0 || sv.keep_alive_max == 0) {
    fail(source, "server.io_threads, max_connections, header_timeout_s and keep_alive_max must be at least 1", s.source());
  }
  sv.queue_limit = get<uint32_t>(s, "queue_limit", sv.queue_limit, "server", source, 4096);
  sv.queue_timeout_s = get<uint32_t>(s, "queue_timeout_s", sv.queue_timeout_s, "server", source, u32);
  sv.request_timeout_s = get<uint32_t>(s, "request_timeout_s", sv.request_timeout_s, "server", source, u32);
  sv.read_timeout_s = get<uint32_t>(s, "read_timeout_s", sv.read_timeout_s, "server", source, u32);
  sv.write_timeout_s = get<uint32_t>(s, "write_timeout_s", sv.write_timeout_s, "server", source, u32);
  if (sv.read_timeout_s == 0 || sv.write_timeout_s == 0) {
    fail(source, "server.read_timeout_s and server.write_timeout_s must be at least 1", s.source());
  }
  sv.max_body_bytes = get<uint64_t>(s, "max_body_bytes", sv.max_body_bytes, "server", source, uint64_t{1} << 32);
  if (sv.max_body_bytes < 1024) fail(source, "server.max_body_bytes must be at least 1024", s.get("max_body_bytes")->source());
  sv.shutdown_grace_s = get<uint32_t>(s, "shutdown_grace_s", sv.shutdown_grace_s, "server", source, u32);
  sv.models_dir = get<std::string>(s, "models_dir", sv.models_dir, "server", source);
  if (!sv.models_dir.empty()) sv.models_dir = resolve(sv.models_dir);
  sv.load_timeout_s = get<uint32_t>(s, "load_timeout_s", sv.load_timeout_s, "server", source, u32);
  if (const toml::node* b = s.get("memory_budget_mib")) {
    // One figure for every device, or a table of figures per device name.
    const std::string wrong = "server.memory_budget_mib must be MiB (a non-negative integer) or a table of them per device";
    const auto mib = [&](const toml::node& n) {
      const auto v = n.value<int64_t>();
      if (!n.is_integer() || !v || *v < 0 || *v > (int64_t{1} << 30)) fail(source, wrong, n.source());
      return static_cast<uint64_t>(*v);
    };
    if (const toml::table* per = b->as_table()) {
      for (const auto& [device, n] : *per) sv.memory_budget_mib.emplace_back(std::string(device.str()), mib(n));
    } else {
      sv.memory_budget_mib.emplace_back("*", mib(*b));
    }
  }

  if (root.contains("cluster")) {
    const toml::table& cl = section(root, "cluster", source);
    check_keys(cl, {"host", "port", "key_file", "tls_cert", "tls_key", "tls_ca", "heartbeat_ms", "down_after_ms", "coordinator_devices", "margin_mib", "rebalance"}, "[cluster]", source);
    cluster_config& cc = c.cluster;
    cc.enabled = true;
    cc.host = get<std::string>(cl, "host", cc.host, "cluster", source);
    cc.port = get<uint16_t>(cl, "port", cc.port, "cluster", source, 65535);
    cc.key_file = get<std::string>(cl, "key_file", cc.key_file, "cluster", source);
    if (!cc.key_file.empty()) cc.key_file = resolve(cc.key_file);
    for (auto [field, value] : {std::pair{"tls_cert", &cc.tls_cert}, {"tls_key", &cc.tls_key}, {"tls_ca", &cc.tls_ca}}) {
      *value = get<std::string>(cl, field, *value, "cluster", source);
      if (!value->empty()) *value = resolve(*value);
    }
    if ((cc.tls_cert.empty() || cc.tls_key.empty() || cc.tls_ca.empty()) &&
        !(cc.tls_cert.empty() && cc.tls_key.empty() && cc.tls_ca.empty())) {
      fail(source, "cluster.tls_cert, cluster.tls_key and cluster.tls_ca go together (TLS on the cluster port is mutual)",
           cl.source());
    }
    cc.heartbeat_ms = get<uint32_t>(cl, "heartbeat_ms", cc.heartbeat_ms, "cluster", source, 600000);
    cc.coordinator_devices = get<bool>(cl, "coordinator_devices", cc.coordinator_devices, "cluster", source);
    cc.margin_mib = get<uint32_t>(cl, "margin_mib", cc.margin_mib, "cluster", source, 1u << 20);
    cc.rebalance = get<std::string>(cl, "rebalance", cc.rebalance, "cluster", source);
    if (cc.rebalance != "on_loss" && cc.rebalance != "on_join") {
      fail(source, "cluster.rebalance must be \"on_loss\" or \"on_join\", not \"" + cc.rebalance + "\"",
           cl.get("rebalance")->source());
    }
    cc.down_after_ms = get<uint32_t>(cl, "down_after_ms", cc.down_after_ms, "cluster", source, 3600000);
    if (cc.heartbeat_ms == 0 || cc.down_after_ms <= cc.heartbeat_ms) {
      fail(source, "cluster.down_after_ms (" + std::to_string(cc.down_after_ms) + ") must be more than cluster.heartbeat_ms (" +
                       std::to_string(cc.heartbeat_ms) + "), which must be at least 1",
           cl.source());
    }
  }

  const toml::table& l = section(root, "logging", source);
  check_keys(l, {"level", "access_log"}, "[logging]", source);
  c.logging.level = get<std::string>(l, "level", c.logging.level, "logging", source);
  if (c.logging.level != "debug" && c.logging.level != "info" && c.logging.level != "warn" && c.logging.level != "error") {
    fail(source, "logging.level must be \"debug\", \"info\", \"warn\" or \"error\", not \"" + c.logging.level + "\"",
         l.get("level")->source());
  }
  c.logging.access_log = get<bool>(l, "access_log", c.logging.access_log, "logging", source);
  return c;
}

daemon_config load_daemon_config(const std::filesystem::path& path) {
  return parse_daemon_config(actors::config_toml::read_file(path), path.string(), path.parent_path());
}

void validate_daemon_config(const daemon_config& c) {
  const std::string where = c.source.empty() ? "command line" : c.source;
  if (!c.server.models_dir.empty()) {
    std::error_code ec;
    if (!std::filesystem::is_directory(c.server.models_dir, ec)) {
      throw error(where + ": server.models_dir: no such folder '" + c.server.models_dir + "'");
    }
  }
  if (c.engine.models.empty() && c.server.models_dir.empty()) {
    throw error(where + ": no model to serve (add a [[model]] table with a name and a path, pass --model, or give a models_dir)");
  }
  std::set<std::string> names;
  for (const actors::model_settings& m : c.engine.models) {
    if (!names.insert(m.name).second) throw error(where + ": two models are named '" + m.name + "'");
    if (m.placement == "cluster" && !c.cluster.enabled) {
      throw error(where + ": model '" + m.name + "': placement = \"cluster\" needs a [cluster] table (this daemon as the coordinator)");
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(m.path, ec)) {
      throw error(where + ": model '" + m.name + "': no such file '" + m.path + "'" +
                  (m.path.find("SmolLM2") != std::string::npos ? " (scripts/fetch-model downloads it)" : ""));
    }
  }
}

std::vector<actors::model_settings> models_in_dir(const daemon_config& c) {
  std::vector<actors::model_settings> out;
  if (c.server.models_dir.empty()) return out;
  std::set<std::string> taken;
  for (const actors::model_settings& m : c.engine.models) {
    taken.insert(m.name);
    taken.insert(m.aliases.begin(), m.aliases.end());
  }
  std::vector<std::filesystem::path> files;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(c.server.models_dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::error_code e2;
    if (it->path().extension() == ".gguf" && it->is_regular_file(e2)) files.push_back(it->path());
  }
  if (ec) throw error("server.models_dir: cannot read '" + c.server.models_dir + "': " + ec.message());
  std::sort(files.begin(), files.end());
  for (const std::filesystem::path& f : files) {
    actors::model_settings m;
    m.name = f.stem().string();
    m.path = f.string();
    m.load = "on_demand";
    if (!taken.insert(m.name).second) continue;  // a [[model]] table of that name is the one served
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace troupe::http
