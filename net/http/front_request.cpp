// A request's bytes to front::requests (net/http/front.h) with Boost.Beast's parser: the conversion and the
// refusals that the connections (front.cpp) share with front::parse, which reads bytes without a socket (the
// fuzzer and tests), and request::header.
#include "net/http/detail/front_request.h"

#include <boost/asio/buffer.hpp>

#include <cctype>
#include <tuple>

namespace troupe::http::front {

namespace asio = boost::asio;
namespace bh = boost::beast::http;
using error_code = boost::system::error_code;

namespace detail {

namespace {

// Whether a read failed on the request's bytes (answered 400), rather than on the connection.
bool is_parse_error(const error_code& ec) {
  static const error_code beast_ec = bh::error::bad_method;
  return ec.category() == beast_ec.category() && ec != bh::error::end_of_stream && ec != bh::error::partial_message;
}

}  // namespace

bool iequals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  }
  return true;
}

std::string str(boost::string_view s) { return {s.data(), s.size()}; }

// A request as handlers see it, from Beast's message.
request to_request(message&& msg, const std::string& remote) {
  request r;
  r.method = str(msg.method_string());
  const std::string target = str(msg.target());
  const size_t q = target.find('?');
  r.path = target.substr(0, q);
  if (q != std::string::npos) r.query = target.substr(q + 1);
  for (const auto& f : msg) r.headers.emplace_back(str(f.name_string()), str(f.value()));
  r.body = std::move(msg.body());
  r.remote_addr = remote;
  return r;
}

std::string body_too_large(uint64_t length, const options& o) {
  return "the request body is too large (" + std::to_string(length) + " bytes; at most " + std::to_string(o.max_body_bytes) + ")";
}

// The status and message a failed read of a request's bytes is answered with; status 0: the connection
// ended (closed, reset, cancelled), nothing to answer.
std::pair<int, std::string> read_refusal(const error_code& ec, const options& o) {
  if (ec == bh::error::header_limit) return {431, "the request header is larger than " + std::to_string(o.max_header_bytes) + " bytes"};
  if (ec == bh::error::body_limit) return {413, "the request body is larger than " + std::to_string(o.max_body_bytes) + " bytes"};
  if (is_parse_error(ec)) return {400, "malformed HTTP request: " + ec.message()};
  return {0, {}};
}

}  // namespace detail

using detail::body_too_large;
using detail::iequals;
using detail::message;
using detail::read_refusal;
using detail::to_request;

parse_outcome parse(std::string_view bytes, const options& opts) {
  parse_outcome out;
  while (!bytes.empty()) {
    bh::request_parser<bh::string_body> p;
    p.header_limit(opts.max_header_bytes);
    p.body_limit(opts.max_body_bytes);
    error_code ec;
    bool header_checked = false;
    while (!p.is_done()) {
      const size_t used = bytes.empty() ? 0 : p.put(asio::buffer(bytes.data(), bytes.size()), ec);
      bytes.remove_prefix(used);
      if (ec && ec != bh::error::need_more) {
        std::tie(out.status, out.message) = read_refusal(ec, opts);
        return out;
      }
      ec = {};
      if (p.is_header_done() && !header_checked) {
        header_checked = true;
        const auto length = p.content_length();
        if (length && *length > opts.max_body_bytes) {
          out.status = 413;
          out.message = body_too_large(*length, opts);
          return out;
        }
        p.eager(true);
      } else if (used == 0 && !p.is_done()) {
        out.complete = false;  // what is left is not yet a whole header, or the body goes on
        return out;
      }
    }
    message msg = p.release();
    const bool keep_alive = msg.keep_alive() && out.requests.size() + 1 < opts.keep_alive_max;
    out.requests.push_back(to_request(std::move(msg), ""));
    if (!keep_alive) break;  // the connection would close after answering it
  }
  return out;
}

std::string request::header(std::string_view name) const {
  for (const auto& [k, v] : headers) {
    if (iequals(k, name)) return v;
  }
  return {};
}

}  // namespace troupe::http::front
