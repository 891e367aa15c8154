// Failures reach the requester as errors, and the rest of the runtime carries on: a device that cannot
// allocate, an answer cancelled mid-way while another session keeps generating, a device actor that dies
// and is restarted by the supervisor, requests for things that do not exist.
#include <catch2/catch.hpp>

#include <caf/all.hpp>

#include <chrono>
#include <future>
#include <thread>

#include "actors/device_actor.h"
#include "actors/engine.h"
#include "backends/cpu_instance.h"
#include "backends/registry.h"
#include "tests/actors/ask.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::actors;

namespace {

template <class T, class Handle, class... Ts>
caf::expected<T> ask(caf::actor_system& sys, const Handle& h, Ts&&... xs) {
  return test::ask_within<T>(std::chrono::seconds(30), sys, h, std::forward<Ts>(xs)...);
}

}  // namespace

TEST_CASE("a device that cannot allocate fails the load with out_of_memory, while a session elsewhere continues", "[actors][failure]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  register_builtin_backends();
  add_cpu_instance({.index = 9, .memory = 64 << 10, .n_threads = 1});  // 64 KiB: too small for any layer
  engine eng({.devices = {"CPU", "CPU9"}, .n_threads = 1});
  eng.load_model("a", path->string(), {.n_ctx = 256, .n_threads = 1});
  const memory_breakdown before = eng.memory();
  session s = eng.open_session("a");

  // The answer runs on its own thread while the failing load happens.
  auto answer = std::async(std::launch::async, [&] { return s.generate("Once upon a time", generation_params::greedy(48)); });
  try {
    eng.load_model("b", path->string(), {.devices = {{"CPU9", 5}}, .n_threads = 1});
    FAIL("loading onto a device without memory succeeded");
  } catch (const request_error& e) {
    CHECK(e.is(errc::out_of_memory));
    CHECK(std::string(e.what()).find("CPU9") != std::string::npos);
  }
  const generate_reply r = answer.get();
  CHECK(r.finish == "length");
  CHECK(r.tokens.size() == 48);

  // Nothing of the failed load stays on record; the device is still up and still refuses too much.
  const memory_breakdown after = eng.memory();
  CHECK(after.model == before.model);
  CHECK(after.n_rejected == 0);
  for (const actor_status& a : eng.status().actors) CHECK(a.up);
  caf::scoped_actor self{eng.system()};
  const auto dir = ask<actor_directory>(eng.system(), eng.supervisor(), get_atom_v, directory_atom_v);
  REQUIRE(dir);
  REQUIRE(dir->device_names.size() == 2);
  const auto dev9 = dir->devices[1];
  const auto big = ask<buffer_info>(eng.system(), dev9, alloc_atom_v, alloc_request{1 << 20, 2, "test"});
  REQUIRE_FALSE(big);
  CHECK(is(big.error(), errc::out_of_memory));
  const uint64_t compute = eng.memory().compute;  // the session's context
  const auto small = ask<buffer_info>(eng.system(), dev9, alloc_atom_v, alloc_request{4096, 2, "test"});
  REQUIRE(small);
  CHECK(eng.memory().compute == compute + 4096);
  CHECK(*ask<uint64_t>(eng.system(), dev9, free_atom_v, small->id) == 4096);
  CHECK(eng.memory().compute == compute);
  const memory_breakdown final_b = eng.shutdown();
  CHECK(final_b.model + final_b.context + final_b.compute == 0);
}

TEST_CASE("a session cancelled mid-answer gets cancelled, and the other session finishes its answer", "[actors][failure]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  engine eng({.n_threads = 1});
  eng.load_model("m", path->string(), {.n_ctx = 512, .n_seq_max = 2, .n_threads = 1});
  session a = eng.open_session("m");
  session b = eng.open_session("m");
  auto long_answer = std::async(std::launch::async, [&] { return b.generate("The little dog", generation_params::greedy(64)); });
  int pieces = 0;
  const generate_reply cancelled = a.generate("Once upon a time", generation_params::greedy(64), [&](std::string_view) { return ++pieces < 3; });
  CHECK(cancelled.finish == "cancelled");
  CHECK(pieces == 3);
  const generate_reply full = long_answer.get();
  CHECK(full.finish == "length");
  CHECK(full.tokens.size() == 64);

  // The cancelled session answers again, and the same as a fresh one would.
  const generate_reply again = a.generate("Once upon a time", generation_params::greedy(16));
  b.close();
  session fresh = eng.open_session("m");
  CHECK(fresh.generate("Once upon a time", generation_params::greedy(16)).tokens == again.tokens);

  // Right after a cancelled answer returns, its session is free: the next answer never finds it busy (the
  // step in flight when the cancel came is back before the requester hears of the cancel).
  for (int i = 0; i < 20; ++i) {
    int n = 0;
    CHECK(a.generate("Once upon a time", generation_params::greedy(64), [&](std::string_view) { return ++n < 2; }).finish == "cancelled");
    CHECK(a.generate("Once upon a time", generation_params::greedy(4)).tokens.size() == 4);
  }

  // Cancelling from another thread while the answer runs: the cancel is sent once the first piece arrived, the
  // callback holding the answer's thread until it was, so it lands while most of the 400 tokens remain.
  std::promise<void> first_piece;
  std::promise<void> cancel_sent;
  std::shared_future<void> sent = cancel_sent.get_future().share();
  auto run = std::async(std::launch::async, [&] {
    bool first = true;
    return a.generate("Once upon a time", generation_params::greedy(400), [&](std::string_view) {
      if (first) {
        first = false;
        first_piece.set_value();
        sent.wait();
      }
      return true;
    });
  });
  first_piece.get_future().wait();
  a.cancel();
  cancel_sent.set_value();
  const generate_reply r = run.get();
  CHECK(r.finish == "cancelled");
  CHECK(r.tokens.size() < 400);
  eng.shutdown();
}

TEST_CASE("a device actor that dies is restarted by the supervisor, and requests for unknown things are errors", "[actors][failure]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  engine eng({.devices = {"CPU", "CPU1"}, .cpu_instances = 1, .n_threads = 1, .max_restarts = 1});
  const auto dir = ask<actor_directory>(eng.system(), eng.supervisor(), get_atom_v, directory_atom_v);
  REQUIRE(dir);
  REQUIRE(dir->device_names == std::vector<std::string>{"CPU", "CPU1"});
  caf::anon_send_exit(dir->devices[1], caf::exit_reason::kill);
  bool restarted = false;
  for (int i = 0; i < 200 && !restarted; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const actor_status& a : eng.status().actors) {
      if (a.name == "device:CPU1" && a.restarts == 1 && a.up) restarted = true;
    }
  }
  REQUIRE(restarted);
  // The restarted device serves a load.
  const model_info info = eng.load_model("m", path->string(), {.devices = {{"CPU1", 5}}, .n_threads = 1});
  CHECK(info.uploads.size() == 2);
  session s = eng.open_session("m");
  CHECK(s.generate("Once", generation_params::greedy(4)).tokens.size() == 4);

  // A second death exceeds max_restarts: the device is marked down and loads onto it fail with down.
  const auto dir2 = ask<actor_directory>(eng.system(), eng.supervisor(), get_atom_v, directory_atom_v);
  REQUIRE(dir2);
  caf::anon_send_exit(dir2->devices[1], caf::exit_reason::kill);
  bool down = false;
  for (int i = 0; i < 200 && !down; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    for (const actor_status& a : eng.status().actors) down = down || (a.name == "device:CPU1" && !a.up);
  }
  REQUIRE(down);
  try {
    eng.load_model("m2", path->string(), {.devices = {{"CPU1", 5}}});
    FAIL("a load onto a device that is down succeeded");
  } catch (const request_error& e) {
    CHECK(e.is(errc::down));
  }
  try {
    eng.open_session("nope");
    FAIL("a session on a model that does not exist");
  } catch (const request_error& e) {
    CHECK(e.is(errc::not_found));
  }
  try {
    eng.load_model("x", "/nonexistent.gguf");
    FAIL("loading a missing file succeeded");
  } catch (const request_error& e) {
    CHECK(e.is(errc::failed));
    CHECK(std::string(e.what()).find("/nonexistent.gguf") != std::string::npos);
  }
  s.close();
  eng.shutdown();
}

TEST_CASE("a load cancelled mid-way fails with cancelled, leaves nothing behind, and can be repeated", "[actors][failure]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  engine eng({.cpu_instances = 1, .n_threads = 1});
  caf::scoped_actor self{eng.system()};
  load_request r;
  r.model = {.name = "m", .path = path->string(), .devices = {{"CPU1", 30}},
             .use_mmap = false};  // every byte read and copied: slow enough to cancel
  r.progress = caf::actor_cast<progress_listener>(self);  // the scoped actor handles progress below
  self->send(eng.supervisor(), load_atom_v, r);
  bool done = false, cancelled = false, loaded = false;
  int progress = 0;
  self->receive_while([&] { return !done; })(
      [&](progress_atom, const load_progress& p) {
        if (progress++ == 0) self->send(eng.supervisor(), cancel_atom_v, std::string("m"));
        CHECK(p.done <= p.total);
      },
      [&](const model_info&) {
        loaded = true;
        done = true;
      },
      [&](const caf::error& e) {
        cancelled = is(e, errc::cancelled);
        done = true;
      },
      caf::after(std::chrono::seconds(60)) >> [&] { done = true; });
  CHECK(progress >= 1);
  CHECK(cancelled);
  CHECK_FALSE(loaded);
  const memory_breakdown b = eng.memory();
  CHECK(b.model == 0);
  CHECK(b.n_rejected == 0);
  CHECK(eng.status().models.empty());
  // The same name loads now.
  CHECK(eng.load_model("m", path->string(), {.devices = {{"CPU1", 30}}, .n_threads = 1}).n_layer == 30);
  CHECK(eng.memory().model > 0);
  eng.shutdown();
}
