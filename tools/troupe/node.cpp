// troupe node: serve this machine's devices over net/rpc (as `troupe peer` does) and join a cluster's
// coordinator (`troupe serve` with a [cluster] table) over CAF's middleman, with their inventory; rejoin
// whenever the coordinator comes back.
//
//   troupe node --join 10.0.0.1:7070 --key-file cluster.key --name box-2 --host 0.0.0.0 --advertise 10.0.0.2
//
// The first line printed names the node's RPC address; each join prints "troupe node: joined ... (id N,
// epoch E)". With --tls-ca the join goes over mutual TLS (net/cluster/tls.h): the node presents --tls-cert
// and checks the coordinator's against the CA and the --join host. A refused join (a wrong key, a malformed inventory) ends it with status 1. SIGINT or SIGTERM
// stop it.
#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "actors/type_ids.h"
#include "net/cluster/coordinator.h"
#include "net/cluster/node.h"
#include "net/cluster/tls.h"
#include "net/cluster/type_ids.h"
#include "backends/rpc/client_options.h"
#include "backends/rpc/wire/auth.h"
#include "runtime/error.h"
#include "tools/troupe/commands.h"
#include "tools/troupe/peer_options.h"

namespace troupe::cli {
namespace {

struct node_options {
  peer_options peer;          // the RPC server (--host, --port, --device, --auth-key-file, -t ...)
  std::string join;           // HOST:PORT of the coordinator
  std::string name;           // default: the host name
  std::string advertise;      // the RPC host in the inventory; default: --host
  std::string cluster_key_file;  // default: --auth-key-file (one key for both)
  std::string tls_ca;            // the cluster's CA: the join over mutual TLS with --tls-cert / --tls-key
};

// HOST:PORT ("[v6 address]:PORT" too) as rpc::split_endpoint reads it, with this command's messages.
std::pair<std::string, uint16_t> split_address(const std::string& a) {
  rpc::endpoint e = rpc::split_endpoint(a);
  if (e.error == rpc::endpoint::fault::form) throw error("'" + a + "' is not HOST:PORT");
  if (e.error != rpc::endpoint::fault::none) throw error("'" + e.port_text + "' is not a port (1-65535)");
  return {std::move(e.host), e.port};
}

std::vector<cluster::node_device> inventory_of(const std::vector<device_i*>& devices) {
  std::vector<cluster::node_device> out;
  for (device_i* d : devices) {
    const device_memory m = d->memory();
    out.push_back({std::string(d->name()), d->description(), std::string(device_type_name(d->type())), m.total, std::min(m.free, m.total),
                   d->buffer_type().max_size()});
  }
  return out;
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0 || buf[0] == '\0') return "node";
  std::string s(buf);
  for (char& c : s) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_' && c != '.') c = '-';
  }
  return s.substr(0, 64);
}

// Set by SIGINT / SIGTERM. A handler, not only a blocked mask and sigwait: threads started before
// run_node (the BLAS library's, a device driver's) do not block the signals, and one of them taking it with
// the default action would end the process at once (status 143) instead of stopping the node.
std::atomic<bool> stop_requested{false};
static_assert(std::atomic<bool>::is_always_lock_free);

extern "C" void on_stop_signal(int) { stop_requested.store(true); }

int run_node(const node_options& o) {
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::atomic<bool>& stopping = stop_requested;

  std::pair<std::string, uint16_t> coordinator_address;
  try {
    coordinator_address = split_address(o.join);
  } catch (const error& e) {
    throw error(std::string("--join: ") + e.what());
  }
  const auto& [coord_host, coord_port] = coordinator_address;
  const std::string key_file = o.cluster_key_file.empty() ? o.peer.key_file : o.cluster_key_file;
  const std::string key = key_file.empty() ? std::string() : rpc::load_key_file(key_file);
  caf::actor_system_config cfg;
  actors::add_message_types(cfg);
  cluster::add_message_types(cfg);
  cfg.load<caf::io::middleman>();
  cfg.set("logger.verbosity", caf::atom("quiet"));
  const bool tls = !o.tls_ca.empty();
  const cluster::tls_files tls_files{o.peer.server.tls_cert.string(), o.peer.server.tls_key.string(), o.tls_ca};
  if (tls) cluster::check_tls_files(tls_files, {"--tls-cert", "--tls-key", "--tls-ca"});
  const rpc::peer_server_options so = server_options_for(o.peer, "node");
  rpc::peer_server srv(so);
  srv.start();
  cluster::node_inventory inv;
  inv.name = o.name.empty() ? host_name() : o.name;
  inv.rpc_host = o.peer.server.host;
  inv.rpc_port = srv.port();
  inv.rpc_tls = srv.tls();
  if (!o.advertise.empty()) {  // HOST, or HOST:PORT (a forwarded port, a proxy)
    const auto colon = o.advertise.rfind(':');
    if (colon != std::string::npos && o.advertise.find(':') == colon) {
      inv.rpc_host = o.advertise.substr(0, colon);
      try {
        inv.rpc_port = split_address("x:" + o.advertise.substr(colon + 1)).second;
      } catch (const error& e) {
        throw error(std::string("--advertise: ") + e.what());
      }
    } else {
      inv.rpc_host = o.advertise;
    }
  }
  inv.devices = inventory_of(so.devices);
  if (const std::string bad = cluster::check_inventory(inv); !bad.empty()) throw error("node: " + bad);
  std::printf("troupe node: '%s' serving on %s (%zu device(s)%s), joining %s%s\n", inv.name.c_str(), srv.address().c_str(),
              inv.devices.size(), inv.rpc_tls ? ", TLS" : "", o.join.c_str(), tls ? " over TLS" : "");
  std::fflush(stdout);

  caf::actor_system sys{cfg};
  // With --tls-ca the middleman connects to a tunnel on 127.0.0.1 that goes on to the coordinator over TLS.
  const std::unique_ptr<cluster::tls_tunnel> tunnel = tls ? cluster::tls_tunnel::client(tls_files, coord_host, coord_port) : nullptr;
  int status = 0;
  bool said_waiting = false;
  while (!stopping) {
    auto coord = tunnel ? sys.middleman().remote_actor<cluster::coordinator_actor>("127.0.0.1", tunnel->port())
                        : sys.middleman().remote_actor<cluster::coordinator_actor>(coord_host, coord_port);
    if (!coord) {
      if (!said_waiting) {
        const std::string why = tunnel && !tunnel->last_error().empty() ? tunnel->last_error() : sys.render(coord.error());
        std::printf("troupe node: the coordinator at %s does not answer (%s); trying every second\n", o.join.c_str(),
                    why.c_str());
        std::fflush(stdout);
        said_waiting = true;
      }
      for (int i = 0; i < 10 && !stopping; ++i) std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    said_waiting = false;
    cluster::node_params np;
    np.key = key;
    np.inventory = inv;
    np.refresh = [devices = so.devices] { return inventory_of(devices); };
    np.on_joined = [&](const cluster::join_accept& a) {
      std::printf("troupe node: joined the cluster at %s as '%s' (id %llu, epoch %llu)\n", o.join.c_str(), inv.name.c_str(),
                  static_cast<unsigned long long>(a.node_id), static_cast<unsigned long long>(a.epoch));
      std::fflush(stdout);
    };
    const cluster::join_outcome out = cluster::run_node(sys, *coord, np, [&] { return stopping.load(); });
    if (stopping) break;
    std::printf("troupe node: %s: %s\n", out.joined ? "left the cluster" : "join failed", out.why.c_str());
    std::fflush(stdout);
    if (out.refused) {
      status = 1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  srv.stop();
  return status;
}

}  // namespace

command_fn add_node(CLI::App& app) {
  auto o = std::make_shared<node_options>();
  o->peer.server.port = 0;
  app.add_option("--join", o->join, "the coordinator to join, HOST:PORT (troupe serve's [cluster] port)")->required();
  app.add_option("--name", o->name, "this node's name in the cluster (default: the host name)");
  app.add_option("--advertise", o->advertise,
                 "HOST or HOST:PORT that others reach this node's RPC server at (default: --host and the bound port)");
  app.add_option("--key-file,--cluster-key-file", o->cluster_key_file, "the cluster's shared key (default: --auth-key-file)");
  app.add_option("--host", o->peer.server.host, "address the RPC server listens on (anything but loopback needs a key)");
  app.add_option("--port", o->peer.server.port, "the RPC server's TCP port (0: any free port)");
  app.add_option("--device", o->peer.devices, "devices to serve: cpu, vulkan or cuda (repeatable; default: all)");
  app.add_option("--cache-dir", o->peer.server.cache_dir, "keep uploaded weights (10 MiB and more) here, by hash");
  app.add_option("--auth-key-file", o->peer.key_file, "the key RPC clients must know (and the cluster's, by default)");
  app.add_option("--tls-cert", o->peer.server.tls_cert, "PEM certificate chain: RPC over TLS (with --tls-key)");
  app.add_option("--tls-key", o->peer.server.tls_key, "PEM private key for --tls-cert");
  app.add_option("--tls-ca", o->tls_ca,
                 "the cluster's CA (PEM): join over mutual TLS, presenting --tls-cert (the coordinator's [cluster] tls_*)");
  app.add_flag("--insecure", o->peer.server.insecure, "allow a non-loopback RPC address without a key");
  app.add_option("-t,--threads", o->peer.threads, "CPU threads per client graph (0: all)");
  return [o] { return run_node(*o); };
}

}  // namespace troupe::cli
