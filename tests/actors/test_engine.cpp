// The actor runtime in one process, through the embedding API: loading, sessions, streaming, the memory
// breakdown at every stage, shutdown to zero; the same tokens as the synchronous generator, and the same
// embeddings as llm::embed.
#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <malloc.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "actors/device_actor.h"
#include "actors/engine.h"
#include "llm/embedding.h"
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

// The largest difference between two vectors of the same length.
float max_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float d = 0;
  for (size_t i = 0; i < a.size(); ++i) d = std::max(d, std::fabs(a[i] - b[i]));
  return d;
}

// Bytes the allocator actors hold for `owner`, over every buffer type.
uint64_t allocator_bytes(engine& eng, const std::string& owner) {
  caf::scoped_actor self{eng.system()};
  actor_directory dir;
  self->request(eng.supervisor(), std::chrono::seconds(30), get_atom_v, directory_atom_v)
      .receive([&](actor_directory& d) { dir = std::move(d); }, [](caf::error& e) { FAIL(describe(e)); });
  uint64_t n = 0;
  for (const allocator_actor& a : dir.allocators) {
    self->request(a, std::chrono::seconds(30), get_atom_v, usage_atom_v)
        .receive(
            [&](allocator_usage& u) {
              for (const owner_bytes& o : u.owners) n += o.owner == owner ? o.bytes : 0;
            },
            [](caf::error& e) { FAIL(describe(e)); });
  }
  return n;
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

TEST_CASE("engine: a session's embedding equals llm::embed, is on the memory record, and is freed with the model",
          "[actors][engine][embeddings]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  engine eng({.n_threads = 2});
  eng.load_model("stories", path->string(), {.n_ctx = 256, .n_seq_max = 2, .n_threads = 2});  // embedding_cells 128
  auto m = llm::model::load(*path);
  const llm::vocab v(m->meta());
  const std::vector<int32_t> tokens = v.tokenize("Once upon a time", true);

  session s = eng.open_session("stories");
  const memory_breakdown before = eng.memory();  // the model's context; the embeddings context comes later
  CHECK(allocator_bytes(eng, "embeddings:stories") == 0);

  // A context made as the decoder actor makes its embeddings context: n_ctx / n_seq_max cells, one sequence, f16 KV.
  llm::llm_context ref(*m, {.n_ctx = 128, .n_batch = 128, .n_ubatch = 128, .n_threads = 2, .embeddings = true});
  const std::vector<float> want = llm::embed(ref, tokens);
  const std::vector<float> got = s.embed(tokens);
  REQUIRE(got.size() == 64);  // stories260K's n_embd
  CHECK(max_difference(got, want) <= 1e-6f);
  double norm2 = 0;
  for (const float x : got) norm2 += static_cast<double>(x) * x;
  CHECK(norm2 == Approx(1.0).epsilon(1e-5));

  // Its memory is on record under its own owner: the KV cells and the compute memory (grown, as the
  // reference's, for an output row per token).
  memory_breakdown b = eng.memory();
  CHECK(ref.kv().bytes() > 0);
  CHECK(b.context == before.context + ref.kv().bytes());
  CHECK(b.compute == before.compute + ref.compute_bytes());
  const uint64_t reserved = allocator_bytes(eng, "embeddings:stories");  // the compute memory's allocators
  CHECK(reserved > 0);
  CHECK(reserved <= ref.compute_bytes());
  CHECK(b.n_rejected == 0);

  // The context is kept: the same input again gives the same vector and takes no more memory.
  CHECK(s.embed(tokens) == got);
  const memory_breakdown again = eng.memory();
  CHECK(again.context == b.context);
  CHECK(again.compute == b.compute);

  // Refused before the decoder actor: no ids, an id outside the vocabulary, more than n_ctx_seq ids.
  const auto refused_with = [&](const std::vector<int32_t>& t, errc code) {
    try {
      s.embed(t);
    } catch (const request_error& e) {
      INFO(e.what());
      return e.is(code);
    }
    return false;
  };
  CHECK(refused_with({}, errc::bad_request));
  CHECK(refused_with({1, static_cast<int32_t>(v.n_tokens())}, errc::bad_request));
  CHECK(refused_with({-1}, errc::bad_request));
  CHECK(refused_with(std::vector<int32_t>(129, 1), errc::capacity));
  CHECK(s.embed(std::vector<int32_t>(128, 1)).size() == 64);

  // The session's conversation took no part: its greedy answer is the generator's.
  const generate_reply r = s.generate("Once upon a time", generation_params::greedy(24));
  CHECK(r.tokens == reference(*m, 24).tokens);

  // Unloading frees both contexts: nothing of the model is on record any more.
  s.close();
  eng.unload_model("stories");
  b = eng.memory();
  CHECK(b.model == 0);
  CHECK(b.context == 0);
  CHECK(b.compute == 0);
  CHECK(b.n_rejected == 0);
  CHECK(allocator_bytes(eng, "embeddings:stories") == 0);

  // Loaded again, an embedding is the same, and the shutdown frees its context.
  eng.load_model("stories", path->string(), {.n_ctx = 256, .n_seq_max = 2, .n_threads = 2});
  session s2 = eng.open_session("stories");
  CHECK(max_difference(s2.embed(tokens), want) <= 1e-6f);
  CHECK(eng.memory().context > 0);
  s2.close();
  const memory_breakdown final_b = eng.shutdown();
  CHECK(final_b.model == 0);
  CHECK(final_b.context == 0);
  CHECK(final_b.compute == 0);
  CHECK(final_b.n_rejected == 0);
}
