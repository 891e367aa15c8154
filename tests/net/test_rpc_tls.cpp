// TLS: a self-signed certificate made here (OpenSSL), a server that requires TLS, clients that verify it.
#include <catch2/catch.hpp>

#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>

#include <cstdio>

#include "backends/rpc/rpc_client.h"
#include "tests/net/test_server.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace std::chrono_literals;

namespace {

// Writes cert.pem and key.pem (P-256, valid for IP 127.0.0.1 and localhost, self-signed) into dir.
void make_certificate(const std::filesystem::path& dir) {
  EVP_PKEY* key = EVP_EC_gen("P-256");
  REQUIRE(key != nullptr);
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), 1);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 3600);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("localhost"), -1, -1, 0);
  X509_set_issuer_name(x, name);
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, nullptr, nullptr, 0);
  for (auto [nid, value] : {std::pair{NID_subject_alt_name, "IP:127.0.0.1,DNS:localhost"},
                            std::pair{NID_basic_constraints, "critical,CA:TRUE"}}) {
    X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    REQUIRE(ext != nullptr);
    X509_add_ext(x, ext, -1);
    X509_EXTENSION_free(ext);
  }
  REQUIRE(X509_sign(x, key, EVP_sha256()) > 0);
  FILE* f = std::fopen((dir / "cert.pem").c_str(), "w");
  PEM_write_X509(f, x);
  std::fclose(f);
  f = std::fopen((dir / "key.pem").c_str(), "w");
  PEM_write_PrivateKey(f, key, nullptr, nullptr, 0, nullptr, nullptr);
  std::fclose(f);
  X509_free(x);
  EVP_PKEY_free(key);
}

}  // namespace

TEST_CASE("TLS: clients that trust the certificate connect, others are refused", "[rpc][tls]") {
  testing::temp_dir dir("troupe-tls");
  make_certificate(dir.path());
  auto srv = testing::start_server({.key = "a shared key of sufficient length",
                                    .tls_cert = dir.path() / "cert.pem",
                                    .tls_key = dir.path() / "key.pem",
                                    .hello_timeout = 500ms});
  CHECK(srv->tls());
  client_options o{.host = "127.0.0.1", .port = srv->port(), .key = "a shared key of sufficient length",
                   .tls = true, .tls_ca_file = dir.path() / "cert.pem", .io_timeout = 10s};
  client c(o);
  REQUIRE_NOTHROW(c.connect());
  const remote_buffer b = c.alloc_buffer(0, 1 << 20);
  std::vector<uint8_t> bytes(1 << 20);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 13);
  c.set_tensor(b, 0, bytes.data(), bytes.size(), false);
  std::vector<uint8_t> got(bytes.size());
  c.get_tensor(b, 0, got.data(), got.size());
  CHECK(got == bytes);

  // A client that does not trust the certificate.
  client_options untrusted = o;
  untrusted.tls_ca_file.clear();
  client u(untrusted);
  CHECK_THROWS_AS(u.connect(), backend_error);
  // A client without TLS: no greeting comes; it times out, and the server drops it.
  client_options plain = o;
  plain.tls = false;
  plain.io_timeout = 300ms;
  client p(plain);
  CHECK_THROWS_AS(p.connect(), backend_error);
  CHECK(testing::wait_for([&] { return srv->stats().connections == 1; }));
}
