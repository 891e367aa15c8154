// The configuration of an embedded troupe runtime: which devices get actors, CPU device instances, threads,
// supervision, and models to load at start. From code (a struct) or from a TOML file:
//
//   [runtime]
//   devices = ["CPU", "CPU1"]      # devices to run actors for (default: "CPU", every local GPU such as
//                                  # "Vulkan0", and every CPU instance)
//   cpu_instances = 1              # extra CPU device instances CPU1..N (backends/cpu_instance.h)
//   cpu_instance_memory = 0        # bytes each instance may hold; 0: unbounded
//   threads = 2                    # CPU threads of device backends; 0: all
//   caf_threads = 0                # CAF worker threads; 0: CAF's default (one per core)
//   caf_policy = "sharing"         # CAF scheduler: "sharing" (idle workers sleep) or "stealing" (they poll)
//   max_restarts = 3               # restarts of a failed device actor before it is marked down
//   flush_delay_us = 2000          # longest wait of a scheduler for other sessions' steps
//   dispatch_splits = true         # decode graph splits run on their device actors' threads (false: on the
//                                  # model's decoder actor's thread)
//   reload_on_peer_reconnect = true  # a model whose weights were on a peer that reconnected is loaded again
//
//   [[model]]                      # the fields of actors::model_settings (model_settings.h)
//   name = "stories"
//   path = "models/stories260K.gguf"
//   n_ctx = 2048                   # cells shared by the model's sessions
//   n_seq_max = 4                  # sessions at once
//   threads = 2                    # decode threads; 0: all
//   use_mmap = true
//   huge_pages = true              # host weights copied into 2 MiB pages where the kernel offers them
//   parallel = true                # upload to every device at once (false: one after another)
//   n_ctx_seq = 0                  # cells one session may use; 0: n_ctx (one pool)
//   kv_type = "f16"                # KV cache type: "f16", "f32" or "q8_0"
//   chat_template = ""             # "": the model's own; or a family ("chatml", "llama3", "raw", ...)
//   chat_template_file = ""        # a Jinja chat template used instead of the model's own
//   aliases = []                   # other names requests may use ("smollm2:135m"; NAME:latest always works)
//   devices = [{ device = "CPU1", layers = 4 }]
//   overrides = [{ pattern = "ffn_.*", device = "CPU" }]   # tensor-name regex -> device
//   cpu_moe = false                # a mixture of experts' expert weights on the CPU (after `overrides`)
//   n_cpu_moe = 0                  # ... of the first N layers only
//
// Unknown tables and keys are errors naming the key (a typo must not silently fall back to a default).
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "actors/model_settings.h"
#include "backends/rpc/client_options.h"

namespace troupe::actors {

// Reconnect backoff of a peer actor: the wait before attempt n (n >= 1 failures so far) is initial * 2^(n-1),
// at most max, shortened by a random fraction of up to `jitter` (so peers that dropped together do not retry
// together). actors/peer_actor.h: backoff_delay.
struct backoff_params {
  std::chrono::milliseconds initial{200};
  std::chrono::milliseconds max{10000};
  double jitter = 0.5;  // in [0, 1]
};

// A remote peer (`troupe peer` on another machine) whose devices this runtime may use: the connection's
// settings (rpc::client_options: name, host, port, key, tls, tls_ca_file, busy_poll, timeouts) and how its
// peer actor (actors/peer_actor.h) watches it. From code, or a [[peer]] table:
//
//   [[peer]]
//   name = "box"                   # for status and messages
//   address = "10.0.0.2:50052"     # host:port ("[::1]:50052" for IPv6)
//   key_file = "peer.key"          # the shared key (troupe peer --auth-key-file); optional
//   tls = false                    # TLS to the peer; tls_ca: CA file to verify it ("": the system's)
//   tls_ca = ""
//   busy_poll_us = 250             # how long a reply is polled for before sleeping on the socket (0: never)
//
// The peer actor reconnects by itself, with backoff: auto_reconnect is not used.
struct peer_params : rpc::client_options {
  peer_params() { connect_timeout = std::chrono::milliseconds(3000); }  // a configured peer's first attempt
  std::string key_file;                             // read into key by load_peer_key; empty: key as given
  std::chrono::milliseconds health_interval{1000};  // between health checks while up
  std::chrono::milliseconds health_timeout{2000};   // a check not answered within this fails
  backoff_params backoff;
};

// p with its key file read into key (when it names one). Throws error naming the peer and the file.
peer_params load_peer_key(peer_params p);

struct engine_config {
  std::vector<std::string> devices;  // empty: "CPU", every local GPU ("Vulkan0", ...) and every CPU instance
  int cpu_instances = 0;
  uint64_t cpu_instance_memory = 0;
  int n_threads = 0;
  int caf_threads = 0;
  // CAF's scheduler policy for an engine's own actor system. "sharing": idle workers wait on a condition
  // variable; "stealing" (CAF's default) polls for work, which on a small machine takes CPU time from the
  // decode threads between tokens (measured: ~15% slower generation on 2 cores).
  std::string caf_policy = "sharing";
  uint32_t max_restarts = 3;
  uint32_t flush_delay_us = 2000;
  bool dispatch_splits = true;
  bool reload_on_peer_reconnect = true;  // see supervisor_params::reload_on_reconnect
  std::vector<model_settings> models;  // [[model]] tables, validated (defaults not resolved yet)
  std::vector<peer_params> peers;  // [[peer]] tables, keys not read yet (actors/peer_actor.h runs one actor per peer)
};

// Parses TOML text; `source` names it in error messages. Throws troupe::error naming the key and where.
// Top-level tables named in `extra_sections` are left to the caller (the daemon's [server], [logging]).
engine_config parse_engine_config(std::string_view toml, const std::string& source = "config",
                                    const std::vector<std::string>& extra_sections = {});
engine_config load_engine_config(const std::filesystem::path& path);

}  // namespace troupe::actors
