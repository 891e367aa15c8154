// Errors of troupe's actors: caf::error values in troupe's category, carrying a message that names what
// failed. Every request handler turns exceptions from the synchronous layers into one of these, so a
// failure reaches the requester as an error, never as a crash or a hang.
//
//   return make_error(errc::not_found, "no model named 'x'");
//   ...
//   [](const caf::error& e) { std::cerr << describe(e); }     // "not_found: no model named 'x'"
#pragma once

#include <caf/atom.hpp>
#include <caf/error.hpp>

#include <cstdint>
#include <exception>
#include <string>

#include "runtime/error.h"

namespace troupe::actors {

enum class errc : uint8_t {
  failed = 1,         // the synchronous layer threw (the message says what)
  cancelled = 2,      // a load or an answer was cancelled
  not_found = 3,      // no such model, device, buffer, job or graph (in this process)
  bad_request = 4,    // invalid parameters
  out_of_memory = 5,  // a device could not allocate
  busy = 6,           // the session is already answering; no free sequence
  down = 7,           // the actor that would serve this is down
  capacity = 8,       // the context is full
  refused = 9,        // authentication failed (a cluster join with a wrong key)
  unavailable = 10,   // a device it needs cannot be reached now (its peer is down, the connection was lost)
};

std::string_view errc_name(errc e);

// The category atom of troupe's errors.
constexpr caf::atom_value error_category = caf::atom("troupe");

caf::error make_error(errc code, std::string message);
// The error for an exception caught at an actor's edge, by its type: out_of_memory_error -> out_of_memory,
// capacity_error -> capacity, load_cancelled -> cancelled, unavailable_error (a peer down or its connection
// lost) -> unavailable, anything else -> failed.
caf::error error_from(const std::exception& e);
// "not_found: no model named 'x'" for troupe's errors, CAF's rendering otherwise.
std::string describe(const caf::error& e);
// Whether e is troupe's error with this code.
bool is(const caf::error& e, errc code);

// An error a request came back with, thrown by the embedding API (actors/engine.h).
class request_error : public troupe::error {
 public:
  request_error(caf::error e) : troupe::error(describe(e)), error_(std::move(e)) {}
  bool is(errc code) const { return actors::is(error_, code); }

 private:
  caf::error error_;
};

}  // namespace troupe::actors
