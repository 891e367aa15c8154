// Registers every backend compiled into this build with troupe::registry. Idempotent; call it once at
// start-up (tools, tests, embedders) before looking devices up.
//
//   troupe::register_builtin_backends();
//   for (troupe::device_i* dev : troupe::registry::instance().devices()) ...
//   std::printf("%s", troupe::format_devices().c_str());   // what `troupe devices` prints
//
// Backends: the CPU (always), Vulkan (built with the Vulkan SDK: every physical device with a compute queue,
// Vulkan0, Vulkan1, ...). A backend compiled in but finding no device registers none and says why.
#pragma once

#include <string>
#include <vector>

#include "runtime/backend.h"

namespace troupe {

void register_builtin_backends();

// The host's CPU device ("CPU", registered when it is not yet): where host memory and the host's compute
// come from for code that names no device.
device_i& host_device();

// The devices register_builtin_backends() registers, in order: "CPU", then "Vulkan0", ... (not the CPU
// instances, not remote peers' devices).
std::vector<std::string> builtin_device_names();

// One backend this build knows of: whether it was compiled, how many devices it registered, and what it
// found ("1 device", "no Vulkan driver", "not compiled: built without the Vulkan SDK").
struct backend_report {
  std::string name;  // "CPU", "Vulkan", "CUDA"
  bool compiled = false;
  std::string build;  // what it was compiled with, as users see it: "compiled (toolkit 13.0)"
  size_t devices = 0;  // registered
  size_t unused = 0;   // found but not registered (the backend cannot compute on them yet)
  std::string status;
};

// Every backend troupe has, compiled or not (registers the built-in backends first).
std::vector<backend_report> builtin_backends();

// One line per registered device (name, description, kind, memory total / free, max buffer size) and one
// per backend without devices ("Vulkan: compiled, no device (...)", "CUDA: compiled (toolkit 13.0), no
// device (...)", "CUDA: not compiled (...)").
std::string format_devices();

}  // namespace troupe
