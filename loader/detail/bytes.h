// Internal helpers of the GGUF reader and writer: little-endian loads and stores, overflow-checked size
// arithmetic. Not part of the loader's interface.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <type_traits>

namespace troupe::detail {

// Reverses the bytes of an integer or floating-point value.
template <class T>
T byte_swapped(T v) {
  static_assert(std::is_trivially_copyable_v<T>);
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  for (size_t i = 0; i < sizeof(T) / 2; ++i) {
    const unsigned char t = b[i];
    b[i] = b[sizeof(T) - 1 - i];
    b[sizeof(T) - 1 - i] = t;
  }
  std::memcpy(&v, b, sizeof(T));
  return v;
}

// A little-endian T from p (unaligned).
template <class T>
T load_le(const void* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  if constexpr (std::endian::native == std::endian::big) v = byte_swapped(v);
  return v;
}

// Stores v at p in little-endian byte order (unaligned).
template <class T>
void store_le(void* p, T v) {
  if constexpr (std::endian::native == std::endian::big) v = byte_swapped(v);
  std::memcpy(p, &v, sizeof(T));
}

// a + b and a * b, empty on overflow.
template <class T>
std::optional<T> checked_add(T a, T b) {
  T r;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

template <class T>
std::optional<T> checked_mul(T a, T b) {
  T r;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// x rounded up to a multiple of `alignment` (a power of two), empty on overflow.
inline std::optional<uint64_t> checked_align_up(uint64_t x, uint64_t alignment) {
  const auto r = checked_add<uint64_t>(x, alignment - 1);
  if (!r) return std::nullopt;
  return *r & ~(alignment - 1);
}

inline bool is_power_of_two(uint64_t x) { return x != 0 && (x & (x - 1)) == 0; }

}  // namespace troupe::detail
