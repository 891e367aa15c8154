// TLS on the cluster: the certificate, key and CA files checked before CAF reads them, and mutual TLS on
// the cluster port (a trusted node joins and holds a placed model over TLS RPC; a plain node and one with
// another certificate never join).
#include <catch2/catch.hpp>

#include <array>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "net/cluster/tls.h"
#include "tests/cluster/cluster_fixture.h"
#include "tests/http/daemon_process.h"
#include "tests/support/certificate.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::test::cluster_fixture;
using namespace std::chrono_literals;
using nlohmann::json;

TEST_CASE("cluster TLS files are checked before CAF reads them, naming the option and the file", "[cluster][tls]") {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-cluster-tls-files-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  test::make_certificate(dir, "a");
  test::make_certificate(dir, "b");
  std::ofstream(dir / "junk.pem") << "not a certificate\n";
  const std::array<std::string, 3> names{"--tls-cert", "--tls-key", "--tls-ca"};
  const auto f = [&](const char* n) { return (dir / n).string(); };
  const auto use = [&](cluster::tls_files t) { cluster::check_tls_files(t, names); };
  CHECK_NOTHROW(use({f("a.pem"), f("a.key"), f("b.pem")}));
  CHECK_THROWS_WITH(use({f("a.pem"), "", f("a.pem")}), Catch::Contains("--tls-key is missing"));
  CHECK_THROWS_WITH(use({f("none.pem"), f("a.key"), f("a.pem")}), Catch::Contains("--tls-cert '" + f("none.pem") + "' is not a readable file"));
  CHECK_THROWS_WITH(use({f("junk.pem"), f("a.key"), f("a.pem")}), Catch::Contains("--tls-cert '" + f("junk.pem") + "' is not a PEM certificate chain"));
  CHECK_THROWS_WITH(use({f("a.pem"), f("b.key"), f("a.pem")}), Catch::Contains("--tls-key '" + f("b.key") + "' is not the key of --tls-cert"));
  CHECK_THROWS_WITH(use({f("a.pem"), f("a.key"), f("junk.pem")}), Catch::Contains("--tls-ca '" + f("junk.pem") + "'"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("mutual TLS on the cluster port: a node with a certificate the cluster's CA trusts joins and holds a placed model over TLS RPC, while a plain node and one with another certificate never join", "[cluster][process][placement][tls]") {
  const auto model = test::model_path("stories260K.gguf");
  if (!model) return;
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-cluster-tls-" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  test::make_certificate(dir, "cluster");
  test::make_certificate(dir, "other");
  std::ofstream(dir / "cluster.secret") << "0123456789abcdef0123456789abcdef\n";
  const auto f = [&](const char* n) { return (dir / n).string(); };
  const std::string tls = "key_file = \"" + f("cluster.secret") + "\"\ntls_cert = \"" + f("cluster.pem") + "\"\ntls_key = \"" +
                          f("cluster.key") + "\"\ntls_ca = \"" + f("cluster.pem") + "\"\ndown_after_ms = 4000\n";
  test::daemon_process d(placement_config(model->string(), tls, ""), {}, false);
  REQUIRE(d.wait_for_log("cluster coordinator on", 60s));
  CHECK(d.wait_for_log("key: shared; mutual TLS", 1s));
  const uint16_t cport = coordinator_port(d);
  const std::vector<std::string> key = {"--auth-key-file", f("cluster.secret")};
  auto with = [&](std::vector<std::string> a, std::vector<std::string> b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  node_process plain(node_args(cport, "plain", key));
  node_process other(node_args(cport, "other", with(key, {"--tls-cert", f("other.pem"), "--tls-key", f("other.key"), "--tls-ca", f("cluster.pem")})));
  node_process member(node_args(cport, "member", with(key, {"--tls-cert", f("cluster.pem"), "--tls-key", f("cluster.key"), "--tls-ca", f("cluster.pem")})));
  const int port = http_port_when_ready(d);
  const json cl = cluster_at(port);  // the model was placed on it before the daemon was ready
  REQUIRE(is_up(cl, "member"));
  CHECK(node_named(cl, "member")["rpc_tls"] == true);
  CHECK_THAT(d.log(), Catch::Contains("(node member)"));
  const answer ref = complete(port, "local");
  REQUIRE(ref.status == 200);
  const answer got = complete(port, "stories");
  CHECK(got.status == 200);
  CHECK(got.text == ref.text);
  // The handshakes of the other two failed (they keep trying, as a node does while its coordinator is away),
  // each logged with the address; the member's connection is not touched by them: still epoch 1.
  CHECK(wait_until([&] { return plain.output().find("does not answer") != std::string::npos; }));
  CHECK(wait_until([&] { return other.output().find("does not answer") != std::string::npos; }));
  CHECK(d.wait_for_log("cluster TLS: refused a connection from 127.0.0.1:", 10s));
  std::this_thread::sleep_for(2s);  // more failed attempts (one a second from each)
  const json after = cluster_at(port);
  CHECK(node_named(after, "plain").is_null());
  CHECK(node_named(after, "other").is_null());
  CHECK(after["nodes"].size() == 1);
  CHECK(is_up(after, "member", 1));
  CHECK_THAT(d.log(), !Catch::Contains("is down"));
  CHECK(complete(port, "stories").text == ref.text);
  // SIGTERM stops a node (status 0), however many threads it runs (its tunnel's, the BLAS library's).
  member.signal(SIGTERM);
  CHECK(member.wait_exit(10s) == 0);
  plain.signal(SIGTERM);
  CHECK(plain.wait_exit(10s) == 0);
  std::filesystem::remove_all(dir);
}
