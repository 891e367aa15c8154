// The peer server's options, shared by `troupe peer` and `troupe node` (which serves its devices the same way).
#pragma once

#include <algorithm>
#include <cctype>
#include <string>
#include <vector>

#include "backends/registry.h"
#include "net/rpc/peer_server.h"
#include "runtime/error.h"

namespace troupe::cli {

// The flags of `troupe peer` and `troupe node`: the server's own options (bound to their flags as they are),
// and what the command line gives in another form (device kinds, a key file, threads, microseconds).
struct peer_options {
  rpc::peer_server_options server;   // host, port, cache_dir, tls_cert, tls_key, insecure, io_threads, max_connections
  std::vector<std::string> devices;  // cpu, vulkan, cuda; empty: every device
  std::string key_file;
  int threads = 0;
  int busy_poll_us = 2000;
  int test_graph_delay_ms = 0;  // tests only (hidden flag): each graph sleeps this long first
  peer_options() { server.port = 50052; }
};

inline std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}

inline std::vector<device_i*> pick_devices(const std::vector<std::string>& kinds) {
  std::vector<device_i*> all = registry::instance().devices();
  if (kinds.empty()) return all;
  std::vector<device_i*> out;
  for (const std::string& k : kinds) {
    const std::string want = lower(k);
    size_t found = 0;
    for (device_i* d : all) {
      const bool match = want == "cpu" ? d->type() == device_type::cpu : lower(std::string(d->name())).rfind(want, 0) == 0;
      if (match && std::find(out.begin(), out.end(), d) == out.end()) {
        out.push_back(d);
        ++found;
      }
    }
    if (found == 0) throw error("no " + k + " device in this build or on this machine");
  }
  return out;
}

// The server's options for o: its devices, a backend per device, the key read from its file. Throws error for a
// non-loopback host without a key (unless o.insecure), naming `who` ("peer", "node").
rpc::peer_server_options server_options_for(const peer_options& o, const char* who);

}  // namespace troupe::cli
