// Pipelined prompts (llm_context, n_pipeline > 1): a model split over the CPU and a CPU instance (CPU1, its
// own buffers and threads) runs a prompt's micro-batches as a pipeline over the two; the logits must be
// bit-identical to running them one at a time, the cache must hold exactly the same, and the pipeline
// slots' compute memory must be accounted.
#include <catch2/catch.hpp>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "backends/cpu_instance.h"
#include "llm/llm_context.h"
#include "runtime/memory.h"
#include "runtime/trace.h"
#include "tests/support/greedy.h"
#include "tests/support/ring.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

// The prompt's logits for every token, decoded in one batch of micro-batches of n_ubatch.
std::vector<float> prompt_logits(llm_context& ctx, const std::vector<int32_t>& prompt) {
  batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), 0, true);
  ctx.decode(b);
  std::vector<float> out;
  for (size_t i = 0; i < ctx.n_outputs(); ++i) {
    const auto l = ctx.logits(i);
    out.insert(out.end(), l.begin(), l.end());
  }
  return out;
}

// One token at position pos after what the cache holds: its logits.
std::vector<float> prompt_logits_at(llm_context& ctx, int32_t token, int32_t pos) {
  batch b;
  b.add(token, pos, 0, true);
  ctx.decode(b);
  const auto l = ctx.logits(0);
  return {l.begin(), l.end()};
}

std::vector<int32_t> tokens_of(int n, uint32_t n_vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = static_cast<int32_t>((i * 7919 + 13) % static_cast<int>(n_vocab));
  return t;
}

// Proof that two devices work at once, by the event rather than by timing: a split runner (the hook the
// actor layer uses) under which the first split on CPU1 does not start until a split on CPU is in flight
// too. In a pipelined prompt the next micro-batch's first split (on CPU), and in a ring the other group's
// first split, is runnable without waiting for it, so the two meet whatever the machine's load; run one
// after another they never would (the wait gives up after a minute, and `met` stays false).
//
// And the other way round: the second split on CPU (the next micro-batch's, or the other group's first) does not
// start until a split on CPU1 is in flight. Without that, a busy machine could let CPU finish both before
// CPU1's first split got its thread, and CPU1's wait would have nothing left to meet (CPU's next split needs
// CPU1's); with it, each waits for the other to be in flight, whichever comes first.
struct rendezvous {
  std::mutex mu;
  std::condition_variable cv;
  std::map<std::string, int> in_flight;
  int splits_on_cpu1 = 0;
  int splits_on_cpu = 0;
  bool met = false;

  void install(llm_context& ctx) {
    std::vector<std::string> names;
    for (int b = 0; b < ctx.sched().n_backends(); ++b) names.emplace_back(ctx.sched().backend(b).device().name());
    ctx.sched().set_split_runner([this, names](int, const scheduler::split& sp, const std::function<void()>& work) {
      const std::string& dev = names[static_cast<size_t>(sp.backend)];
      {
        std::unique_lock lock(mu);
        ++in_flight[dev];
        if (in_flight["CPU"] > 0 && in_flight["CPU1"] > 0) met = true;
        cv.notify_all();
        if (dev == "CPU1" && ++splits_on_cpu1 == 1) cv.wait_for(lock, std::chrono::minutes(1), [this] { return met; });
        if (dev == "CPU" && ++splits_on_cpu == 2) {
          cv.wait_for(lock, std::chrono::minutes(1), [this] { return in_flight["CPU1"] > 0; });
        }
      }
      work();
      std::lock_guard lock(mu);
      --in_flight[dev];
    });
  }
};


}  // namespace

TEST_CASE("stories260K over CPU and CPU1: a pipelined prompt's logits are bit-identical to one micro-batch at a time", "[llm][pipeline]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 3}}});  // the last 3 layers and the output on CPU1
  const auto prompt = tokens_of(100, m->hp().n_vocab);
  llm_context off(*m, {.n_ctx = 256, .n_ubatch = 16, .n_threads = 1, .n_pipeline = 1});
  llm_context on(*m, {.n_ctx = 256, .n_ubatch = 16, .n_threads = 1, .n_pipeline = 4});
  CHECK_FALSE(off.pipelines());
  REQUIRE(on.pipelines());
  const size_t compute_before = on.compute_bytes();
  const auto serial = prompt_logits(off, prompt);
  const auto piped = prompt_logits(on, prompt);
  CHECK(off.stats().n_pipelined == 0);
  CHECK(on.stats().n_pipelined == 1);
  CHECK(on.stats().n_graphs == 7);  // 100 tokens in micro-batches of 16
  REQUIRE(serial.size() == 100 * m->hp().n_vocab);
  CHECK(test::same_bits(piped, serial));
  // Three more slots, each with compute memory of its own, in the ledger too.
  CHECK(on.n_pipeline_slots() == 3);
  CHECK(on.compute_bytes() == 4 * compute_before);
  memory_ledger ledger;
  on.account(ledger);
  CHECK(ledger.total().compute == on.compute_bytes());
  CHECK(ledger.usage("CPU1").compute > 0);
  on.account(ledger, -1);
  CHECK(ledger.total().compute == 0);
  // The caches hold the same: the next token's logits agree bit for bit; and from the reference's prompt,
  // the reference's tokens.
  CHECK(test::same_bits(prompt_logits_at(on, 42, 100), prompt_logits_at(off, 42, 100)));
  on.kv().clear();
  off.kv().clear();
  llm_context short_ub(*m, {.n_ctx = 256, .n_ubatch = 2, .n_threads = 1, .n_pipeline = 4});
  CHECK(test::greedy(short_ub, test::stories_prompt, 32) == test::stories_ref);  // 5 prompt tokens: 3 micro-batches
  CHECK(short_ub.stats().n_pipelined == 1);
}

TEST_CASE("a pipelined prompt that does not fit the cache changes nothing, and the next one works", "[llm][pipeline]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 3}}});
  llm_context ctx(*m, {.n_ctx = 64, .n_ubatch = 8, .n_threads = 1, .n_pipeline = 4});
  const auto prompt = tokens_of(40, m->hp().n_vocab);
  (void)prompt_logits(ctx, prompt);
  CHECK(ctx.kv().used_cells() == 40);
  batch b;
  for (int i = 0; i < 40; ++i) b.add(prompt[static_cast<size_t>(i)], 40 + i, 0, true);
  CHECK_THROWS_AS(ctx.decode(b), capacity_error);
  CHECK(ctx.kv().used_cells() == 40);
  ctx.kv().seq_rm(0, 20, -1);
  batch c;
  for (int i = 0; i < 30; ++i) c.add(prompt[static_cast<size_t>(i)], 20 + i, 0, i == 29);
  ctx.decode(c);
  CHECK(ctx.kv().used_cells() == 50);
  CHECK(ctx.stats().n_pipelined == 2);
}

TEST_CASE("SmolLM2 over CPU and CPU1: a pipelined prompt's logits are bit-identical to one micro-batch at a time", "[llm][pipeline][smollm2]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 16}}});
  const auto prompt = tokens_of(160, m->hp().n_vocab);
  std::vector<float> serial, piped;
  {
    llm_context off(*m, {.n_ctx = 256, .n_ubatch = 32, .n_threads = 1, .n_pipeline = 1});
    serial = prompt_logits(off, prompt);
  }
  {
    llm_context on(*m, {.n_ctx = 256, .n_ubatch = 32, .n_threads = 1, .n_pipeline = 4});
    piped = prompt_logits(on, prompt);
    CHECK(on.stats().n_pipelined == 1);
  }
  REQUIRE(serial.size() == 160 * m->hp().n_vocab);
  CHECK(test::same_bits(piped, serial));
}

TEST_CASE("a trace of a pipelined prompt: CPU and CPU1 splits in flight at once, each track's micro-batches in order", "[llm][pipeline][trace]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 3}}});
  llm_context ctx(*m, {.n_ctx = 512, .n_ubatch = 8, .n_threads = 1, .n_pipeline = 4});
  rendezvous meeting;
  meeting.install(ctx);
  trace::clear();
  trace::enable(true);
  (void)prompt_logits(ctx, tokens_of(400, m->hp().n_vocab));  // 50 micro-batches
  trace::enable(false);
  const auto ev = trace::events();
  trace::clear();
  std::map<std::string, std::vector<const trace::event*>> by_track;
  std::map<std::string, int> scheduler_spans;
  for (const trace::event& e : ev) {
    if (e.name == "split") by_track[e.track].push_back(&e);
    if (e.track == "scheduler") ++scheduler_spans[e.name];
  }
  // The scheduler's track: every micro-batch placed and finished by the pipeline's coordinator.
  CHECK(scheduler_spans["place"] == 50);
  CHECK(scheduler_spans["finish"] == 50);
  REQUIRE(by_track.count("CPU") == 1);
  REQUIRE(by_track.count("CPU1") == 1);
  CHECK(by_track["CPU1"].size() == 50);  // a split per micro-batch on CPU1 (its layers and the output)
  // Two devices at work at once: a CPU split in flight while a CPU1 split was (the event, not the clock).
  CHECK(meeting.met);
  // Per track, micro-batches in order (every layer's cache writes in micro-batch order).
  for (const auto& [track, spans] : by_track) {
    for (size_t i = 1; i < spans.size(); ++i) CHECK(spans[i]->begin_us >= spans[i - 1]->begin_us);
  }
  const std::string json = trace::to_json(ev);
  CHECK_THAT(json, Catch::Contains("\"traceEvents\"") && Catch::Contains("\"thread_name\"") && Catch::Contains("\"ubatch\":49"));
}

// The ring checked against the other two ways on a model split over CPU and CPU1; and its two groups' steps
// on CPU and CPU1 at once (the rendezvous, from the first step on: each prompt alone is one micro-batch).
void check_ring(const model& m, int n) {
  rendezvous meeting;
  test::check_ring(m, n, [&](llm_context& ring) { meeting.install(ring); });
  CHECK(meeting.met);
}

TEST_CASE("stories260K over CPU and CPU1: 4 sequences in 2 groups as a ring give the tokens of one batch per step, the logits of the groups one after another", "[llm][pipeline][ring]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 3}}});
  check_ring(*m, 24);
}

TEST_CASE("SmolLM2 over CPU and CPU1: a ring of 2 groups gives the same tokens and bits", "[llm][pipeline][ring][smollm2]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 16}}});
  check_ring(*m, 12);
}

namespace {

// Batch invariance: four sequences' logits (a row per prompt and per step, teacher-forced tokens) decoded
// each alone, and arriving one after another so that every batch mixes one sequence's prompt with the
// others' steps (the decoder actor's batches when sessions start at different times). The cells a
// sequence gets are scattered among the others' and n_kv differs, yet each row must be the same bits.
using rows_by_seq = std::map<std::pair<int32_t, int>, std::vector<float>>;  // (sequence, row) -> logits

rows_by_seq decode_plan(const model& m, const std::vector<std::vector<std::pair<int32_t, int>>>& plan) {
  llm_context ctx(m, {.n_ctx = 512, .n_ubatch = 64, .n_seq_max = 4, .n_threads = 1});
  const auto tokens = tokens_of(64, m.hp().n_vocab);  // sequence s's token at position p: tokens[p + 3 s]
  std::vector<int32_t> pos(4, 0);
  std::vector<int> rows(4, 0);
  rows_by_seq out;
  for (const auto& step : plan) {
    batch b;
    for (const auto& [s, n] : step) {
      int32_t& p = pos[static_cast<size_t>(s)];
      for (int i = 0; i < n; ++i, ++p) b.add(tokens.at(static_cast<size_t>(p + 3 * s)), p, s, i + 1 == n);
    }
    ctx.decode(b);
    for (size_t i = 0; i < step.size(); ++i) {
      const auto l = ctx.logits(i);
      out[{step[i].first, rows[static_cast<size_t>(step[i].first)]++}] = {l.begin(), l.end()};
    }
  }
  return out;
}

void check_batch_invariance(const model& m) {
  const int prompt[4] = {13, 17, 21, 15};
  const int steps = 6;
  std::vector<std::vector<std::pair<int32_t, int>>> alone, staggered;
  for (int32_t s = 0; s < 4; ++s) {
    alone.push_back({{s, prompt[s]}});
    for (int k = 0; k < steps; ++k) alone.push_back({{s, 1}});
  }
  // Sequence s's prompt joins the steps of the ones before it; then all four step together; then they end
  // one after another.
  std::vector<int> done(4, 0);
  for (int32_t s = 0; s < 4; ++s) {
    std::vector<std::pair<int32_t, int>> step;
    for (int32_t o = 0; o < s; ++o) {
      step.push_back({o, 1});
      ++done[static_cast<size_t>(o)];
    }
    step.push_back({s, prompt[s]});
    staggered.push_back(step);
  }
  for (int32_t first = 0; first < 4; ++first) {
    while (done[static_cast<size_t>(first)] < steps) {
      std::vector<std::pair<int32_t, int>> step;
      for (int32_t o = first; o < 4; ++o) {
        if (done[static_cast<size_t>(o)] < steps) {
          step.push_back({o, 1});
          ++done[static_cast<size_t>(o)];
        }
      }
      staggered.push_back(step);
    }
  }
  const rows_by_seq want = decode_plan(m, alone);
  const rows_by_seq got = decode_plan(m, staggered);
  REQUIRE(want.size() == 4 * (steps + 1));
  REQUIRE(got.size() == want.size());
  for (const auto& [key, row] : want) {
    INFO("sequence " << key.first << ", row " << key.second);
    CHECK(test::same_bits(got.at(key), row));
  }
}

}  // namespace

TEST_CASE("stories260K over CPU and CPU1: a sequence's logits are the same bits whatever else its batches hold", "[llm][pipeline][invariance]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 3}}});
  check_batch_invariance(*m);
}

TEST_CASE("SmolLM2 over CPU and CPU1: a sequence's logits are the same bits whatever else its batches hold", "[llm][pipeline][invariance][smollm2]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  device_i& cpu1 = add_cpu_instance({.index = 1, .n_threads = 1});
  auto m = model::load(*path, {.devices = {{&cpu1, 15}}});
  check_batch_invariance(*m);
}
