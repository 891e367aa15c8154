#include "backends/rpc/rpc_client.h"

#include <algorithm>
#include <cstring>

#include "backends/rpc/detail/client_impl.h"
#include "runtime/log.h"

namespace troupe::rpc {

std::vector<device_info> client::devices() {
  auto lock = impl_->enter();
  impl_->ensure_up(true);
  const auto rep = impl_->call(command::device_count, {}, 64 * max_message_bytes);
  std::vector<device_info> out;
  try {
    reader r(rep);
    const uint32_t n = r.u32();
    if (n > 1024) throw protocol_error("more than 1024 devices");
    for (uint32_t i = 0; i < n; ++i) {
      device_info d;
      d.name = r.str(256);
      d.description = r.str(4096);
      const uint8_t t = r.u8();
      if (t > static_cast<uint8_t>(device_type::accel)) throw protocol_error("unknown device type");
      d.type = static_cast<device_type>(t);
      d.flags = r.u32();
      out.push_back(std::move(d));
    }
    r.done("device_count reply");
  } catch (const protocol_error& e) {
    impl_->fail(std::string("bad device_count reply: ") + e.what());
  }
  return out;
}

namespace {
std::vector<uint8_t> u32_payload(uint32_t v) {
  std::vector<uint8_t> p;
  writer(p).u32(v);
  return p;
}
uint64_t read_u64(const std::vector<uint8_t>& rep, size_t at = 0) {
  reader r(rep);
  if (at) r.bytes(at);
  return r.u64();
}
}  // namespace

remote_buffer client::alloc_buffer(uint32_t device, uint64_t size) {
  auto lock = impl_->enter();
  impl_->ensure_up(true);
  std::vector<uint8_t> p;
  writer w(p);
  w.u32(device);
  w.u64(size);
  std::vector<uint8_t> rep;
  try {
    rep = impl_->call(command::alloc_buffer, p, 16);
  } catch (const remote_error& e) {
    if (impl_->opts.debug) {
      TROUPE_LOG(debug, "rpc client " << impl_->addr << ": alloc_buffer device " << device << ", size " << size << " -> failed: " << e.what());
    }
    // The peer checked the request (device index, sizes); a refusal after that is its memory or its limits.
    if (e.code() == status::failed) throw out_of_memory_error(e.what());
    throw;
  }
  if (rep.size() != 16) impl_->fail("bad alloc_buffer reply");
  const uint64_t handle = read_u64(rep);
  if (impl_->opts.debug) {
    reader r(rep);
    (void)r.u64();
    TROUPE_LOG(debug, "rpc client " << impl_->addr << ": alloc_buffer device " << device << ", size " << size << " -> handle "
                                    << handle << ", remote_ptr 0x" << std::hex << r.u64());
  }
  return {impl_->epoch, handle};
}

uint64_t client::alignment(uint32_t device) {
  auto lock = impl_->enter();
  impl_->ensure_up(true);
  const auto rep = impl_->call(command::get_alignment, u32_payload(device), 8);
  if (rep.size() != 8) impl_->fail("bad get_alignment reply");
  return read_u64(rep);
}

uint64_t client::max_size(uint32_t device) {
  auto lock = impl_->enter();
  impl_->ensure_up(true);
  const auto rep = impl_->call(command::get_max_size, u32_payload(device), 8);
  if (rep.size() != 8) impl_->fail("bad get_max_size reply");
  return read_u64(rep);
}

device_memory client::memory(uint32_t device) {
  auto lock = impl_->enter();
  impl_->ensure_up(true);
  const auto rep = impl_->call(command::get_device_memory, u32_payload(device), 16);
  if (rep.size() != 16) impl_->fail("bad get_device_memory reply");
  return {static_cast<size_t>(read_u64(rep)), static_cast<size_t>(read_u64(rep, 8))};
}

uint64_t client::buffer_base(remote_buffer b) {
  auto lock = impl_->enter();
  impl_->check(b);
  std::vector<uint8_t> p;
  writer(p).u64(b.handle);
  const auto rep = impl_->call(command::buffer_get_base, p, 8);
  if (rep.size() != 8) impl_->fail("bad buffer_get_base reply");
  return read_u64(rep);
}

void client::free_buffer(remote_buffer b) {
  if (impl_->down.load()) return;  // gone with its connection
  std::lock_guard lock(impl_->mu);
  if (!impl_->up || impl_->down.load() || b.epoch != impl_->epoch) return;
  std::vector<uint8_t> p;
  writer(p).u64(b.handle);
  impl_->last_graph.clear();  // the peer forgets its graphs when a buffer goes
  impl_->drop_outputs_in({b.handle});
  impl_->call(command::free_buffer, p, 0);
}

void client::buffer_clear(remote_buffer b, uint8_t value) {
  auto lock = impl_->enter();
  impl_->check(b);
  std::vector<uint8_t> p;
  writer w(p);
  w.u64(b.handle);
  w.u8(value);
  impl_->drop_outputs_in({b.handle});
  impl_->call(command::buffer_clear, p, 0);
}

void client::set_tensor(remote_buffer b, uint64_t offset, const void* data, uint64_t size, bool cacheable) {
  auto lock = impl_->enter();
  impl_->check(b);
  impl_->drop_outputs(b.handle, offset, size);
  if (cacheable && size >= impl_->opts.hash_threshold) {
    std::vector<uint8_t> p;
    writer w(p);
    w.u64(b.handle);
    w.u64(offset);
    w.u64(size);
    w.u64(content_hash(data, size));
    w.u32(set_flag_cacheable);
    const auto rep = impl_->call(command::set_tensor_hash, p, 1);
    if (rep.size() != 1) impl_->fail("bad set_tensor_hash reply");
    if (rep[0] == 1) {
      impl_->st.cache_hits += 1;
      return;
    }
    impl_->st.cache_misses += 1;
  }
  uint8_t prefix[set_tensor_prefix];
  {
    std::vector<uint8_t> p;
    writer w(p);
    w.u64(b.handle);
    w.u64(offset);
    w.u32(cacheable ? set_flag_cacheable : 0u);
    std::memcpy(prefix, p.data(), sizeof prefix);
  }
  const std::span<const uint8_t> bytes(static_cast<const uint8_t*>(data), static_cast<size_t>(size));
  if (size <= impl_->max_held / 4) {
    impl_->hold_frame(command::set_tensor, prefix, bytes);
  } else {
    impl_->send_frame(command::set_tensor, prefix, bytes);
  }
}

void client::get_tensor(remote_buffer b, uint64_t offset, void* out, uint64_t size) {
  // A graph reply's output needs no lock on the connection: it is answered while another thread's request
  // (the next micro-batch's graph) is in flight. (Copies are of this connection's buffers only: a lost
  // connection drops them, so a stale handle finds none and fails its check below.)
  impl_->throw_if_down();
  if (impl_->from_outputs(b, offset, out, size)) return;
  auto lock = impl_->enter();
  impl_->check(b);
  if (impl_->from_outputs(b, offset, out, size)) return;
  std::vector<uint8_t> p;
  writer w(p);
  w.u64(b.handle);
  w.u64(offset);
  w.u64(size);
  impl_->send_frame(command::get_tensor, p);
  const uint64_t n = impl_->read_ok(command::get_tensor);
  if (n != size) impl_->fail("get_tensor: reply of " + std::to_string(n) + " bytes, asked for " + std::to_string(size));
  impl_->read_exact(out, static_cast<size_t>(n));
}

void client::copy_tensor(remote_buffer src, uint64_t src_offset, remote_buffer dst, uint64_t dst_offset, uint64_t size) {
  auto lock = impl_->enter();
  impl_->check(src);
  impl_->check(dst);
  std::vector<uint8_t> p;
  writer w(p);
  w.u64(src.handle);
  w.u64(src_offset);
  w.u64(dst.handle);
  w.u64(dst_offset);
  w.u64(size);
  impl_->drop_outputs(dst.handle, dst_offset, size);
  impl_->call(command::copy_tensor, p, 0);
}

client::impl::output_list client::impl::list_outputs(const std::vector<output_request>& outputs) const {
  output_list l;
  writer w(l.wire);
  for (const auto& o : outputs) {
    if (l.ranges.size() >= max_graph_outputs || o.size > max_output_bytes - l.bytes) break;
    check(o.buffer);
    l.ranges.push_back(o);
    l.bytes += o.size;
  }
  w.u32(static_cast<uint32_t>(l.ranges.size()));
  for (const auto& o : l.ranges) {
    w.u64(o.buffer.handle);
    w.u64(o.offset);
    w.u64(o.size);
  }
  return l;
}

void client::impl::drop_written(const std::optional<std::vector<uint64_t>>& written) {
  if (written) {
    drop_outputs_in(*written);
  } else {
    drop_outputs();
  }
}

void client::compute(uint32_t device, std::vector<uint8_t> graph, const std::vector<output_request>& outputs,
                     const std::optional<std::vector<uint64_t>>& written) {
  auto lock = impl_->enter();
  impl_->ensure_up(false);
  impl_->drain_queued();  // (a recompute's reply time is measured from its request)
  impl_->drop_written(written);
  const std::vector<uint8_t> dev = u32_payload(device);
  const impl::output_list outs = impl_->list_outputs(outputs);
  auto it = impl_->last_graph.find(device);
  if (it != impl_->last_graph.end() && it->second == graph) {
    impl_->send_frame(command::graph_recompute, dev, outs.wire);
    const auto sent = std::chrono::steady_clock::now();
    status s = status::ok;
    const uint64_t n = impl_->read_ok(command::graph_recompute, false, &s, impl_->recompute_latency.window(device, sent, impl_->opts.busy_poll));
    if (s == status::ok) {
      if (impl_->opts.busy_poll.count() > 0) impl_->recompute_latency.note(device, std::chrono::steady_clock::now() - sent);
      impl_->st.graphs_recomputed += 1;
      impl_->receive_outputs(n, outs.bytes, outs.ranges);
      return;
    }
    if (n > max_message_bytes) impl_->fail("graph_recompute: reply too large");
    std::string msg(n, '\0');
    impl_->read_exact(msg.data(), n);
    impl_->last_graph.erase(device);
    if (s != status::no_graph) {
      throw remote_error(s, "peer " + impl_->who + ": graph_recompute failed (" + std::string(status_name(s)) + "): " + msg);
    }
  }
  impl_->last_graph.erase(device);
  impl_->send_frame(command::graph_compute, dev, graph, outs.wire);
  impl_->st.graphs_sent += 1;
  const uint64_t n = impl_->read_ok(command::graph_compute);
  impl_->receive_outputs(n, outs.bytes, outs.ranges);
  impl_->last_graph[device] = std::move(graph);
}

bool client::can_queue() const { return !impl_->opts.tls; }

client::ticket client::submit(uint32_t device, std::vector<uint8_t> graph, const std::vector<output_request>& outputs,
                              const std::optional<std::vector<uint64_t>>& written) {
  if (!can_queue()) {
    compute(device, std::move(graph), outputs, written);
    return {};
  }
  auto lock = impl_->enter();
  impl_->ensure_up(false);
  impl_->drop_written(written);
  impl::output_list outs = impl_->list_outputs(outputs);
  impl_->last_graph.erase(device);  // (never run again by graph_recompute: its reply is not waited for here)
  impl_->send_frame(command::graph_compute, u32_payload(device), graph, outs.wire);
  impl_->st.graphs_sent += 1;
  impl::queued_graph q;
  q.id = impl_->next_ticket++;
  q.outputs = std::move(outs.ranges);
  q.out_bytes = outs.bytes;
  q.drops_from = impl_->drop_log.size();
  q.sent = std::chrono::steady_clock::now();
  impl_->queued.push_back(std::move(q));
  return {impl_->epoch, impl_->queued.back().id};
}

bool client::wait(ticket t, std::chrono::microseconds timeout, int wake_fd) {
  if (t.id == 0) return true;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    {
      auto lock = impl_->enter();
      const auto failed = impl_->ticket_failures.find(t.id);
      if (t.epoch == impl_->epoch && failed != impl_->ticket_failures.end()) {
        const std::exception_ptr e = failed->second;
        impl_->ticket_failures.erase(failed);
        std::rethrow_exception(e);
      }
      if (t.epoch != impl_->epoch || (!impl_->up && t.id >= impl_->first_unread())) {
        throw unavailable_error("peer " + impl_->who + ": a graph's reply was lost when its connection dropped");
      }
      if (t.id < impl_->first_unread()) return true;
      // Its reply, or one before it, is to come: read what has arrived.
      if (impl_->io.wait_readable(std::chrono::microseconds(0))) {
        try {
          impl_->read_queued(true);
        } catch (...) {
          impl_->ticket_failures.erase(t.id);  // the same failure is thrown here
          throw;
        }
        continue;
      }
      // No reply, and no progress frame either, within io_timeout: the peer is not at work on it.
      if (std::chrono::steady_clock::now() - std::max(impl_->queued.front().sent, impl_->heard) > impl_->opts.io_timeout) {
        impl_->fail("graph_compute: no reply and no progress within " + std::to_string(impl_->opts.io_timeout.count()) + " ms");
      }
      if (std::chrono::steady_clock::now() >= deadline) return false;
      // Unlocked below: another thread may send meanwhile, or read the reply; a reply read after this check
      // writes wake_fd (sleepers), so the sleep below cannot miss it.
      if (wake_fd >= 0) impl_->sleepers.push_back(wake_fd);
    }
    // Without a wake fd, in slices of 10 ms (another thread may have read the reply meanwhile).
    auto left = std::max(std::chrono::duration_cast<std::chrono::microseconds>(deadline - std::chrono::steady_clock::now()),
                         std::chrono::microseconds(0));
    if (wake_fd < 0) left = std::min(left, std::chrono::microseconds(10000));
    const bool readable = impl_->io.wait_readable(left, wake_fd);
    if (wake_fd >= 0) {
      std::lock_guard lock(impl_->mu);
      const auto it = std::find(impl_->sleepers.begin(), impl_->sleepers.end(), wake_fd);
      if (it != impl_->sleepers.end()) impl_->sleepers.erase(it);
    }
    if (!readable && wake_fd < 0) continue;  // (the deadline is checked above)
    if (!readable) return false;
  }
}

void client::init_tensor(const wire_tensor& t) {
  auto lock = impl_->enter();
  impl_->ensure_up(false);
  std::vector<uint8_t> p;
  writer w(p);
  t.write(w);
  impl_->call(command::init_tensor, p, 0);
}

uint64_t client::alloc_size(uint32_t device, const wire_tensor& t) {
  auto lock = impl_->enter();
  impl_->ensure_up(true);
  std::vector<uint8_t> p;
  writer w(p);
  w.u32(device);
  t.write(w);
  const auto rep = impl_->call(command::get_alloc_size, p, 8);
  if (rep.size() != 8) impl_->fail("bad get_alloc_size reply");
  return read_u64(rep);
}

}  // namespace troupe::rpc
