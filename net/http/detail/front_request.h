// What the front's connections (net/http/front.cpp) and front::parse (net/http/front_request.cpp) share,
// internal to troupe_http: a request read by Boost.Beast's parser turned into a front::request, and the
// answers to requests over the limits or malformed.
#pragma once

#include <boost/beast/http.hpp>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>

#include "net/http/front.h"

namespace troupe::http::front::detail {

using message = boost::beast::http::request<boost::beast::http::string_body>;

// Whether a and b are equal but for the case of ASCII letters (header names and values).
bool iequals(std::string_view a, std::string_view b);
// Beast's string view as a std::string.
std::string str(boost::string_view s);
// A request as handlers see it, from Beast's message.
request to_request(message&& msg, const std::string& remote);
// The message of a 413 for a body announced longer than o.max_body_bytes.
std::string body_too_large(uint64_t length, const options& o);
// The status and message a failed read of a request's bytes is answered with; status 0: the connection
// ended (closed, reset, cancelled), nothing to answer.
std::pair<int, std::string> read_refusal(const boost::system::error_code& ec, const options& o);

}  // namespace troupe::http::front::detail
