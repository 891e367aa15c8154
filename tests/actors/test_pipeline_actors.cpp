// Pipelined prompts in the actor runtime: a model split over CPU and CPU1 decodes a long prompt's
// micro-batches through the two device actors at once (llm_context's pipeline handing each split to its
// device actor); the answer is the same as with one micro-batch per prompt, the pipeline slots' compute
// memory is in the breakdown while the model is loaded and gone after it is unloaded.
#include <catch2/catch.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <thread>

#include "actors/engine.h"
#include "backends/cpu/cpu_backend.h"
#include "backends/cpu_instance.h"
#include "backends/registry.h"
#include "runtime/error.h"
#include "tests/actors/ask.h"
#include "tests/net/test_server.h"
#include "tests/support/failing_backend.h"
#include "runtime/trace.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

// Holds a device actor of an engine: a split task of the test's own, handed to that actor by id as a
// model's decoder actor hands it a decode split, runs there and waits until release() (or the hold's end).
// A model's splits for that device queue behind it meanwhile, so the decode they belong to stays in the
// pipeline for as long as the test needs: what overlaps is up to the test, not to the threads.
class device_hold {
 public:
  device_hold(engine& eng, const std::string& device) : eng_(eng), s_(std::make_shared<state>()) {
    s_->work = [s = s_.get()] {
      std::unique_lock l(s->mu);
      s->running = true;
      s->cv.notify_all();
      s->cv.wait(l, [s] { return s->released; });
    };
    s_->task.work = &s_->work;
    s_->task.device = device;
    // The task keeps the work (and its latch) alive for as long as the device actor has it.
    id_ = eng.env()->objects.put(std::shared_ptr<actors::split_task>(s_, &s_->task));
    const auto dir = test::ask<actors::actor_directory>(eng.system(), eng.supervisor(), actors::get_atom_v, actors::directory_atom_v);
    if (!dir) return;
    for (size_t i = 0; i < dir->device_names.size(); ++i) {
      if (dir->device_names[i] == device) caf::anon_send(dir->devices[i], actors::compute_atom_v, actors::decode_split{id_, 0});
    }
  }
  ~device_hold() {
    release();
    eng_.env()->objects.erase(id_);
  }
  device_hold(const device_hold&) = delete;
  device_hold& operator=(const device_hold&) = delete;

  // Whether the device actor is running the hold (waits for it at most `limit`).
  bool holding(std::chrono::seconds limit = 60s) {
    std::unique_lock l(s_->mu);
    return s_->cv.wait_for(l, limit, [this] { return s_->running; });
  }
  void release() {
    {
      std::lock_guard l(s_->mu);
      s_->released = true;
    }
    s_->cv.notify_all();
  }

 private:
  struct state {
    std::mutex mu;
    std::condition_variable cv;
    bool running = false, released = false;
    std::function<void()> work;
    actors::split_task task;
  };
  engine& eng_;
  std::shared_ptr<state> s_;
  uint64_t id_ = 0;
};

// Polls pred until it holds (true) or `limit` passed (false).
bool eventually(const std::function<bool()>& pred, std::chrono::seconds limit = 60s) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return pred();
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

const char* const prompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, "
    "she saw a big red ball in the park. She ran to the ball and kicked it very hard. The ball went up";

// A session's greedy answer of n tokens to text.
std::vector<int32_t> answer(engine& eng, const std::string& model, const std::string& text = prompt, int n = 12) {
  session s = eng.open_session(model);
  actors::generation_params gp;
  gp.max_tokens = n;
  gp.temperature = 0;
  const auto r = s.generate(text, gp);
  s.close();
  return r.tokens;
}

uint64_t compute_on(const actors::memory_breakdown& mb, const std::string& device) {
  uint64_t n = 0;
  for (const actors::buft_usage& u : mb.entries) n += u.device == device ? u.compute : 0;
  return n;
}

}  // namespace

TEST_CASE("the actor runtime pipelines a long prompt over CPU and CPU1: the same answer, its compute memory accounted", "[actors][pipeline]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  engine eng({.cpu_instances = 1, .n_threads = 1});
  actors::model_settings one{.n_ctx = 256, .n_ubatch = 512, .n_seq_max = 1, .n_threads = 1};
  one.devices = {{"CPU1", 3}};
  actors::model_settings piped = one;
  piped.n_ubatch = 8;  // the prompt in several micro-batches
  eng.load_model("one", path->string(), one);
  eng.load_model("piped", path->string(), piped);
  const auto ref = answer(eng, "one");
  const uint64_t before = compute_on(eng.memory(), "CPU1");
  trace::clear();
  trace::enable(true);
  const auto got = answer(eng, "piped");
  trace::enable(false);
  CHECK(got == ref);
  REQUIRE(ref.size() == 12);
  // The prompt's micro-batches ran their CPU1 splits on the CPU1 device actor, several micro-batches.
  std::set<int64_t> ubatches;
  for (const trace::event& e : trace::events()) {
    if (e.track == "CPU1" && e.name == "split") ubatches.insert(e.args.at(0).second);
  }
  trace::clear();
  CHECK(ubatches.size() > 12 + 4);  // the prompt's micro-batches and then one per generated token
  // Three more pipeline slots of compute memory on CPU1 (and the CPU) while "piped" is loaded.
  const uint64_t during = compute_on(eng.memory(), "CPU1");
  CHECK(during > before);
  eng.unload_model("piped");
  eng.unload_model("one");
  CHECK(compute_on(eng.memory(), "CPU1") == 0);
}

namespace {

const char* const prompts[4] = {
    "Once upon a time, there was a little girl named Lily.",
    "Tom had a red ball. He liked to throw it high",
    "The sun was shining and the birds were singing. A small dog",
    "One day, a big bear came to the forest and",
};

actors::decoder_stats stats_of(engine& eng, const std::string& model) {
  for (const actors::decoder_stats& s : eng.decoding_stats()) {
    if (s.model == model) return s;
  }
  FAIL("no scheduler stats for " << model);
  return {};
}

// The decodes of a model now in its context's pipeline (-1 when it has no scheduler): never throws, so that
// a thread the caller started is joined whatever happens.
int64_t in_flight_of(engine& eng, const std::string& model) {
  try {
    for (const actors::decoder_stats& s : eng.decoding_stats()) {
      if (s.model == model) return s.n_in_flight;
    }
  } catch (const std::exception&) {
  }
  return -1;
}

// Four sessions generating at once, each on a thread of its own; their answers in prompt order.
std::vector<std::vector<int32_t>> four_at_once(engine& eng, const std::string& model, int n) {
  std::vector<std::vector<int32_t>> out(4);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < 4; ++i) threads.emplace_back([&, i] { out[i] = answer(eng, model, prompts[i], n); });
  for (std::thread& t : threads) t.join();
  return out;
}

// Sessions on a model over CPU and CPU1 (its last `layers` layers on CPU1): four at once give each the
// answer it gets alone; on one device they are batched as before. On the model over two devices the CPU1
// device actor is held (device_hold) while the four start: the first decode stays in the pipeline, so the
// others' steps arrive while it is there, and the hold is released once the scheduler has put a second
// group's decode in beside it (or after a minute, when it never does: a failure).
void check_groups(const std::string& path, int32_t layers, int n) {
  engine eng({.cpu_instances = 1, .n_threads = 1});
  actors::model_settings split{.n_ctx = 1024, .n_ubatch = 64, .n_seq_max = 4, .n_threads = 1};
  split.devices = {{"CPU1", layers}};
  actors::model_settings alone = split;
  alone.devices.clear();
  eng.load_model("split", path, split);
  eng.load_model("alone", path, alone);
  std::vector<std::vector<int32_t>> ref;
  for (const char* p : prompts) ref.push_back(answer(eng, "alone", p, n));
  const auto one_device = four_at_once(eng, "alone", n);
  trace::clear();
  trace::enable(true);
  std::vector<std::vector<int32_t>> grouped;
  bool two_in_flight = false;
  {
    device_hold hold(eng, "CPU1");
    REQUIRE(hold.holding());
    std::thread sessions([&] { grouped = four_at_once(eng, "split", n); });
    two_in_flight = eventually([&] { return in_flight_of(eng, "split") == 2; });
    hold.release();
    sessions.join();
  }
  trace::enable(false);
  std::set<int64_t> groups;
  for (const trace::event& e : trace::events()) {
    if (e.name == "split") groups.insert(e.args.at(2).second);
  }
  trace::clear();
  REQUIRE(grouped.size() == 4);
  for (size_t i = 0; i < 4; ++i) {
    INFO("prompt " << i);
    CHECK(ref[i].size() == static_cast<size_t>(n));
    CHECK(one_device[i] == ref[i]);
    CHECK(grouped[i] == ref[i]);
  }
  CHECK(stats_of(eng, "alone").max_in_flight == 1);  // one device: one batch at a time, as ever
  const actors::decoder_stats s = stats_of(eng, "split");
  CHECK(s.n_in_flight == 0);
  // Several sessions on a model over two devices: a second group's decode went into the pipeline while the
  // first was there (never more than two), and the trace's split spans carry both group ids.
  CHECK(two_in_flight);
  CHECK(s.max_in_flight == 2);
  CHECK(groups.count(0) == 1);
  CHECK(groups.count(1) == 1);
}

}  // namespace

TEST_CASE("stories260K over CPU and CPU1: four sessions at once run as two sequence groups and get the answers they get alone", "[actors][pipeline][groups]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  check_groups(path->string(), 3, 24);
}

TEST_CASE("SmolLM2 over CPU and CPU1: four sessions at once run as two sequence groups and get the answers they get alone", "[actors][pipeline][groups][smollm2]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  check_groups(path->string(), 15, 8);
}

TEST_CASE("the decoder actor answers while a decode is in the pipeline", "[actors][pipeline]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  engine eng({.cpu_instances = 1, .n_threads = 1});
  actors::model_settings ms{.n_ctx = 1024, .n_ubatch = 16, .n_seq_max = 1, .n_threads = 1};
  ms.devices = {{"CPU1", 15}};
  eng.load_model("split", path->string(), ms);
  std::string text;
  for (int i = 0; i < 6; ++i) text += prompts[i % 4];  // about 80 tokens: several micro-batches
  const auto dir = test::ask<actors::actor_directory>(eng.system(), eng.supervisor(), actors::get_atom_v, actors::directory_atom_v);
  REQUIRE(dir);
  REQUIRE(dir->decoders.size() == 1);
  const actors::decoder_actor decoder = dir->decoders[0];
  std::vector<int32_t> tokens;
  bool seen_in_flight = false;
  {
    // The CPU1 device actor is held, so the first decode stays in the pipeline until the test has asked.
    // A scheduler that waited for its decodes could only ever answer between them (none in flight): here it
    // would not answer at all while the hold lasts, and the bounded ask fails.
    device_hold hold(eng, "CPU1");
    REQUIRE(hold.holding());
    std::thread gen([&] { tokens = answer(eng, "split", text, 16); });
    eventually([&] {
      const auto st = test::ask_within<actors::decoder_stats>(std::chrono::seconds(60), eng.system(), decoder, actors::get_atom_v, actors::stats_atom_v);
      if (!st) return true;  // no answer while the decode is held: seen_in_flight stays false
      seen_in_flight = st->n_in_flight > 0;
      return seen_in_flight;
    });
    hold.release();
    gen.join();
  }
  CHECK(seen_in_flight);
  CHECK(tokens.size() == 16);
}

TEST_CASE("a device failing mid-pipeline fails the decode through its device actor, and the next decode works", "[actors][pipeline][failure]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  register_builtin_backends();
  std::atomic<int> graphs{0}, fail_at{-1};
  rpc::peer_server_options so;
  so.make_backend = [&](device_i&) -> backend_ptr { return std::make_unique<test::failing_backend>(graphs, fail_at); };
  auto srv = rpc::testing::start_server(std::move(so));
  const std::string device = "RPC[127.0.0.1:" + std::to_string(srv->port()) + "]#0";
  actors::engine_config cfg;
  cfg.n_threads = 1;
  cfg.peers.resize(1);
  cfg.peers[0].name = "box";
  cfg.peers[0].host = "127.0.0.1";
  cfg.peers[0].port = srv->port();
  engine eng(cfg);
  actors::model_settings ms{.name = "m", .path = path->string(), .n_ctx = 256, .n_ubatch = 8, .n_seq_max = 1, .n_threads = 1};
  ms.devices = {{device, 3}};  // the last 3 layers and the output on the peer
  eng.load_model(ms);
  bool device_actor = false;  // the peer's device has an actor, which runs the model's splits there
  for (const actors::actor_status& a : eng.status().actors) device_actor = device_actor || a.name == "device:" + device;
  REQUIRE(device_actor);
  const auto ref = answer(eng, "m");  // the long prompt in micro-batches of 8, then 12 tokens
  REQUIRE(ref.size() == 12);
  // The peer's graph in the middle of the next prompt fails: the answer fails with its error (named by the
  // device actor's split), the scheduler forgets the decode, and the next answer is the reference again.
  fail_at = graphs + 10;
  session s = eng.open_session("m");
  actors::generation_params gp;
  gp.max_tokens = 12;
  gp.temperature = 0;
  try {
    s.generate(prompt, gp);
    FAIL("an answer whose decode failed on the peer succeeded");
  } catch (const actors::request_error& e) {
    CHECK_THAT(std::string(e.what()), Catch::Contains("injected failure of graph"));
  }
  s.close();
  CHECK(stats_of(eng, "m").n_in_flight == 0);
  CHECK(answer(eng, "m") == ref);
}
