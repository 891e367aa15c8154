// Random blocks of the quantized types troupe computes with but does not write (the i-quants below 4 bits):
// random bytes, every block's fp16 scale set to a small positive value so that its values lie within about
// [-2, 2]. Every bit pattern of those blocks is a valid block, so random bytes exercise every grid entry,
// sign pattern and scale.
//
//   std::vector<uint8_t> bytes = test::random_blocks(type::iq3_s, n_blocks, rng);
#pragma once

#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/fp16.h"
#include "runtime/types.h"

namespace troupe::test {

inline std::vector<uint8_t> random_blocks(type t, int64_t n_blocks, std::mt19937& rng) {
  const size_t bs = type_size(t);
  std::vector<uint8_t> bytes(bs * static_cast<size_t>(n_blocks));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(0.002f, 0.01f);
  for (int64_t i = 0; i < n_blocks; ++i) {
    uint8_t* blk = bytes.data() + static_cast<size_t>(i) * bs;
    const fp16_t d = fp32_to_fp16(scale(rng));
    uint16_t bits;
    std::memcpy(&bits, &d, 2);
    if (t == type::iq1_m) {
      // The scale's 16 bits in the top nibbles of the four 16-bit scale words (bytes 48..55).
      for (int w = 0; w < 4; ++w) {
        uint16_t word;
        std::memcpy(&word, blk + 48 + 2 * w, 2);
        word = static_cast<uint16_t>((word & 0x0FFF) | (((bits >> (4 * w)) & 0xF) << 12));
        std::memcpy(blk + 48 + 2 * w, &word, 2);
      }
    } else {
      std::memcpy(blk, &bits, 2);
    }
  }
  return bytes;
}

}  // namespace troupe::test
