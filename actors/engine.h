// The embedding API: a small C++ API over troupe's actors, for programs that want answers, not messages.
//
//   troupe::engine eng({.n_threads = 2});                          // its own CAF actor system
//   eng.load_model("stories", "stories260K.gguf", {.n_ctx = 512});  // model_settings; blocks until loaded (throws)
//   troupe::session s = eng.open_session("stories");
//   auto r = s.generate("Once upon a time", {.max_tokens = 32}, [](std::string_view piece) {
//     std::cout << piece << std::flush;
//     return true;                                                 // false cancels the answer
//   });
//   std::vector<float> e = s.embed({1, 403, 407});                 // token ids -> their embedding, length 1
//   std::cout << eng.memory().table;                               // the memory breakdown
//   eng.shutdown();                                                // frees everything; returns the final breakdown
//
// A host service with its own actor system embeds the same actors: it registers troupe's types on its
// configuration, constructs the engine over its system, and talks to the actors directly where it wants
// (examples/embed):
//
//   caf::actor_system_config cfg;
//   troupe::actors::add_message_types(cfg);
//   caf::actor_system sys{cfg};
//   troupe::engine eng(sys, {});
//   self->request(eng.supervisor(), caf::infinite, open_atom_v, session_request{"m"}).then(...);
//
// Calls block the calling thread with one round trip each (load, open, memory); token callbacks run on
// the calling thread of generate() as the tokens arrive. Sessions must not outlive their engine. Errors
// from the actors are thrown as actors::request_error (with the errc); a cancelled answer is not an
// error here: it returns with finish "cancelled" and the text streamed so far.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "actors/errors.h"
#include "actors/peer_actor.h"
#include "actors/engine_config.h"
#include "runtime/memory.h"
#include "actors/engine_env.h"
#include "actors/session_actor.h"
#include "actors/supervisor_actor.h"

namespace troupe {

// Called with each piece of generated text as it arrives; returning false ends the answer at that piece:
// generate() returns finish "cancelled" with the text and tokens given so far, and no later piece, even
// when the model finished before the session heard of the stop.
using token_callback = std::function<bool(std::string_view piece)>;
// The same with the whole event (the piece and, when asked for, its tokens' log-probabilities).
using token_event_callback = std::function<bool(const actors::token_event& event)>;
// Load progress: (bytes loaded, bytes in all).
using progress_callback = std::function<void(uint64_t, uint64_t)>;

class engine;

// A conversation on one model (a session actor). Move-only; closed by close() or its destructor.
class session {
 public:
  session() = default;
  session(session&&) noexcept = default;
  session& operator=(session&&) noexcept;
  session(const session&) = delete;
  session& operator=(const session&) = delete;
  ~session();

  // Completion of a prompt; blocks until the answer is done.
  actors::generate_reply generate(const std::string& prompt, const actors::generation_params& p = {},
                                  const token_callback& on_piece = {});
  // The next answer of a chat (the whole conversation, formatted with the model's chat template); the
  // cached prefix of the previous turn is reused.
  actors::generate_reply chat(const std::vector<actors::chat_message>& messages, const actors::generation_params& p = {},
                              const token_callback& on_piece = {});
  // Any request (prompt, token ids or chat), each token event passed to on_event as it arrives.
  actors::generate_reply run(actors::generate_request r, const token_event_callback& on_event);
  // Ends the current answer (from any thread); generate()/chat() then return with finish "cancelled".
  void cancel();
  // Forgets the conversation's cached tokens.
  void reset();
  // The embedding of token ids, used as given (pooled as the model declares, length 1: llm/embedding.h),
  // computed by the model's decoder actor on an embeddings context of its own (made on the first one,
  // model_settings::embedding_cells, on the memory record as "embeddings:MODEL", freed with the model); the conversation's
  // cache is untouched. Throws actors::request_error: bad_request (no ids, or one outside the vocabulary),
  // capacity (more than embedding_cells()), down (the session or its model's decoder actor is gone).
  std::vector<float> embed(const std::vector<int32_t>& tokens);
  // Takes what `other` (a session of the same model, not answering) holds in the cache as this session's
  // own, sharing its cells: this session's next answer to the same prompt decodes only its last token.
  void share_prefix(const session& other);
  // Leaves the model (blocks for one round trip); the session's sequence is free for others afterwards.
  void close();

 private:
  friend class engine;
  session(caf::actor_system& sys, actors::session_actor h) : sys_(&sys), handle_(std::move(h)) {}
  actors::generate_reply run_pieces(actors::generate_request r, const token_callback& on_piece);

  caf::actor_system* sys_ = nullptr;
  actors::session_actor handle_;
};

class engine {
 public:
  // Starts a runtime with its own actor system. Throws troupe::error for a bad configuration.
  explicit engine(const actors::engine_config& cfg);
  // Starts a runtime inside the host's actor system (configured with actors::add_message_types).
  engine(caf::actor_system& sys, const actors::engine_config& cfg);
  ~engine();
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Loads a model (s with its name and path set to these); blocks until it is loaded. Throws
  // actors::request_error (errc::bad_request for settings that model_settings::validate refuses).
  actors::model_info load_model(const std::string& name, const std::string& path, actors::model_settings s = {},
                                const progress_callback& progress = {});
  // Loads a model with these settings (a configured [[model]] as it is), reporting progress when given.
  actors::model_info load_model(const actors::model_settings& s, const progress_callback& progress = {});
  // Loads the configuration's [[model]] entries.
  void load_configured_models();
  void unload_model(const std::string& name);
  // Connects to a peer (as a configured [[peer]]) after the start, and waits up to its connect timeout for it
  // to be up; returns its devices' names ("RPC[host:port]#0", ...), which models may then use. The runtime
  // watches it like the configured ones (a model on it is marked down while it is down). Throws
  // actors::request_error (errc::down) naming the peer when it does not come up in time. A peer at an
  // address the runtime already has is that one, asked to connect now (parked or down) and waited for.
  std::vector<std::string> add_peer(const actors::peer_params& p);
  // Tells the peer at host:port to stop trying to reach it (state "parked", `why` as its last error) until
  // add_peer asks for it again: a cluster node that went away. Its devices stay known (and fail fast).
  // False when no peer has that address.
  bool park_peer(const std::string& address, const std::string& why);
  session open_session(const std::string& model);
  // The memory breakdown now (table, JSON, numbers).
  actors::memory_breakdown memory();
  actors::engine_status status();
  // Each loaded model's scheduler counters (batches decoded, steps batched together, KV and compute bytes).
  std::vector<actors::decoder_stats> decoding_stats();
  // Stops every session and model, frees every buffer, stops the actors; returns the final breakdown (all
  // zero). Later calls return an empty breakdown.
  actors::memory_breakdown shutdown();

  caf::actor_system& system() { return *sys_; }
  const actors::supervisor_actor& supervisor() const { return supervisor_; }
  // What the runtime's actors share in this process: the loaded models and the registry of in-process
  // objects that messages name by id.
  const actors::engine_env_ptr& env() const { return env_; }

 private:
  void start();
  actors::peer_actor peer_at(const std::string& address);  // the peer actor at "host:port", or none

  actors::engine_config cfg_;
  std::unique_ptr<caf::actor_system_config> own_cfg_;
  std::unique_ptr<caf::actor_system> own_sys_;
  caf::actor_system* sys_ = nullptr;
  actors::engine_env_ptr env_;
  actors::supervisor_actor supervisor_;
  bool stopped_ = false;
};

}  // namespace troupe
