// troupe peer: serve this machine's devices to troupe clients (rpc::add_peer on the other side).
//
//   troupe peer --host 127.0.0.1 --port 50052
//   troupe peer --host 0.0.0.0 --port 50052 --auth-key-file key --tls-cert cert.pem --tls-key key.pem
//
// Binding to an address that is not loopback needs --auth-key-file (a shared key, at least 16 bytes) unless
// --insecure is given. The first line printed names the address (with the bound port when --port 0).
// SIGINT or SIGTERM stop it: every connection is closed and its buffers freed.
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/rpc/wire/auth.h"
#include "net/rpc/peer_server.h"
#include "runtime/error.h"
#include "tools/troupe/commands.h"
#include "tools/troupe/peer_options.h"

namespace troupe::cli {

rpc::peer_server_options server_options_for(const peer_options& o, const char* who) {
  rpc::peer_server_options so = o.server;
  so.devices = pick_devices(o.devices);
  so.make_backend = [threads = o.threads](device_i& d) -> backend_ptr {
    if (&d == &cpu::cpu_device()) return cpu::make_cpu_backend({.n_threads = threads});
    return d.init_backend();
  };
  if (!o.key_file.empty()) so.key = rpc::load_key_file(o.key_file);
  so.busy_poll = std::chrono::microseconds(o.busy_poll_us);
  so.graph_delay = std::chrono::milliseconds(o.test_graph_delay_ms);
  if (!so.insecure && so.key.empty() && !rpc::is_loopback_host(so.host)) {
    throw error(std::string(who) + ": refusing to listen on " + so.host + " without --auth-key-file: anyone who can "
                "reach it could use this machine. Give --auth-key-file FILE (and, on a network you do not control, "
                "--tls-cert and --tls-key), or --insecure to accept the risk");
  }
  if (so.insecure && so.key.empty() && !rpc::is_loopback_host(so.host)) {
    std::fprintf(stderr, "troupe %s: WARNING: serving %s without authentication: anyone who can reach it can "
                         "use this machine\n", who, so.host.c_str());
  }
  return so;
}

namespace {

int run_peer(const peer_options& o) {
  // Signals are taken by sigwait below: block them before any thread starts, so every thread inherits it.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  const rpc::peer_server_options so = server_options_for(o, "peer");
  rpc::peer_server srv(so);
  srv.start();
  std::string names;
  for (device_i* d : so.devices) names += (names.empty() ? "" : ", ") + std::string(d->name());
  std::printf("troupe peer: listening on %s (devices: %s; auth: %s; tls: %s; cache: %s)\n", srv.address().c_str(),
              names.c_str(), so.key.empty() ? "off" : "shared key", srv.tls() ? "on" : "off",
              so.cache_dir.empty() ? "none" : so.cache_dir.c_str());
  std::fflush(stdout);
  int sig = 0;
  sigwait(&sigs, &sig);
  std::printf("troupe peer: %s, stopping\n", sig == SIGINT ? "interrupted" : "terminated");
  std::fflush(stdout);
  srv.stop();
  return 0;
}

}  // namespace

command_fn add_peer(CLI::App& app) {
  auto o = std::make_shared<peer_options>();
  app.add_option("--host", o->server.host, "address to listen on (anything but loopback needs --auth-key-file)");
  app.add_option("--port", o->server.port, "TCP port (0: any free port, printed at start)");
  app.add_option("--device", o->devices, "devices to serve: cpu, vulkan or cuda (repeatable; default: all)");
  app.add_option("--cache-dir", o->server.cache_dir, "keep uploaded weights (10 MiB and more) here, by hash");
  app.add_option("--auth-key-file", o->key_file, "file holding the shared key clients must know");
  app.add_option("--tls-cert", o->server.tls_cert, "PEM certificate chain: serve over TLS (with --tls-key)");
  app.add_option("--tls-key", o->server.tls_key, "PEM private key for --tls-cert");
  app.add_flag("--insecure", o->server.insecure, "allow a non-loopback address without an auth key");
  app.add_option("-t,--threads", o->threads, "CPU threads per client graph (0: all)");
  app.add_option("--io-threads", o->server.io_threads, "threads running client graphs (a control thread of its own answers health probes)");
  app.add_option("--busy-poll-us", o->busy_poll_us,
                 "poll a lone connection's socket this long for the next request before sleeping (0: never)")
      ->check(CLI::Range(0, 1000000));
  app.add_option("--max-connections", o->server.max_connections, "connections served at once");
  // Tests only: a graph slower than any health timeout, whatever the machine (hidden from --help).
  app.add_option("--test-graph-delay-ms", o->test_graph_delay_ms, "each graph sleeps this long first (tests)")
      ->check(CLI::Range(0, 600000))
      ->group("");
  return [o] { return run_peer(*o); };
}

}  // namespace troupe::cli
