// The cluster's control plane between real processes: `troupe serve` with a [cluster] table as the
// coordinator, `troupe node` processes joining it over CAF's middleman, and this test process talking to the
// coordinator over the middleman too (so every message type crosses a connection between processes). Nodes
// killed, stopped and restarted; a wrong key; a coordinator that must not listen without a key; the [cluster]
// table's checks. Every wait is bounded. (Models placed over the cluster: test_cluster_placement.cpp; TLS:
// test_cluster_tls.cpp.)
#include <catch2/catch.hpp>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <fstream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "actors/errors.h"
#include "backends/rpc/rpc_client.h"
#include "net/cluster/coordinator.h"
#include "net/cluster/type_ids.h"
#include "net/http/daemon_config.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/http/daemon_process.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test::cluster_fixture;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

std::string cluster_config(const std::string& model, const std::string& extra = "") {
  // down_after well above the heartbeat: on a busy machine a node's heartbeats come late, and a node that is
  // killed must be found by its dropped connection, not by a silence that a loaded machine causes anyway.
  return "[server]\nport = 0\n[cluster]\nport = 0\nheartbeat_ms = 100\ndown_after_ms = 4000\n" + extra +
         "[[model]]\nname = \"stories\"\npath = \"" + model + "\"\nn_ctx = 256\n";
}

json cluster_of(test::daemon_process& d) { return cluster_at(d.port()); }

// Polls /v1/cluster until pred holds (at most `within`); returns the last view.
json wait_cluster(test::daemon_process& d, const std::function<bool(const json&)>& pred, std::chrono::seconds within = 20s) {
  const auto until = std::chrono::steady_clock::now() + within;
  json cl = cluster_of(d);
  while (!pred(cl) && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(50ms);
    cl = cluster_of(d);
  }
  return cl;
}

const cluster::node_entry* entry_named(const cluster::cluster_view& v, const std::string& name) {
  for (const cluster::node_entry& n : v.nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

// The views a subscriber heard.
struct view_log {
  std::mutex mu;
  std::vector<cluster::cluster_view> views;
};

cluster::cluster_subscriber::behavior_type collect_views(cluster::cluster_subscriber::pointer, view_log* log) {
  return {[log](cluster::update_atom, const cluster::cluster_view& v) {
    std::lock_guard l(log->mu);
    log->views.push_back(v);
  }};
}

struct caf_client {
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  caf_client() {
    actors::add_message_types(cfg);
    cluster::add_message_types(cfg);
    cfg.load<caf::io::middleman>();
    cfg.set("logger.verbosity", caf::atom("quiet"));
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

}  // namespace

TEST_CASE("a join's inventory is checked field by field", "[cluster]") {
  cluster::node_inventory inv{"box-1", "127.0.0.1", 5000, {{"CPU", "a CPU", "cpu", 100, 50, 100}}};
  CHECK(cluster::check_inventory(inv).empty());
  auto bad = [&](auto change) {
    cluster::node_inventory x = inv;
    change(x);
    return cluster::check_inventory(x);
  };
  CHECK_THAT(bad([](auto& x) { x.name = "no spaces"; }), Catch::Contains("inventory.name"));
  CHECK_THAT(bad([](auto& x) { x.name = std::string(65, 'a'); }), Catch::Contains("inventory.name"));
  CHECK_THAT(bad([](auto& x) { x.rpc_port = 0; }), Catch::Contains("inventory.rpc_port"));
  CHECK_THAT(bad([](auto& x) { x.rpc_host.clear(); }), Catch::Contains("inventory.rpc_host"));
  CHECK_THAT(bad([](auto& x) { x.devices.clear(); }), Catch::Contains("inventory.devices is empty"));
  CHECK_THAT(bad([](auto& x) { x.devices.resize(65, x.devices[0]); }), Catch::Contains("65 entries"));
  CHECK_THAT(bad([](auto& x) { x.devices.push_back({"TPU0", "", "tpu", 1, 1, 1}); }),
             Catch::Contains("inventory.devices[1].kind 'tpu' is not one of cpu, gpu, igpu, accel"));
  CHECK_THAT(bad([](auto& x) { x.devices[0].memory_free = 200; }), Catch::Contains("inventory.devices[0].memory_free"));
  CHECK_THAT(bad([](auto& x) { x.devices[0].name.clear(); }), Catch::Contains("inventory.devices[0].name"));
}

TEST_CASE("a coordinator listens beyond loopback only with a key, and checks its timing", "[cluster]") {
  caf_client c;
  auto coord = cluster::spawn_coordinator(*c.sys, {});
  CHECK_THROWS_WITH(cluster::publish_coordinator(*c.sys, coord, "0.0.0.0", 0, false), Catch::Contains("without a key"));
  CHECK(cluster::publish_coordinator(*c.sys, coord, "127.0.0.1", 0, false) > 0);
  caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
  CHECK_THROWS_WITH(cluster::spawn_coordinator(*c.sys, {.heartbeat = 1000ms, .down_after = 500ms}),
                    Catch::Contains("must be more than heartbeat"));
}

TEST_CASE("nodes join `troupe serve`'s coordinator, are down when killed or silent, and come back in a new epoch", "[cluster][process]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  test::daemon_process d(cluster_config(model->string()));
  const uint16_t cport = coordinator_port(d);
  node_process a(node_args(cport, "a")), b(node_args(cport, "b"));
  json cl = wait_cluster(d, [](const json& v) { return is_up(v, "a") && is_up(v, "b"); });
  INFO(cl.dump(1) << "\n" << a.output() << b.output());
  REQUIRE(is_up(cl, "a", 1));
  REQUIRE(is_up(cl, "b", 1));
  const json na = node_named(cl, "a");
  CHECK(na["joins"] == 1);
  REQUIRE(na["devices"].size() == 1);
  CHECK(na["devices"][0]["name"] == "CPU");
  CHECK(na["devices"][0]["kind"] == "cpu");
  CHECK(na["devices"][0]["memory_total"].get<uint64_t>() > 0);
  CHECK(node_named(cl, "b")["id"] != na["id"]);
  // The inventory's RPC address is the node's peer server, serving its CPU.
  {
    const std::string addr = na["rpc_address"];
    const auto colon = addr.rfind(':');
    rpc::client rc({.host = addr.substr(0, colon), .port = static_cast<uint16_t>(std::stoi(addr.substr(colon + 1)))});
    rc.connect();
    const auto devs = rc.devices();
    REQUIRE(devs.size() == 1);
    CHECK(devs[0].name == "CPU");
  }
  // The plan over the cluster before loading: both nodes' CPUs, every layer and the output, in two ranges.
  {
    const auto [st, text] = test::run_captured({TROUPE_BIN, "inspect", model->string(), "--cluster",
                                                "127.0.0.1:" + std::to_string(d.port()), "--ctx", "256"});
    INFO(text);
    CHECK(WIFEXITED(st));
    CHECK(WEXITSTATUS(st) == 0);
    CHECK_THAT(text, Catch::Contains("placement by free memory (n_ctx 256"));
    for (const char* name : {"a", "b"}) {
      const json n = node_named(cl, name);
      CHECK_THAT(text, Catch::Contains("RPC[" + n["rpc_address"].get<std::string>() + "]#0"));
    }
    CHECK(std::regex_search(text, std::regex("RPC\\[[0-9.:]+\\]#0 +[ab] +0-[0-9]+ ")));
    CHECK_THAT(text, Catch::Contains("-4 + output"));  // stories260K: layers 0-4, the last range with the output
  }

  // Heartbeats arrive.
  cl = wait_cluster(d, [](const json& v) { return node_named(v, "a")["heartbeats"].get<uint64_t>() >= 3; });
  CHECK(node_named(cl, "a")["heartbeats"].get<uint64_t>() >= 3);

  // This process asks the coordinator and subscribes to it over the middleman.
  caf_client client;
  auto coord = client.sys->middleman().remote_actor<cluster::coordinator_actor>("127.0.0.1", cport);
  REQUIRE(coord);
  view_log heard_views;
  std::mutex& views_mu = heard_views.mu;
  std::vector<cluster::cluster_view>& views = heard_views.views;
  // (With an argument: CAF 0.17 spawning a function actor without one dereferences an empty pointer, which
  // UBSan reports.)
  auto sub = client.sys->spawn(collect_views, &heard_views);
  // Ended however the test ends (the actor system waits for every actor when it goes).
  struct end_actor {
    cluster::cluster_subscriber& a;
    ~end_actor() { caf::anon_send_exit(a, caf::exit_reason::user_shutdown); }
  } end_sub{sub};
  {
    caf::scoped_actor self{*client.sys};
    cluster::cluster_view v;
    self->request(*coord, 10s, cluster::get_atom_v, cluster::status_atom_v)
        .receive([&](const cluster::cluster_view& got) { v = got; }, [&](const caf::error& e) { FAIL(actors::describe(e)); });
    REQUIRE(v.nodes.size() == 2);
    const cluster::node_entry* ea = entry_named(v, "a");
    REQUIRE(ea != nullptr);
    CHECK(ea->state == "up");
    CHECK(ea->id == na["id"].get<uint64_t>());
    CHECK(ea->devices.size() == 1);
    CHECK(ea->rpc_address == na["rpc_address"].get<std::string>());
    bool subscribed = false;
    self->request(*coord, 10s, cluster::subscribe_atom_v, sub)
        .receive([&](bool ok) { subscribed = ok; }, [&](const caf::error& e) { FAIL(actors::describe(e)); });
    CHECK(subscribed);
  }

  // kill -9: its connection drops, it is down at once (well within down_after), the other stays up.
  a.kill9();
  cl = wait_cluster(d, [](const json& v) { return node_named(v, "a")["state"] == "down"; });
  CHECK(node_named(cl, "a")["state"] == "down");
  CHECK_THAT(node_named(cl, "a")["down_reason"].get<std::string>(), Catch::Contains("connection lost"));
  CHECK(is_up(cl, "b", 1));
  const std::string a_id = std::to_string(na["id"].get<uint64_t>());
  CHECK(d.wait_for_log("cluster: node 'a' (id " + a_id + ", epoch 1) is down", 5s));

  // SIGSTOP: no heartbeat for down_after, down; SIGCONT: back, in epoch 2.
  b.signal(SIGSTOP);
  cl = wait_cluster(d, [](const json& v) { return node_named(v, "b")["state"] == "down"; });
  CHECK_THAT(node_named(cl, "b")["down_reason"].get<std::string>(), Catch::Contains("no heartbeat for"));
  b.signal(SIGCONT);
  cl = wait_cluster(d, [](const json& v) { return is_up(v, "b", 2); });
  CHECK(is_up(cl, "b", 2));

  // a restarted: the same id, epoch 2, its second join.
  node_process a2(node_args(cport, "a"));
  cl = wait_cluster(d, [](const json& v) { return is_up(v, "a", 2); });
  INFO(a2.output());
  REQUIRE(is_up(cl, "a", 2));
  CHECK(node_named(cl, "a")["joins"] == 2);
  CHECK(node_named(cl, "a")["id"] == na["id"]);
  CHECK_THAT(a2.output(), Catch::Contains("joined the cluster at 127.0.0.1:" + std::to_string(cport) + " as 'a' (id " + a_id + ", epoch 2)"));

  // The subscriber heard every change, across the middleman: a's fall among them.
  const bool heard = wait_until([&] {
    std::lock_guard l(views_mu);
    return std::any_of(views.begin(), views.end(), [](const cluster::cluster_view& v) {
      const cluster::node_entry* e = entry_named(v, "a");
      return v.nodes.size() == 2 && e != nullptr && e->state == "up" && e->epoch == 2;
    });
  });
  CHECK(heard);
  {
    std::lock_guard l(views_mu);
    CHECK(std::any_of(views.begin(), views.end(), [](const cluster::cluster_view& v) {
      const cluster::node_entry* e = entry_named(v, "a");
      return e != nullptr && e->state == "down" && e->down_reason.find("connection lost") == 0;
    }));
  }
}

TEST_CASE("a join with a wrong key is refused and logged, the right key joins", "[cluster][process]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-cluster-keys-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "good.key") << "0123456789abcdef0123456789abcdef\n";
  std::ofstream(dir / "bad.key") << "fedcba9876543210fedcba9876543210\n";
  test::daemon_process d(cluster_config(model->string(), "key_file = \"" + (dir / "good.key").string() + "\"\n"));
  const uint16_t cport = coordinator_port(d);
  node_process wrong(node_args(cport, "intruder", {"--cluster-key-file", (dir / "bad.key").string()}));
  CHECK(wrong.wait_exit(20s) == 1);
  CHECK_THAT(wrong.output(), Catch::Contains("refused"));
  CHECK(d.wait_for_log("cluster: refused a join of node 'intruder': wrong key", 5s));
  node_process none(node_args(cport, "keyless"));
  CHECK(none.wait_exit(20s) == 1);
  CHECK(d.wait_for_log("cluster: refused a join of node 'keyless': it gave no key", 5s));
  node_process right(node_args(cport, "member", {"--cluster-key-file", (dir / "good.key").string()}));
  const json cl = wait_cluster(d, [](const json& v) { return is_up(v, "member"); });
  CHECK(is_up(cl, "member", 1));
  CHECK(node_named(cl, "intruder").is_null());
  CHECK(node_named(cl, "keyless").is_null());
  // With a key, the cluster's state is not for whoever connects: this process has not joined.
  caf_client client;
  auto coord = client.sys->middleman().remote_actor<cluster::coordinator_actor>("127.0.0.1", cport);
  REQUIRE(coord);
  caf::scoped_actor self{*client.sys};
  std::string refusal;
  self->request(*coord, 10s, cluster::get_atom_v, cluster::status_atom_v)
      .receive([&](const cluster::cluster_view&) { refusal = "answered"; }, [&](const caf::error& e) { refusal = actors::describe(e); });
  CHECK_THAT(refusal, Catch::Contains("refused") && Catch::Contains("for its nodes"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the [cluster] table and placement = \"cluster\" are checked by name", "[cluster][config]") {
  const std::string model = "[[model]]\nname = \"m\"\npath = \"m.gguf\"\n";
  auto parse = [](const std::string& text) { return http::parse_daemon_config(text, "d.toml"); };
  const http::daemon_config ok = parse("[cluster]\nport = 0\nkey_file = \"k\"\nheartbeat_ms = 50\ndown_after_ms = 500\n"
                                       "coordinator_devices = false\nmargin_mib = 64\n" + model);
  CHECK(ok.cluster.enabled);
  CHECK(ok.cluster.port == 0);
  CHECK(ok.cluster.heartbeat_ms == 50);
  CHECK(ok.cluster.down_after_ms == 500);
  CHECK_FALSE(ok.cluster.coordinator_devices);
  CHECK(ok.cluster.margin_mib == 64);
  CHECK_FALSE(parse(model).cluster.enabled);
  CHECK_THROWS_WITH(parse("[cluster]\nprot = 1\n" + model), Catch::Contains("unknown key 'prot' in [cluster]"));
  CHECK(parse("[cluster]\nrebalance = \"on_join\"\n" + model).cluster.rebalance == "on_join");
  CHECK(parse(model).cluster.rebalance == "on_loss");
  CHECK_THROWS_WITH(parse("[cluster]\nrebalance = \"always\"\n" + model),
                    Catch::Contains("d.toml:2") && Catch::Contains("cluster.rebalance must be \"on_loss\" or \"on_join\""));
  const http::daemon_config tls = parse("[cluster]\ntls_cert = \"c.pem\"\ntls_key = \"c.key\"\ntls_ca = \"ca.pem\"\n" + model);
  CHECK(std::filesystem::path(tls.cluster.tls_ca).filename() == "ca.pem");
  CHECK_THROWS_WITH(parse("[cluster]\ntls_cert = \"c.pem\"\n" + model),
                    Catch::Contains("cluster.tls_cert, cluster.tls_key and cluster.tls_ca go together"));
  CHECK_THROWS_WITH(parse("[cluster]\nheartbeat_ms = 1000\ndown_after_ms = 1000\n" + model),
                    Catch::Contains("d.toml:1") && Catch::Contains("cluster.down_after_ms (1000) must be more than cluster.heartbeat_ms"));
  CHECK_THROWS_WITH(parse("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nplacement = \"everywhere\"\n"),
                    Catch::Contains("placement must be \"cluster\" or \"auto\""));
  CHECK_THROWS_WITH(parse("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nplacement = \"cluster\"\ndevices = [{ device = \"CPU\", layers = 3 }]\n"),
                    Catch::Contains("give no devices"));
  CHECK_THROWS_WITH(parse("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nplacement = \"cluster\"\nmin_nodes = 0\n"),
                    Catch::Contains("min_nodes 0 is outside 1..1024"));
  // placement = "cluster" without a [cluster] table: refused before anything starts.
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  http::daemon_config c = parse("[[model]]\nname = \"m\"\npath = \"" + path->string() + "\"\nplacement = \"cluster\"\n");
  CHECK_THROWS_WITH(http::validate_daemon_config(c), Catch::Contains("placement = \"cluster\" needs a [cluster] table"));
}
