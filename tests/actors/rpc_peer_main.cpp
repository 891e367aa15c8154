// rpc_peer: a peer server process for tests/actors/test_peer.cpp: the same rpc::peer_server `troupe peer` runs
// (tools/troupe/peer.cpp is a command-line front end over it), serving the CPU with one thread on
// 127.0.0.1, without depending on the troupe command's build. Usage: rpc_peer PORT (0: ephemeral). Prints
//
//   listening on 127.0.0.1:PORT
//
// and serves until SIGTERM/SIGINT (the tests SIGSTOP and SIGKILL it), at most 300 s.
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <exception>

#include "backends/cpu/cpu_backend.h"
#include "net/rpc/peer_server.h"

using namespace troupe;

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: rpc_peer PORT\n");
    return 2;
  }
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  try {
    rpc::peer_server_options so;
    so.host = "127.0.0.1";
    so.port = static_cast<uint16_t>(std::atoi(argv[1]));
    so.devices = {&cpu::cpu_device()};
    so.make_backend = [](device_i&) -> backend_ptr { return cpu::make_cpu_backend({.n_threads = 1}); };
    rpc::peer_server srv(so);
    srv.start();
    std::printf("listening on %s\n", srv.address().c_str());
    std::fflush(stdout);
    timespec limit{300, 0};
    sigtimedwait(&sigs, nullptr, &limit);
    srv.stop();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rpc_peer: %s\n", e.what());
    return 1;
  }
  return 0;
}
