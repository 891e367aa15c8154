// troupe-embed: a host service that embeds troupe's actors in its own CAF actor system.
//
//   troupe-embed MODEL.gguf [TOKENS]        e.g. troupe-embed ../shared/models/stories260K.gguf 48
//
// The host configures its actor system (troupe's message types registered), starts troupe's runtime
// inside it, and then talks to troupe's actors from an actor of its own, as a service would: it loads the
// model, opens two sessions, asks both for an answer at once (the model's scheduler batches their steps
// together), and streams both answers into a subscriber actor of its own, which prints every piece tagged
// with its session. At the end it prints the memory breakdown, shuts troupe down and prints the final
// breakdown (all zero).
#include <caf/all.hpp>

#include <cstdio>
#include <cstdlib>
#include <future>
#include <map>
#include <string>

#include "actors/fan_in.h"
#include "actors/engine.h"

using namespace troupe::actors;

namespace {

// The host's subscriber: receives (token_atom, token_event) from both sessions.
struct printer_state {
  std::map<uint64_t, std::string> text;  // per session
  static inline const char* name = "host.printer";
};

token_subscriber::behavior_type printer(token_subscriber::stateful_pointer<printer_state> self, std::string tag) {
  return {
      [self, tag](token_atom, const token_event& e) {
        self->state.text[e.session] += e.piece;
        std::printf("[%s %llu] %s\n", tag.c_str(), static_cast<unsigned long long>(e.session), e.piece.c_str());
        std::fflush(stdout);
      },
  };
}

// The host's service logic: load, open two sessions, two answers at once, the breakdown. `done` gets the
// outcome ("" on success).
void run_service(caf::event_based_actor* self, supervisor_actor troupe, std::string path, int tokens, token_subscriber sink,
                 std::shared_ptr<std::promise<std::string>> done) {
  auto fail = [done](const caf::error& e) { done->set_value(describe(e)); };
  const load_request load{{.name = "model", .path = std::move(path), .n_ctx = 1024, .n_seq_max = 2}, {}};
  self->request(troupe, caf::infinite, load_atom_v, load).then(
      [=](const model_info& info) {
        std::printf("loaded %s (%s, %u layers, %llu bytes of weights) in %.1f ms\n", info.path.c_str(), info.arch.c_str(),
                    info.n_layer, static_cast<unsigned long long>(info.weight_bytes), info.load_seconds * 1e3);
        self->request(troupe, caf::infinite, open_atom_v, session_request{"model"}).then(
            [=](const session_actor& a) {
              self->request(troupe, caf::infinite, open_atom_v, session_request{"model"}).then(
                  [=](const session_actor& b) {
                    // Both answers in, then the breakdown (fan_in: a reply counter for actors).
                    const fan_in both(2, [=] {
                      self->request(troupe, caf::infinite, get_atom_v, breakdown_atom_v).then(
                          [=](const memory_breakdown& m) {
                            std::printf("\n%s", m.table.c_str());
                            self->send(a, close_atom_v);
                            self->send(b, close_atom_v);
                            done->set_value("");
                          },
                          fail);
                    });
                    auto answer = [=](const session_actor& s, std::string prompt) {
                      generate_request r;
                      r.prompt = std::move(prompt);
                      r.params.max_tokens = tokens;
                      r.params.temperature = 0.0f;
                      r.subscriber = sink;
                      self->request(s, caf::infinite, generate_atom_v, r).then(
                          [=](const generate_reply& g) {
                            std::printf("session %llu done: %zu tokens, finish %s, %.1f tokens/s\n",
                                        static_cast<unsigned long long>(g.session), g.tokens.size(), g.finish.c_str(),
                                        g.gen_seconds > 0 ? g.tokens.size() / g.gen_seconds : 0.0);
                            both();
                          },
                          fail);
                    };
                    answer(a, "Once upon a time");
                    answer(b, "The little dog");
                  },
                  fail);
            },
            fail);
      },
      fail);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: troupe-embed MODEL.gguf [TOKENS]\n");
    return 1;
  }
  const int tokens = argc > 2 ? std::atoi(argv[2]) : 32;

  // The host's actor system: troupe's types registered, the host's own settings.
  caf::actor_system_config cfg;
  add_message_types(cfg);
  cfg.set("scheduler.policy", caf::atom("sharing"));
  caf::actor_system sys{cfg};
  int rc = 0;
  try {
    troupe::engine eng(sys, {.n_threads = 2});
    const token_subscriber sink = sys.spawn(printer, std::string("session"));
    auto done = std::make_shared<std::promise<std::string>>();
    auto outcome = done->get_future();
    sys.spawn(run_service, eng.supervisor(), std::string(argv[1]), tokens, sink, done);
    const std::string err = outcome.get();
    if (!err.empty()) {
      std::fprintf(stderr, "troupe-embed: %s\n", err.c_str());
      rc = 1;
    }
    const memory_breakdown final_b = eng.shutdown();
    std::printf("after shutdown: model %llu, context %llu, compute %llu bytes\n",
                static_cast<unsigned long long>(final_b.model), static_cast<unsigned long long>(final_b.context),
                static_cast<unsigned long long>(final_b.compute));
    caf::anon_send_exit(sink, caf::exit_reason::user_shutdown);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe-embed: %s\n", e.what());
    rc = 1;
  }
  return rc;
}
