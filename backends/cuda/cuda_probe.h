// What the CUDA runtime finds on this machine: the first piece of the CUDA backend (issue 16). The devices
// are asked of cudart (name, compute capability, memory total / free from cudaMemGetInfo), never guessed;
// without a GPU or a driver there are none, and status() says why in cudart's words.
//
//   for (const cuda::device_info& d : cuda::probe()) ...   // empty without a GPU
//   cuda::status();   // why there is no device: "cudaGetDeviceCount: CUDA driver version is insufficient ..."
//
// The devices are not registered with the runtime yet: buffers, transfers and kernels come next, and a device
// that cannot compute must not be offered to models.
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
std::string status();

}  // namespace troupe::cuda
