#include "backends/cuda/cuda_probe.h"

#include <cuda_runtime_api.h>

#include <mutex>

namespace troupe::cuda {

namespace {

struct probe_state {
  std::vector<device_info> devices;
  std::string why;  // why there is none
};

std::string cuda_error(const char* call, cudaError_t e) {
  return std::string(call) + ": " + cudaGetErrorString(e) + " (" + cudaGetErrorName(e) + ")";
}

probe_state run_probe() {
  probe_state s;
  int n = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&n); e != cudaSuccess) {
    s.why = cuda_error("cudaGetDeviceCount", e);
    return s;
  }
  if (n == 0) {
    s.why = "cudaGetDeviceCount: 0 devices";
    return s;
  }
  for (int i = 0; i < n; ++i) {
    cudaDeviceProp prop{};
    if (const cudaError_t e = cudaGetDeviceProperties(&prop, i); e != cudaSuccess) {
      s.why = cuda_error("cudaGetDeviceProperties", e);
      continue;
    }
    device_info d;
    d.index = i;
    d.name = prop.name;
    d.cc_major = prop.major;
    d.cc_minor = prop.minor;
    if (cudaSetDevice(i) == cudaSuccess) {
      if (cudaMemGetInfo(&d.free, &d.total) != cudaSuccess) d.total = prop.totalGlobalMem;
    }
    s.devices.push_back(d);
  }
  return s;
}

const probe_state& state() {
  static const probe_state s = run_probe();
  return s;
}

}  // namespace

const std::vector<device_info>& probe() { return state().devices; }

std::string toolkit_version() {
  return std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10);
}

std::string probe_status() {
  const probe_state& s = state();
  if (s.devices.empty()) return s.why;
  std::string out = "found " + std::to_string(s.devices.size()) + " device(s):";
  for (const device_info& d : s.devices) {
    out += " CUDA" + std::to_string(d.index) + " " + d.name + " (compute " + std::to_string(d.cc_major) + "." +
           std::to_string(d.cc_minor) + ", " + std::to_string(d.total >> 20) + " MiB)";
  }
  return out;
}

}  // namespace troupe::cuda
