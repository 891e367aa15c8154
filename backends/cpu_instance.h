// Extra CPU device instances ("CPU1", "CPU2", ...): devices computed by the CPU but with buffer types of
// their own, so multi-device code (placement, range-mapped uploads, graph splits, memory accounting per
// device, loading several devices at once) runs and is tested on any machine.
//
//   device_i& d = add_cpu_instance({.index = 1, .memory = 256 << 20});  // registered as "CPU1"
//   model::load(path, {.devices = {{&d, 4}}});                           // last 4 layers in CPU1 memory
//
// An instance's buffer type is not host memory as far as the rest of troupe knows (is_host() is false), so
// its weights are copied rather than mapped, its memory gets a row of its own in the breakdown, and the
// scheduler copies split inputs in from other devices' compute memory (host buffers, such as mapped
// weights, it reads in place). `memory` bounds what the instance allocates at once
// (0: unbounded, reporting the host's memory): an allocation beyond it throws backend_error, which is how
// tests make a device fail an allocation.
#pragma once

#include <cstddef>

#include "runtime/backend.h"

namespace troupe {

struct cpu_instance_params {
  int index = 1;         // the device is named "CPU<index>"; index >= 1
  size_t memory = 0;     // bytes this device may hold at once; 0: unbounded
  int n_threads = 0;     // threads of its backends; 0: all hardware threads
};

// Registers (or returns the already registered) instance "CPU<index>". The registry keeps it for the
// process's lifetime. Throws error for index < 1.
device_i& add_cpu_instance(const cpu_instance_params& p);

}  // namespace troupe
