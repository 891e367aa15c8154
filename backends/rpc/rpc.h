// Remote peers as local devices: connect to a `troupe peer` server and register its devices.
//
//   auto devs = rpc::add_peer("10.0.0.2:50052", key);    // "RPC[10.0.0.2:50052]#0", ... in the registry
//   auto m = llm::model::load(path, {.devices = {{devs[0], 99}}});   // every layer on the peer
//   llm::llm_context ctx(*m);                            // the scheduler runs those layers there
//
// Not part of register_builtin_backends(): there are no peers by default. A remote device's memory is not
// host memory (the scheduler copies inputs in and results out through set/get tensor), and a remote CPU
// reports device_type::accel, since to this process it behaves like an accelerator.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "backends/rpc/rpc_client.h"
#include "runtime/backend.h"

namespace troupe::rpc {

// Connects to "host:port", says hello, and registers every device the peer serves in troupe::registry as
// "RPC[host:port]#i" (a device already registered under that name is kept). Returns them in the peer's order.
// Throws backend_error when the peer cannot be reached or refuses the connection.
std::vector<device_i*> add_peer(const std::string& endpoint, const std::string& key = {});
// The same over a client the caller made (and may mark down, reconnect...: the remote-peer actor); connects
// it first when it is not connected. Devices already registered under a name keep their own client.
std::vector<device_i*> add_peer(std::shared_ptr<client> c);

// The connection behind a remote device (for statistics, health checks and reconnecting), or null when dev
// is not a remote device.
std::shared_ptr<client> client_of(const device_i& dev);
// The peer's index of a remote device, or -1.
int remote_index(const device_i& dev);

}  // namespace troupe::rpc
