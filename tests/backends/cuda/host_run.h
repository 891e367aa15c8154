// The CUDA backend's kernels run on the host: every step plan() makes (backends/cuda/plan.h) executed by the
// kernels themselves (backends/cuda/kernels/kernels.cuh) at the launch geometry plan.h gives (dims_of), with
// every thread of every block, their warp shuffles, barriers and shared memory emulated (host_lanes.h); and
// cuBLAS's products by their definition (column-major, A transposed). An emulated device wraps them so the
// conformance runner takes the CUDA backend's decisions (supports, plan, its arguments), its kernels' split of
// the work between threads and their arithmetic through the whole op table on a machine without a GPU. It
// does not check the launches themselves, the hardware or cuBLAS (test_cuda_device.cpp does, on a GPU).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "backends/cuda/plan.h"
#include "runtime/backend.h"

namespace troupe::test {

// Runs step s over host memory (pointers in it are host addresses).
void run_on_host(const cuda::step& s);
// How many steps of each kind (cuda::step_name) run_on_host has run in this process.
std::map<std::string, int, std::less<>>& host_steps_run();

// Scratch memory in host memory.
class host_scratch final : public cuda::scratch_i {
 public:
  uint8_t* get(int slot, size_t bytes) override;
  size_t requested(int slot) const { return requested_[static_cast<size_t>(slot)]; }

 private:
  std::vector<double> memory_[cuda::scratch_slots];  // 8-byte aligned
  size_t requested_[cuda::scratch_slots] = {};
};

// A device whose buffers are the CPU's host memory and whose backend runs plan()'s steps with run_on_host.
std::unique_ptr<device_i> make_emulated_cuda_device();

}  // namespace troupe::test
