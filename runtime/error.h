// Error types of the runtime core.
//
// Library code never aborts or exits on bad input: it throws one of these, and the layer that owns the
// request (an actor, a tool's main) catches it and reports it. Messages name what was wrong: the op, the
// tensor, the key, the offset.
#pragma once

#include <stdexcept>
#include <string>

namespace troupe {

// Base of every error troupe throws on purpose.
class error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// An op was built with sources whose shapes or types it cannot take.
class op_error : public error {
 public:
  using error::error;
};

// A context ran out of tensor slots or data memory, or a graph out of node slots.
class capacity_error : public error {
 public:
  using error::error;
};

// A tensor type that exists in GGUF but that troupe does not implement (iq*, tq*, mxfp4...), or an
// unknown type id.
class type_error : public error {
 public:
  using error::error;
};

// A backend could not do what was asked (allocation failed, op unsupported, device lost).
class backend_error : public error {
 public:
  using error::error;
};

// A device that cannot be reached now: its peer is down, or the connection (and what lived on it) was lost.
// Trying again later may succeed. Actors report it as errc::unavailable, the daemon as a 503.
class unavailable_error : public backend_error {
 public:
  using backend_error::backend_error;
};

// A buffer type could not allocate what was asked: the device (or a configured limit) has no room, or the
// size exceeds the buffer type's max_size. Thrown by buffer types; actors report it as errc::out_of_memory.
class out_of_memory_error : public backend_error {
 public:
  using backend_error::backend_error;
};

}  // namespace troupe
