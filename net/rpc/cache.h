// The peer's cache of large weights: files named by the 64-bit xxHash (XXH3) of their bytes.
//
//   tensor_cache cache("/var/cache/troupe");       // created when missing
//   cache.store(bytes, n);                         // after a set_tensor of weights >= hash_threshold bytes
//   if (cache.load(hash, dst, n)) ...              // set_tensor_hash: the bytes are not sent again
//
// The server names each file by the hash it computes itself, so a client cannot plant bytes under another
// hash; load() checks the hash of what it read, so a damaged file is a miss, never wrong weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>

#include "backends/rpc/wire/protocol.h"

namespace troupe::rpc {

class tensor_cache {
 public:
  // Creates dir when missing; throws error when it cannot.
  explicit tensor_cache(std::filesystem::path dir);

  // Reads the n bytes stored under hash into out. False when there is no such entry, it has another size,
  // or its bytes do not hash to `hash`.
  bool load(uint64_t hash, void* out, size_t n) const;
  // Stores n bytes under their hash (written to a temporary file, then renamed). Failures are logged and
  // otherwise ignored: the cache is an optimisation.
  void store(const void* data, size_t n) const;
  std::filesystem::path path_of(uint64_t hash) const;

 private:
  std::filesystem::path dir_;
};

}  // namespace troupe::rpc
