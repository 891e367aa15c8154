// Every message type of troupe's actors, registered in one place.
//
//   caf::actor_system_config cfg;
//   troupe::actors::add_message_types(cfg);   // this block, the actor handles, the error category
//   caf::actor_system sys{cfg};
//
// CAF 0.17.6: atoms (actors/atoms.h) need no registration. Message types get type IDs here
// (CAF_ADD_TYPE_ID) and are loaded into a configuration with add_message_types<caf::id_block::troupe>(); a
// type missing from this list fails only at run time, across the network, which is why
// tests/actors/test_remote.cpp sends every type of this block between two processes. Typed actor handles
// (actors/handles.h) are registered by add_message_types() (type_ids.cpp).
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
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::decode_split))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::split_result))
  // allocators
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::compute_reservation))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::graph_plan))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::owner_bytes))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::allocator_usage))
  // loading
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::device_layers))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::tensor_override))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::model_settings))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::load_request))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::load_progress))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::model_info))
  // sessions
  CAF_ADD_TYPE_ID(troupe, (troupe::llm::generate_params))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::chat_message))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::generate_request))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::token_event))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::generate_reply))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::session_request))
  // scheduler
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::session_prefix))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::decode_step))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::step_logits))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::decoder_stats))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::slot_status))
  // supervisor
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::actor_status))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::engine_status))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::actor_directory))
  // remote peers
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::peer_status))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::peer_memory))
  // embeddings (last, so that every type above keeps its ID)
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::embed_request))
  CAF_ADD_TYPE_ID(troupe, (troupe::actors::embed_reply))

CAF_END_TYPE_ID_BLOCK(troupe)

namespace troupe::actors {

// Registers this block, every actor handle type and troupe's error category with a configuration. Call it
// before constructing the actor system (hosts that embed troupe call it on their own configuration).
void add_message_types(caf::actor_system_config& cfg);

}  // namespace troupe::actors
