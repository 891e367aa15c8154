// The frame handler of one client connection (net/rpc/frame_handler.h): the greeting and hello, the check of each
// frame's header, and every command on the connection's buffers and devices. Its debug lines are in
// session_debug.cpp.
#include "net/rpc/frame_handler.h"

#include <cstring>
#include <new>
#include <string>
#include <thread>

#include "backends/rpc/wire/auth.h"
#include "runtime/log.h"

namespace troupe::rpc {
namespace {

// An unknown buffer handle or device index.
class lookup_error : public protocol_error {
 public:
  using protocol_error::protocol_error;
};

reply error_reply(status st, std::string_view msg, bool close = false) {
  reply r;
  r.st = st;
  r.body.assign(msg.begin(), msg.end());
  r.close = close;
  return r;
}

reply ok() { return reply{}; }

// A byte range of a buffer as a tensor, for the buffer's set/get/memset methods.
tensor byte_range(buffer_i& buf, uint64_t offset, uint64_t size) {
  tensor t;
  t.type = type::i8;
  t.ne = {static_cast<int64_t>(size), 1, 1, 1};
  t.nb = {1, size, size, size};
  t.buffer = &buf;
  t.data = static_cast<char*>(buf.base()) + offset;
  return t;
}

}  // namespace

frame_handler::frame_handler(const frame_handler_config& cfg, std::string peer) : cfg_(cfg), peer_(std::move(peer)) {
  server_nonce_ = random_nonce();
  backends_.resize(cfg_.devices.size());
  count(&peer_server_stats::connections, 1);
  count(&peer_server_stats::connections_total, 1);
}

frame_handler::~frame_handler() {
  last_graph_.clear();
  backends_.clear();
  count(&peer_server_stats::buffers, -static_cast<int64_t>(buffers_.size()));
  count(&peer_server_stats::buffer_bytes, -static_cast<int64_t>(bytes_));
  if (debugging()) {
    log_message(log_level::debug, "rpc " + peer_ + ": closed; freeing " + std::to_string(buffers_.size()) +
                                     " buffers (" + std::to_string(bytes_) + " bytes)");
  }
  buffers_.clear();
  count(&peer_server_stats::connections, -1);
}

void frame_handler::count(std::atomic<uint64_t> peer_server_stats::*field, int64_t delta) {
  if (cfg_.stats != nullptr) (cfg_.stats->*field).fetch_add(static_cast<uint64_t>(delta));
}

std::vector<uint8_t> frame_handler::greeting() const {
  std::vector<uint8_t> out;
  writer w(out);
  w.u32(greeting_magic);
  w.u16(cfg_.server_version.major);
  w.u16(cfg_.server_version.minor);
  w.u16(cfg_.server_version.patch);
  w.u32(cfg_.key.empty() ? 0u : 1u);
  w.bytes(server_nonce_.data(), server_nonce_.size());
  return out;
}

reply frame_handler::handle(uint8_t code, std::span<const uint8_t> payload) {
  count(&peer_server_stats::frames, 1);
  if (auto bad_header = check_header(code, payload.size())) return std::move(*bad_header);
  const command c = *command_from_code(code);
  if (c == command::hello) {
    reply r = hello_done_ ? error_reply(status::protocol, "hello sent twice", true) : hello(payload);
    if (debugging()) debug_line(describe(c, payload, r));
    return r;
  }
  if (c == command::set_tensor) {
    reply r;
    r.send = false;
    try {
      if (payload.size() < set_tensor_prefix) throw protocol_error("set_tensor: payload shorter than its prefix");
      const set_target t = begin_set_tensor(payload.first(set_tensor_prefix), payload.size() - set_tensor_prefix);
      const auto data = payload.subspan(set_tensor_prefix);
      if (t.host != nullptr) std::memcpy(t.host, data.data(), data.size());
      end_set_tensor(t, t.host != nullptr ? std::span<const uint8_t>{} : data);
    } catch (const std::exception& e) {
      TROUPE_LOG(error, "rpc " << peer_ << ": " << e.what());
      if (!pending_error_) pending_error_ = e.what();
    }
    if (debugging()) debug_set_tensor(payload.first(std::min(payload.size(), set_tensor_prefix)), payload.size() - std::min(payload.size(), set_tensor_prefix), false);
    return r;
  }
  if (control_ && !control_command(c)) {
    reply r = error_reply(status::bad_request, std::string(command_name(c)) +
                                                   ": not served on a control connection (probes and capability "
                                                   "questions only; buffers and graphs need a connection of their own)");
    count(&peer_server_stats::error_replies, 1);
    if (debugging()) debug_line(describe(c, payload, r));
    return r;
  }
  if (pending_error_) {
    reply r = error_reply(status::bad_request, "an earlier set_tensor failed: " + *pending_error_);
    pending_error_.reset();
    count(&peer_server_stats::error_replies, 1);
    if (debugging()) debug_line(describe(c, payload, r));
    return r;
  }
  reply r;
  try {
    r = dispatch(c, payload);
  } catch (const lookup_error& e) {
    r = error_reply(status::not_found, std::string(command_name(c)) + ": " + e.what());
  } catch (const protocol_error& e) {
    r = error_reply(status::bad_request, std::string(command_name(c)) + ": " + e.what());
  } catch (const std::bad_alloc&) {
    r = error_reply(status::failed, std::string(command_name(c)) + ": out of memory");
  } catch (const std::exception& e) {
    r = error_reply(status::failed, std::string(command_name(c)) + ": " + e.what());
  }
  if (r.st != status::ok && r.st != status::no_graph) {
    count(&peer_server_stats::error_replies, 1);
    // A malformed request may be an attack: a warning. A request the device could not serve (no memory, an
    // unknown handle after a reconnect) is the client's to report: a debug line, as llama.cpp's rpc-server
    // logs it.
    if (r.st == status::bad_request || r.st == status::protocol) {
      TROUPE_LOG(warn, "rpc " << peer_ << ": " << std::string(r.body.begin(), r.body.end()));
    } else {
      TROUPE_LOG(debug, "rpc " << peer_ << ": " << std::string(r.body.begin(), r.body.end()));
    }
  }
  if (debugging()) debug_line(describe(c, payload, r));
  return r;
}

std::optional<reply> frame_handler::check_header(uint8_t code, uint64_t size) const {
  const auto c = command_from_code(code);
  if (!c) {
    TROUPE_LOG(error, "rpc " << peer_ << ": unknown command " << int(code) << "; closing the connection");
    return error_reply(status::protocol, "unknown command " + std::to_string(code), true);
  }
  if (size > max_payload(*c)) {
    TROUPE_LOG(error, "rpc " << peer_ << ": " << command_name(*c) << " payload of " << size
                             << " bytes exceeds the limit; closing the connection");
    return error_reply(status::protocol, std::string(command_name(*c)) + ": payload of " + std::to_string(size) +
                                             " bytes exceeds the limit of " + std::to_string(max_payload(*c)),
                       true);
  }
  if (!hello_done_ && *c != command::hello) {
    TROUPE_LOG(error, "rpc " << peer_ << ": " << command_name(*c) << " before hello; closing the connection");
    return error_reply(status::protocol, "the first command must be hello", true);
  }
  return std::nullopt;
}

reply frame_handler::hello(std::span<const uint8_t> payload) {
  reader r(payload);
  version v;
  nonce cn{};
  mac proof{};
  uint32_t flags = 0;
  try {
    v = read_version(r);
    flags = r.u32();
    std::memcpy(cn.data(), r.bytes(cn.size()).data(), cn.size());
    std::memcpy(proof.data(), r.bytes(proof.size()).data(), proof.size());
    r.done("hello");
  } catch (const protocol_error& e) {
    return error_reply(status::protocol, std::string("hello: ") + e.what(), true);
  }
  if (!compatible(v, cfg_.server_version)) {
    TROUPE_LOG(error, "rpc " << peer_ << ": client version " << to_string(v) << " refused (server "
                             << to_string(cfg_.server_version) << ")");
    return error_reply(status::version_mismatch,
                       "client protocol " + to_string(v) + " is incompatible with server protocol " +
                           to_string(cfg_.server_version) +
                           " (the major versions must match and the server's minor must not be newer)",
                       true);
  }
  if (!cfg_.key.empty() && !equal_macs(proof, client_proof(cfg_.key, server_nonce_, cn, v))) {
    TROUPE_LOG(error, "rpc " << peer_ << ": authentication failed");
    return error_reply(status::auth_failed, "authentication failed: this peer requires the shared key", true);
  }
  if ((flags & ~uint32_t{hello_control}) != 0) {
    return error_reply(status::protocol, "hello: unknown flags " + std::to_string(flags), true);
  }
  hello_done_ = true;
  control_ = (flags & hello_control) != 0;
  if (control_) count(&peer_server_stats::control_connections, 1);
  reply out;
  writer w(out.body);
  w.u16(cfg_.server_version.major);
  w.u16(cfg_.server_version.minor);
  w.u16(cfg_.server_version.patch);
  const mac sp = cfg_.key.empty() ? mac{} : server_proof(cfg_.key, cn, server_nonce_);
  w.bytes(sp.data(), sp.size());
  return out;
}

reply frame_handler::dispatch(command c, std::span<const uint8_t> payload) {
  reader r(payload);
  reply out;
  writer w(out.body);
  switch (c) {
    case command::device_count: return device_count(r);
    case command::alloc_buffer: return alloc_buffer(r);
    case command::get_alignment: {
      device_i& dev = *cfg_.devices[device_index(r)];
      r.done("get_alignment");
      w.u64(dev.buffer_type().alignment());
      return out;
    }
    case command::get_max_size: {
      device_i& dev = *cfg_.devices[device_index(r)];
      r.done("get_max_size");
      uint64_t m = dev.buffer_type().max_size();
      if (cfg_.max_buffer_size != 0) m = std::min(m, cfg_.max_buffer_size);
      w.u64(m);
      return out;
    }
    case command::buffer_get_base: {
      const uint64_t h = r.u64();
      r.done("buffer_get_base");
      lookup(h);
      // Opaque: tensors are named by (handle, offset), so the base is never a server address.
      w.u64(h << 32);
      return out;
    }
    case command::free_buffer: return free_buffer(r);
    case command::buffer_clear: return buffer_clear(r);
    case command::set_tensor_hash: return set_tensor_hash(r);
    case command::get_tensor: return get_tensor(r);
    case command::copy_tensor: return copy_tensor(r);
    case command::graph_compute: return graph_compute(r);
    case command::graph_recompute: return graph_recompute(r);
    case command::get_device_memory: {
      device_i& dev = *cfg_.devices[device_index(r)];
      r.done("get_device_memory");
      const device_memory m = dev.memory();
      w.u64(m.free);
      w.u64(m.total);
      return out;
    }
    case command::init_tensor: return init_tensor(r);
    case command::get_alloc_size: return get_alloc_size(r);
    case command::supports_op: return supports_op(r);
    case command::hello:
    case command::set_tensor:
    case command::count: break;
  }
  throw protocol_error("not a dispatchable command");
}

uint32_t frame_handler::device_index(reader& r) {
  const uint32_t d = r.u32();
  if (d >= cfg_.devices.size()) {
    throw lookup_error("device index " + std::to_string(d) + " (this peer serves " +
                       std::to_string(cfg_.devices.size()) + ")");
  }
  return d;
}

frame_handler::buffer_entry& frame_handler::lookup(uint64_t handle) {
  const auto it = buffers_.find(handle);
  if (it == buffers_.end()) throw lookup_error("unknown buffer handle " + std::to_string(handle));
  return it->second;
}

backend_i& frame_handler::backend_for(uint32_t device) {
  backend_ptr& be = backends_.at(device);
  if (!be) be = cfg_.make_backend ? cfg_.make_backend(*cfg_.devices[device]) : cfg_.devices[device]->init_backend();
  if (!be) throw backend_error("no backend for device " + std::string(cfg_.devices[device]->name()));
  return *be;
}

reply frame_handler::device_count(reader& r) {
  r.done("device_count");
  reply out;
  writer w(out.body);
  w.u32(static_cast<uint32_t>(cfg_.devices.size()));
  for (device_i* d : cfg_.devices) {
    w.str(d->name());
    w.str(d->description());
    w.u8(static_cast<uint8_t>(d->type()));
    w.u32(0);  // device_flags: none; the devices a peer serves need neither init_tensor nor a custom alloc size
  }
  return out;
}

reply frame_handler::alloc_buffer(reader& r) {
  const uint32_t d = device_index(r);
  const uint64_t size = r.u64();
  r.done("alloc_buffer");
  device_i& dev = *cfg_.devices[d];
  uint64_t limit = dev.buffer_type().max_size();
  if (cfg_.max_buffer_size != 0) limit = std::min(limit, cfg_.max_buffer_size);
  if (size > limit) {
    throw out_of_memory_error("a buffer of " + std::to_string(size) + " bytes exceeds the limit of " +
                              std::to_string(limit) + " on " + std::string(dev.name()));
  }
  if (cfg_.max_connection_bytes != 0 && size > cfg_.max_connection_bytes - std::min(bytes_, cfg_.max_connection_bytes)) {
    throw out_of_memory_error("a buffer of " + std::to_string(size) + " bytes exceeds this connection's limit (" +
                              std::to_string(bytes_) + " of " + std::to_string(cfg_.max_connection_bytes) + " in use)");
  }
  if (buffers_.size() >= cfg_.max_buffers) {
    throw backend_error("this connection already holds " + std::to_string(buffers_.size()) + " buffers");
  }
  buffer_ptr buf = dev.buffer_type().alloc_buffer(static_cast<size_t>(size));
  const uint64_t h = next_handle_++;
  buffers_.emplace(h, buffer_entry{std::move(buf), d});
  bytes_ += size;
  count(&peer_server_stats::buffers, 1);
  count(&peer_server_stats::buffer_bytes, static_cast<int64_t>(size));
  reply out;
  writer w(out.body);
  w.u64(h);
  w.u64(h << 32);
  return out;
}

reply frame_handler::free_buffer(reader& r) {
  const uint64_t h = r.u64();
  r.done("free_buffer");
  buffer_entry& e = lookup(h);
  const uint64_t size = e.buf->size();
  // The last graphs may point into this buffer: forget them before the memory goes.
  last_graph_.clear();
  buffers_.erase(h);
  bytes_ -= size;
  count(&peer_server_stats::buffers, -1);
  count(&peer_server_stats::buffer_bytes, -static_cast<int64_t>(size));
  return ok();
}

reply frame_handler::buffer_clear(reader& r) {
  const uint64_t h = r.u64();
  const uint8_t value = r.u8();
  r.done("buffer_clear");
  lookup(h).buf->clear(value);
  return ok();
}

void frame_handler::write_bytes(buffer_i& buf, uint64_t offset, const uint8_t* data, uint64_t size) {
  if (size == 0) return;
  tensor t = byte_range(buf, offset, size);
  buf.set_tensor(t, data, 0, static_cast<size_t>(size));
}

void frame_handler::read_bytes(buffer_i& buf, uint64_t offset, uint8_t* out, uint64_t size) {
  if (size == 0) return;
  tensor t = byte_range(buf, offset, size);
  buf.get_tensor(t, out, 0, static_cast<size_t>(size));
}

frame_handler::set_target frame_handler::begin_set_tensor(std::span<const uint8_t> prefix, uint64_t data_size) {
  reader r(prefix);
  set_target t;
  const uint64_t h = r.u64();
  t.offset = r.u64();
  t.flags = r.u32();
  r.done("set_tensor");
  t.size = data_size;
  t.buf = lookup(h).buf.get();
  check_range(t.offset, t.size, t.buf->size(), "set_tensor");
  if (t.buf->is_host()) t.host = static_cast<uint8_t*>(t.buf->base()) + t.offset;
  return t;
}

void frame_handler::end_set_tensor(const set_target& t, std::span<const uint8_t> staged) {
  try {
    if (t.host == nullptr) write_bytes(*t.buf, t.offset, staged.data(), t.size);
    if (cfg_.cache != nullptr && (t.flags & set_flag_cacheable) && t.size >= hash_threshold) {
      cfg_.cache->store(t.host != nullptr ? t.host : staged.data(), t.size);
      count(&peer_server_stats::cache_stores, 1);
    }
  } catch (const std::exception& e) {
    // No reply to carry it: the next one does.
    TROUPE_LOG(error, "rpc " << peer_ << ": set_tensor: " << e.what());
    if (!pending_error_) pending_error_ = std::string("set_tensor: ") + e.what();
  }
}

reply frame_handler::set_tensor_hash(reader& r) {
  const uint64_t h = r.u64();
  const uint64_t offset = r.u64();
  const uint64_t size = r.u64();
  const uint64_t hash = r.u64();
  (void)r.u32();  // flags
  r.done("set_tensor_hash");
  buffer_i& buf = *lookup(h).buf;
  check_range(offset, size, buf.size(), "set_tensor_hash");
  bool hit = false;
  if (cfg_.cache != nullptr && size > 0) {
    if (buf.is_host()) {
      hit = cfg_.cache->load(hash, static_cast<uint8_t*>(buf.base()) + offset, size);
    } else {
      std::vector<uint8_t> staging(size);
      hit = cfg_.cache->load(hash, staging.data(), size);
      if (hit) write_bytes(buf, offset, staging.data(), size);
    }
  }
  count(hit ? &peer_server_stats::cache_hits : &peer_server_stats::cache_misses, 1);
  reply out;
  out.body.push_back(hit ? 1 : 0);
  return out;
}

reply frame_handler::get_tensor(reader& r) {
  const uint64_t h = r.u64();
  const uint64_t offset = r.u64();
  const uint64_t size = r.u64();
  r.done("get_tensor");
  buffer_i& buf = *lookup(h).buf;
  check_range(offset, size, buf.size(), "get_tensor");
  reply out;
  if (buf.is_host()) {
    out.tail = {static_cast<const uint8_t*>(buf.base()) + offset, static_cast<size_t>(size)};
  } else {
    out.body.resize(size);
    read_bytes(buf, offset, out.body.data(), size);
  }
  return out;
}

reply frame_handler::copy_tensor(reader& r) {
  const uint64_t hs = r.u64();
  const uint64_t os = r.u64();
  const uint64_t hd = r.u64();
  const uint64_t od = r.u64();
  const uint64_t size = r.u64();
  r.done("copy_tensor");
  buffer_i& src = *lookup(hs).buf;
  buffer_i& dst = *lookup(hd).buf;
  check_range(os, size, src.size(), "copy_tensor source");
  check_range(od, size, dst.size(), "copy_tensor destination");
  if (size == 0) return ok();
  if (src.is_host() && dst.is_host()) {
    // memmove: the ranges may overlap.
    std::memmove(static_cast<char*>(dst.base()) + od, static_cast<const char*>(src.base()) + os, size);
    return ok();
  }
  tensor ts = byte_range(src, os, size);
  tensor td = byte_range(dst, od, size);
  if (&src != &dst && dst.copy_tensor(ts, td)) return ok();
  std::vector<uint8_t> staging(size);
  read_bytes(src, os, staging.data(), size);
  write_bytes(dst, od, staging.data(), size);
  return ok();
}

std::vector<frame_handler::output_range> frame_handler::read_outputs(reader& r, const char* what) {
  const uint32_t n = r.u32();
  if (n > max_graph_outputs) throw protocol_error(std::string(what) + ": more than " + std::to_string(max_graph_outputs) + " outputs");
  std::vector<output_range> out;
  uint64_t total = 0;
  for (uint32_t i = 0; i < n; ++i) {
    output_range o;
    o.buf = lookup(r.u64()).buf.get();
    o.offset = r.u64();
    o.size = r.u64();
    check_range(o.offset, o.size, o.buf->size(), what);
    if (o.size > max_output_bytes - total) throw protocol_error(std::string(what) + ": outputs exceed 64 MiB");
    total += o.size;
    out.push_back(o);
  }
  r.done(what);
  return out;
}

reply frame_handler::outputs_reply(const std::vector<output_range>& outs) {
  reply out;
  if (outs.size() == 1 && outs[0].buf->is_host()) {
    out.tail = {static_cast<const uint8_t*>(outs[0].buf->base()) + outs[0].offset, static_cast<size_t>(outs[0].size)};
    return out;
  }
  uint64_t total = 0;
  for (const auto& o : outs) total += o.size;
  out.body.resize(total);
  uint64_t at = 0;
  for (const auto& o : outs) {
    read_bytes(*o.buf, o.offset, out.body.data() + at, o.size);
    at += o.size;
  }
  return out;
}

reply frame_handler::graph_compute(reader& r) {
  const uint32_t d = device_index(r);
  const uint32_t n = r.u32();
  if (n > max_graph_entries) throw protocol_error("graph of " + std::to_string(n) + " entries exceeds the limit");
  if (r.remaining() < static_cast<size_t>(n) * wire_tensor::wire_size) {
    throw protocol_error("graph of " + std::to_string(n) + " entries needs " +
                         std::to_string(static_cast<size_t>(n) * wire_tensor::wire_size) + " bytes, the payload has " +
                         std::to_string(r.remaining()));
  }
  std::vector<wire_tensor> entries;
  entries.reserve(n);
  for (uint32_t i = 0; i < n; ++i) entries.push_back(wire_tensor::read(r));
  const std::vector<output_range> outs = read_outputs(r, "graph_compute");
  last_graph_.erase(d);
  device_i& dev = *cfg_.devices[d];
  if (cfg_.graph_delay.count() > 0) std::this_thread::sleep_for(cfg_.graph_delay);
  decoded_graph g = decode_graph(entries, dev, [this](uint64_t h) -> buffer_i* {
    const auto it = buffers_.find(h);
    return it == buffers_.end() ? nullptr : it->second.buf.get();
  });
  backend_for(d).graph_compute(*g.g);
  last_graph_.emplace(d, std::move(g));
  return outputs_reply(outs);
}

reply frame_handler::graph_recompute(reader& r) {
  const uint32_t d = device_index(r);
  const std::vector<output_range> outs = read_outputs(r, "graph_recompute");
  const auto it = last_graph_.find(d);
  if (it == last_graph_.end()) return error_reply(status::no_graph, "graph_recompute: no graph to run again");
  if (cfg_.graph_delay.count() > 0) std::this_thread::sleep_for(cfg_.graph_delay);
  backend_for(d).graph_compute(*it->second.g);
  return outputs_reply(outs);
}

reply frame_handler::init_tensor(reader& r) {
  const wire_tensor w = wire_tensor::read(r);
  r.done("init_tensor");
  context ctx({.max_tensors = 1, .no_alloc = true});
  tensor* t = decode_leaf(ctx, w, nullptr,
                          [this](uint64_t h) -> buffer_i* {
                            const auto it = buffers_.find(h);
                            return it == buffers_.end() ? nullptr : it->second.buf.get();
                          },
                          "init_tensor");
  t->buffer->init_tensor(*t);
  return ok();
}

reply frame_handler::get_alloc_size(reader& r) {
  const uint32_t d = device_index(r);
  const wire_tensor w = wire_tensor::read(r);
  r.done("get_alloc_size");
  const type t = check_type(w.type, "get_alloc_size");
  check_shape(t, w.ne, "get_alloc_size");
  if ((block_size(t) > 1 && w.nb[0] != type_size(t)) || !checked_span(t, w.ne, w.nb)) {
    throw protocol_error("get_alloc_size: strides out of range");
  }
  tensor x;
  x.type = t;
  x.ne = w.ne;
  x.nb = {w.nb[0], w.nb[1], w.nb[2], w.nb[3]};
  reply out;
  writer wr(out.body);
  wr.u64(cfg_.devices[d]->buffer_type().alloc_size(x));
  return out;
}

}  // namespace troupe::rpc

namespace troupe::rpc {

// Whether the device would compute a node: the peer's own device answers (device_i::supports_op), so a
// client places work on a remote device exactly as on a local one.
reply frame_handler::supports_op(reader& r) {
  const uint32_t d = device_index(r);
  const uint32_t n = r.u32();
  if (n == 0 || n > max_query_entries) {
    throw protocol_error("supports_op: " + std::to_string(n) + " entries (1 to " + std::to_string(max_query_entries) + ")");
  }
  std::vector<wire_tensor> entries;
  for (uint32_t i = 0; i < n; ++i) entries.push_back(wire_tensor::read(r));
  r.done("supports_op");
  context ctx({.max_tensors = 16, .no_alloc = true});
  const tensor* x = decode_query(ctx, entries, "supports_op");
  const bool yes = cfg_.devices[d]->supports_op(*x);
  count(&peer_server_stats::op_questions, 1);
  reply out;
  out.body.push_back(yes ? 1 : 0);
  return out;
}

}  // namespace troupe::rpc
