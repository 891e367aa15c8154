// The emulation of CUDA's thread model the host tests run the CUDA kernels with (host_lanes.h): every thread
// of every block with its indices, the warp shuffles and votes as CUDA's programming guide defines them,
// __syncthreads ordering __shared__ memory, the kernels' thread groups reducing over all their threads, and
// what CUDA leaves undefined (divergent barriers, shuffles naming threads that returned) reported as errors.
#include <catch2/catch.hpp>

#include <stdexcept>
#include <vector>

// CUDA's names on the host, before the device code that uses them.
#include "tests/backends/cuda/host_lanes.h"

#include "backends/cuda/kernels/groups.cuh"

using namespace troupe;
using namespace troupe::cuda::kern;
namespace lanes = troupe::test::lanes;

namespace {

unsigned linear_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

unsigned linear_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }

}  // namespace

TEST_CASE("host lanes: every thread of every block runs once, with CUDA's indices", "[cuda][lanes]") {
  const dim3 grid(3, 2, 2), block(8, 4, 2);
  const unsigned threads = block.x * block.y * block.z, blocks = grid.x * grid.y * grid.z;
  for (lanes::mode m : {lanes::mode::independent, lanes::mode::cooperative}) {
    INFO("cooperative " << (m == lanes::mode::cooperative));
    std::vector<int> hits(threads * blocks);
    std::vector<unsigned> seen(threads * blocks);
    int dims_differ = 0;
    lanes::launch(grid, block, m, [&] {
      const unsigned i = linear_block() * threads + linear_thread();
      ++hits[i];
      seen[i] = (threadIdx.x << 24) | (threadIdx.y << 16) | (threadIdx.z << 12) | (blockIdx.x << 8) | (blockIdx.y << 4) | blockIdx.z;
      if (blockDim.x != 8 || blockDim.y != 4 || blockDim.z != 2 || gridDim.x != 3 || gridDim.y != 2 || gridDim.z != 2) ++dims_differ;
    });
    CHECK(dims_differ == 0);
    for (unsigned b = 0; b < blocks; ++b) {
      for (unsigned t = 0; t < threads; ++t) {
        const unsigned i = b * threads + t;
        CHECK(hits[i] == 1);
        const unsigned tx = t % 8, ty = t / 8 % 4, tz = t / 32, bx = b % 3, by = b / 3 % 2, bz = b / 6;
        CHECK(seen[i] == ((tx << 24) | (ty << 16) | (tz << 12) | (bx << 8) | (by << 4) | bz));
      }
    }
  }
}

TEST_CASE("host lanes: warp shuffles and votes as CUDA defines them, widths included", "[cuda][lanes]") {
  const unsigned n = 64;  // two warps
  std::vector<int> x5(n), down3w8(n), up2w16(n), idx7w8(n), idx9w8(n), xor16w16(n);
  std::vector<unsigned> ballot(n);
  std::vector<int> any(n), all(n);
  lanes::launch(dim3(1), dim3(n), lanes::mode::cooperative, [&] {
    const unsigned t = threadIdx.x;
    const int v = static_cast<int>(t);
    x5[t] = __shfl_xor_sync(0xffffffffu, v, 5);
    down3w8[t] = __shfl_down_sync(0xffffffffu, v, 3, 8);
    up2w16[t] = __shfl_up_sync(0xffffffffu, v, 2, 16);
    idx7w8[t] = __shfl_sync(0xffffffffu, v, 7, 8);
    idx9w8[t] = __shfl_sync(0xffffffffu, v, 9, 8);
    xor16w16[t] = __shfl_xor_sync(0xffffffffu, v, 16, 16);
    ballot[t] = __ballot_sync(0xffffffffu, t % 3 == 0);
    any[t] = __any_sync(0xffffffffu, t == 37);
    all[t] = __all_sync(0xffffffffu, t < 40);
  });
  // Lane ids are per warp: thread 37 is lane 5 of warp 1.
  CHECK(x5[0] == 5);
  CHECK(x5[6] == 3);
  CHECK(x5[37] == 32);
  CHECK(down3w8[0] == 3);
  CHECK(down3w8[4] == 7);
  CHECK(down3w8[5] == 5);  // 5 + 3 leaves the group of 8: its own value
  CHECK(down3w8[10] == 13);
  CHECK(down3w8[13] == 13);
  CHECK(down3w8[60] == 63);
  CHECK(up2w16[0] == 0);
  CHECK(up2w16[17] == 17);  // lane 1 of the second group of 16
  CHECK(up2w16[18] == 16);
  CHECK(up2w16[33] == 33);
  CHECK(idx7w8[12] == 15);
  CHECK(idx9w8[12] == 9);  // 9 mod 8 within the group
  CHECK(idx7w8[40] == 47);
  CHECK(xor16w16[3] == 3);    // lane 19 is in a later group of 16: its own value
  CHECK(xor16w16[19] == 3);   // an earlier group may be read
  CHECK(xor16w16[35] == 35);  // lane 3 of warp 1
  for (unsigned t = 0; t < n; ++t) {
    INFO("thread " << t);
    CHECK(ballot[t] == (t < 32 ? 0x49249249u : 0x92492492u));
    CHECK(any[t] == (t < 32 ? 0 : 1));
    CHECK(all[t] == (t < 32 ? 1 : 0));
  }
}

TEST_CASE("host lanes: __syncthreads orders __shared__ memory between a block's threads, block after block", "[cuda][lanes]") {
  const unsigned n = 96, blocks = 3;
  std::vector<int> out(n * blocks), out2(n * blocks);
  lanes::launch(dim3(blocks), dim3(n), lanes::mode::cooperative, [&] {
    __shared__ int sh[96];
    const unsigned t = threadIdx.x;
    sh[t] = static_cast<int>(1000 * blockIdx.x + t);
    __syncthreads();
    const int next = sh[(t + 1) % n];
    __syncthreads();  // every thread has read before any writes again
    sh[t] = -next;
    __syncthreads();
    out[blockIdx.x * n + t] = next;
    out2[blockIdx.x * n + t] = sh[(t + n - 1) % n];
  });
  for (unsigned b = 0; b < blocks; ++b) {
    for (unsigned t = 0; t < n; ++t) {
      CHECK(out[b * n + t] == static_cast<int>(1000 * b + (t + 1) % n));
      CHECK(out2[b * n + t] == -static_cast<int>(1000 * b + t));
    }
  }
}

TEST_CASE("host lanes: the kernels' thread groups give every thread the sum and maximum over all of theirs", "[cuda][lanes]") {
  for (unsigned n : {32u, 64u, 96u, 256u, 1024u}) {
    INFO("block of " << n);
    std::vector<float> sum(n), mx(n), sum2(n), wsum(n);
    lanes::launch(dim3(2), dim3(n), lanes::mode::cooperative, [&] {
      block_group g;
      warp_group w;
      const auto t = static_cast<unsigned>(g.lane());
      const float v = static_cast<float>(t + 1);
      sum[t] = g.sum(v);
      mx[t] = g.max(v);
      sum2[t] = g.sum(2.0f * v);  // the shared partials again, right after max used them
      wsum[t] = w.sum(v);
    });
    const float total = static_cast<float>(n * (n + 1) / 2);
    for (unsigned t = 0; t < n; ++t) {
      INFO("thread " << t);
      CHECK(sum[t] == total);
      CHECK(mx[t] == static_cast<float>(n));
      CHECK(sum2[t] == 2.0f * total);
      const unsigned w0 = t / 32 * 32;  // the warp's threads w0 .. w0 + 31 hold w0 + 1 .. w0 + 32
      CHECK(wsum[t] == static_cast<float>(32 * w0 + 32 * 33 / 2));
    }
  }
}

TEST_CASE("host lanes: what CUDA leaves undefined is an error, and the next launch runs", "[cuda][lanes]") {
  const auto coop = lanes::mode::cooperative;
  // Even threads at __syncthreads, odd ones at __syncwarp naming the even ones: neither can go on.
  CHECK_THROWS_WITH(lanes::launch(dim3(1), dim3(64), coop,
                                  [] {
                                    if (threadIdx.x % 2 == 0) {
                                      __syncthreads();
                                    } else {
                                      __syncwarp();
                                    }
                                  }),
                    Catch::Contains("wait for each other forever") && Catch::Contains("at __syncthreads"));
  CHECK_THROWS_WITH(lanes::launch(dim3(1), dim3(32), coop,
                                  [] {
                                    if (threadIdx.x == 5) return;
                                    (void)__shfl_xor_sync(0xffffffffu, 1.0f, 1);
                                  }),
                    Catch::Contains("names thread 5, which has returned"));
  CHECK_THROWS_WITH(lanes::launch(dim3(1), dim3(48), coop, [] { (void)__shfl_xor_sync(0xffffffffu, 1, 1); }),
                    Catch::Contains("which the block does not have"));
  CHECK_THROWS_WITH(lanes::launch(dim3(1), dim3(32), coop, [] { (void)__shfl_sync(0x1u, 1, 0); }),
                    Catch::Contains("which does not name it"));
  CHECK_THROWS_WITH(lanes::launch(dim3(1), dim3(32), coop,
                                  [] {
                                    if (threadIdx.x < 2) (void)__shfl_sync(0x3u, 1, 2);
                                  }),
                    Catch::Contains("outside its mask"));
  CHECK_THROWS_WITH(lanes::launch(dim3(1), dim3(32), coop, [] { (void)__shfl_xor_sync(0xffffffffu, 1, 1, 12); }),
                    Catch::Contains("width 12"));
  CHECK_THROWS_WITH(lanes::launch(dim3(2), dim3(32), lanes::mode::independent, [] { __syncthreads(); }),
                    Catch::Contains("independent lanes"));
  // An exception in one thread ends the launch; the threads waiting for it are unwound.
  CHECK_THROWS_WITH(lanes::launch(dim3(4), dim3(64), coop,
                                  [] {
                                    if (blockIdx.x == 1 && threadIdx.x == 40) throw std::runtime_error("thread 40 of block 1");
                                    __syncthreads();
                                  }),
                    "thread 40 of block 1");
  CHECK_THROWS_WITH(__syncthreads(), Catch::Contains("outside a kernel launch"));
  std::vector<float> sum(128);
  lanes::launch(dim3(1), dim3(128), coop, [&] { sum[threadIdx.x] = block_group{}.sum(1.0f); });
  for (float s : sum) CHECK(s == 128.0f);
}
