#include "backends/rpc/wire/protocol.h"

#include <xxhash.h>

#include <cstdlib>
#include <cstring>

namespace troupe::rpc {

bool compatible(const version& client, const version& server) {
  return client.major == server.major && server.minor <= client.minor;
}

std::string to_string(const version& v) {
  return std::to_string(v.major) + "." + std::to_string(v.minor) + "." + std::to_string(v.patch);
}

bool debug_from_env() {
  static const bool on = [] {
    for (const char* name : {"TROUPE_RPC_DEBUG", "GGML_RPC_DEBUG"}) {
      const char* v = std::getenv(name);
      if (v != nullptr && *v != '\0' && std::string_view(v) != "0") return true;
    }
    return false;
  }();
  return on;
}

std::string_view command_name(command c) {
  switch (c) {
    case command::hello: return "hello";
    case command::device_count: return "device_count";
    case command::alloc_buffer: return "alloc_buffer";
    case command::get_alignment: return "get_alignment";
    case command::get_max_size: return "get_max_size";
    case command::buffer_get_base: return "buffer_get_base";
    case command::free_buffer: return "free_buffer";
    case command::buffer_clear: return "buffer_clear";
    case command::set_tensor: return "set_tensor";
    case command::set_tensor_hash: return "set_tensor_hash";
    case command::get_tensor: return "get_tensor";
    case command::copy_tensor: return "copy_tensor";
    case command::graph_compute: return "graph_compute";
    case command::graph_recompute: return "graph_recompute";
    case command::get_device_memory: return "get_device_memory";
    case command::init_tensor: return "init_tensor";
    case command::get_alloc_size: return "get_alloc_size";
    case command::supports_op: return "supports_op";
    case command::count: break;
  }
  return "unknown";
}

std::optional<command> command_from_code(uint8_t code) {
  if (code >= static_cast<uint8_t>(command::count)) return std::nullopt;
  return static_cast<command>(code);
}

std::string_view status_name(status s) {
  switch (s) {
    case status::ok: return "ok";
    case status::bad_request: return "bad request";
    case status::not_found: return "not found";
    case status::failed: return "failed";
    case status::version_mismatch: return "version mismatch";
    case status::auth_failed: return "authentication failed";
    case status::no_graph: return "no graph";
    case status::protocol: return "protocol error";
    case status::progress: return "progress";
  }
  return "unknown status";
}

bool control_command(command c) {
  switch (c) {
    case command::hello:
    case command::device_count:
    case command::get_alignment:
    case command::get_max_size:
    case command::get_device_memory:
    case command::get_alloc_size:
    case command::supports_op:
      return true;
    default:
      return false;
  }
}

void encode_header(uint8_t* out, uint8_t code, uint64_t size) {
  out[0] = code;
  for (int i = 0; i < 8; ++i) out[1 + i] = static_cast<uint8_t>(size >> (8 * i));
}

frame_header decode_header(const uint8_t* in) {
  frame_header h;
  h.code = in[0];
  for (int i = 0; i < 8; ++i) h.size |= static_cast<uint64_t>(in[1 + i]) << (8 * i);
  return h;
}

uint64_t max_payload(command c) {
  switch (c) {
    case command::set_tensor: return UINT64_MAX;
    case command::graph_compute:
      return 8 + uint64_t{max_graph_entries} * wire_tensor::wire_size + 4 + max_graph_outputs * output_range_size;
    default: return max_small_payload;
  }
}

void writer::f32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, 4);
  u32(u);
}

void writer::bytes(const void* p, size_t n) {
  const auto* b = static_cast<const uint8_t*>(p);
  out_.insert(out_.end(), b, b + n);
}

void writer::str(std::string_view s) {
  u32(static_cast<uint32_t>(s.size()));
  bytes(s.data(), s.size());
}

void reader::truncated(size_t n) const {
  throw protocol_error("payload truncated: " + std::to_string(n) + " more bytes needed at byte " + std::to_string(pos_) +
                       " of " + std::to_string(in_.size()));
}

std::span<const uint8_t> reader::bytes(size_t n) {
  if (remaining() < n) {
    throw protocol_error("payload truncated: " + std::to_string(n) + " bytes needed at byte " + std::to_string(pos_) +
                         " of " + std::to_string(in_.size()));
  }
  auto s = in_.subspan(pos_, n);
  pos_ += n;
  return s;
}

std::string reader::str(size_t max_len) {
  const uint32_t n = u32();
  if (n > max_len) throw protocol_error("string of " + std::to_string(n) + " bytes exceeds " + std::to_string(max_len));
  const auto b = bytes(n);
  return std::string(reinterpret_cast<const char*>(b.data()), b.size());
}

void reader::done(std::string_view what) const {
  if (remaining() != 0) {
    throw protocol_error(std::string(what) + ": " + std::to_string(remaining()) + " unexpected trailing bytes");
  }
}

void wire_tensor::write(writer& w) const {
  // One entry at a time into a fixed block (graphs have thousands of entries).
  uint8_t buf[wire_size];
  uint8_t* p = buf;
  auto put = [&p](auto v) {
    store_le(p, v);
    p += sizeof(v);
  };
  put(static_cast<uint8_t>(k));
  put(op);
  put(uint16_t{0});
  put(type);
  for (int64_t v : ne) put(static_cast<uint64_t>(v));
  for (uint64_t v : nb) put(v);
  for (int32_t v : op_params) put(static_cast<uint32_t>(v));
  for (int32_t v : src) put(static_cast<uint32_t>(v));
  put(flags);
  put(buffer);
  put(offset);
  w.bytes(buf, wire_size);
}

wire_tensor wire_tensor::read(reader& r) {
  wire_tensor t;
  const uint8_t k = r.u8();
  if (k > 1) throw protocol_error("tensor kind " + std::to_string(k) + " is neither leaf (0) nor node (1)");
  t.k = static_cast<kind>(k);
  t.op = r.u8();
  if (r.u16() != 0) throw protocol_error("reserved tensor field is not zero");
  t.type = r.u32();
  for (auto& v : t.ne) v = r.i64();
  for (auto& v : t.nb) v = r.u64();
  for (auto& v : t.op_params) v = r.i32();
  for (auto& v : t.src) v = r.i32();
  t.flags = r.u32();
  t.buffer = r.u64();
  t.offset = r.u64();
  return t;
}

uint64_t content_hash(const void* data, size_t n) { return XXH3_64bits(data, n); }

}  // namespace troupe::rpc
