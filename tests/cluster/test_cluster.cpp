// The cluster's control plane between real processes: `troupe serve` with a [cluster] table as the
// coordinator, `troupe node` processes joining it over CAF's middleman, and this test process talking to the
// coordinator over the middleman too (so every message type crosses a connection between processes). Nodes
// killed, stopped and restarted; a wrong key; a coordinator that must not listen without a key. Every wait is
// bounded.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <httplib.h>

#include <algorithm>
#include <array>
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
#include "net/cluster/cluster_engine.h"
#include "net/cluster/coordinator.h"
#include "net/cluster/tls.h"
#include "net/cluster/type_ids.h"
#include "net/http/daemon_config.h"
#include "tests/http/daemon_process.h"
#include "tests/support/certificate.h"
#include "tests/support/tcp_proxy.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

// A `troupe node` process, its stdout collected on a thread; SIGKILLed by the destructor if still running.
class node_process {
 public:
  explicit node_process(std::vector<std::string> args) {
    args.insert(args.begin(), {TROUPE_BIN, "node"});
    int out = -1;
    std::tie(pid_, out) = test::spawn_piped(std::move(args), STDOUT_FILENO);
    reader_ = std::thread([this, out] {
      char buf[1024];
      for (;;) {
        const ssize_t n = read(out, buf, sizeof buf);
        if (n <= 0) break;
        std::lock_guard l(m_);
        text_.append(buf, static_cast<size_t>(n));
      }
      close(out);
    });
  }
  ~node_process() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (reader_.joinable()) reader_.join();
  }
  void signal(int sig) { kill(pid_, sig); }
  void kill9() {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
    pid_ = -1;
  }
  // The exit status, or -2 when still running after `within`.
  int wait_exit(std::chrono::milliseconds within) {
    const auto until = std::chrono::steady_clock::now() + within;
    while (std::chrono::steady_clock::now() < until) {
      int st = 0;
      if (waitpid(pid_, &st, WNOHANG) == pid_) {
        pid_ = -1;
        return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
      }
      std::this_thread::sleep_for(20ms);
    }
    return -2;
  }
  std::string output() {
    std::lock_guard l(m_);
    return text_;
  }

 private:
  pid_t pid_ = -1;
  std::thread reader_;
  std::mutex m_;
  std::string text_;
};

std::string cluster_config(const std::string& model, const std::string& extra = "") {
  // down_after well above the heartbeat: on a busy machine a node's heartbeats come late, and a node that is
  // killed must be found by its dropped connection, not by a silence that a loaded machine causes anyway.
  return "[server]\nport = 0\n[cluster]\nport = 0\nheartbeat_ms = 100\ndown_after_ms = 4000\n" + extra +
         "[[model]]\nname = \"stories\"\npath = \"" + model + "\"\nn_ctx = 256\n";
}

uint16_t coordinator_port(test::daemon_process& d) {
  std::smatch m;
  const std::string log = d.log();
  REQUIRE(std::regex_search(log, m, std::regex("cluster coordinator on 127\\.0\\.0\\.1:([0-9]+)")));
  return static_cast<uint16_t>(std::stoi(m[1]));
}

json cluster_at(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(10, 0);
  auto r = c.Get("/v1/cluster");
  REQUIRE(r);
  REQUIRE(r->status == 200);
  return json::parse(r->body);
}

json cluster_of(test::daemon_process& d) { return cluster_at(d.port()); }

// The node named `name` in /v1/cluster (null when absent).
json node_named(const json& cl, const std::string& name) {
  for (const json& n : cl["nodes"]) {
    if (n["name"] == name) return n;
  }
  return nullptr;
}

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

bool is_up(const json& cl, const std::string& name, uint64_t epoch = 0) {
  const json n = node_named(cl, name);
  return !n.is_null() && n["state"] == "up" && (epoch == 0 || n["epoch"] == epoch);
}

std::vector<std::string> node_args(uint16_t coord, const std::string& name, std::vector<std::string> extra = {}) {
  std::vector<std::string> a = {"--join", "127.0.0.1:" + std::to_string(coord), "--name", name, "--device", "cpu", "-t", "1"};
  a.insert(a.end(), extra.begin(), extra.end());
  return a;
}

// A free TCP port on 127.0.0.1 (bound and released: the caller binds it next).
uint16_t free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t n = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &n) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

const cluster::node_entry* entry_named(const cluster::cluster_view& v, const std::string& name) {
  for (const cluster::node_entry& n : v.nodes) {
    if (n.name == name) return &n;
  }
  return nullptr;
}

bool wait_until(const std::function<bool()>& pred, std::chrono::seconds within = 20s) {
  const auto until = std::chrono::steady_clock::now() + within;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return pred();
    std::this_thread::sleep_for(20ms);
  }
  return true;
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

namespace {

struct answer {
  int status = 0;
  std::string text;  // the completion's text, or the error's message
};

answer complete(int port, const std::string& model) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(30, 0);
  const json body = {{"model", model}, {"prompt", "Once upon a time"}, {"max_tokens", 16}, {"temperature", 0}};
  auto r = c.Post("/v1/completions", body.dump(), "application/json");
  if (!r) return {-1, "no answer"};
  answer a{r->status, r->body};
  try {
    const json j = json::parse(r->body);
    if (j.contains("choices")) a.text = j["choices"][0]["text"];
    if (j.contains("error")) {
      a.text = j["error"]["message"];
      if (a.status == 200) a.status = 500;  // an answer that failed after its headers went out
    }
  } catch (const json::exception&) {
  }
  return a;
}

// A coordinating daemon with a model "stories" placed over the cluster and the same model "local" on its own
// CPU (the reference answer), with `cluster_extra` and `model_extra` lines in their tables.
std::string placement_config(const std::string& m, const std::string& cluster_extra, const std::string& model_extra) {
  return "[server]\nport = 0\n[cluster]\nport = 0\nheartbeat_ms = 100\ncoordinator_devices = false\n" + cluster_extra +
         "[[model]]\nname = \"stories\"\npath = \"" + m + "\"\nn_ctx = 256\nchat_template = \"raw\"\nplacement = \"cluster\"\n" +
         model_extra + "[[model]]\nname = \"local\"\npath = \"" + m + "\"\nn_ctx = 256\nchat_template = \"raw\"\n";
}

// Its HTTP port, once it is ready.
int http_port_when_ready(test::daemon_process& d) {
  REQUIRE(d.wait_for_log("info  ready", 60s));
  std::smatch mt;
  const std::string log = d.log();
  REQUIRE(std::regex_search(log, mt, std::regex("listening on http://127\\.0\\.0\\.1:([0-9]+)")));
  return std::stoi(mt[1]);
}

}  // namespace

TEST_CASE("a model placed over two nodes answers as on the CPU, moves to the node left when one is killed, is 503 naming the node with none left, and answers again when a node is back", "[cluster][process][placement]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string m = model->string();
  test::daemon_process d(placement_config(m, "down_after_ms = 4000\n", "min_nodes = 2\n"), {}, false);
  REQUIRE(d.wait_for_log("cluster coordinator on", 60s));
  const uint16_t cport = coordinator_port(d);
  CHECK(d.wait_for_log("model 'stories' waits for 2 node(s) up", 30s));
  const uint16_t a_rpc = free_port();  // a comes back at the same address (its peer is asked to reconnect)
  const std::string a_address = "127.0.0.1:" + std::to_string(a_rpc);
  auto a = std::make_unique<node_process>(node_args(cport, "a", {"--port", std::to_string(a_rpc)}));
  node_process b(node_args(cport, "b"));
  const int port = http_port_when_ready(d);
  std::smatch mt;
  const std::string log = d.log();
  // Placed over both nodes' CPUs (coordinator_devices = false: none of its own), every layer and the output.
  REQUIRE(std::regex_search(log, mt, std::regex("model 'stories' placed by free memory: RPC\\[[0-9.:]+\\]#0 \\(node ([ab])\\) ([0-9]) "
                                                "layer\\(s\\), RPC\\[[0-9.:]+\\]#0 \\(node ([ab])\\) ([0-9]) layer\\(s\\)")));
  CHECK(mt[1] != mt[3]);
  CHECK(std::stoi(mt[2]) + std::stoi(mt[4]) == 6);  // stories260K: 5 layers and the output
  {  // GET /v1/cluster: the placement, per device its node and its layer range
    const json cl = cluster_at(port);
    REQUIRE(cl["models"].size() == 1);
    const json& pm = cl["models"][0];
    CHECK(pm["name"] == "stories");
    CHECK(pm["state"] == "placed");
    REQUIRE(pm["devices"].size() == 2);
    const int k = std::stoi(mt[2]);
    CHECK(pm["devices"][0]["node"] == mt[1].str());
    CHECK(pm["devices"][0]["layers"] == json::array({0, k - 1}));
    CHECK(pm["devices"][0]["output"] == false);
    CHECK(pm["devices"][1]["node"] == mt[3].str());
    CHECK(pm["devices"][1]["layers"] == json::array({k, 4}));
    CHECK(pm["devices"][1]["output"] == true);
  }
  const answer ref = complete(port, "local");
  REQUIRE(ref.status == 200);
  REQUIRE_FALSE(ref.text.empty());
  const answer first = complete(port, "stories");
  CHECK(first.status == 200);
  CHECK(first.text == ref.text);

  // a killed: placed on b alone, and the same answer within 30 s.
  a->kill9();
  const bool moved = wait_until([&] { return complete(port, "stories").text == ref.text && d.log().find("(node b) 6 layer(s)") != std::string::npos; },
                                30s);
  CHECK(moved);
  CHECK(d.wait_for_log("cluster: model 'stories' lost its placement: node 'a' is down", 5s));
  // a's peer stops trying its address (no retries for a node that is gone).
  CHECK(d.wait_for_log("peer a (" + a_address + ") parked: node 'a' is down", 5s));

  // b killed too: nowhere to go; requests get 503 naming it (the model waits for a node). Before the cluster
  // marks the node down, a request that meets b's lost connection is a 503 naming b's peer.
  b.kill9();
  answer got;
  const bool refused = wait_until([&] {
    got = complete(port, "stories");
    return got.status == 503 && got.text.find("node 'b' is down") != std::string::npos;
  }, 20s);
  INFO(got.text);
  CHECK(refused);
  CHECK_THAT(got.text, Catch::Contains("node 'b' is down"));
  CHECK(complete(port, "local").text == ref.text);  // the daemon's other model is not touched
  CHECK(d.wait_for_log("parked: node 'b' is down", 5s));

  // a restarted at its old address: it rejoins in epoch 2, its parked peer connects again (a second
  // connection to it would find its devices taken), the model is placed on it, the same answer.
  node_process a2(node_args(cport, "a", {"--port", std::to_string(a_rpc)}));
  const bool back = wait_until([&] { return complete(port, "stories").text == ref.text; }, 30s);
  CHECK(back);
  const json cl = cluster_at(port);
  CHECK(is_up(cl, "a", 2));
  CHECK(node_named(cl, "a")["rpc_address"] == a_address);
  CHECK_THAT(d.log(), Catch::Contains("peer a (" + a_address + ") is up (connection 2") &&
                          !Catch::Contains("not using them twice"));
  httplib::Client c("127.0.0.1", port);
  const auto metrics = c.Get("/metrics");
  REQUIRE(metrics);
  CHECK(std::regex_search(metrics->body, std::regex("troupe_cluster_recoveries_total [2-9]")));
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

TEST_CASE("a model placed over a node behind a slow link (2 ms each way) answers as on the CPU", "[cluster][process][placement][proxy]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string m = model->string();
  test::daemon_process d(placement_config(m, "down_after_ms = 4000\n", "min_nodes = 2\n"), {}, false);
  REQUIRE(d.wait_for_log("cluster coordinator on", 60s));
  const uint16_t cport = coordinator_port(d);
  // Node b's RPC server on a port of its own, reached through the proxy: the address it advertises.
  const uint16_t b_rpc = free_port();
  test::tcp_proxy proxy({.target_port = b_rpc, .latency = std::chrono::milliseconds(2)});
  node_process a(node_args(cport, "a"));
  node_process b(node_args(cport, "b", {"--port", std::to_string(b_rpc), "--advertise", "127.0.0.1:" + std::to_string(proxy.port())}));
  const int port = http_port_when_ready(d);
  const std::string log = d.log();
  CHECK_THAT(log, Catch::Contains("RPC[127.0.0.1:" + std::to_string(proxy.port()) + "]#0 (node b)"));
  const answer ref = complete(port, "local");
  REQUIRE(ref.status == 200);
  const answer got = complete(port, "stories");
  CHECK(got.status == 200);
  CHECK(got.text == ref.text);
}

TEST_CASE("rebalance = on_join: a node that joins takes part of a placed model, which answers the same", "[cluster][process][placement]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string m = model->string();
  test::daemon_process d(placement_config(m, "down_after_ms = 4000\nrebalance = \"on_join\"\n", ""), {}, false);
  REQUIRE(d.wait_for_log("cluster coordinator on", 60s));
  const uint16_t cport = coordinator_port(d);
  node_process a(node_args(cport, "a"));
  const int port = http_port_when_ready(d);
  CHECK_THAT(d.log(), Catch::Contains("(node a) 6 layer(s)"));  // min_nodes = 1: everything on a
  const answer ref = complete(port, "local");
  REQUIRE(ref.status == 200);
  CHECK(complete(port, "stories").text == ref.text);
  node_process b(node_args(cport, "b"));
  CHECK(d.wait_for_log("lost its placement: node 'b' joined (rebalance = \"on_join\")", 30s));
  const bool spread = wait_until([&] {
    const std::string l = d.log();
    return std::regex_search(l, std::regex("placed by free memory: RPC\\[[0-9.:]+\\]#0 \\(node [ab]\\) [1-5] layer\\(s\\), "
                                           "RPC\\[[0-9.:]+\\]#0 \\(node [ab]\\) [1-5] layer\\(s\\)")) &&
           complete(port, "stories").text == ref.text;
  }, 30s);
  CHECK(spread);
}

TEST_CASE("placement = auto places a model over the daemon's own devices by free memory", "[http][placement]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const std::string m = model->string();
  test::daemon_process d("[server]\nport = 0\n[runtime]\ndevices = [\"CPU\", \"CPU1\"]\ncpu_instances = 1\n"
                         "[[model]]\nname = \"stories\"\npath = \"" + m + "\"\nn_ctx = 256\nchat_template = \"raw\"\nplacement = \"auto\"\n"
                         "[[model]]\nname = \"local\"\npath = \"" + m + "\"\nn_ctx = 256\nchat_template = \"raw\"\n");
  // CPU and CPU1 share the host's free memory: the layers and the output split between them.
  std::smatch mt;
  const std::string log = d.log();
  REQUIRE(std::regex_search(log, mt, std::regex("-ngl auto: layers by free memory: CPU ([0-9]) \\([0-9]+ MiB\\), CPU1 ([0-9]) ")));
  CHECK(std::stoi(mt[1]) + std::stoi(mt[2]) == 6);
  const answer ref = complete(d.port(), "local");
  REQUIRE(ref.status == 200);
  const answer got = complete(d.port(), "stories");
  CHECK(got.status == 200);
  CHECK(got.text == ref.text);
}

TEST_CASE("cluster TLS files are checked before CAF reads them, naming the option and the file", "[cluster][tls]") {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-cluster-tls-files-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  test::make_certificate(dir, "a");
  test::make_certificate(dir, "b");
  std::ofstream(dir / "junk.pem") << "not a certificate\n";
  const std::array<std::string, 3> names{"--tls-cert", "--tls-key", "--tls-ca"};
  const auto f = [&](const char* n) { return (dir / n).string(); };
  const auto use = [&](cluster::tls_files t) { cluster::check_tls_files(t, names); };
  CHECK_NOTHROW(use({f("a.pem"), f("a.key"), f("b.pem")}));
  CHECK_THROWS_WITH(use({f("a.pem"), "", f("a.pem")}), Catch::Contains("--tls-key is missing"));
  CHECK_THROWS_WITH(use({f("none.pem"), f("a.key"), f("a.pem")}), Catch::Contains("--tls-cert '" + f("none.pem") + "' is not a readable file"));
  CHECK_THROWS_WITH(use({f("junk.pem"), f("a.key"), f("a.pem")}), Catch::Contains("--tls-cert '" + f("junk.pem") + "' is not a PEM certificate chain"));
  CHECK_THROWS_WITH(use({f("a.pem"), f("b.key"), f("a.pem")}), Catch::Contains("--tls-key '" + f("b.key") + "' is not the key of --tls-cert"));
  CHECK_THROWS_WITH(use({f("a.pem"), f("a.key"), f("junk.pem")}), Catch::Contains("--tls-ca '" + f("junk.pem") + "'"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("mutual TLS on the cluster port: a node with a certificate the cluster's CA trusts joins and holds a placed model over TLS RPC, while a plain node and one with another certificate never join", "[cluster][process][placement][tls]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-cluster-tls-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  test::make_certificate(dir, "cluster");
  test::make_certificate(dir, "other");
  std::ofstream(dir / "cluster.secret") << "0123456789abcdef0123456789abcdef\n";
  const auto f = [&](const char* n) { return (dir / n).string(); };
  const std::string tls = "key_file = \"" + f("cluster.secret") + "\"\ntls_cert = \"" + f("cluster.pem") + "\"\ntls_key = \"" +
                          f("cluster.key") + "\"\ntls_ca = \"" + f("cluster.pem") + "\"\ndown_after_ms = 4000\n";
  test::daemon_process d(placement_config(model->string(), tls, ""), {}, false);
  REQUIRE(d.wait_for_log("cluster coordinator on", 60s));
  CHECK(d.wait_for_log("key: shared; mutual TLS", 1s));
  const uint16_t cport = coordinator_port(d);
  const std::vector<std::string> key = {"--auth-key-file", f("cluster.secret")};
  auto with = [&](std::vector<std::string> a, std::vector<std::string> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  node_process plain(node_args(cport, "plain", key));
  node_process other(node_args(cport, "other", with(key, {"--tls-cert", f("other.pem"), "--tls-key", f("other.key"), "--tls-ca", f("cluster.pem")})));
  node_process member(node_args(cport, "member", with(key, {"--tls-cert", f("cluster.pem"), "--tls-key", f("cluster.key"), "--tls-ca", f("cluster.pem")})));
  const int port = http_port_when_ready(d);
  const json cl = cluster_at(port);  // the model was placed on it before the daemon was ready
  REQUIRE(is_up(cl, "member"));
  CHECK(node_named(cl, "member")["rpc_tls"] == true);
  CHECK_THAT(d.log(), Catch::Contains("(node member)"));
  const answer ref = complete(port, "local");
  REQUIRE(ref.status == 200);
  const answer got = complete(port, "stories");
  CHECK(got.status == 200);
  CHECK(got.text == ref.text);
  // The handshakes of the other two failed (they keep trying, as a node does while its coordinator is away),
  // each logged with the address; the member's connection is not touched by them: still epoch 1.
  CHECK(wait_until([&] { return plain.output().find("does not answer") != std::string::npos; }));
  CHECK(wait_until([&] { return other.output().find("does not answer") != std::string::npos; }));
  CHECK(d.wait_for_log("cluster TLS: refused a connection from 127.0.0.1:", 10s));
  std::this_thread::sleep_for(2s);  // more failed attempts (one a second from each)
  const json after = cluster_at(port);
  CHECK(node_named(after, "plain").is_null());
  CHECK(node_named(after, "other").is_null());
  CHECK(after["nodes"].size() == 1);
  CHECK(is_up(after, "member", 1));
  CHECK_THAT(d.log(), !Catch::Contains("is down"));
  CHECK(complete(port, "stories").text == ref.text);
  // SIGTERM stops a node (status 0), however many threads it runs (its tunnel's, the BLAS library's).
  member.signal(SIGTERM);
  CHECK(member.wait_exit(10s) == 0);
  plain.signal(SIGTERM);
  CHECK(plain.wait_exit(10s) == 0);
  std::filesystem::remove_all(dir);
}

TEST_CASE("the embedding API coordinates a cluster: a cluster_engine places a model over a node process, answers as its own CPU, and places it again by itself when the node is killed", "[cluster][process][placement][embed]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  actors::runtime_config rc;
  rc.devices = {"CPU"};
  cluster::cluster_engine ce(rc, {.port = 0,
                                  .heartbeat = std::chrono::milliseconds(100),
                                  .down_after = std::chrono::milliseconds(4000),
                                  .coordinator_devices = false});
  REQUIRE(ce.port() != 0);
  node_process a(node_args(ce.port(), "a"));
  ce.keep_placed();
  actors::model_settings local;
  local.name = "local";
  local.path = model->string();
  local.n_ctx = 256;
  actors::model_settings placed = local;
  placed.name = "stories";
  placed.placement = "cluster";
  ce.load_model(local);
  ce.load_model(placed);  // waits for one node
  const auto answer_of = [&](const std::string& m) {
    session s = ce.engine().open_session(m);
    return s.generate("Once upon a time", actors::generation_params::greedy(16)).tokens;
  };
  const std::vector<int32_t> ref = answer_of("local");
  REQUIRE(ref.size() == 16);
  CHECK(answer_of("stories") == ref);
  const cluster::cluster_view v = ce.view();
  REQUIRE(v.nodes.size() == 1);
  CHECK(v.nodes[0].name == "a");
  CHECK(v.nodes[0].state == "up");
  // Its layers are on the node: the engine's peer named after it holds the model.
  const actors::runtime_status st = ce.engine().status();
  REQUIRE(st.peers.size() == 1);
  CHECK(st.peers[0].name == "a");
  CHECK(std::find(st.peers[0].models.begin(), st.peers[0].models.end(), "stories") != st.peers[0].models.end());

  // a killed, b joins: the engine places the model on b by itself, and it answers the same.
  node_process b(node_args(ce.port(), "b"));
  REQUIRE(wait_until([&] { return ce.view().nodes.size() == 2; }));
  a.kill9();
  REQUIRE(wait_until([&] { return ce.recoveries() == 1; }, 30s));
  std::vector<int32_t> again;
  CHECK(wait_until([&] {
    try {
      again = answer_of("stories");
    } catch (const std::exception&) {
      return false;
    }
    return true;
  }, 10s));
  CHECK(again == ref);
  const actors::runtime_status after = ce.engine().status();
  const auto on_b = std::find_if(after.peers.begin(), after.peers.end(), [](const actors::peer_status& p) { return p.name == "b"; });
  REQUIRE(on_b != after.peers.end());
  CHECK(std::find(on_b->models.begin(), on_b->models.end(), "stories") != on_b->models.end());
}
