#include "net/rpc/cache.h"


#include <atomic>
#include <cstdio>
#include <fstream>
#include <string>
#include <unistd.h>

#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::rpc {


tensor_cache::tensor_cache(std::filesystem::path dir) : dir_(std::move(dir)) {
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec || !std::filesystem::is_directory(dir_, ec)) {
    throw error("rpc cache: cannot create the cache directory '" + dir_.string() + "'");
  }
}

std::filesystem::path tensor_cache::path_of(uint64_t hash) const {
  char name[32];
  std::snprintf(name, sizeof name, "%016llx", static_cast<unsigned long long>(hash));
  return dir_ / name;
}

bool tensor_cache::load(uint64_t hash, void* out, size_t n) const {
  const auto p = path_of(hash);
  std::error_code ec;
  const auto size = std::filesystem::file_size(p, ec);
  if (ec || size != n) return false;
  std::ifstream in(p, std::ios::binary);
  if (!in.read(static_cast<char*>(out), static_cast<std::streamsize>(n))) return false;
  if (content_hash(out, n) != hash) {
    TROUPE_LOG(warn, "rpc cache: " << p.string() << " does not match its hash; ignored");
    return false;
  }
  return true;
}

void tensor_cache::store(const void* data, size_t n) const {
  const uint64_t hash = content_hash(data, n);
  const auto p = path_of(hash);
  std::error_code ec;
  if (std::filesystem::file_size(p, ec) == n && !ec) return;  // already there
  static std::atomic<uint64_t> counter{0};
  const auto tmp = dir_ / (p.filename().string() + ".tmp." + std::to_string(::getpid()) + "." +
                           std::to_string(counter.fetch_add(1)));
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out.write(static_cast<const char*>(data), static_cast<std::streamsize>(n))) {
      TROUPE_LOG(error, "rpc cache: cannot write " << tmp.string());
      std::filesystem::remove(tmp, ec);
      return;
    }
  }
  std::filesystem::rename(tmp, p, ec);
  if (ec) {
    TROUPE_LOG(error, "rpc cache: cannot rename " << tmp.string() << " to " << p.string() << ": " << ec.message());
    std::filesystem::remove(tmp, ec);
  }
}

}  // namespace troupe::rpc
