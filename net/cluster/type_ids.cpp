#include "net/cluster/type_ids.h"

#include <string>

namespace troupe::cluster {

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::troupe_cluster>();
  cfg.add_message_type<coordinator_actor>("troupe::cluster::coordinator_actor");
  cfg.add_message_type<cluster_subscriber>("troupe::cluster::cluster_subscriber");
}

}  // namespace troupe::cluster
