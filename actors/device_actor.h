// The device actor, one per device: owns the device's backend (a stream its own thread computes on) and
// the buffers it is asked to allocate; takes uploads of tensor ranges (bytes into its buffers, or its part
// of a staged model load), returns tensor data, computes graph splits and reports its memory. Every
// allocation and release goes to the memory accountant; an allocation the device cannot make is an
// errc::out_of_memory error for the requester, never a crash.
//
//   device_actor dev = spawn_device_actor(sys, env, "CPU1", acct, {.n_threads = 2});
//   self->request(dev, timeout, alloc_atom_v, alloc_request{1 << 20, 2, "me"}).then(
//       [](const buffer_info& b) { ... }, [](const caf::error& e) { ... });
//
// Device actors run detached (a thread each): uploads and graph splits block them, not the scheduler's
// worker threads, and several devices work at the same time.
#pragma once

#include <caf/actor_system.hpp>

#include <string>
#include <vector>

#include "actors/memory_accountant_actor.h"
#include "actors/engine_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

// The interface (using device_actor = caf::typed_actor<...>) is in actors/handles.h.

struct device_actor_params {
  int n_threads = 0;  // threads of the device's backend (CPU devices); 0: all
};

// Throws error when the registry has no such device.
device_actor spawn_device_actor(caf::actor_system& sys, engine_env_ptr env, const std::string& device,
                                memory_accountant_actor accountant, const device_actor_params& p = {});

}  // namespace troupe::actors
