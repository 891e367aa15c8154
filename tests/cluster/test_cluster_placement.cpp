// Models placed over the cluster's nodes (`placement = "cluster"`): answers as on the CPU, moved to the
// node left when one is killed, 503 with none left, back when a node returns; a node behind a slow link;
// rebalance = on_join; placement = "auto" over the daemon's own devices; and the embedding API's
// cluster_engine doing the same by itself.
#include <catch2/catch.hpp>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>
#include <vector>

#include "net/cluster/cluster_engine.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/http/daemon_process.h"
#include "tests/support/tcp_proxy.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test::cluster_fixture;
using namespace std::chrono_literals;
using nlohmann::json;

namespace {

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

TEST_CASE("the embedding API coordinates a cluster: a cluster_engine places a model over a node process, answers as its own CPU, and places it again by itself when the node is killed", "[cluster][process][placement][embed]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  actors::engine_config rc;
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
  const actors::engine_status st = ce.engine().status();
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
  const actors::engine_status after = ce.engine().status();
  const auto on_b = std::find_if(after.peers.begin(), after.peers.end(), [](const actors::peer_status& p) { return p.name == "b"; });
  REQUIRE(on_b != after.peers.end());
  CHECK(std::find(on_b->models.begin(), on_b->models.end(), "stories") != on_b->models.end());
}
