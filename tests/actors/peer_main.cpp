// actors_peer: the other process of tests/actors/test_remote.cpp. It embeds troupe's actors in its own CAF
// actor system (devices CPU and CPU1), publishes the supervisor on 127.0.0.1 (an ephemeral port), prepares
// in-process objects that messages refer to by id (a decode split task, a graph, a staged load), prints
//
//   port <n>
//   split <id>
//   graph <id>
//   load <id>
//   peer_port <n>     (a remote-peer actor, published on its own port, connected to an rpc::peer_server here)
//   ready
//
// and serves until its standard input closes (the test holds the other end; it closes when the test ends,
// however it ends) or the process that started it is gone. No wall-clock limit: a test that takes long on a
// busy machine must not lose its peer half-way.
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <poll.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>

#include "actors/peer_actor.h"
#include "actors/engine.h"
#include "backends/cpu/cpu_backend.h"
#include "net/rpc/peer_server.h"
#include "runtime/ops.h"

using namespace troupe;

int main() {
  const pid_t parent = getppid();
  caf::actor_system_config cfg;
  actors::add_message_types(cfg);
  cfg.load<caf::io::middleman>();
  cfg.set("scheduler.max-threads", 2);
  caf::actor_system sys{cfg};
  int rc = 0;
  {
    engine eng(sys, {.devices = {"CPU", "CPU1"}, .cpu_instances = 1, .n_threads = 1});
    const auto port = sys.middleman().publish(eng.supervisor(), 0, "127.0.0.1", true);
    if (!port) {
      std::fprintf(stderr, "actors_peer: publish failed: %s\n", sys.render(port.error()).c_str());
      return 1;
    }

    // A split task of this process, as a model context's pipeline registers one: the device actor CPU1 of
    // this process runs it when asked by id (decode_split), whichever process asks.
    std::atomic<int> split_runs{0};
    const std::function<void()> split_work = [&] { ++split_runs; };
    auto split = std::make_shared<actors::split_task>();
    split->work = &split_work;
    split->device = "CPU1";
    const uint64_t split_id = eng.env()->objects.put(split);

    context gctx({.max_tensors = 8, .no_alloc = true});
    tensor* x = gctx.new_tensor_2d(type::f32, 256, 4);
    x->flags |= flag_input;
    auto g = std::make_shared<graph>();
    g->build_forward_expand(scale(gctx, rms_norm(gctx, x, 1e-5f), 3.0f));
    const uint64_t graph_id = eng.env()->objects.put(g);

    auto load = std::make_shared<actors::staged_load>();
    load->model = "staged";
    load->opened = llm::model::open(TROUPE_TEST_MODEL_DIR "/stories260K.gguf",
                                    {.devices = {{registry::instance().find("CPU1"), 5}}});
    load->job = std::make_unique<load_job>(load->opened->loader().begin(load->opened->plan(), {}));
    const uint64_t load_id = eng.env()->objects.put(load);

    // A tensor RPC server in this process and a remote-peer actor connected to it.
    rpc::peer_server rpc_srv({.host = "127.0.0.1", .port = 0, .devices = {&cpu::cpu_device()}});
    rpc_srv.start();
    actors::peer_params loopback;
    loopback.name = "loopback";
    loopback.host = "127.0.0.1";
    loopback.port = rpc_srv.port();
    loopback.health_interval = std::chrono::milliseconds(200);
    const actors::peer_actor peer = actors::spawn_peer_actor(sys, loopback);
    const auto peer_port = sys.middleman().publish(peer, 0, "127.0.0.1", true);
    if (!peer_port) {
      std::fprintf(stderr, "actors_peer: publishing the peer actor failed: %s\n", sys.render(peer_port.error()).c_str());
      return 1;
    }

    std::printf("port %u\nsplit %llu\ngraph %llu\nload %llu\npeer_port %u\nready\n", static_cast<unsigned>(*port),
                static_cast<unsigned long long>(split_id), static_cast<unsigned long long>(graph_id),
                static_cast<unsigned long long>(load_id), static_cast<unsigned>(*peer_port));
    std::fflush(stdout);

    // Serve until stdin closes (end of file or an error) or the parent is gone (this process was handed to
    // another: the test died and something else holds the pipe's other end). The poll's timeout only paces
    // that second check.
    for (;;) {
      if (getppid() != parent) {
        std::fprintf(stderr, "actors_peer: the test process is gone; ending\n");
        rc = 2;
        break;
      }
      pollfd p{STDIN_FILENO, POLLIN, 0};
      const int n = poll(&p, 1, 200);
      if (n < 0 && errno != EINTR) break;
      if (n > 0) {
        char buf[64];
        if (read(STDIN_FILENO, buf, sizeof buf) <= 0) break;
      }
    }
    caf::anon_send_exit(peer, caf::exit_reason::user_shutdown);
    eng.env()->objects.erase(split_id);
    eng.env()->objects.erase(graph_id);
    eng.env()->objects.erase(load_id);
  }
  return rc;
}
