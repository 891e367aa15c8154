// TLS on the cluster port, through CAF's caf_openssl module: mutual TLS, every side presenting a certificate
// that the other verifies against the cluster's CA (caf_openssl verifies the chain; it checks no host name,
// so the CA should sign only the cluster's certificates). One set of files per process:
//
//   cluster::tls_files t{.cert = "node.pem", .key = "node.key", .ca = "cluster-ca.pem"};
//   cluster::use_tls(cfg, t, {"--tls-cert", "--tls-key", "--tls-ca"});   // before the actor_system
//   publish_coordinator(sys, c, host, port, has_key, /*tls=*/true);       // or join_remote(sys, host, port, true)
//
// caf_openssl reads the files again for every connection and has no way to report a bad one but to throw
// in its I/O thread (which ends the process): use_tls loads them first, with the same OpenSSL calls, and
// throws error naming the option and the file.
#pragma once

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include <array>
#include <cstdint>
#include <string>

#include "net/cluster/messages.h"

namespace troupe::cluster {

struct tls_files {
  std::string cert;  // PEM certificate chain (unencrypted key below)
  std::string key;   // PEM private key, not encrypted
  std::string ca;    // PEM CA certificates the other side's certificate must chain to
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// Checks t (all three files, readable, the key unencrypted and matching the certificate, the CA loadable;
// names: the options' names for messages, in the order cert, key, ca) and loads caf_openssl into cfg with
// them. Throws error naming the option and the file. cfg must have the middleman loaded.
void use_tls(caf::actor_system_config& cfg, const tls_files& t, const std::array<std::string, 3>& names);

// The coordinator at host:port as a node joins it: over TLS when tls (the system must have use_tls's
// configuration), else plain. An error says what failed (a TLS handshake refused reads as
// "disconnect_during_handshake").
caf::expected<coordinator_actor> join_remote(caf::actor_system& sys, const std::string& host, uint16_t port, bool tls);

}  // namespace troupe::cluster
