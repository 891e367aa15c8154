// Hand-made GGUF bytes for the loader tests: a little-endian byte builder that can write anything, valid or
// not, and remembers nothing. Tests take positions with size() before writing a field to know the offset a
// message must report.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "loader/gguf.h"

namespace troupe::test {

class raw_gguf {
 public:
  size_t size() const { return b_.size(); }
  const std::vector<std::byte>& bytes() const { return b_; }
  std::span<const std::byte> span() const { return b_; }

  raw_gguf& raw(std::string_view s) {
    for (char c : s) b_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  template <class T>
  raw_gguf& put(T v) {
    unsigned char tmp[sizeof(T)];
    std::memcpy(tmp, &v, sizeof(T));  // the tests run on little-endian hosts
    for (unsigned char c : tmp) b_.push_back(static_cast<std::byte>(c));
    return *this;
  }
  raw_gguf& u8(uint8_t v) { return put(v); }
  raw_gguf& u16(uint16_t v) { return put(v); }
  raw_gguf& u32(uint32_t v) { return put(v); }
  raw_gguf& i32(int32_t v) { return put(v); }
  raw_gguf& u64(uint64_t v) { return put(v); }
  raw_gguf& i64(int64_t v) { return put(v); }
  raw_gguf& f32(float v) { return put(v); }
  raw_gguf& str(std::string_view s) {
    u64(s.size());
    return raw(s);
  }
  raw_gguf& zeros(size_t n) {
    b_.resize(b_.size() + n);
    return *this;
  }
  raw_gguf& pad(size_t alignment) {
    while (b_.size() % alignment) b_.push_back(std::byte{0});
    return *this;
  }

  // magic, version, tensor count, metadata count
  raw_gguf& header(uint64_t n_tensors, uint64_t n_kv, uint32_t version = 3) {
    return raw("GGUF").u32(version).u64(n_tensors).u64(n_kv);
  }
  // A key and its value type; the value follows.
  raw_gguf& key(std::string_view k, gguf_type t) { return str(k).u32(static_cast<uint32_t>(t)); }
  raw_gguf& kv_u32(std::string_view k, uint32_t v) { return key(k, gguf_type::uint32).u32(v); }
  raw_gguf& kv_str(std::string_view k, std::string_view v) { return key(k, gguf_type::string).str(v); }
  // A tensor info: name, n_dims, ne..., type id, offset.
  raw_gguf& tensor(std::string_view name, std::vector<int64_t> ne, uint32_t type_id, uint64_t offset) {
    str(name).u32(static_cast<uint32_t>(ne.size()));
    for (int64_t n : ne) i64(n);
    return u32(type_id).u64(offset);
  }

 private:
  std::vector<std::byte> b_;
};

// The message of the gguf_error that parsing `bytes` throws, or a note that it parsed. Any other exception
// escapes (and fails the test).
inline std::string parse_error(std::span<const std::byte> bytes) {
  try {
    parse_gguf(bytes);
  } catch (const gguf_error& e) {
    return e.what();
  }
  return "(parsed without error)";
}

// The whole content of a file.
inline std::vector<std::byte> read_file_bytes(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  if (!chars.empty()) std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

inline std::string at(size_t offset) { return "offset " + std::to_string(offset) + ","; }
inline std::string file_size(size_t n) { return "file size " + std::to_string(n) + " bytes"; }

}  // namespace troupe::test
