// The CUDA backend's device probe (backends/cuda/cuda_probe.h), on any machine: with a GPU the devices are
// what cudart says; without one (CI) there are none, and the reason is cudart's, shown by `troupe devices`.
#include <catch2/catch.hpp>

#include <string>

#include "backends/cuda/cuda_probe.h"
#include "backends/registry.h"

using namespace troupe;

TEST_CASE("the CUDA probe reports the toolkit and what cudart found", "[cuda]") {
  // The runtime headers the probe was compiled with are those of the nvcc CMake found at configure time
  // (TROUPE_NVCC_VERSION: its major.minor.patch): the same release.
  INFO("nvcc " << TROUPE_NVCC_VERSION << ", cudart headers " << cuda::toolkit_version());
  CHECK(std::string(TROUPE_NVCC_VERSION).rfind(cuda::toolkit_version() + ".", 0) == 0);
  const auto& devs = cuda::probe();
  if (devs.empty()) {
    WARN("no CUDA device: " << cuda::probe_status());
    CHECK_THAT(cuda::probe_status(), Catch::Contains("cudaGetDeviceCount"));
  }
  for (const cuda::device_info& d : devs) {
    INFO("CUDA" << d.index << " " << d.name);
    CHECK_FALSE(d.name.empty());
    CHECK(d.cc_major >= 5);
    CHECK(d.total > 0);
    CHECK(d.free <= d.total);
  }
  // troupe devices says it in one line.
  const std::string listing = format_devices();
  INFO(listing);
  CHECK_THAT(listing, Catch::Contains("CUDA: compiled (toolkit " + cuda::toolkit_version() + ")"));
  if (devs.empty()) CHECK_THAT(listing, Catch::Contains("no device ("));
}
