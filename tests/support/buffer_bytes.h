// The byte-level check of a device's buffers the GPU tests share (Vulkan, CUDA): n bytes written and read
// back whole, 3 bytes at an odd offset, a fill of 7 at another, a copy into a second tensor, a clear, and a
// write past the tensor refused.
//
//   test::check_buffer_bytes(dev.buffer_type(), (size_t{20} << 20) + 13);   // several staging pieces
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <random>
#include <vector>

#include "runtime/backend.h"
#include "runtime/error.h"

namespace troupe::test {

inline std::vector<uint8_t> random_bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng());
  return v;
}

inline void check_buffer_bytes(buffer_type_i& bt, size_t n) {
  context ctx({.max_tensors = 4, .no_alloc = true});
  tensor* t = ctx.new_tensor_1d(type::i8, static_cast<int64_t>(n));
  tensor* u = ctx.new_tensor_1d(type::i8, static_cast<int64_t>(n));
  buffer_ptr buf = alloc_ctx_tensors(ctx, bt);
  REQUIRE(buf);
  CHECK_FALSE(buf->is_host());
  const auto data = random_bytes(n, 7);
  tensor_set(*t, data.data(), 0, n);
  std::vector<uint8_t> back(n);
  tensor_get(*t, back.data(), 0, n);
  CHECK(back == data);

  // Unaligned pieces: 3 bytes at offset 5, a fill of 7 bytes at offset 1021 (ends a device cannot fill).
  const uint8_t three[3] = {0xAA, 0xBB, 0xCC};
  tensor_set(*t, three, 5, 3);
  buf->memset_tensor(*t, 0x5A, 1021, 7);
  std::vector<uint8_t> head(1100);
  tensor_get(*t, head.data(), 0, head.size());
  for (size_t i = 0; i < head.size(); ++i) {
    uint8_t want = data[i];
    if (i >= 5 && i < 8) want = three[i - 5];
    if (i >= 1021 && i < 1028) want = 0x5A;
    INFO("byte " << i);
    REQUIRE(head[i] == want);
  }
  tensor_copy(*t, *u);  // directly where the buffer can, else through the host
  std::vector<uint8_t> copied(n);
  tensor_get(*u, copied.data(), 0, n);
  tensor_get(*t, back.data(), 0, n);
  CHECK(copied == back);
  buf->clear(0x11);
  tensor_get(*t, back.data(), 0, n);
  CHECK(std::all_of(back.begin(), back.end(), [](uint8_t b) { return b == 0x11; }));
  // Outside the tensor: an error naming it, nothing written.
  CHECK_THROWS_AS(tensor_set(*t, three, n - 1, 3), troupe::error);
}

}  // namespace troupe::test
