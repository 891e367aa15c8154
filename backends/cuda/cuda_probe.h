// What the CUDA runtime finds on this machine. The devices are asked of cudart (name, compute capability,
// memory total / free from cudaMemGetInfo), never guessed; without a GPU or a driver there are none, and
// probe_status() says why in cudart's words. cuda_device.h makes troupe devices of them.
//
//   for (const cuda::device_info& d : cuda::probe()) ...   // empty without a GPU
//   cuda::probe_status();   // "cudaGetDeviceCount: CUDA driver version is insufficient ..."
#pragma once

#include <cstddef>
#include <string>
#include <vector>

namespace troupe::cuda {

struct device_info {
  int index = 0;             // CUDA0, CUDA1, ...
  std::string name;          // cudaDeviceProp::name
  int cc_major = 0, cc_minor = 0;
  size_t total = 0, free = 0;  // bytes
};

// The devices, asked once (thread-safe).
const std::vector<device_info>& probe();
// The toolkit this build was compiled with, "13.0".
std::string toolkit_version();
// Why there is no device (cudart's error), or "found N device(s): CUDA0 NAME (compute 9.0, 143771 MiB) ...".
std::string probe_status();

}  // namespace troupe::cuda
