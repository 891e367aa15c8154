#include "tools/bench/measure.h"

#include <caf/all.hpp>

#include <algorithm>
#include <chrono>
#include <future>
#include <limits>

#include "actors/engine.h"
#include "actors/decoder_actor.h"
#include "runtime/error.h"
#include "llm/batch_decoder.h"
#include "llm/generator.h"

namespace troupe::actors {

namespace {

using clock_type = std::chrono::steady_clock;

double since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

// Arithmetic the compiler cannot drop or vectorize away.
double spin(uint64_t n) {
  volatile double x = 0;
  for (uint64_t i = 0; i < n; ++i) x = x + static_cast<double>(i) * 1e-9;
  return x;
}

}  // namespace

double parallel_capacity() {
  constexpr uint64_t n = 20'000'000;
  double best = 0;
  for (int r = 0; r < 3; ++r) {
    auto t0 = clock_type::now();
    spin(n);
    spin(n);
    const double one = since(t0);
    t0 = clock_type::now();
    auto other = std::async(std::launch::async, [] { return spin(n); });
    spin(n);
    other.get();
    best = std::max(best, one / since(t0));
  }
  return best;
}

load_overlap_figures measure_load_overlap(const measure_params& p) {
  engine eng({.cpu_instances = 2, .n_threads = p.n_threads});
  const int n_layer = static_cast<int>(llm::model::open(p.model)->hp().n_layer);
  model_settings o;
  o.devices = {{"CPU1", n_layer / 2}, {"CPU2", n_layer - n_layer / 2}};
  o.use_mmap = true;  // the host's part (token embeddings) is mapped; the two devices' parts are copied
  load_overlap_figures f;
  f.sequential_s = f.parallel_s = std::numeric_limits<double>::max();
  eng.unload_model(eng.load_model("warm", p.model, o).name);  // the file in the page cache
  for (int r = 0; r < p.repeats; ++r) {
    for (bool parallel : {false, true}) {
      o.parallel = parallel;
      const model_info info = eng.load_model("m", p.model, o);
      double& best = parallel ? f.parallel_s : f.sequential_s;
      f.bytes = 0;
      double busy = 0;
      for (const upload_result& u : info.uploads) {
        if (u.device != "CPU") f.bytes += u.bytes;
        busy += u.seconds;
      }
      if (parallel && info.upload_seconds < best) f.concurrency = busy / info.upload_seconds;
      best = std::min(best, info.upload_seconds);
      eng.unload_model("m");
    }
  }
  f.ratio = f.parallel_s / f.sequential_s;
  eng.shutdown();
  return f;
}

batching_figures measure_batching(const measure_params& p) {
  engine eng({.n_threads = 1});
  eng.load_model("m", p.model, {.n_ctx = 2048, .n_seq_max = 2, .n_threads = p.n_threads});
  session a = eng.open_session("m");
  session b = eng.open_session("m");
  // The model's scheduler, for its batching counts.
  caf::scoped_actor self{eng.system()};
  decoder_actor sched;
  self->request(eng.supervisor(), std::chrono::seconds(30), get_atom_v, directory_atom_v)
      .receive([&](const actor_directory& d) { sched = d.decoders.at(0); },
               [](caf::error& e) { throw request_error(e); });
  auto stats = [&] {
    decoder_stats s;
    self->request(sched, std::chrono::seconds(30), get_atom_v, stats_atom_v)
        .receive([&](decoder_stats& x) { s = std::move(x); }, [](caf::error& e) { throw request_error(e); });
    return s;
  };
  a.generate(p.prompt, generation_params::greedy(4));  // warm-up: the context's first graphs
  batching_figures f;
  uint64_t steps = 0, batches = 0;
  for (int r = 0; r < p.repeats; ++r) {
    a.reset();
    b.reset();
    auto t0 = clock_type::now();
    const generate_reply one = a.generate(p.prompt, generation_params::greedy(p.max_tokens));
    f.single_tps = std::max(f.single_tps, static_cast<double>(one.tokens.size()) / since(t0));
    a.reset();
    const decoder_stats before = stats();
    t0 = clock_type::now();
    auto other = std::async(std::launch::async, [&] { return b.generate(p.prompt, generation_params::greedy(p.max_tokens)); });
    const generate_reply first = a.generate(p.prompt, generation_params::greedy(p.max_tokens));
    const generate_reply second = other.get();
    const double s = since(t0);
    const decoder_stats after = stats();
    steps += after.n_steps - before.n_steps;
    batches += after.n_batches - before.n_batches;
    f.combined_tps = std::max(f.combined_tps, static_cast<double>(first.tokens.size() + second.tokens.size()) / s);
  }
  f.ratio = f.combined_tps / f.single_tps;
  f.steps_per_batch = batches > 0 ? static_cast<double>(steps) / static_cast<double>(batches) : 0.0;
  f.max_batch = stats().max_steps;
  {
    // The synchronous layer's own batching gain on this model and machine: the bound for the actors.
    std::shared_ptr<const loaded_model> lm = eng.env()->model("m");
    llm::llm_context ctx(*lm->model, {.n_ctx = 2048, .n_seq_max = 2, .n_threads = p.n_threads});
    const auto gp = llm::generate_params::greedy(p.max_tokens);
    const auto prompt = lm->vocab->tokenize(p.prompt, true);
    llm::generate_together(ctx, *lm->vocab, {prompt}, gp);  // warm-up
    double one_tps = 0, two_tps = 0;
    for (int r = 0; r < p.repeats; ++r) {
      auto t0 = clock_type::now();
      const auto one = llm::generate_together(ctx, *lm->vocab, {prompt}, gp);
      one_tps = std::max(one_tps, static_cast<double>(one[0].tokens.size()) / since(t0));
      t0 = clock_type::now();
      const auto two = llm::generate_together(ctx, *lm->vocab, {prompt, prompt}, gp);
      two_tps = std::max(two_tps, static_cast<double>(two[0].tokens.size() + two[1].tokens.size()) / since(t0));
    }
    f.sync_ratio = two_tps / one_tps;
  }
  a.close();
  b.close();
  eng.shutdown();
  return f;
}

overhead_figures measure_overhead(const measure_params& p) {
  auto m = llm::model::load(p.model);
  llm::vocab v(m->meta());
  llm::llm_context ctx(*m, {.n_ctx = 2048, .n_seq_max = 1, .n_threads = p.n_threads});
  llm::generator gen(ctx, v);
  const auto gp = llm::generate_params::greedy(p.max_tokens);
  const auto prompt = v.tokenize(p.prompt, true);

  // Two runtimes: decode splits dispatched to the device actor (the default), and run in the scheduler.
  engine dispatched({.n_threads = 1, .dispatch_splits = true});
  engine local({.n_threads = 1, .dispatch_splits = false});
  dispatched.load_model("m", p.model, {.n_ctx = 2048, .n_seq_max = 1, .n_threads = p.n_threads});
  local.load_model("m", p.model, {.n_ctx = 2048, .n_seq_max = 1, .n_threads = p.n_threads});
  session s = dispatched.open_session("m");
  session l = local.open_session("m");
  gen.generate(prompt, gp);  // warm-up all three
  s.generate(p.prompt, generation_params::greedy(p.max_tokens));
  l.generate(p.prompt, generation_params::greedy(p.max_tokens));

  overhead_figures f;
  f.sync_s = f.actors_s = f.local_s = std::numeric_limits<double>::max();
  for (int r = 0; r < p.repeats; ++r) {
    gen.reset();
    auto t0 = clock_type::now();
    const llm::generate_result a = gen.generate(prompt, gp);
    f.sync_s = std::min(f.sync_s, since(t0));
    s.reset();
    t0 = clock_type::now();
    const generate_reply b = s.generate(p.prompt, generation_params::greedy(p.max_tokens));
    f.actors_s = std::min(f.actors_s, since(t0));
    l.reset();
    t0 = clock_type::now();
    const generate_reply c = l.generate(p.prompt, generation_params::greedy(p.max_tokens));
    f.local_s = std::min(f.local_s, since(t0));
    if (a.tokens != b.tokens || a.tokens != c.tokens) {
      throw error("measure_overhead: the actors generated other tokens than the generator");
    }
    f.tokens = static_cast<int>(a.tokens.size());
  }
  f.ratio = f.actors_s / f.sync_s;
  f.local_ratio = f.local_s / f.sync_s;
  s.close();
  l.close();
  dispatched.shutdown();
  local.shutdown();
  return f;
}

}  // namespace troupe::actors
