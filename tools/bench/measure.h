// The figures the actor runtime promises, measured the same way by its tests (tests/actors/test_measure.cpp,
// which assert the ratios with margins) and its benchmark (tools/bench/bench_actors):
//
//   load overlap   a model split over two devices, their uploads one after the other vs at once
//                  (wall time at once / sum of each device's upload alone; at most 0.7)
//   batching       one session generating alone vs two sessions of one model at the same time
//                  (combined tokens/s over one session's; at least 1.5)
//   overhead       generation through the actors vs the synchronous generator, same model and threads
//                  (time through actors / time synchronous; at most 1.05)
//
//   auto f = actors::measure_load_overlap({.model = path, .repeats = 3});
//   std::cout << f.ratio;
//
// Each figure is the best of `repeats` runs (the least disturbed by other work on the machine).
#pragma once

#include <cstdint>
#include <string>

namespace troupe::actors {

struct measure_params {
  std::string model;     // GGUF file
  int repeats = 3;
  int n_threads = 2;     // decode threads (batching, overhead); device backends' threads (loading)
  int max_tokens = 48;   // generated tokens per answer
  std::string prompt = "Once upon a time";
};

struct load_overlap_figures {
  double sequential_s = 0;  // the devices' uploads one after the other (sum of each alone)
  double parallel_s = 0;    // wall time of the uploads at once
  double ratio = 0;         // parallel_s / sequential_s
  double concurrency = 0;   // at once: sum of the uploads' own durations / their wall time (2: fully overlapped)
  uint64_t bytes = 0;       // bytes uploaded (both devices)
};

struct batching_figures {
  double single_tps = 0;    // tokens/s of one session alone
  double combined_tps = 0;  // tokens/s of two sessions together
  double ratio = 0;         // combined_tps / single_tps
  uint32_t max_batch = 0;   // most steps one decode took
  double steps_per_batch = 0;  // while both sessions generated: session steps per decode (2: always together)
  double sync_ratio = 0;    // the same ratio for the synchronous layer (llm::generate_together): the bound
};

struct overhead_figures {
  double sync_s = 0;    // the synchronous generator
  double actors_s = 0;  // a session through the actors (decode splits on the device actor's thread)
  double ratio = 0;     // actors_s / sync_s
  double local_s = 0;   // the same with dispatch_splits off (splits on the decoder actor's thread)
  double local_ratio = 0;
  int tokens = 0;
};

// How much faster two threads of pure arithmetic finish than one doing both's work (about 2 on an idle
// machine with two cores; about 1 when other work leaves this process one core). Overlap and batching
// ratios can only show where this is near 2.
double parallel_capacity();

// Two CPU device instances (CPU1, CPU2), half the layers each; their weights are copied from the mapping.
load_overlap_figures measure_load_overlap(const measure_params& p);
batching_figures measure_batching(const measure_params& p);
overhead_figures measure_overhead(const measure_params& p);

}  // namespace troupe::actors
