#include "backends/registry.h"

#include <cstdint>
#include <cstdio>

#include "backends/cpu/cpu_backend.h"
#include "runtime/backend.h"

#ifdef TROUPE_HAVE_VULKAN
#include "backends/vulkan/vulkan_device.h"
#endif
#ifdef TROUPE_HAVE_CUDA
#include "backends/cuda/cuda_device.h"
#endif

namespace troupe {

// CUDA before Vulkan: where both drive the same NVIDIA GPU, -ngl without --device (the first device that is
// not the CPU) takes its native backend.
void register_builtin_backends() {
  cpu::register_cpu_backend();
#ifdef TROUPE_HAVE_CUDA
  for (cuda::device* d : cuda::devices()) registry::instance().add(*d);
#endif
#ifdef TROUPE_HAVE_VULKAN
  for (vulkan::device* d : vulkan::devices()) registry::instance().add(*d);
#endif
}

device_i& host_device() {
  cpu::register_cpu_backend();
  return cpu::cpu_device();
}

std::vector<std::string> builtin_device_names() {
  register_builtin_backends();
  std::vector<std::string> out{"CPU"};
#ifdef TROUPE_HAVE_CUDA
  for (cuda::device* d : cuda::devices()) out.emplace_back(d->name());
#endif
#ifdef TROUPE_HAVE_VULKAN
  for (vulkan::device* d : vulkan::devices()) out.emplace_back(d->name());
#endif
  return out;
}

std::vector<backend_report> builtin_backends() {
  register_builtin_backends();
  std::vector<backend_report> out;
  out.push_back({"CPU", true, "compiled", 1, 0, "1 device"});
#ifdef TROUPE_HAVE_VULKAN
  out.push_back({"Vulkan", true, "compiled", vulkan::devices().size(), 0, vulkan::status()});
#else
  out.push_back({"Vulkan", false, "not compiled", 0, 0, "built without the Vulkan SDK"});
#endif
#ifdef TROUPE_HAVE_CUDA
  out.push_back({"CUDA", true, "compiled (toolkit " + cuda::toolkit_version() + ")", cuda::devices().size(), 0, cuda::status()});
#else
  out.push_back({"CUDA", false, "not compiled", 0, 0, "built without the CUDA toolkit"});
#endif
  return out;
}

namespace {

std::string mib(size_t bytes) { return bytes == SIZE_MAX ? std::string("none") : std::to_string(bytes >> 20) + " MiB"; }

}  // namespace

std::string format_devices() {
  const std::vector<backend_report> backends = builtin_backends();
  std::string out = "devices:\n";
  for (device_i* d : registry::instance().devices()) {
    const device_memory m = d->memory();
    char line[512];
    std::snprintf(line, sizeof line, "  %-10s %-40s %-5s %9s total, %9s free, max buffer %s\n", std::string(d->name()).c_str(),
                  d->description().c_str(), std::string(device_type_name(d->type())).c_str(), mib(m.total).c_str(),
                  mib(m.free).c_str(), mib(d->buffer_type().max_size()).c_str());
    out += line;
  }
  for (const backend_report& b : backends) {
    if (b.devices > 0) continue;
    if (!b.compiled) {
      out += "  " + b.name + ": " + b.build + " (" + b.status + ")\n";
    } else if (b.unused > 0) {  // devices the backend cannot use yet
      out += "  " + b.name + ": " + b.build + ", " + b.status + "\n";
    } else {
      out += "  " + b.name + ": " + b.build + ", no device (" + b.status + ")\n";
    }
  }
  return out;
}

}  // namespace troupe
