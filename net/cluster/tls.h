// TLS on the cluster port: CAF's middleman traffic (BASP) inside mutual TLS, every side presenting a
// certificate that the other verifies against the cluster's CA (and, on a node, against the coordinator's
// host name or IP). The coordinator is published on 127.0.0.1 (any port) and reached through a server
// tunnel on the cluster port; a node joins through a client tunnel on 127.0.0.1 (any port).
//
//   cluster::tls_files t{.cert = "node.pem", .key = "node.key", .ca = "cluster-ca.pem"};
//   cluster::check_tls_files(t, {"--tls-cert", "--tls-key", "--tls-ca"});   // throws error naming the option
//   auto up = cluster::publish_coordinator_tls(sys, c, "0.0.0.0", 7070, true, t);   // the coordinator's side
//   auto tunnel = cluster::tls_tunnel::client(t, "10.0.0.1", 7070);                 // a node's side
//   sys.middleman().remote_actor<coordinator_actor>("127.0.0.1", tunnel->port());
//
// Not CAF's caf_openssl: in 0.17 it does not clear OpenSSL's per-thread error queue, so one failed
// handshake on its I/O thread (anyone connecting without the right certificate) drops every other TLS
// connection on it, and a certificate file it cannot read ends the process. The tunnels are Asio and
// OpenSSL, as the RPC server's TLS is: a failed handshake closes that connection only (and is logged with
// the address and OpenSSL's reason), a handshake must finish within 10 s.
#pragma once

#include <caf/actor_system.hpp>

#include <array>
#include <cstdint>
#include <memory>
#include <string>

#include "net/cluster/messages.h"

namespace troupe::cluster {

struct tls_files {
  std::string cert;  // PEM certificate chain
  std::string key;   // PEM private key, not encrypted
  std::string ca;    // PEM CA certificates the other side's certificate must chain to
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Checks t: all three files, readable, the key unencrypted and matching the certificate, the CA loadable.
// names: the options' names for messages, in the order cert, key, ca. Throws error naming the option and
// the file.
void check_tls_files(const tls_files& t, const std::array<std::string, 3>& names);

class tls_tunnel {
 public:
  // Accepts TLS on host:port (0: any), requiring a client certificate that chains to t.ca, and forwards each
  // connection to 127.0.0.1:inner_port. Throws error when it cannot listen or t is unusable.
  static std::unique_ptr<tls_tunnel> server(const tls_files& t, const std::string& host, uint16_t port, uint16_t inner_port);
  // Listens on 127.0.0.1 (any port); each connection to it goes on to host:port over TLS, presenting t.cert
  // and checking the server's certificate against t.ca and host.
  static std::unique_ptr<tls_tunnel> client(const tls_files& t, const std::string& host, uint16_t port);
  ~tls_tunnel();  // closes every connection and stops its thread
  tls_tunnel(const tls_tunnel&) = delete;
  tls_tunnel& operator=(const tls_tunnel&) = delete;

  uint16_t port() const;          // where it listens
  uint64_t refused() const;       // handshakes that failed
  std::string last_error() const;  // the last failed handshake or connection ("" : none)

  struct impl;

 private:
  explicit tls_tunnel(std::unique_ptr<impl> m);
  std::unique_ptr<impl> m_;
};

// The coordinator published on 127.0.0.1 and a server tunnel on host:port in front of it (the same key rule
// as publish_coordinator: a host that is not loopback needs has_key). Keep the tunnel as long as the
// coordinator serves; its port() is the cluster port.
std::unique_ptr<tls_tunnel> publish_coordinator_tls(caf::actor_system& sys, const coordinator_actor& c, const std::string& host,
                                                    uint16_t port, bool has_key, const tls_files& t);

}  // namespace troupe::cluster
