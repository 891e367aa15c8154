// The figures the actor runtime promises (tools/bench/measure.h), asserted with their target ratios
// (tools/bench/measure.h) where the machine can show them. Each figure is the best of several runs.
//
// Overlap and batching gains need parallel hardware and kernels that gain from a batch: on a shared
// machine that leaves this process one core (parallel_capacity() near 1), two uploads at once cannot
// finish sooner than one after the other, whatever the runtime does. So the hardware-independent part is
// always asserted (the uploads really ran at the same time; the two sessions really shared each decode;
// the actors keep the synchronous layer's batching gain), and the target ratios when the machine has
// the room for them (capacity >= 1.8; the synchronous layer's own batching gain >= 1.65). Figures are
// printed either way; tools/bench/bench_actors prints the same.
#include <catch2/catch.hpp>

#include "tools/bench/measure.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::actors;

// Under the sanitizers the figures measure the instrumentation, not the runtime.
#if defined(__SANITIZE_ADDRESS__)
#define TROUPE_SKIP_UNDER_SANITIZERS()                                  \
  do {                                                                  \
    WARN("SKIPPED: timing figures are not measured under sanitizers"); \
    return;                                                             \
  } while (false)
#else
#define TROUPE_SKIP_UNDER_SANITIZERS() \
  do {                                 \
  } while (false)
#endif

TEST_CASE("loading one model onto two devices at once takes at most 0.7x their sum", "[actors][perf]") {
  TROUPE_SKIP_UNDER_SANITIZERS();
  const auto path = test::smollm2_path();
  if (!path) return;
  const load_overlap_figures f = measure_load_overlap({.model = path->string(), .repeats = 3, .n_threads = 1});
  const double capacity = parallel_capacity();
  WARN("load overlap: sequential " << f.sequential_s * 1e3 << " ms, parallel " << f.parallel_s * 1e3 << " ms, ratio "
                                   << f.ratio << ", concurrency " << f.concurrency << " (" << f.bytes / (1 << 20)
                                   << " MiB; parallel capacity " << capacity << ")");
  CHECK(f.concurrency >= 1.6);  // both uploads were in flight together
  if (capacity >= 1.8) {
    CHECK(f.ratio <= 0.7);
  } else {
    WARN("this machine runs two threads " << capacity << "x as fast as one: the 0.7x wall-time bound is not checked");
    CHECK(f.ratio <= 1.25);
  }
}

TEST_CASE("two sessions decoding at once on one model: at least 1.5x one session's throughput", "[actors][perf]") {
  TROUPE_SKIP_UNDER_SANITIZERS();
  // stories260K: per-token work is dominated by what a batch shares (graph building, scheduling), the case
  // batching is for; SmolLM2 is also reported by bench_actors.
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const batching_figures f = measure_batching({.model = path->string(), .repeats = 3, .n_threads = 1, .max_tokens = 96});
  const double capacity = parallel_capacity();
  WARN("batching: one session " << f.single_tps << " t/s, two sessions " << f.combined_tps << " t/s, ratio " << f.ratio
                                << " (synchronous layer: " << f.sync_ratio << "), " << f.steps_per_batch
                                << " steps per batch, largest batch " << f.max_batch << ", parallel capacity " << capacity);
  // The sessions shared the decodes (hardware-independent): nearly every batch took both sessions' steps.
  CHECK(f.max_batch == 2);
  CHECK(f.steps_per_batch >= 1.6);
  if (f.sync_ratio >= 1.65 && capacity >= 1.8) {
    CHECK(f.ratio >= 1.5);
  } else {
    WARN("the synchronous layer gains " << f.sync_ratio << "x from a batch of two here, with parallel capacity "
                                        << capacity << ": the 1.5x bound is not checked");
  }
}

TEST_CASE("generation through the actors is within 5% of the synchronous decode API", "[actors][perf]") {
  TROUPE_SKIP_UNDER_SANITIZERS();
  const auto path = test::smollm2_path();
  if (!path) return;
  const overhead_figures f = measure_overhead({.model = path->string(), .repeats = 3, .n_threads = 1, .max_tokens = 32});
  WARN("overhead: synchronous " << f.sync_s * 1e3 << " ms, actors " << f.actors_s * 1e3 << " ms for " << f.tokens
                                << " tokens, ratio " << f.ratio);
  CHECK(f.ratio <= 1.05);
}
