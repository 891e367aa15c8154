// The tensor RPC protocol between a client (backends/rpc) and a peer server (net/rpc/peer_server.h).
//
//   frame  = code:u8  size:u64  payload[size]            (every integer little-endian)
//   client -> server: code = command;  server -> client: code = status (ok = 0)
//
//   connect            server sends a greeting (status ok): magic, version, flags, 32-byte nonce
//   hello              must be the first command: version, flags, client nonce, HMAC (see auth.h)
//   alloc_buffer ...   one reply per command, except set_tensor (none: errors are reported by the next reply)
//   progress           while a command runs long, the server sends progress frames (status progress) before its
//                      reply; the client skips them, and each one restarts its timeout for the reply
//
// A hello with the control flag opens a control connection: the peer serves it on a thread that never runs a
// graph, and it takes only the commands that touch no buffer (device_count, get_alignment, get_max_size,
// get_device_memory, get_alloc_size, supports_op): health probes and capability questions.
//
// Payloads are written with `writer` and read with `reader`, which never read past the payload (a short or
// over-long payload throws protocol_error). Tensors travel as `wire_tensor`: type, shape, strides, op,
// parameters, sources by index into the message, and their place as (buffer handle, byte offset) — never as
// an address. docs/rpc.md has the table of commands and payloads and the validation rules.
#pragma once

#include <array>
#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/tensor.h"

namespace troupe::rpc {

// A payload that does not follow the protocol (truncated, trailing bytes, a field out of range).
class protocol_error : public error {
 public:
  using error::error;
};

struct version {
  uint16_t major = 0;
  uint16_t minor = 0;
  uint16_t patch = 0;
  bool operator==(const version&) const = default;
};
// 2.0.0: progress frames, control connections and supports_op (a 1.x peer cannot serve a 2.x client).
// 2.1.0: a graph may hold flash_attn and mul_mat with a mask (mul_mat_masked): the attention a CPU computes
// over its own KV layout, so that a peer's CPU gives the local CPU's bits (rpc_device::cpu_kernels).
inline constexpr version protocol_version{2, 1, 0};
// The first version whose peers rebuild flash_attn and masked products.
inline constexpr version cpu_attention_version{2, 1, 0};
// Whether a server of version `server` may serve a client of version `client`: the same major version, and
// the server's minor version not newer than the client's.
bool compatible(const version& client, const version& server);
std::string to_string(const version& v);

enum class command : uint8_t {
  hello = 0,
  device_count = 1,
  alloc_buffer = 2,
  get_alignment = 3,
  get_max_size = 4,
  buffer_get_base = 5,
  free_buffer = 6,
  buffer_clear = 7,
  set_tensor = 8,
  set_tensor_hash = 9,
  get_tensor = 10,
  copy_tensor = 11,
  graph_compute = 12,
  graph_recompute = 13,
  get_device_memory = 14,
  init_tensor = 15,
  get_alloc_size = 16,
  supports_op = 17,  // device u32, n u32, n entries (the node's sources as leafs, then the node): u8 answer
  count = 18,
};
std::string_view command_name(command c);
std::optional<command> command_from_code(uint8_t code);

// The RPC debug switch: TROUPE_RPC_DEBUG, or llama.cpp's GGML_RPC_DEBUG, set to anything but "" or "0" (read
// once). With it, the server logs a line per command with its arguments and result, and the client its
// connects, hellos, allocations and closes, at debug level; without it nothing is formatted.
bool debug_from_env();

enum class status : uint8_t {
  ok = 0,
  bad_request = 1,       // malformed payload or a field out of range
  not_found = 2,         // unknown buffer handle or device index
  failed = 3,            // the device could not do it (allocation, compute)
  version_mismatch = 4,  // hello refused: incompatible versions
  auth_failed = 5,       // hello refused: missing or wrong key
  no_graph = 6,          // graph_recompute without a previous graph on this device
  protocol = 7,          // a command before hello, or an unknown command (the server then closes)
  progress = 8,          // not a reply: the command is still running (payload: u32 milliseconds since it began)
};
std::string_view status_name(status s);

// ---- frames ----
constexpr size_t frame_header_size = 9;
struct frame_header {
  uint8_t code = 0;
  uint64_t size = 0;
};
void encode_header(uint8_t* out, uint8_t code, uint64_t size);
frame_header decode_header(const uint8_t* in);

// ---- limits (checked before anything is allocated) ----
constexpr uint32_t greeting_magic = 0x43505254;  // "TRPC"
constexpr size_t nonce_size = 32;
constexpr size_t mac_size = 32;
constexpr uint64_t max_small_payload = 4096;         // every command but set_tensor and graph_compute
constexpr uint32_t max_graph_entries = 1u << 16;     // tensors in one graph message
constexpr uint64_t max_message_bytes = 1u << 20;     // an error message or device description
constexpr uint64_t hash_threshold = 10u << 20;       // set_tensor_hash is used from this size on
constexpr uint64_t set_tensor_prefix = 20;           // handle u64, offset u64, flags u32; then the bytes
constexpr uint32_t set_flag_cacheable = 1u << 0;     // weights: the server may keep the bytes in its cache
constexpr uint32_t max_graph_outputs = 64;           // byte ranges a graph_compute / recompute reply carries
constexpr uint64_t max_output_bytes = 64u << 20;     // their total size
constexpr size_t output_range_size = 24;             // handle u64, offset u64, size u64
constexpr int64_t max_ne = int64_t{1} << 40;         // elements in one dimension, and in a whole tensor
constexpr uint64_t max_stride = uint64_t{1} << 48;   // bytes per step in one dimension
constexpr uint64_t max_progress_payload = 64;        // a progress frame's payload (u32 today)
constexpr uint32_t max_query_entries = 1 + max_src;  // supports_op: the sources and the node

// Hello flags (the u32 after the version).
enum hello_flags : uint32_t {
  hello_control = 1u << 0,  // a control connection (see above)
};
// Whether a command may be sent on a control connection.
bool control_command(command c);

// The largest payload a command may carry (set_tensor: unbounded here; its bytes must fit the target buffer,
// which the server checks before receiving them).
uint64_t max_payload(command c);

using nonce = std::array<uint8_t, nonce_size>;
using mac = std::array<uint8_t, mac_size>;

// ---- little-endian encoding ----

// Stores v at p in little-endian byte order (a plain copy on little-endian hosts).
template <class T>
inline void store_le(uint8_t* p, T v) {
  static_assert(std::is_unsigned_v<T>);
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(p, &v, sizeof(T));
  } else {
    for (size_t i = 0; i < sizeof(T); ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
  }
}

template <class T>
inline T load_le(const uint8_t* p) {
  static_assert(std::is_unsigned_v<T>);
  T v;
  if constexpr (std::endian::native == std::endian::little) {
    std::memcpy(&v, p, sizeof(T));
  } else {
    v = 0;
    for (size_t i = 0; i < sizeof(T); ++i) v = static_cast<T>(v | static_cast<T>(static_cast<T>(p[i]) << (8 * i)));
  }
  return v;
}

class writer {
 public:
  explicit writer(std::vector<uint8_t>& out) : out_(out) {}
  void u8(uint8_t v) { out_.push_back(v); }
  void u16(uint16_t v) { le(v); }
  void u32(uint32_t v) { le(v); }
  void u64(uint64_t v) { le(v); }
  void i32(int32_t v) { le(static_cast<uint32_t>(v)); }
  void f32(float v);
  void bytes(const void* p, size_t n);
  void str(std::string_view s);  // u32 length, bytes

 private:
  template <class T>
  void le(T v) {
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    store_le(out_.data() + at, v);
  }
  std::vector<uint8_t>& out_;
};

class reader {
 public:
  explicit reader(std::span<const uint8_t> in) : in_(in) {}
  uint8_t u8() { return le<uint8_t>(); }
  uint16_t u16() { return le<uint16_t>(); }
  uint32_t u32() { return le<uint32_t>(); }
  uint64_t u64() { return le<uint64_t>(); }
  int32_t i32() { return static_cast<int32_t>(le<uint32_t>()); }
  int64_t i64() { return static_cast<int64_t>(le<uint64_t>()); }
  std::span<const uint8_t> bytes(size_t n);
  std::string str(size_t max_len);
  size_t remaining() const { return in_.size() - pos_; }
  // Throws protocol_error when bytes are left over.
  void done(std::string_view what) const;

 private:
  template <class T>
  T le() {
    if (remaining() < sizeof(T)) truncated(sizeof(T));
    const T v = load_le<T>(in_.data() + pos_);
    pos_ += sizeof(T);
    return v;
  }
  [[noreturn]] void truncated(size_t n) const;
  std::span<const uint8_t> in_;
  size_t pos_ = 0;
};

// A protocol version as the greeting, hello and its reply carry it: major, minor, patch (u16 each).
inline version read_version(reader& r) {
  version v;
  v.major = r.u16();
  v.minor = r.u16();
  v.patch = r.u16();
  return v;
}

// ---- tensors on the wire ----

// One tensor of a graph message (or of init_tensor / get_alloc_size). Leafs are memory that exists (weights,
// inputs, results of earlier graphs): placed, never computed. Nodes are computed, in message order; the
// server rebuilds each from its op, parameters and sources (earlier entries of the same message).
struct wire_tensor {
  enum class kind : uint8_t { leaf = 0, node = 1 };
  kind k = kind::leaf;
  uint8_t op = 0;            // troupe::op
  uint32_t type = 0;         // troupe::type id
  std::array<int64_t, max_dims> ne{1, 1, 1, 1};
  std::array<uint64_t, max_dims> nb{0, 0, 0, 0};
  std::array<int32_t, max_op_params> op_params{};
  std::array<int32_t, max_src> src{-1, -1, -1, -1};  // index of an earlier entry, -1: none
  uint32_t flags = 0;
  uint64_t buffer = 0;       // handle of the buffer holding the data (0: none)
  uint64_t offset = 0;       // byte offset of the data in that buffer

  static constexpr size_t wire_size = 1 + 1 + 2 + 4 + 8 * max_dims + 8 * max_dims + 4 * max_op_params + 4 * max_src +
                                      4 + 8 + 8;
  void write(writer& w) const;
  static wire_tensor read(reader& r);
};

// ---- devices ----
enum device_flags : uint32_t {
  device_needs_init_tensor = 1u << 0,  // the client must send init_tensor for tensors placed on it
  device_custom_alloc_size = 1u << 1,  // alloc_size may differ from nbytes: ask with get_alloc_size
};

struct device_info {
  std::string name;         // the device's name on the peer ("CPU")
  std::string description;
  device_type type = device_type::cpu;
  uint32_t flags = 0;
};

// The 64-bit xxHash (XXH3) of a tensor's bytes: what set_tensor_hash sends instead of large weights, and
// what names the peer's cache entries.
uint64_t content_hash(const void* data, size_t n);

}  // namespace troupe::rpc
