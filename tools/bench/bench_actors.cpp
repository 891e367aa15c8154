// bench_actors: the actor runtime's figures, as Google Benchmark counters.
//
//   ./build/tools/bench/bench_actors                       # all
//   ./build/tools/bench/bench_actors --benchmark_filter=load
//
// load_overlap/<model>   two CPU device instances, half the layers each: uploads one after the other
//                        (sequential_ms) and at once (parallel_ms); ratio = parallel / sequential (<= 0.7)
// batching/<model>       one session alone against two sessions of the model at once (tokens/s);
//                        ratio >= 1.5 where the decode kernels gain from a batch (sync_ratio is the
//                        synchronous layer's own gain, the bound)
// overhead/<model>       generation through a session actor against llm::generator, same model and
//                        threads; ratio <= 1.05
// round_trip            one request/response between a scoped actor and an actor of this process
//                        (a middleman round trip needs a second process: tests/actors/test_remote.cpp)
// capacity               parallel_capacity(): how much faster two threads finish than one (2: two free cores)
#include <benchmark/benchmark.h>

#include <caf/all.hpp>

#include <filesystem>
#include <string>

#include "tools/bench/measure.h"
#include "actors/type_ids.h"

using namespace troupe::actors;

namespace {

const std::string stories = TROUPE_TEST_MODEL_DIR "/stories260K.gguf";
const std::string smollm2 = TROUPE_FETCHED_MODEL_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf";

bool have(benchmark::State& state, const std::string& path) {
  if (std::filesystem::exists(path)) return true;
  state.SkipWithError(("model " + path + " is missing").c_str());
  return false;
}

void bm_load_overlap(benchmark::State& state, const std::string& path) {
  if (!have(state, path)) return;
  load_overlap_figures f;
  for (auto _ : state) f = measure_load_overlap({.model = path, .repeats = 5, .n_threads = 1});
  state.counters["sequential_ms"] = f.sequential_s * 1e3;
  state.counters["parallel_ms"] = f.parallel_s * 1e3;
  state.counters["ratio"] = f.ratio;
  state.counters["concurrency"] = f.concurrency;
  state.counters["MiB"] = static_cast<double>(f.bytes) / (1 << 20);
}

void bm_batching(benchmark::State& state, const std::string& path, int threads) {
  if (!have(state, path)) return;
  batching_figures f;
  for (auto _ : state) f = measure_batching({.model = path, .repeats = 3, .n_threads = threads, .max_tokens = 64});
  state.counters["single_tps"] = f.single_tps;
  state.counters["combined_tps"] = f.combined_tps;
  state.counters["ratio"] = f.ratio;
  state.counters["sync_ratio"] = f.sync_ratio;
  state.counters["max_batch"] = f.max_batch;
  state.counters["steps_per_batch"] = f.steps_per_batch;
}

void bm_overhead(benchmark::State& state, const std::string& path, int threads) {
  if (!have(state, path)) return;
  overhead_figures f;
  for (auto _ : state) f = measure_overhead({.model = path, .repeats = 5, .n_threads = threads, .max_tokens = 64});
  state.counters["sync_ms"] = f.sync_s * 1e3;
  state.counters["actors_ms"] = f.actors_s * 1e3;
  state.counters["ratio"] = f.ratio;
  state.counters["local_ms"] = f.local_s * 1e3;
  state.counters["local_ratio"] = f.local_ratio;
}

void bm_capacity(benchmark::State& state) {
  double c = 0;
  for (auto _ : state) c = parallel_capacity();
  state.counters["capacity"] = c;
}

using echo_actor = caf::typed_actor<caf::replies_to<get_atom, uint64_t>::with<uint64_t>>;

echo_actor::behavior_type echo(uint64_t step) {
  return {[step](get_atom, uint64_t x) { return x + step; }};
}

void bm_round_trip(benchmark::State& state) {
  caf::actor_system_config cfg;
  add_message_types(cfg);
  cfg.add_message_type<echo_actor>("bench::echo_actor");
  cfg.set("scheduler.policy", caf::atom("sharing"));
  caf::actor_system sys{cfg};
  echo_actor e = sys.spawn(echo, uint64_t{1});
  caf::scoped_actor self{sys};
  uint64_t n = 0;
  for (auto _ : state) {
    self->request(e, std::chrono::seconds(10), get_atom_v, n).receive([&](uint64_t r) { n = r; }, [&](caf::error&) {});
  }
  benchmark::DoNotOptimize(n);
  caf::anon_send_exit(e, caf::exit_reason::user_shutdown);
}

}  // namespace

BENCHMARK_CAPTURE(bm_load_overlap, smollm2, smollm2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_batching, stories260K_1thread, stories, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_batching, smollm2_1thread, smollm2, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_batching, smollm2_2threads, smollm2, 2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_overhead, smollm2_1thread, smollm2, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_overhead, smollm2_2threads, smollm2, 2)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK_CAPTURE(bm_overhead, stories260K_1thread, stories, 1)->Iterations(1)->Unit(benchmark::kMillisecond);
BENCHMARK(bm_capacity)->Iterations(1);
BENCHMARK(bm_round_trip)->Unit(benchmark::kMicrosecond);

BENCHMARK_MAIN();
