// The micro-batch pipeline through the actors, as the daemon runs it: a model's decoder actor decodes a
// prompt of several micro-batches, and its context's pipeline hands every split to the device actor of the
// split's device (decode_split). Micro-batches overlap (a later one's split runs on the CPU's device actor
// while an earlier one's split is in flight on another device's actor: proven by the event, not by
// timing), every split runs on a device actor, and the logits are bit-identical to one micro-batch at a
// time (and agree with the model on the CPU alone). And the allocator actor planning a graph's compute
// memory, growing it for a larger graph, and accounting for every allocation and release.
#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "actors/allocator_actor.h"
#include "actors/device_actor.h"
#include "actors/engine.h"
#include "actors/decoder_actor.h"
#include "backends/cpu/cpu_backend.h"
#include "runtime/error.h"
#include "runtime/ops.h"
#include "runtime/trace.h"
#include "tests/actors/ask.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

using test::ask;
constexpr auto wait_limit = std::chrono::seconds(60);

// Holds the first graph a GATE backend computes after arm() until `until` holds, so that a test sees what
// other devices do while that split is in flight. The condition is checked every millisecond; after 30 s
// without it (well within the test's request limits) the graph goes on and met() stays false: the test
// fails instead of hanging.
class gate {
 public:
  void arm(std::function<bool()> until) {
    std::lock_guard lock(mu_);
    until_ = std::move(until);
    met_ = false;
  }
  bool met() const { return met_; }
  // Called by every GATE backend before it computes a graph (on the GATE device actor's thread).
  void pass() {
    std::function<bool()> until;
    {
      std::lock_guard lock(mu_);
      until = std::move(until_);
      until_ = nullptr;
    }
    if (!until) return;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (!until()) {
      if (std::chrono::steady_clock::now() > deadline) return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    met_ = true;
  }

 private:
  std::mutex mu_;
  std::function<bool()> until_;
  std::atomic<bool> met_{false};
};

// "GATE": a device computed by the CPU with a buffer type of its own, as a CPU instance
// (backends/cpu_instance.h) is, whose backends pass its gate before every graph.
class gate_buffer final : public cpu::host_memory_buffer {
 public:
  gate_buffer(buffer_type_i& type, void* base, size_t size) : host_memory_buffer(type, base, size) {}
  ~gate_buffer() override { std::free(base()); }
};

class gate_buffer_type final : public buffer_type_i {
 public:
  explicit gate_buffer_type(device_i& dev) : dev_(dev) {}
  std::string_view name() const override { return "GATE"; }
  buffer_ptr alloc_buffer(size_t size) override {
    const size_t bytes = std::max(alignment(), (size + alignment() - 1) / alignment() * alignment());
    void* p = std::aligned_alloc(alignment(), bytes);
    if (p == nullptr) throw out_of_memory_error("buffer type GATE: cannot allocate " + std::to_string(size) + " bytes");
    return std::make_unique<gate_buffer>(*this, p, size);
  }
  size_t alignment() const override { return 64; }
  device_i& device() const override { return dev_; }

 private:
  device_i& dev_;
};

class gate_backend final : public backend_i {
 public:
  gate_backend(device_i& dev, gate& g) : dev_(dev), gate_(g), inner_(cpu::make_cpu_backend({.n_threads = 1})) {}
  std::string_view name() const override { return "GATE"; }
  device_i& device() const override { return dev_; }
  void graph_compute(graph& g) override {
    gate_.pass();
    inner_->graph_compute(g);
  }

 private:
  device_i& dev_;
  gate& gate_;
  std::unique_ptr<cpu::cpu_backend> inner_;
};

class gate_device final : public device_i {
 public:
  gate_device() : buft_(*this) {}
  std::string_view name() const override { return "GATE"; }
  std::string description() const override { return "CPU device with a gate (tests/actors/test_pipeline.cpp)"; }
  device_type type() const override { return device_type::cpu; }
  device_memory memory() const override { return cpu::cpu_device().memory(); }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override { return std::make_unique<gate_backend>(*this, gate_); }
  buffer_type_i& buffer_type() override { return buft_; }
  bool supports_op(const tensor& t) const override { return cpu::cpu_device().supports_op(t); }
  bool supports_buft(const buffer_type_i& b) const override { return &b == &buft_ || b.is_host(); }
  gate& the_gate() { return gate_; }

 private:
  gate_buffer_type buft_;
  gate gate_;
};

// The GATE device, registered once per process (the registry keeps it).
gate_device& gate_dev() {
  static gate_device& d = static_cast<gate_device&>(registry::instance().add(std::make_unique<gate_device>()));
  return d;
}

// The last token's logits of `prompt` decoded as one step by a model's decoder actor, with `self`
// standing in for a session (the scheduler takes a sequence's steps only from the actor attached to it).
std::vector<float> step_once(caf::scoped_actor& self, const decoder_actor& sched, const std::vector<int32_t>& prompt) {
  int32_t seq = -1;
  self->request(sched, wait_limit, attach_atom_v, caf::actor_cast<session_actor>(self))
      .receive([&](int32_t s) { seq = s; }, [](caf::error& e) { FAIL(describe(e)); });
  std::vector<float> out;
  self->request(sched, wait_limit, step_atom_v, decode_step{seq, 0, prompt})
      .receive([&](step_logits& l) { out = std::move(l.logits); }, [](caf::error& e) { FAIL(describe(e)); });
  self->send(sched, end_atom_v, seq);
  self->request(sched, wait_limit, detach_atom_v, seq).receive([](bool) {}, [](caf::error& e) { FAIL(describe(e)); });
  return out;
}

// Splits computed by every device actor so far (device_status::n_splits).
uint64_t splits_run(caf::scoped_actor& self, const actor_directory& dir) {
  uint64_t n = 0;
  for (const device_actor& d : dir.devices) {
    self->request(d, wait_limit, memory_atom_v)
        .receive([&](device_status& s) { n += s.n_splits; }, [](caf::error& e) { FAIL(describe(e)); });
  }
  return n;
}

template <class Handle>
Handle named(const std::vector<std::string>& names, const std::vector<Handle>& handles, const std::string& name) {
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i] == name) return handles[i];
  }
  FAIL("no actor for " << name);
  return {};
}

// The micro-batch ids of the split spans traced on the CPU so far.
std::set<int64_t> cpu_microbatches() {
  std::set<int64_t> out;
  for (const trace::event& e : trace::events()) {
    if (e.track == "CPU" && e.name == "split") out.insert(e.args.at(0).second);  // "ubatch"
  }
  return out;
}

}  // namespace

TEST_CASE("pipeline: a prompt's micro-batches overlap on the device actors, every split runs on one, the logits are those of one micro-batch at a time", "[actors][pipeline]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  gate_device& gated = gate_dev();
  engine eng({.devices = {"CPU", "GATE"}, .n_threads = 1});
  model_settings serial{.n_ctx = 256, .n_ubatch = 8, .n_seq_max = 1, .n_threads = 1};
  // Layers 2..4 on GATE: per micro-batch a split on the CPU (the embedding, layers 0..1), one on GATE
  // (layers 2..4) and one more on the CPU (the output layer, which stays on the host).
  serial.devices = {{"GATE", 3}};
  serial.n_pipeline = 1;           // one micro-batch at a time
  model_settings piped = serial;
  piped.n_pipeline = 4;            // up to 4 in flight
  model_settings alone = serial;
  alone.devices.clear();           // everything on the CPU: the reference
  eng.load_model("serial", path->string(), serial);
  eng.load_model("piped", path->string(), piped);
  eng.load_model("alone", path->string(), alone);
  caf::scoped_actor self{eng.system()};
  actor_directory dir;
  self->request(eng.supervisor(), wait_limit, get_atom_v, directory_atom_v)
      .receive([&](actor_directory& d) { dir = std::move(d); }, [](caf::error& e) { FAIL(describe(e)); });
  const decoder_actor piped_sched = named(dir.model_names, dir.decoders, std::string("piped"));
  const decoder_actor serial_sched = named(dir.model_names, dir.decoders, std::string("serial"));
  const decoder_actor alone_sched = named(dir.model_names, dir.decoders, std::string("alone"));
  std::vector<int32_t> prompt;
  for (int i = 0; i < 32; ++i) prompt.push_back(1 + (i * 37) % 500);  // 32 tokens: 4 micro-batches of 8

  // The first micro-batch's GATE split is held on the GATE device actor until the CPU device actor has run
  // a split of another micro-batch meanwhile: only a pipeline gets there (one micro-batch at a time, the
  // next one's first split waits for the held split).
  const uint64_t before = splits_run(self, dir);
  trace::clear();
  trace::enable(true);
  gated.the_gate().arm([] { return cpu_microbatches().size() >= 2; });
  const std::vector<float> got = step_once(self, piped_sched, prompt);
  trace::enable(false);
  const uint64_t after = splits_run(self, dir);
  CHECK(gated.the_gate().met());

  std::set<int64_t> microbatches;
  uint64_t on_cpu = 0, on_gate = 0;
  for (const trace::event& e : trace::events()) {
    if (e.name != "split") continue;
    if (e.track == "CPU") ++on_cpu;
    if (e.track == "GATE") {
      ++on_gate;
      microbatches.insert(e.args.at(0).second);
    }
  }
  trace::clear();
  CHECK(microbatches.size() == 4);       // 32 tokens in micro-batches of 8
  CHECK(on_gate == 4);                   // one split per micro-batch on GATE
  CHECK(on_cpu == 8);                    // two per micro-batch on the CPU, before and after GATE's
  CHECK(after - before == on_cpu + on_gate);  // every split ran on a device actor

  const std::vector<float> want = step_once(self, serial_sched, prompt);
  REQUIRE(!want.empty());
  REQUIRE(got.size() == want.size());
  CHECK(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)) == 0);  // bit-identical
  // And the model's logits: those of the model on the CPU alone, up to rounding.
  const std::vector<float> ref = step_once(self, alone_sched, prompt);
  REQUIRE(ref.size() == got.size());
  double err = 0;
  for (size_t i = 0; i < got.size(); ++i) err = std::max(err, static_cast<double>(std::abs(got[i] - ref[i])));
  CHECK(err < 1e-3);

  // A split task of this process, as a context's pipeline registers one: the device actor of another device
  // refuses it without running it, an id that names nothing in this process is not found, and the device
  // actor of its device runs it.
  std::atomic<int> runs{0};
  const std::function<void()> work = [&] { ++runs; };
  auto task = std::make_shared<split_task>();
  task->work = &work;
  task->device = "GATE";
  const uint64_t id = eng.env()->objects.put(task);
  const device_actor cpu = named(dir.device_names, dir.devices, std::string("CPU"));
  const device_actor gate_actor = named(dir.device_names, dir.devices, std::string("GATE"));
  const auto wrong = ask<split_result>(eng.system(), cpu, compute_atom_v, decode_split{id, 0});
  REQUIRE_FALSE(wrong);
  CHECK(is(wrong.error(), errc::bad_request));
  CHECK(runs == 0);
  const auto missing = ask<split_result>(eng.system(), gate_actor, compute_atom_v, decode_split{id + 1000, 0});
  REQUIRE_FALSE(missing);
  CHECK(is(missing.error(), errc::not_found));
  const auto right = ask<split_result>(eng.system(), gate_actor, compute_atom_v, decode_split{id, 0});
  REQUIRE(right);
  CHECK(runs == 1);
  eng.env()->objects.erase(id);
  eng.shutdown();
}

TEST_CASE("allocator actor: plans a graph in chunked buffers it owns, grows for a larger one, accounts it all", "[actors][pipeline]") {
  engine eng({.cpu_instances = 1, .n_threads = 1});
  const auto dir = ask<actor_directory>(eng.system(), eng.supervisor(), get_atom_v, directory_atom_v);
  REQUIRE(dir);
  const auto alloc = dir->allocators[1];  // CPU1's
  auto make = [](int64_t n) {
    auto ctx = std::make_shared<context>(context_params{.max_tensors = 8, .no_alloc = true});
    tensor* x = ctx->new_tensor_2d(type::f32, n, 8);
    x->flags |= flag_input;
    tensor* y = scale(*ctx, rms_norm(*ctx, x, 1e-5f), 2.0f);
    y->flags |= flag_output;
    auto g = std::make_shared<graph>();
    g->build_forward_expand(y);
    return std::make_pair(ctx, g);
  };
  auto [c1, g1] = make(256);
  auto [c2, g2] = make(4096);
  const uint64_t id1 = eng.env()->objects.put(g1);
  const uint64_t id2 = eng.env()->objects.put(g2);
  const auto small = ask<uint64_t>(eng.system(), alloc, plan_atom_v, graph_plan{id1, "test"});
  REQUIRE(small);
  CHECK(*small >= 256 * 8 * 4);  // norm and scale run in place over one buffer
  CHECK(g1->nodes().back()->buffer != nullptr);
  CHECK(eng.memory().compute == *small);
  const auto big = ask<uint64_t>(eng.system(), alloc, plan_atom_v, graph_plan{id2, "test"});
  REQUIRE(big);
  CHECK(*big > *small);
  CHECK(eng.memory().compute == *big);
  const auto again = ask<uint64_t>(eng.system(), alloc, plan_atom_v, graph_plan{id1, "test"});
  CHECK(*again == *big);  // reused, not shrunk
  const auto usage = ask<allocator_usage>(eng.system(), alloc, get_atom_v, usage_atom_v);
  REQUIRE(usage);
  CHECK(usage->n_reallocations == 2);
  CHECK(usage->total == *big);
  const auto unknown = ask<uint64_t>(eng.system(), alloc, plan_atom_v, graph_plan{id2 + 100, "test"});
  REQUIRE_FALSE(unknown);
  CHECK(is(unknown.error(), errc::not_found));
  CHECK(*ask<uint64_t>(eng.system(), alloc, release_atom_v, std::string("test")) == *big);
  CHECK(eng.memory().compute == 0);
  eng.env()->objects.erase(id1);
  eng.env()->objects.erase(id2);
  eng.shutdown();
}
