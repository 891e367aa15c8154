// The daemon's configuration (`troupe serve --config FILE`): the engine and its models (actors/
// engine_config.h: [runtime], [[model]], [[peer]]) plus the HTTP server and logging:
//
//   [server]
//   host = "127.0.0.1"            # address to listen on
//   port = 8080                   # 0: any free port (printed at startup)
//   api_keys = []                 # accepted bearer keys; empty (and no api_key_file): no authentication
//   api_key_file = ""             # a file with one key per line (added to api_keys)
//   http_threads = 0              # threads that answer completions; 0: parallel sessions + queue_limit + 4
//   io_threads = 2                # event-loop threads: every connection's reads and writes
//   max_connections = 4096        # open connections at once; one more is answered 503 and closed
//   header_timeout_s = 10         # a request's header must arrive within this
//   keep_alive_timeout_s = 5      # an idle keep-alive connection is closed after this
//   keep_alive_max = 1000         # requests per connection
//   queue_limit = 64              # requests waiting for a free session; more get 503
//   queue_timeout_s = 60          # longest wait for a free session (then 503)
//   request_timeout_s = 600       # longest generation; 0: none (then the answer ends with "length")
//   read_timeout_s = 30           # a request's body must arrive within this
//   write_timeout_s = 30          # each write of a response must be taken within this
//   max_body_bytes = 8388608      # largest request body
//   shutdown_grace_s = 10         # on SIGTERM/SIGINT: how long in-flight answers may finish before cancel
//   models_dir = ""               # every *.gguf in this folder is a model named by its file (loaded on demand)
//   memory_budget_mib = 0         # what the models may hold on each device (MiB), or per device:
//                                 #   { CPU = 4096, Vulkan0 = 6144 }; 0 / absent: what the device reports free
//   load_timeout_s = 600          # longest wait of a request for its model to load (then 503)
//
//   [logging]
//   level = "info"                # debug, info, warn, error
//   access_log = true             # one line per HTTP request
//
//   [cluster]                     # present: this daemon is a cluster's coordinator (docs/cluster.md)
//   host = "127.0.0.1"            # where `troupe node --join` reaches it (anything but loopback needs key_file)
//   port = 7070                   # 0: any free port (printed at startup)
//   key_file = ""                 # the cluster's shared key (at least 16 bytes); relative to this file
//   tls_cert = ""                 # with tls_key and tls_ca: the cluster port over mutual TLS (nodes join with
//   tls_key = ""                  #   --tls-ca and a certificate the CA signed); the coordinator checks TLS nodes'
//   tls_ca = ""                   #   RPC servers against tls_ca too
//   heartbeat_ms = 1000           # nodes send a heartbeat this often
//   down_after_ms = 3000          # a node silent this long is down (a dropped connection is down at once)
//   coordinator_devices = true    # models with placement = "cluster" use this daemon's devices too
//   margin_mib = 512              # memory placement leaves free on each device
//   rebalance = "on_loss"         # models move when a node they use goes; "on_join": also when a node joins
//
// Every key has the default shown; unknown keys and wrong types are errors naming the file, line and key.
#pragma once

#include <cstdint>
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

#include "actors/engine_config.h"
#include "net/http/front.h"

namespace troupe::http {

// [server]: the listener's keys are front::listen_options (net/http/front.h); the rest are the daemon's.
struct server_config : front::listen_options {
  server_config() { port = 8080; }  // the daemon's port; a bare front::listen_options takes any free one
  std::vector<std::string> api_keys;
  std::string api_key_file;
  uint32_t http_threads = 0;
  uint32_t queue_limit = 64;
  uint32_t queue_timeout_s = 60;
  uint32_t request_timeout_s = 600;
  uint32_t shutdown_grace_s = 10;
  std::string models_dir;
  // Per device name ("*": every device not named), in MiB; 0: the device's free memory decides.
  std::vector<std::pair<std::string, uint64_t>> memory_budget_mib;
  uint32_t load_timeout_s = 600;
};

struct logging_config {
  std::string level = "info";
  bool access_log = true;
};

struct cluster_config {
  bool enabled = false;  // the [cluster] table is there
  std::string host = "127.0.0.1";
  uint16_t port = 7070;
  std::string key_file;
  std::string tls_cert, tls_key, tls_ca;  // all three: the cluster port over mutual TLS (net/cluster/tls.h)
  uint32_t heartbeat_ms = 1000;
  uint32_t down_after_ms = 3000;
  bool coordinator_devices = true;
  uint32_t margin_mib = 512;
  std::string rebalance = "on_loss";
};

struct daemon_config {
  actors::engine_config engine;
  server_config server;
  logging_config logging;
  cluster_config cluster;
  std::string source;  // the file it came from ("" when built from flags)
};

// Parses a daemon configuration; throws troupe::error "FILE:LINE: what" naming the key. api_key_file is
// read here (relative paths against the config file's folder, as are model paths).
daemon_config parse_daemon_config(std::string_view toml, const std::string& source = "config",
                                  const std::filesystem::path& base_dir = {});
daemon_config load_daemon_config(const std::filesystem::path& path);

// Checks what parsing cannot: at least one model (or a models_dir), unique model names, model files that
// exist, a known log level. Throws troupe::error naming the model and the file.
void validate_daemon_config(const daemon_config& c);

// The models of server.models_dir (every regular *.gguf file, sorted by name, named by the file without
// ".gguf", loaded on demand), less those whose name a [[model]] table or alias already takes. Throws
// troupe::error when the folder cannot be read.
std::vector<actors::model_settings> models_in_dir(const daemon_config& c);

}  // namespace troupe::http
