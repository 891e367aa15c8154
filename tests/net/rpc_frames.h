// Request frames for tests and the fuzzer: payloads written as the protocol says (backends/rpc/wire/protocol.h), and
// a small valid graph message, so tests can send good, bad and hostile frames without the client library.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "backends/rpc/wire/auth.h"
#include "backends/rpc/wire/protocol.h"
#include "runtime/types.h"

namespace troupe::rpc::testing {

struct frame {
  uint8_t code = 0;
  std::vector<uint8_t> payload;
};

template <class F>
inline frame make(command c, F&& fill) {
  frame f;
  f.code = static_cast<uint8_t>(c);
  writer w(f.payload);
  fill(w);
  return f;
}

inline frame hello(const nonce& server_nonce = {}, const std::string& key = {}, version v = protocol_version) {
  const nonce cn{};
  return make(command::hello, [&](writer& w) {
    w.u16(v.major);
    w.u16(v.minor);
    w.u16(v.patch);
    w.u32(0);
    w.bytes(cn.data(), cn.size());
    const mac m = key.empty() ? mac{} : client_proof(key, server_nonce, cn, v);
    w.bytes(m.data(), m.size());
  });
}
inline frame device_count() { return make(command::device_count, [](writer&) {}); }
inline frame alloc(uint32_t dev, uint64_t size) {
  return make(command::alloc_buffer, [&](writer& w) { w.u32(dev); w.u64(size); });
}
inline frame alignment(uint32_t dev) { return make(command::get_alignment, [&](writer& w) { w.u32(dev); }); }
inline frame max_size(uint32_t dev) { return make(command::get_max_size, [&](writer& w) { w.u32(dev); }); }
inline frame memory(uint32_t dev) { return make(command::get_device_memory, [&](writer& w) { w.u32(dev); }); }
inline frame base(uint64_t h) { return make(command::buffer_get_base, [&](writer& w) { w.u64(h); }); }
inline frame free_buffer(uint64_t h) { return make(command::free_buffer, [&](writer& w) { w.u64(h); }); }
inline frame clear(uint64_t h, uint8_t v) { return make(command::buffer_clear, [&](writer& w) { w.u64(h); w.u8(v); }); }
inline frame set(uint64_t h, uint64_t off, std::span<const uint8_t> bytes, uint32_t flags = 0) {
  return make(command::set_tensor, [&](writer& w) {
    w.u64(h);
    w.u64(off);
    w.u32(flags);
    w.bytes(bytes.data(), bytes.size());
  });
}
inline frame set_hash(uint64_t h, uint64_t off, uint64_t size, uint64_t hash) {
  return make(command::set_tensor_hash, [&](writer& w) {
    w.u64(h);
    w.u64(off);
    w.u64(size);
    w.u64(hash);
    w.u32(set_flag_cacheable);
  });
}
inline frame get(uint64_t h, uint64_t off, uint64_t size) {
  return make(command::get_tensor, [&](writer& w) { w.u64(h); w.u64(off); w.u64(size); });
}
inline frame copy(uint64_t hs, uint64_t os, uint64_t hd, uint64_t od, uint64_t size) {
  return make(command::copy_tensor, [&](writer& w) { w.u64(hs); w.u64(os); w.u64(hd); w.u64(od); w.u64(size); });
}
inline frame graph_frame(uint32_t dev, const std::vector<wire_tensor>& entries) {
  return make(command::graph_compute, [&](writer& w) {
    w.u32(dev);
    w.u32(static_cast<uint32_t>(entries.size()));
    for (const auto& e : entries) e.write(w);
    w.u32(0);  // no outputs to read back
  });
}
// Reads back (h, offset, size) with the reply.
inline frame recompute(uint32_t dev, uint64_t h = 0, uint64_t offset = 0, uint64_t size = 0) {
  return make(command::graph_recompute, [&](writer& w) {
    w.u32(dev);
    w.u32(h != 0 ? 1 : 0);
    if (h != 0) {
      w.u64(h);
      w.u64(offset);
      w.u64(size);
    }
  });
}
inline frame init_tensor(const wire_tensor& t) { return make(command::init_tensor, [&](writer& w) { t.write(w); }); }
inline frame alloc_size(uint32_t dev, const wire_tensor& t) {
  return make(command::get_alloc_size, [&](writer& w) { w.u32(dev); t.write(w); });
}

// A dense f32 tensor of shape ne at `offset` in buffer h.
inline wire_tensor leaf_f32(uint64_t h, uint64_t offset, std::array<int64_t, 4> ne) {
  wire_tensor t;
  t.type = static_cast<uint32_t>(type::f32);
  t.ne = ne;
  t.nb = {4, 4 * static_cast<uint64_t>(ne[0]), 4 * static_cast<uint64_t>(ne[0] * ne[1]),
          4 * static_cast<uint64_t>(ne[0] * ne[1] * ne[2])};
  t.buffer = h;
  t.offset = offset;
  return t;
}

inline wire_tensor node_f32(op o, uint64_t h, uint64_t offset, std::array<int64_t, 4> ne, std::array<int32_t, 4> src) {
  wire_tensor t = leaf_f32(h, offset, ne);
  t.k = wire_tensor::kind::node;
  t.op = static_cast<uint8_t>(o);
  t.src = src;
  return t;
}

// out[4, 3] = mul_mat(a[16, 4], b[16, 3]) + c[4, 3], all f32 in buffer h (1024 bytes at least):
// a at 0, b at 256, c at 448, mul_mat at 512, out at 576.
inline std::vector<wire_tensor> sample_graph(uint64_t h) {
  return {
      leaf_f32(h, 0, {16, 4, 1, 1}),
      leaf_f32(h, 256, {16, 3, 1, 1}),
      node_f32(op::mul_mat, h, 512, {4, 3, 1, 1}, {0, 1, -1, -1}),
      leaf_f32(h, 448, {4, 3, 1, 1}),
      node_f32(op::add, h, 576, {4, 3, 1, 1}, {2, 3, -1, -1}),
  };
}

// Fuzzer inputs: frames as [code u8][payload length u16][payload].
inline std::vector<uint8_t> encode_frames(const std::vector<frame>& frames) {
  std::vector<uint8_t> out;
  for (const auto& f : frames) {
    const size_t n = std::min<size_t>(f.payload.size(), 65535);
    out.push_back(f.code);
    out.push_back(static_cast<uint8_t>(n));
    out.push_back(static_cast<uint8_t>(n >> 8));
    out.insert(out.end(), f.payload.begin(), f.payload.begin() + static_cast<std::ptrdiff_t>(n));
  }
  return out;
}

inline std::vector<frame> decode_frames(std::span<const uint8_t> in) {
  std::vector<frame> out;
  size_t i = 0;
  while (i + 3 <= in.size()) {
    frame f;
    f.code = in[i];
    const size_t n = in[i + 1] | (static_cast<size_t>(in[i + 2]) << 8);
    i += 3;
    const size_t take = std::min(n, in.size() - i);
    f.payload.assign(in.begin() + static_cast<std::ptrdiff_t>(i), in.begin() + static_cast<std::ptrdiff_t>(i + take));
    i += take;
    out.push_back(std::move(f));
  }
  return out;
}

// Sessions that exercise every command (after hello), for seeds and tests.
inline std::vector<std::vector<frame>> sample_sessions() {
  std::vector<uint8_t> bytes(1024);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 7);
  std::vector<std::vector<frame>> out;
  out.push_back({device_count(), alloc(0, 1024), alignment(0), max_size(0), memory(0), base(1), set(1, 0, bytes),
                 get(1, 0, 1024), clear(1, 0), copy(1, 0, 1, 512, 256), free_buffer(1)});
  out.push_back({alloc(0, 1024), set(1, 0, bytes), graph_frame(0, sample_graph(1)), recompute(0, 1, 576, 48), get(1, 576, 48)});
  out.push_back({alloc(0, 1024), alloc(0, 2048), set_hash(2, 0, 1024, 1234), init_tensor(leaf_f32(1, 0, {16, 4, 1, 1})),
                 alloc_size(0, leaf_f32(0, 0, {16, 4, 1, 1})), copy(1, 0, 2, 1024, 1024), free_buffer(2)});
  return out;
}

}  // namespace troupe::rpc::testing
