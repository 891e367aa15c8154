// TLS: a self-signed certificate made here (OpenSSL), a server that requires TLS, clients that verify it.
#include <catch2/catch.hpp>

#include "backends/rpc/rpc_client.h"
#include "tests/net/test_server.h"
#include "tests/support/certificate.h"

using namespace troupe;
using namespace troupe::rpc;
using namespace std::chrono_literals;

TEST_CASE("TLS: clients that trust the certificate connect, others are refused", "[rpc][tls]") {
  testing::temp_dir dir("troupe-tls");
  test::make_certificate(dir.path(), "cert");
  auto srv = testing::start_server({.key = "a shared key of sufficient length",
                                    .tls_cert = dir.path() / "cert.pem",
                                    .tls_key = dir.path() / "cert.key",
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
