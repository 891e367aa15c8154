#include "actors/type_ids.h"

#include <array>
#include <string>

#include "actors/errors.h"

namespace troupe::actors {

namespace {

// Registers each handle type under "troupe::actors::" + its name.
template <class... Handles>
void add_handles(caf::actor_system_config& cfg, const std::array<const char*, sizeof...(Handles)>& names) {
  size_t i = 0;
  (cfg.add_message_type<Handles>(std::string("troupe::actors::") + names[i++]), ...);
}

}  // namespace

void add_message_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::troupe>();
  // Actor handles that travel in messages (a session from open_atom, subscribers) or are looked up remotely.
  add_handles<memory_accountant_actor, device_actor, allocator_actor, loader_actor, decoder_actor, session_actor,
              supervisor_actor, peer_actor, progress_listener, token_subscriber, breakdown_subscriber, peer_subscriber>(
      cfg, {"memory_accountant_actor", "device_actor", "allocator_actor", "loader_actor", "decoder_actor",
            "session_actor", "supervisor_actor", "peer_actor", "progress_listener", "token_subscriber",
            "breakdown_subscriber", "peer_subscriber"});
  cfg.add_error_category(error_category, [](uint8_t code, caf::atom_value, const caf::message& ctx) {
    return describe(make_error(static_cast<errc>(code), ctx.match_elements<std::string>() ? ctx.get_as<std::string>(0) : ""));
  });
}

}  // namespace troupe::actors
