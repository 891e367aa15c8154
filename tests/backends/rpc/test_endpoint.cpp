// backends/rpc/client_options.h: a peer's address split into host and port, and the messages of
// rpc::parse_endpoint for each way an address can be wrong.
#include <catch2/catch.hpp>

#include "backends/rpc/client_options.h"
#include "runtime/error.h"

using namespace troupe::rpc;

TEST_CASE("split_endpoint: host:port, [v6]:port, and what is wrong with the rest", "[rpc][endpoint]") {
  endpoint e = split_endpoint("10.0.0.2:50052");
  CHECK(e.error == endpoint::fault::none);
  CHECK(e.host == "10.0.0.2");
  CHECK(e.port == 50052);
  e = split_endpoint("[::1]:7000");
  CHECK(e.error == endpoint::fault::none);
  CHECK(e.host == "::1");
  CHECK(e.port == 7000);
  e = split_endpoint("::1:7000");  // unbracketed: the last colon separates the port
  CHECK(e.host == "::1");
  CHECK(e.port == 7000);
  CHECK(split_endpoint("box:65535").port == 65535);

  for (const char* form : {"", "nohost", ":80", "[::1]", "[::1]80", "[]:80", "[::1:80"}) {
    INFO(form);
    CHECK(split_endpoint(form).error == endpoint::fault::form);
  }
  for (const char* port : {"h:", "h:x", "h:8o", "h: 80", "h:+80", "h:-1"}) {
    INFO(port);
    CHECK(split_endpoint(port).error == endpoint::fault::port);
  }
  for (const char* range : {"h:0", "h:65536", "h:99999", "h:123456", "h:000080"}) {
    INFO(range);
    CHECK(split_endpoint(range).error == endpoint::fault::range);
  }
  CHECK(split_endpoint("h:x1").port_text == "x1");
}

TEST_CASE("parse_endpoint: the pair, or an error naming the endpoint", "[rpc][endpoint]") {
  CHECK(parse_endpoint("127.0.0.1:50052") == std::pair<std::string, uint16_t>("127.0.0.1", 50052));
  CHECK(parse_endpoint("[::1]:1") == std::pair<std::string, uint16_t>("::1", 1));
  CHECK_THROWS_WITH(parse_endpoint("nohost"), "rpc: endpoint 'nohost' is not of the form host:port");
  CHECK_THROWS_WITH(parse_endpoint("[::1]"), "rpc: endpoint '[::1]' is not of the form [host]:port");
  CHECK_THROWS_WITH(parse_endpoint("h:x"), "rpc: endpoint 'h:x' has no valid port");
  CHECK_THROWS_WITH(parse_endpoint("h:70000"), "rpc: port 70000 of 'h:70000' is outside 1..65535");
  CHECK_THROWS_AS(parse_endpoint("h:0"), troupe::error);
}
