// The peer server's debug lines (frame_handler_config::debug, TROUPE_RPC_DEBUG, at the logger's debug level): one
// line per command a session handles, with its arguments read from the payload and its result read from the
// reply, and the line of a set_tensor whose bytes the connection streamed. The frame handler itself is in
// session.cpp.
#include <sstream>
#include <string>

#include "net/rpc/frame_handler.h"
#include "runtime/log.h"

namespace troupe::rpc {

bool frame_handler::debugging() const { return cfg_.debug && log_level::debug >= get_log_level(); }

void frame_handler::debug_line(const std::string& line) {
  count(&peer_server_stats::debug_lines, 1);
  log_message(log_level::debug, "rpc " + peer_ + ": " + line);
}

void frame_handler::debug_set_tensor(std::span<const uint8_t> prefix, uint64_t data_size, bool streamed) {
  if (!debugging()) return;
  std::ostringstream os;
  os << "set_tensor ";
  try {
    reader r(prefix);
    const uint64_t h = r.u64();
    const uint64_t offset = r.u64();
    const uint32_t flags = r.u32();
    os << "handle " << h << ", offset " << offset << ", size " << data_size << (streamed ? " (streamed)" : "")
       << ((flags & set_flag_cacheable) ? ", cacheable" : "");
  } catch (const protocol_error& e) {
    os << "(malformed: " << e.what() << ")";
  }
  if (pending_error_) os << " -> failed: " << *pending_error_;
  debug_line(os.str());
}

namespace {

std::string hex(uint64_t v) {
  std::ostringstream os;
  os << "0x" << std::hex << v;
  return os.str();
}

void describe_outputs(std::ostringstream& os, reader& r) {
  const uint32_t n = r.u32();
  uint64_t bytes = 0;
  for (uint32_t i = 0; i < n && r.remaining() >= 24; ++i) {
    (void)r.u64();
    (void)r.u64();
    bytes += r.u64();
  }
  os << ", " << n << (n == 1 ? " output" : " outputs") << " (" << bytes << " bytes)";
}

}  // namespace

std::string frame_handler::describe(command c, std::span<const uint8_t> payload, const reply& rep) const {
  std::ostringstream os;
  os << command_name(c);
  reader r(payload);
  try {
    switch (c) {
      case command::hello: os << " client " << to_string(read_version(r)); break;
      case command::alloc_buffer: {
        const uint32_t d = r.u32();
        os << " device " << d << ", size " << r.u64();
        break;
      }
      case command::get_alignment:
      case command::get_max_size:
      case command::get_device_memory: os << " device " << r.u32(); break;
      case command::buffer_get_base:
      case command::free_buffer: os << " handle " << r.u64(); break;
      case command::buffer_clear: {
        const uint64_t h = r.u64();
        os << " handle " << h << ", value " << int(r.u8());
        break;
      }
      case command::set_tensor_hash: {
        const uint64_t h = r.u64(), off = r.u64(), size = r.u64(), hash = r.u64();
        os << " handle " << h << ", offset " << off << ", size " << size << ", hash " << hex(hash);
        break;
      }
      case command::get_tensor: {
        const uint64_t h = r.u64(), off = r.u64();
        os << " handle " << h << ", offset " << off << ", size " << r.u64();
        break;
      }
      case command::copy_tensor: {
        const uint64_t hs = r.u64(), os_ = r.u64(), hd = r.u64(), od = r.u64();
        os << " handle " << hs << " offset " << os_ << " -> handle " << hd << " offset " << od << ", size " << r.u64();
        break;
      }
      case command::graph_compute: {
        const uint32_t d = r.u32();
        const uint32_t n = r.u32();
        os << " device " << d << ", " << n << " nodes";
        if (r.remaining() >= static_cast<size_t>(n) * wire_tensor::wire_size) {
          (void)r.bytes(static_cast<size_t>(n) * wire_tensor::wire_size);
          describe_outputs(os, r);
        }
        break;
      }
      case command::graph_recompute: {
        os << " device " << r.u32();
        describe_outputs(os, r);
        break;
      }
      case command::init_tensor: {
        const wire_tensor w = wire_tensor::read(r);
        os << " handle " << w.buffer << ", offset " << w.offset << ", type " << w.type;
        break;
      }
      case command::get_alloc_size: {
        const uint32_t d = r.u32();
        const wire_tensor w = wire_tensor::read(r);
        os << " device " << d << ", type " << w.type << ", ne [" << w.ne[0] << ", " << w.ne[1] << ", " << w.ne[2] << ", "
           << w.ne[3] << "]";
        break;
      }
      case command::supports_op: {
        const uint32_t d = r.u32();
        const uint32_t n = r.u32();
        os << " device " << d << ", " << n << " entries";
        if (n >= 1 && n <= max_query_entries && r.remaining() == static_cast<size_t>(n) * wire_tensor::wire_size) {
          (void)r.bytes(static_cast<size_t>(n - 1) * wire_tensor::wire_size);
          const wire_tensor w = wire_tensor::read(r);
          os << ", op id " << int(w.op) << ", type " << w.type;
        }
        break;
      }
      case command::device_count:
      case command::set_tensor:
      case command::count: break;
    }
  } catch (const protocol_error& e) {
    os << " (malformed: " << e.what() << ")";
  }
  os << " -> ";
  if (rep.st != status::ok) {
    os << status_name(rep.st) << ": " << std::string(rep.body.begin(), rep.body.end());
    return os.str();
  }
  reader out(rep.body);
  try {
    switch (c) {
      case command::hello: os << "ok, server " << to_string(read_version(out)); break;
      case command::device_count: os << out.u32() << " devices"; break;
      case command::alloc_buffer: {
        const uint64_t h = out.u64();
        os << "handle " << h << ", remote_ptr " << hex(out.u64());
        break;
      }
      case command::get_alignment:
      case command::get_max_size:
      case command::get_alloc_size: os << out.u64(); break;
      case command::buffer_get_base: os << "remote_ptr " << hex(out.u64()); break;
      case command::get_device_memory: {
        const uint64_t free = out.u64();
        os << "free " << free << ", total " << out.u64();
        break;
      }
      case command::set_tensor_hash: os << (out.u8() != 0 ? "hit" : "miss"); break;
      case command::supports_op: os << (out.u8() != 0 ? "supported" : "not supported"); break;
      case command::get_tensor:
      case command::graph_compute:
      case command::graph_recompute: os << "ok, " << rep.size() << " bytes back"; break;
      default: os << "ok"; break;
    }
  } catch (const protocol_error&) {
    os << "ok";
  }
  return os.str();
}

}  // namespace troupe::rpc
