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
#include <caf/replies_to.hpp>
#include <caf/typed_actor.hpp>

#include <string>
#include <vector>

#include "actors/memory_accountant_actor.h"
#include "actors/runtime_env.h"
#include "actors/type_ids.h"

namespace troupe::actors {

using device_actor = caf::typed_actor<
    // Allocates a buffer of the device's default buffer type, accounted as the request's kind and owner.
    caf::replies_to<alloc_atom, alloc_request>::with<buffer_info>,
    // Frees a buffer this actor allocated; replies its size.
    caf::replies_to<free_atom, uint64_t>::with<uint64_t>,
    // Writes bytes into a buffer this actor allocated; replies the bytes written.
    caf::replies_to<upload_atom, range_upload>::with<uint64_t>,
    // Loads this device's part of a staged model load (range-mapped reads and uploads).
    caf::replies_to<upload_atom, upload_job>::with<upload_result>,
    // Returns bytes of a buffer this actor allocated.
    caf::replies_to<get_atom, tensor_range>::with<std::vector<char>>,
    // Computes one split of a pipeline job on this device's backend (its inputs copied in first).
    caf::replies_to<compute_atom, split_ref>::with<split_result>,
    // The device's memory now.
    caf::replies_to<memory_atom>::with<device_status>>;

struct device_actor_params {
  int n_threads = 0;  // threads of the device's backend (CPU devices); 0: all
};

// Throws error when the registry has no such device.
device_actor spawn_device_actor(caf::actor_system& sys, runtime_env_ptr env, const std::string& device,
                                memory_accountant_actor accountant, const device_actor_params& p = {});

}  // namespace troupe::actors
