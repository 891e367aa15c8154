// Every atom and message type of troupe's actors, registered in one place.
//
//   caf::actor_system_config cfg;
//   troupe::actors::add_message_types(cfg);   // this block, the actor handles, the error category
//   caf::actor_system sys{cfg};
//
// CAF 0.17.6: atoms are atom_constant values of at most 10 characters; CAF_ADD_ATOM only names them.
// Message types get type IDs here (CAF_ADD_TYPE_ID) and are loaded into a configuration with
// add_message_types<caf::id_block::troupe>(); a type missing from this list fails only at run time, across
// the network, which is why tests/actors/test_remote.cpp sends every type of this block between two
// processes. Typed actor handles are registered by add_message_types() (type_ids.cpp), since their
// interfaces (one header per actor) need the atoms defined here first.
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/type_id.hpp>

#include "actors/messages.h"

CAF_BEGIN_TYPE_ID_BLOCK(troupe, caf::first_custom_type_id)

  // memory accounting
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::memory_event))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::device_status))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::buft_usage))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::memory_breakdown))
  // devices
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::alloc_request))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::buffer_info))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::tensor_range))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::range_upload))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::upload_job))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::upload_result))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::split_ref))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::split_result))
  // allocators
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::compute_reservation))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::graph_plan))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::owner_bytes))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::allocator_usage))
  // loading
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::device_layers))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::tensor_override))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::load_request))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::load_progress))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::model_info))
  // sessions
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::generation_params))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::chat_message))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::generate_request))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::token_event))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::generate_reply))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::session_request))
  // scheduler
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::decode_step))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::step_logits))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::sched_stats))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::pipeline_ref))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::pipeline_result))
  // supervisor
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::actor_status))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::runtime_status))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::actor_directory))
  // remote peers
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::peer_status))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::peer_memory))

  CAF_ADD_ATOM(troupe, troupe::actors, alloc_atom, "alloc")
  CAF_ADD_ATOM(troupe, troupe::actors, free_atom, "free")
  CAF_ADD_ATOM(troupe, troupe::actors, upload_atom, "upload")
  CAF_ADD_ATOM(troupe, troupe::actors, get_atom, "get")
  CAF_ADD_ATOM(troupe, troupe::actors, memory_atom, "memory")
  CAF_ADD_ATOM(troupe, troupe::actors, compute_atom, "compute")
  CAF_ADD_ATOM(troupe, troupe::actors, record_atom, "record")
  CAF_ADD_ATOM(troupe, troupe::actors, breakdown_atom, "breakdown")
  CAF_ADD_ATOM(troupe, troupe::actors, subscribe_atom, "subscribe")
  CAF_ADD_ATOM(troupe, troupe::actors, unsubscribe_atom, "unsubscrib")
  CAF_ADD_ATOM(troupe, troupe::actors, update_atom, "update")
  CAF_ADD_ATOM(troupe, troupe::actors, device_atom, "device")
  CAF_ADD_ATOM(troupe, troupe::actors, load_atom, "load")
  CAF_ADD_ATOM(troupe, troupe::actors, unload_atom, "unload")
  CAF_ADD_ATOM(troupe, troupe::actors, cancel_atom, "cancel")
  CAF_ADD_ATOM(troupe, troupe::actors, progress_atom, "progress")
  CAF_ADD_ATOM(troupe, troupe::actors, attach_atom, "attach")
  CAF_ADD_ATOM(troupe, troupe::actors, detach_atom, "detach")
  CAF_ADD_ATOM(troupe, troupe::actors, step_atom, "step")
  CAF_ADD_ATOM(troupe, troupe::actors, end_atom, "end")
  CAF_ADD_ATOM(troupe, troupe::actors, flush_atom, "flush")
  CAF_ADD_ATOM(troupe, troupe::actors, pipeline_atom, "pipeline")
  CAF_ADD_ATOM(troupe, troupe::actors, stats_atom, "stats")
  CAF_ADD_ATOM(troupe, troupe::actors, generate_atom, "generate")
  CAF_ADD_ATOM(troupe, troupe::actors, token_atom, "token")
  CAF_ADD_ATOM(troupe, troupe::actors, reset_atom, "reset")
  CAF_ADD_ATOM(troupe, troupe::actors, close_atom, "close")
  CAF_ADD_ATOM(troupe, troupe::actors, open_atom, "open")
  CAF_ADD_ATOM(troupe, troupe::actors, reserve_atom, "reserve")
  CAF_ADD_ATOM(troupe, troupe::actors, plan_atom, "plan")
  CAF_ADD_ATOM(troupe, troupe::actors, release_atom, "release")
  CAF_ADD_ATOM(troupe, troupe::actors, usage_atom, "usage")
  CAF_ADD_ATOM(troupe, troupe::actors, status_atom, "status")
  CAF_ADD_ATOM(troupe, troupe::actors, directory_atom, "directory")
  CAF_ADD_ATOM(troupe, troupe::actors, shutdown_atom, "shutdown")
  CAF_ADD_ATOM(troupe, troupe::actors, check_atom, "check")
  CAF_ADD_ATOM(troupe, troupe::actors, connect_atom, "connect")
  CAF_ADD_ATOM(troupe, troupe::actors, lost_atom, "lost")
  CAF_ADD_ATOM(troupe, troupe::actors, retry_atom, "retry")

CAF_END_TYPE_ID_BLOCK(troupe)

namespace troupe::actors {

// Registers this block, every actor handle type and troupe's error category with a configuration. Call it
// before constructing the actor system (hosts that embed troupe call it on their own configuration).
void add_message_types(caf::actor_system_config& cfg);

}  // namespace troupe::actors
