// The cluster's message types, registered after troupe's own block (actors/type_ids.h).
//
//   caf::actor_system_config cfg;
//   troupe::actors::add_message_types(cfg);
//   troupe::cluster::add_message_types(cfg);
//   cfg.load<caf::io::middleman>();
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/type_id.hpp>

#include "actors/type_ids.h"
#include "net/cluster/messages.h"

CAF_BEGIN_TYPE_ID_BLOCK(troupe_cluster, caf::id_block::troupe::end)

  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::node_device))
  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::node_inventory))
  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::join_challenge))
  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::join_request))
  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::join_accept))
  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::node_heartbeat))
  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::node_entry))
  CAF_ADD_TYPE_ID(troupe_cluster, (troupe::cluster::cluster_view))

CAF_END_TYPE_ID_BLOCK(troupe_cluster)

namespace troupe::cluster {

// This block and the cluster's actor handles; after troupe::actors::add_message_types.
void add_message_types(caf::actor_system_config& cfg);

}  // namespace troupe::cluster
