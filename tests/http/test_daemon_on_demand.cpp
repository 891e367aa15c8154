// Models loaded on demand: the configuration's keys, a daemon whose memory budget holds two of three models
// serving all three in turn (its /v1/memory never above the budget), idle models unloading after their
// keep_alive (and at once for ollama's keep_alive 0), a model too large for the budget refused with the
// figures, models_dir, and a load in progress that does not hold up requests to a loaded model.
#include <catch2/catch.hpp>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>

#include "actors/model_settings.h"
#include "backends/cpu/cpu_backend.h"
#include "net/http/daemon_config.h"
#include "tests/http/daemon_fixture.h"
#include "tests/http/daemon_process.h"
#include "tests/http/stories_daemon.h"
#include "tests/net/test_server.h"
#include "tests/support/gated_device.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test;
using namespace troupe::http;
using json = nlohmann::json;
using Catch::Matchers::Contains;

namespace {

// A [[model]] table serving stories260K under `name` (the raw template: the reference's prompt).
std::string stories_model(const std::string& name, const std::string& path, const std::string& extra = "") {
  return "[[model]]\nname = \"" + name + "\"\npath = \"" + path + "\"\nchat_template = \"raw\"\nthreads = 1\nn_ctx = 4096\nn_seq_max = 2\n" +
         extra;
}

json greedy_for(const std::string& model, int max_tokens = 32) {
  json body = greedy_chat(max_tokens);
  body["model"] = model;
  return body;
}

json get_json(httplib::Client& c, const std::string& path) {
  auto r = c.Get(path);
  REQUIRE(r);
  return json::parse(r->body);
}

std::string state_of(httplib::Client& c, const std::string& model) {
  const json models = get_json(c, "/v1/models");  // (held: a range over a temporary's member would dangle)
  for (const json& m : models["data"]) {
    if (m["id"] == model) return m["meta"]["state"].get<std::string>();
  }
  return "(absent)";
}

// What the models hold in host memory now (the CPU device's budget counts this), from /v1/memory.
uint64_t host_bytes(httplib::Client& c) { return get_json(c, "/v1/memory")["host"]["self"].get<uint64_t>(); }

daemon_config parse(const std::string& toml) { return parse_daemon_config(toml, "d.toml"); }

std::string config_error(const std::string& toml) {
  try {
    (void)parse(toml);
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_CASE("keep_alive durations as ollama writes them", "[http][on_demand][config]") {
  CHECK(actors::parse_keep_alive("300") == 300000);
  CHECK(actors::parse_keep_alive("2.5") == 2500);
  CHECK(actors::parse_keep_alive("5m") == 300000);
  CHECK(actors::parse_keep_alive("1h30m") == 5400000);
  CHECK(actors::parse_keep_alive("250ms") == 250);
  CHECK(actors::parse_keep_alive(" 30s ") == 30000);
  CHECK(actors::parse_keep_alive("0") == 0);
  CHECK(actors::parse_keep_alive("-1") == -1);
  CHECK(actors::parse_keep_alive("-5m") == -1);
  CHECK_FALSE(actors::parse_keep_alive(""));
  CHECK_FALSE(actors::parse_keep_alive("soon"));
  CHECK_FALSE(actors::parse_keep_alive("5 m"));
  CHECK_FALSE(actors::parse_keep_alive("5d"));
  CHECK_FALSE(actors::parse_keep_alive("m"));
  CHECK_FALSE(actors::parse_keep_alive("1e400"));
  CHECK_FALSE(actors::parse_keep_alive("99999999999999999999999h"));
}

TEST_CASE("daemon config: load, keep_alive, memory_budget_mib, models_dir and load_timeout_s", "[http][on_demand][config]") {
  const daemon_config c = parse(
      "[server]\nmemory_budget_mib = { CPU = 2048, Vulkan0 = 512 }\nload_timeout_s = 30\nmodels_dir = \"/models\"\n"
      "[[model]]\nname = \"a\"\npath = \"a.gguf\"\nkeep_alive = 60\n"
      "[[model]]\nname = \"b\"\npath = \"b.gguf\"\nload = \"startup\"\nkeep_alive = \"1h\"\n"
      "[[model]]\nname = \"c\"\npath = \"c.gguf\"\nload = \"on_demand\"\nkeep_alive = -1\n"
      "[[model]]\nname = \"d\"\npath = \"d.gguf\"\n");
  REQUIRE(c.engine.models.size() == 4);
  CHECK(c.engine.models[0].keep_alive_ms == 60000);
  CHECK(c.engine.models[1].load == "startup");
  CHECK(c.engine.models[1].keep_alive_ms == 3600000);
  CHECK(c.engine.models[2].load == "on_demand");
  CHECK(c.engine.models[2].keep_alive_ms == -1);
  CHECK(c.engine.models[3].load.empty());
  CHECK(c.engine.models[3].keep_alive_ms == actors::model_settings::keep_alive_default);
  CHECK(c.server.memory_budget_mib == std::vector<std::pair<std::string, uint64_t>>{{"CPU", 2048}, {"Vulkan0", 512}});
  CHECK(c.server.load_timeout_s == 30);
  CHECK(c.server.models_dir == "/models");
  CHECK(parse("[server]\nmemory_budget_mib = 100\n").server.memory_budget_mib == std::vector<std::pair<std::string, uint64_t>>{{"*", 100}});

  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nload = \"lazy\"\n"), Contains("d.toml") && Contains("load"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nkeep_alive = \"soon\"\n"),
             Contains("d.toml:4") && Contains("keep_alive"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nkeep_alive = true\n"), Contains("keep_alive"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nplacement = \"cluster\"\nload = \"on_demand\"\n"),
             Contains("load"));
  CHECK_THAT(config_error("[server]\nmemory_budget_mib = \"lots\"\n"), Contains("d.toml:2") && Contains("memory_budget_mib"));
  CHECK_THAT(config_error("[server]\nmemory_budget_mib = { CPU = -1 }\n"), Contains("memory_budget_mib"));
  CHECK_THAT(config_error("[server]\nmodel_dir = \"x\"\n"), Contains("model_dir"));

  // models_dir: every GGUF by file name, on demand; a [[model]] of the same name wins; a missing folder is
  // an error naming it, and a models_dir alone is enough to serve.
  rpc::testing::temp_dir dir("troupe-models-dir");
  for (const char* f : {"zeta.gguf", "alpha.gguf", "taken.gguf", "notes.txt"}) std::ofstream(dir.path() / f) << "x";
  std::filesystem::create_directory(dir.path() / "sub.gguf");
  daemon_config d = parse("[server]\nmodels_dir = \"" + dir.path().string() + "\"\n[[model]]\nname = \"taken\"\npath = \"m.gguf\"\n");
  const std::vector<actors::model_settings> found = models_in_dir(d);
  REQUIRE(found.size() == 2);
  CHECK(found[0].name == "alpha");
  CHECK(found[0].path == (dir.path() / "alpha.gguf").string());
  CHECK(found[0].load == "on_demand");
  CHECK(found[1].name == "zeta");
  d.engine.models.clear();
  CHECK_NOTHROW(validate_daemon_config(d));
  d.server.models_dir = (dir.path() / "absent").string();
  CHECK_THROWS_WITH(validate_daemon_config(d), Contains("models_dir") && Contains("absent"));
}

TEST_CASE("daemon: three models under a budget that holds two are served in turn, /v1/memory never above the budget", "[http][daemon][on_demand]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string path = model->string();
  // What one stories model holds once it has answered (weights, its KV cache of 4096 cells, compute).
  uint64_t one = 0;
  {
    test::daemon_process d("[server]\nport = 0\n" + stories_model("a", path));
    httplib::Client c("127.0.0.1", d.port());
    c.set_read_timeout(60, 0);
    auto r = c.Post("/v1/chat/completions", greedy_for("a").dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    one = host_bytes(c);
  }
  REQUIRE(one > 0);
  // Room for two and a fifth: never three.
  const uint64_t budget_mib = (one * 12 / 5 + (uint64_t{1} << 20) - 1) >> 20;
  INFO("one model holds " << one << " bytes; the budget is " << budget_mib << " MiB");
  REQUIRE(3 * one > (budget_mib << 20));
  test::daemon_process d("[server]\nport = 0\nmemory_budget_mib = " + std::to_string(budget_mib) + "\n" + stories_model("a", path) +
                         stories_model("b", path) + stories_model("c", path));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(120, 0);
  // The first loads at start; the others wait for their first request.
  CHECK(state_of(c, "a") == "loaded");
  CHECK(state_of(c, "b") == "unloaded");
  CHECK(state_of(c, "c") == "unloaded");
  auto health = c.Get("/health");
  REQUIRE(health);
  CHECK(health->status == 200);
  CHECK(json::parse(health->body)["status"] == "ok");

  // /v1/memory watched throughout from another client.
  std::atomic<bool> done{false};
  std::atomic<uint64_t> peak{0};
  std::atomic<int> samples{0};
  std::thread watcher([&] {
    httplib::Client w("127.0.0.1", d.port());
    while (!done.load()) {
      if (auto r = w.Get("/v1/memory"); r && r->status == 200) {
        const uint64_t held = json::parse(r->body)["host"]["self"].get<uint64_t>();
        if (held > peak.load()) peak.store(held);
        ++samples;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  });
  int failures = 0;
  for (int round = 0; round < 4; ++round) {
    for (const char* m : {"a", "b", "c"}) {
      auto r = c.Post("/v1/chat/completions", greedy_for(m).dump(), "application/json");
      if (!r || r->status != 200) {
        ++failures;
        continue;
      }
      CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
    }
  }
  done.store(true);
  watcher.join();
  CHECK(failures == 0);
  CHECK(samples.load() > 0);
  CHECK(peak.load() <= (budget_mib << 20));
  CHECK(host_bytes(c) <= (budget_mib << 20));
  // Each of the three went and came back: round robin over three in room for two.
  for (const char* m : {"a", "b", "c"}) {
    CHECK(metric(c, std::string("troupe_model_loads_total{model=\"") + m + "\"}") >= 2);
    CHECK(metric(c, std::string("troupe_model_unloads_total{model=\"") + m + "\"}") >= 1);
  }
  int loaded = 0;
  for (const char* m : {"a", "b", "c"}) loaded += state_of(c, m) == "loaded" ? 1 : 0;
  CHECK(loaded == 2);
  CHECK_THAT(d.log(), Contains("unloaded to make room for"));
}

TEST_CASE("daemon: an idle model unloads after its keep_alive, ollama's keep_alive 0 unloads at once, and the next request loads it again", "[http][daemon][on_demand]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string path = model->string();
  test::daemon_process d("[server]\nport = 0\n" + stories_model("a", path) + stories_model("brief", path, "keep_alive = \"1s\"\n") +
                         stories_model("kept", path, "keep_alive = -1\n"));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  const uint64_t alone = host_bytes(c);
  for (const char* m : {"brief", "kept"}) {
    auto r = c.Post("/v1/chat/completions", greedy_for(m).dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  }
  // ollama's /api/ps lists what is loaded, with when it unloads.
  const json ps = get_json(c, "/api/ps");
  CHECK(ps["models"].size() == 3);
  REQUIRE(eventually([&] { return state_of(c, "brief") == "unloaded"; }));
  CHECK(state_of(c, "kept") == "loaded");
  CHECK(state_of(c, "a") == "loaded");
  CHECK(get_json(c, "/api/ps")["models"].size() == 2);
  CHECK_THAT(d.log(), Contains("model 'brief' unloaded after 1000 ms idle"));
  // A request's own keep_alive (ollama's): 0 unloads it once answered; a load-only request with keep_alive 0
  // unloads it at once.
  auto r = c.Post("/api/generate", json{{"model", "kept"}, {"prompt", "Once upon a time"}, {"stream", false}, {"raw", true},
                                        {"options", {{"temperature", 0}, {"num_predict", 4}}}, {"keep_alive", 0}}.dump(),
                  "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  REQUIRE(eventually([&] { return state_of(c, "kept") == "unloaded"; }));
  r = c.Post("/api/generate", json{{"model", "a"}, {"keep_alive", 0}}.dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["done_reason"] == "unload");
  CHECK(state_of(c, "a") == "unloaded");
  // Everything they held was given back.
  CHECK(host_bytes(c) < alone);
  // The next request loads it again, with the same answer.
  r = c.Post("/v1/chat/completions", greedy_for("a").dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  CHECK(state_of(c, "a") == "loaded");
  // A load-only request (as `ollama run` sends first) loads it.
  r = c.Post("/api/chat", json{{"model", "brief"}, {"messages", json::array()}}.dump(), "application/json");
  REQUIRE(r);
  CHECK(json::parse(r->body)["done_reason"] == "load");
  CHECK(state_of(c, "brief") == "loaded");
}

TEST_CASE("daemon: a model larger than its memory budget alone is refused with the figures, and the others keep serving", "[http][daemon][on_demand]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string path = model->string();
  // 1 MiB of budget: the first model (loaded at start) is over it already; the second cannot be loaded.
  test::daemon_process d("[server]\nport = 0\nmemory_budget_mib = 1\n" + stories_model("a", path) + stories_model("big", path));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  auto r = c.Post("/v1/chat/completions", greedy_for("big").dump(), "application/json");
  REQUIRE(r);
  CHECK(r->status == 507);
  const json e = json::parse(r->body)["error"];
  CHECK_THAT(e["message"].get<std::string>(), Contains("'big'") && Contains("MiB on CPU") && Contains("budget of 1.0 MiB"));
  CHECK_THAT(get_json(c, "/v1/models")["data"][1]["meta"]["error"].get<std::string>(), Contains("budget"));
  r = c.Post("/v1/chat/completions", greedy_for("a").dump(), "application/json");
  REQUIRE(r);
  CHECK(r->status == 200);
}

TEST_CASE("daemon: models_dir serves each GGUF of a folder by its file name, loaded on first use", "[http][daemon][on_demand]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  rpc::testing::temp_dir dir("troupe-models-dir");
  std::filesystem::copy_file(*model, dir.path() / "storyteller.gguf");
  test::daemon_process d("[server]\nport = 0\n", {"--models-dir", dir.path().string(), "--chat-template", "raw", "-t", "1"});
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(60, 0);
  CHECK(state_of(c, "storyteller") == "unloaded");
  auto r = c.Post("/v1/chat/completions", greedy_for("storyteller").dump(), "application/json");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  CHECK(json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  CHECK(state_of(c, "storyteller") == "loaded");
}

TEST_CASE("daemon: while a model loads (its upload held at a peer's gate), a loaded model keeps answering", "[http][daemon][on_demand][peer]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string path = model->string();
  // The second model's layers go to a peer served by this process, whose allocations pass a gate: closed,
  // its load stays in progress for as long as the test needs.
  alloc_gate gate;
  gated_device gated(cpu::cpu_device(), gate);
  auto peer = rpc::testing::start_server({.devices = {&gated}, .io_threads = 4});
  const std::string address = "127.0.0.1:" + std::to_string(peer->port());
  test::daemon_process d("[server]\nport = 0\n[[peer]]\nname = \"box\"\naddress = \"" + address + "\"\n" + stories_model("a", path) +
                         stories_model("remote", path, "devices = [{ device = \"RPC[" + address + "]#0\", layers = 5 }]\n"));
  httplib::Client c("127.0.0.1", d.port());
  c.set_read_timeout(120, 0);
  gate.close();
  struct open_at_exit {  // a failed REQUIRE must not leave the daemon's load waiting at the gate
    alloc_gate& g;
    ~open_at_exit() { g.open(); }
  } opener{gate};
  std::optional<httplib::Result> remote;
  std::thread asker([&] {
    httplib::Client rc("127.0.0.1", d.port());
    rc.set_read_timeout(120, 0);
    remote.emplace(rc.Post("/v1/chat/completions", greedy_for("remote").dump(), "application/json"));
  });
  REQUIRE(gate.wait_held(std::chrono::seconds(60)));
  CHECK(state_of(c, "remote") == "loading");
  auto h = get_json(c, "/health");
  CHECK(h["models"][1]["state"] == "loading");
  // The load is held: the loaded model answers, each time the reference.
  for (int i = 0; i < 3; ++i) {
    auto r = c.Post("/v1/chat/completions", greedy_for("a", 16).dump(), "application/json");
    REQUIRE(r);
    REQUIRE(r->status == 200);
    const auto tokens = json::parse(r->body)["choices"][0]["tokens"].get<std::vector<int>>();
    CHECK(tokens == std::vector<int>(reference_tokens.begin(), reference_tokens.begin() + 16));
  }
  CHECK(state_of(c, "remote") == "loading");  // (still held: the answers above did not wait for it)
  gate.open();
  asker.join();
  REQUIRE(remote);
  REQUIRE(*remote);
  REQUIRE((*remote)->status == 200);
  CHECK(json::parse((*remote)->body)["choices"][0]["tokens"].get<std::vector<int>>() == reference_tokens);
  CHECK(state_of(c, "remote") == "loaded");
}
