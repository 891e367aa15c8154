#include "net/cluster/tls.h"

#include <caf/io/middleman.hpp>
#include <caf/openssl/manager.hpp>
#include <caf/openssl/remote_actor.hpp>

#include <openssl/err.h>
#include <openssl/ssl.h>

#include <filesystem>
#include <memory>

#include "runtime/error.h"

namespace troupe::cluster {

namespace {

std::string ssl_errors() {
  std::string out;
  while (const unsigned long e = ERR_get_error()) {
    char buf[256];
    ERR_error_string_n(e, buf, sizeof buf);
    if (!out.empty()) out += "; ";
    out += buf;
  }
  return out.empty() ? "no detail from OpenSSL" : out;
}

// An encrypted key would make OpenSSL ask on the terminal (caf_openssl takes a passphrase from its
// configuration only): refused here instead.
int no_passphrase(char*, int, int, void*) { return 0; }

}  // namespace

void use_tls(caf::actor_system_config& cfg, const tls_files& t, const std::array<std::string, 3>& names) {
  const std::array<const std::string*, 3> files{&t.cert, &t.key, &t.ca};
  for (size_t i = 0; i < 3; ++i) {
    if (files[i]->empty()) {
      throw error("cluster TLS: " + names[i] + " is missing (TLS on the cluster port needs " + names[0] + ", " + names[1] +
                  " and " + names[2] + ")");
    }
    std::error_code ec;
    if (!std::filesystem::is_regular_file(*files[i], ec)) {
      throw error("cluster TLS: " + names[i] + " '" + *files[i] + "' is not a readable file");
    }
  }
  ERR_clear_error();
  const std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> ctx(SSL_CTX_new(TLS_method()), SSL_CTX_free);
  if (!ctx) throw error("cluster TLS: cannot create an OpenSSL context: " + ssl_errors());
  SSL_CTX_set_default_passwd_cb(ctx.get(), no_passphrase);
  if (SSL_CTX_use_certificate_chain_file(ctx.get(), t.cert.c_str()) != 1) {
    throw error("cluster TLS: " + names[0] + " '" + t.cert + "' is not a PEM certificate chain: " + ssl_errors());
  }
  {  // the key alone first (a context without the certificate): a file that is no key, or an encrypted one
    const std::unique_ptr<SSL_CTX, decltype(&SSL_CTX_free)> alone(SSL_CTX_new(TLS_method()), SSL_CTX_free);
    if (!alone) throw error("cluster TLS: cannot create an OpenSSL context: " + ssl_errors());
    SSL_CTX_set_default_passwd_cb(alone.get(), no_passphrase);
    if (SSL_CTX_use_PrivateKey_file(alone.get(), t.key.c_str(), SSL_FILETYPE_PEM) != 1) {
      throw error("cluster TLS: " + names[1] + " '" + t.key + "' is not an unencrypted PEM private key: " + ssl_errors());
    }
  }
  if (SSL_CTX_use_PrivateKey_file(ctx.get(), t.key.c_str(), SSL_FILETYPE_PEM) != 1 || SSL_CTX_check_private_key(ctx.get()) != 1) {
    ERR_clear_error();
    throw error("cluster TLS: " + names[1] + " '" + t.key + "' is not the key of " + names[0] + " '" + t.cert + "'");
  }
  if (SSL_CTX_load_verify_locations(ctx.get(), t.ca.c_str(), nullptr) != 1) {
    throw error("cluster TLS: " + names[2] + " '" + t.ca + "' holds no PEM CA certificate: " + ssl_errors());
  }
  cfg.openssl_certificate = t.cert;
  cfg.openssl_key = t.key;
  cfg.openssl_cafile = t.ca;
  cfg.load<caf::openssl::manager>();
}

caf::expected<coordinator_actor> join_remote(caf::actor_system& sys, const std::string& host, uint16_t port, bool tls) {
  if (tls) return caf::openssl::remote_actor<coordinator_actor>(sys, host, port);
  return sys.middleman().remote_actor<coordinator_actor>(host, port);
}

}  // namespace troupe::cluster
