// The parsing of a peer's address ("host:port", "[v6 address]:port") declared in client_options.h.
#include "backends/rpc/client_options.h"

#include "runtime/error.h"

namespace troupe::rpc {

endpoint split_endpoint(std::string_view address) {
  endpoint e;
  std::string_view host;
  std::string_view port;
  bool split = false;
  if (!address.empty() && address.front() == '[') {
    const auto close = address.find(']');
    if (close != std::string_view::npos && close + 1 < address.size() && address[close + 1] == ':') {
      host = address.substr(1, close - 1);
      port = address.substr(close + 2);
      split = true;
    }
  } else if (const auto colon = address.rfind(':'); colon != std::string_view::npos) {
    host = address.substr(0, colon);
    port = address.substr(colon + 1);
    split = true;
  }
  if (!split || host.empty()) {
    e.error = endpoint::fault::form;
    return e;
  }
  e.port_text = std::string(port);
  if (port.empty() || port.find_first_not_of("0123456789") != std::string_view::npos) {
    e.error = endpoint::fault::port;
    return e;
  }
  // More than five digits is over 65535 (or has leading zeros, which no port is written with).
  uint32_t n = 0;
  if (port.size() <= 5) {
    for (const char c : port) n = n * 10 + static_cast<uint32_t>(c - '0');
  }
  if (port.size() > 5 || n == 0 || n > 65535) {
    e.error = endpoint::fault::range;
    return e;
  }
  e.host = std::string(host);
  e.port = static_cast<uint16_t>(n);
  return e;
}

std::pair<std::string, uint16_t> parse_endpoint(const std::string& address) {
  endpoint e = split_endpoint(address);
  switch (e.error) {
    case endpoint::fault::none:
      break;
    case endpoint::fault::form:
      throw error("rpc: endpoint '" + address + "' is not of the form " +
                  (!address.empty() && address.front() == '[' ? "[host]:port" : "host:port"));
    case endpoint::fault::port:
      throw error("rpc: endpoint '" + address + "' has no valid port");
    case endpoint::fault::range:
      throw error("rpc: port " + e.port_text + " of '" + address + "' is outside 1..65535");
  }
  return {std::move(e.host), e.port};
}

}  // namespace troupe::rpc
