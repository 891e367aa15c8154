// The actor runtime in one process, through the embedding API: loading, sessions, streaming, the memory
// breakdown at every stage, shutdown to zero; the same tokens as the synchronous generator.
#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <malloc.h>

#include "actors/device_actor.h"
#include "actors/engine.h"
#include "llm/generator.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

// The synchronous generator's greedy answer to "Once upon a time" (the reference for the actors).
llm::generate_result reference(const llm::model& m, int n) {
  llm::vocab v(m.meta());
  llm::llm_context c(m, {.n_ctx = 256, .n_threads = 2});
  llm::generator gen(c, v);
  llm::generate_params gp;
  gp.max_tokens = n;
  gp.temperature = 0.0f;
  return gen.generate(v.tokenize("Once upon a time", true), gp);
}

}  // namespace

TEST_CASE("engine: load, generate with streaming, the generator's tokens, memory to zero at shutdown", "[actors][engine]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  engine eng({.n_threads = 2});
  const model_info info = eng.load_model("stories", path->string(), {.n_ctx = 256, .n_seq_max = 2, .n_threads = 2});
  CHECK(info.n_layer == 5);
  CHECK(info.weight_bytes > 0);

  // After load: model bytes equal the weights, nothing else yet.
  auto m = llm::model::load(*path);
  uint64_t weights = 0;
  for (const auto& [b, n] : m->weight_bytes()) weights += n;
  memory_breakdown b = eng.memory();
  CHECK(b.model == weights);
  CHECK(b.model == info.weight_bytes);
  CHECK(b.context == 0);
  CHECK(b.compute == 0);

  session s = eng.open_session("stories");
  b = eng.memory();
  llm::llm_context ref_ctx(*m, {.n_ctx = 256, .n_seq_max = 2, .n_threads = 2});
  CHECK(b.context == ref_ctx.kv().bytes());
  CHECK(b.compute == ref_ctx.compute_bytes());
  CHECK(b.compute > 0);
  CHECK(b.table.find("Host") != std::string::npos);

  std::string streamed;
  const generate_reply r = s.generate("Once upon a time", generation_params::greedy(24), [&](std::string_view piece) {
    streamed += piece;
    return true;
  });
  const llm::generate_result ref = reference(*m, 24);
  CHECK(r.tokens == ref.tokens);
  CHECK(r.text == ref.text);
  CHECK(streamed == ref.text);
  CHECK(r.finish == ref.finish);

  const memory_breakdown final_b = eng.shutdown();
  CHECK(final_b.model == 0);
  CHECK(final_b.context == 0);
  CHECK(final_b.compute == 0);
  CHECK(final_b.n_rejected == 0);
}

TEST_CASE("engine: decode splits run on the device actors that own their devices", "[actors][engine]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const llm::generate_result ref = reference(*llm::model::load(*path), 16);

  for (const bool dispatch : {true, false}) {
    INFO("dispatch_splits = " << dispatch);
    // Layers 2..4 (and the output) on CPU1, the rest on CPU: every decode has splits on both devices.
    engine eng({.devices = {"CPU", "CPU1"}, .cpu_instances = 1, .n_threads = 1, .dispatch_splits = dispatch});
    eng.load_model("stories", path->string(), {.devices = {{"CPU1", 3}}, .n_ctx = 256, .n_seq_max = 1, .n_threads = 1});
    session s = eng.open_session("stories");
    const generate_reply r = s.generate("Once upon a time", generation_params::greedy(16));
    CHECK(r.tokens == ref.tokens);

    caf::scoped_actor self{eng.system()};
    actor_directory dir;
    self->request(eng.supervisor(), std::chrono::seconds(30), get_atom_v, directory_atom_v)
        .receive([&](actor_directory& d) { dir = std::move(d); }, [](caf::error& e) { FAIL(describe(e)); });
    REQUIRE(dir.device_names.size() == 2);
    for (size_t i = 0; i < dir.devices.size(); ++i) {
      device_status st;
      self->request(dir.devices[i], std::chrono::seconds(30), memory_atom_v)
          .receive([&](device_status& d) { st = std::move(d); }, [](caf::error& e) { FAIL(describe(e)); });
      INFO("device " << dir.device_names[i]);
      // 16 tokens: the prompt's decode and 15 more, each with a split on both devices.
      if (dispatch) {
        CHECK(st.n_splits >= 16);
      } else {
        CHECK(st.n_splits == 0);
      }
    }
    s.close();
    const memory_breakdown final_b = eng.shutdown();
    CHECK(final_b.model + final_b.context + final_b.compute == 0);
  }
}

TEST_CASE("engine: a long-lived session's answers give back all the memory they take", "[actors][engine]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  WARN("SKIPPED: the sanitizers' allocators do not report malloc's figures");
  return;
#endif
  engine eng({.n_threads = 1});
  eng.load_model("m", path->string(), {.n_ctx = 256, .n_threads = 1});
  session s = eng.open_session("m");
  const auto answer = [&](int i) {
    // Plain, streamed and cancelled answers, as a daemon's session serves them.
    // A stop at the second piece ends the answer there, however far the session got meanwhile.
    int pieces = 0;
    std::string given;
    const auto r = s.generate("Once upon a time", generation_params::greedy(6), [&](std::string_view piece) {
      given += piece;
      return i % 3 != 2 || ++pieces < 2;
    });
    CHECK(r.finish == (i % 3 == 2 ? "cancelled" : "length"));
    CHECK(r.text == given);
    CHECK(r.tokens.size() == (i % 3 == 2 ? size_t{2} : size_t{6}));
    s.reset();
  };
  for (int i = 0; i < 30; ++i) answer(i);  // warm-up: graphs, caches, the allocator's pools
  // Bytes in use over every malloc arena (all threads), at rest between answers.
  const auto in_use = [] { return mallinfo2().uordblks; };
  const size_t before = in_use();
  constexpr int n = 300;
  for (int i = 0; i < n; ++i) answer(i);
  const size_t after = in_use();
  // Each answer that kept its requester (the session's monitor of a finished scoped actor) kept 0.5 KiB:
  // 300 answers would keep 170 KiB. A few KiB come and go with the allocator's own bookkeeping.
  INFO("bytes in use: " << before << " -> " << after);
  CHECK(after < before + 32 * 1024);
  eng.shutdown();
}
