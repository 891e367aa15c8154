#include "actors/type_ids.h"

#include "actors/allocator_actor.h"
#include "actors/device_actor.h"
#include "actors/errors.h"
#include "actors/loader_actor.h"
#include "actors/memory_accountant_actor.h"
#include "actors/peer_actor.h"
#include "actors/scheduler_actor.h"
#include "actors/session_actor.h"
#include "actors/supervisor_actor.h"

namespace troupe::actors {

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::troupe>();
  // Actor handles that travel in messages (a session from open_atom, subscribers) or are looked up remotely.
  cfg.add_message_type<progress_listener>("troupe::actors::progress_listener");
  cfg.add_message_type<token_subscriber>("troupe::actors::token_subscriber");
  cfg.add_message_type<breakdown_subscriber>("troupe::actors::breakdown_subscriber");
  cfg.add_message_type<peer_subscriber>("troupe::actors::peer_subscriber");
  cfg.add_message_type<memory_accountant_actor>("troupe::actors::memory_accountant_actor");
  cfg.add_message_type<device_actor>("troupe::actors::device_actor");
  cfg.add_message_type<allocator_actor>("troupe::actors::allocator_actor");
  cfg.add_message_type<loader_actor>("troupe::actors::loader_actor");
  cfg.add_message_type<scheduler_actor>("troupe::actors::scheduler_actor");
  cfg.add_message_type<session_actor>("troupe::actors::session_actor");
  cfg.add_message_type<supervisor_actor>("troupe::actors::supervisor_actor");
  cfg.add_message_type<peer_actor>("troupe::actors::peer_actor");
  cfg.add_error_category(error_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    return describe(make_error(static_cast<errc>(code), ctx.match_elements<std::string>() ? ctx.get_as<std::string>(0) : ""));
  });
}

}  // namespace troupe::actors
