#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <functional>

#include "backends/rpc/detail/client_impl.h"

namespace troupe::rpc {

void client::impl::write_all(std::span<const asio::const_buffer> bufs, uint64_t total) {
  try {
    io.write_all(bufs, opts.io_timeout);
  } catch (const transport_error& e) {
    fail(e.what());
  }
  st.bytes_sent += total;
}

void client::impl::read_exact(void* p, size_t n, std::optional<poll_window> window) {
  if (n == 0) return;
  // By default a reply is expected soon: polling at once, for busy_poll.
  const auto now = std::chrono::steady_clock::now();
  try {
    if (io.read_exact(p, n, opts.io_timeout, window ? *window : poll_window{now, now + opts.busy_poll})) st.polled_reads += 1;
  } catch (const transport_error& e) {
    fail(e.what());
  }
  st.bytes_received += n;
}

namespace {

// The writes and graphs drop the output copies they change themselves (rpc_client.cpp); any other command
// may change all of them.
bool drops_its_own_outputs(command c) {
  switch (c) {
    case command::get_tensor:
    case command::set_tensor:
    case command::set_tensor_hash:
    case command::copy_tensor:
    case command::buffer_clear:
    case command::free_buffer:
    case command::graph_compute:
    case command::graph_recompute:
      return true;
    default:
      return false;
  }
}

}  // namespace

void client::impl::send_frame(command c, std::span<const uint8_t> a, std::span<const uint8_t> b, std::span<const uint8_t> d) {
  uint8_t hdr[frame_header_size];
  const uint64_t size = a.size() + b.size() + d.size();
  encode_header(hdr, static_cast<uint8_t>(c), size);
  if (!queued.empty() && !fits_while_queued(held.size() + frame_header_size + size)) drain_queued();
  if (!drops_its_own_outputs(c)) drop_outputs();
  // Frames held back (small set_tensor) go first, in the same write.
  const std::array<asio::const_buffer, 5> bufs{asio::buffer(held), asio::buffer(hdr), asio::buffer(a.data(), a.size()),
                                               asio::buffer(b.data(), b.size()), asio::buffer(d.data(), d.size())};
  const uint64_t n_held = held.size();
  held.clear();
  write_all(bufs, n_held + frame_header_size + size);
  st.requests += 1;
}

// A frame without a reply, small enough to hold back until the next frame that is sent at once: a decode
// step's inputs then travel with its graph in one write (one wake-up of the peer, not one per input).
// Nothing can observe the delay: only this connection can read its buffers, and it sends something
// before it reads.
void client::impl::hold_frame(command c, std::span<const uint8_t> a, std::span<const uint8_t> b) {
  if (held.size() + frame_header_size + a.size() + b.size() > max_held) {
    send_frame(c, a, b);
    return;
  }
  if (!drops_its_own_outputs(c)) drop_outputs();
  uint8_t hdr[frame_header_size];
  encode_header(hdr, static_cast<uint8_t>(c), a.size() + b.size());
  held.insert(held.end(), hdr, hdr + frame_header_size);
  held.insert(held.end(), a.begin(), a.end());
  held.insert(held.end(), b.begin(), b.end());
  st.requests += 1;
}

void client::impl::receive_outputs(uint64_t n, uint64_t expected, const std::vector<output_request>& ranges,
                                   std::optional<size_t> drops_from) {
  if (n != expected) fail("graph reply of " + std::to_string(n) + " bytes, expected " + std::to_string(expected));
  std::vector<output_copy> got(ranges.size());
  for (size_t i = 0; i < got.size(); ++i) {
    got[i].range = ranges[i];
    got[i].bytes.resize(ranges[i].size);
    read_exact(got[i].bytes.data(), got[i].bytes.size());
  }
  auto dropped_since = [&](const output_request& r) {
    return drops_from && std::any_of(drop_log.begin() + static_cast<std::ptrdiff_t>(*drops_from), drop_log.end(),
                                     [&](const auto& drops) { return drops(r); });
  };
  std::lock_guard lock(outputs_mu);
  for (output_copy& o : got) {
    if (!dropped_since(o.range)) outputs.push_back(std::move(o));
  }
  uint64_t bytes = 0;
  for (const output_copy& o : outputs) bytes += o.bytes.size();
  while (!outputs.empty() && (outputs.size() > max_output_copies || bytes > max_output_copy_bytes)) {
    bytes -= outputs.front().bytes.size();
    outputs.erase(outputs.begin());
  }
}

bool client::impl::from_outputs(remote_buffer b, uint64_t offset, void* out, uint64_t size) {
  std::lock_guard lock(outputs_mu);
  for (auto it = outputs.rbegin(); it != outputs.rend(); ++it) {  // the newest copy of a range wins
    const output_request& r = it->range;
    if (r.buffer.handle == b.handle && r.buffer.epoch == b.epoch && offset >= r.offset &&
        size <= r.size && offset - r.offset <= r.size - size) {
      std::memcpy(out, it->bytes.data() + (offset - r.offset), size);
      outputs_served += 1;
      return true;
    }
  }
  return false;
}

void client::impl::drop_outputs_where(std::function<bool(const output_request&)> drops) {
  {
    std::lock_guard lock(outputs_mu);
    std::erase_if(outputs, [&](const output_copy& o) { return drops(o.range); });
  }
  if (!queued.empty()) drop_log.push_back(std::move(drops));
}

void client::impl::drop_outputs() {
  drop_outputs_where([](const output_request&) { return true; });
}

void client::impl::drop_outputs(uint64_t handle, uint64_t offset, uint64_t size) {
  drop_outputs_where([=](const output_request& r) {
    return r.buffer.handle == handle && offset < r.offset + r.size && r.offset < offset + size;  // the ranges overlap
  });
}

void client::impl::drop_outputs_in(const std::vector<uint64_t>& handles) {
  drop_outputs_where([handles](const output_request& r) {
    return std::find(handles.begin(), handles.end(), r.buffer.handle) != handles.end();
  });
}

frame_header client::impl::read_any_header(std::optional<poll_window> window) {
  uint8_t hdr[frame_header_size];
  read_exact(hdr, sizeof hdr, window);
  return decode_header(hdr);
}

void client::impl::take_progress(const frame_header& h) {
  if (h.size > max_progress_payload) fail("a progress frame of " + std::to_string(h.size) + " bytes (at most " + std::to_string(max_progress_payload) + ")");
  uint8_t body[max_progress_payload];
  read_exact(body, static_cast<size_t>(h.size));
  heard = std::chrono::steady_clock::now();
  st.progress_frames += 1;
}

frame_header client::impl::read_header(std::optional<poll_window> window) {
  for (;;) {
    const frame_header h = read_any_header(window);
    if (h.code != static_cast<uint8_t>(status::progress)) {
      st.round_trips += 1;
      return h;
    }
    // The peer is at work: the reply comes later (no point polling for it now), and the next read's timeout
    // starts afresh.
    take_progress(h);
    const auto now = std::chrono::steady_clock::now();
    window = poll_window{now, now};
  }
}

void client::impl::read_queued(bool progress_only_ok) {
  const queued_graph& q = queued.front();
  frame_header h;
  if (progress_only_ok) {
    h = read_any_header(std::nullopt);
    if (h.code == static_cast<uint8_t>(status::progress)) {
      take_progress(h);
      return;
    }
    st.round_trips += 1;
  } else {
    h = read_header();
  }
  const auto s = static_cast<status>(h.code);
  if (s == status::ok) {
    receive_outputs(h.size, q.out_bytes, q.outputs, q.drops_from);
  } else {
    if (h.size > max_message_bytes) fail("graph_compute: error reply of " + std::to_string(h.size) + " bytes");
    std::string msg(h.size, '\0');
    read_exact(msg.data(), msg.size());
    ticket_failures[q.id] = std::make_exception_ptr(
        remote_error(s, "peer " + who + ": graph_compute failed (" + std::string(status_name(s)) + "): " + msg));
    if (s == status::protocol || s == status::version_mismatch || s == status::auth_failed) {
      queued.pop_front();
      close_locked();  // the graphs after it fail with the connection
      return;
    }
  }
  queued.pop_front();
  if (queued.empty()) drop_log.clear();
  wake_sleepers();
}

void client::impl::wake_sleepers() const {
  for (int fd : sleepers) {
    const uint64_t one = 1;
    [[maybe_unused]] const auto n = ::write(fd, &one, sizeof one);
  }
}

void client::impl::drain_queued() {
  while (!queued.empty()) read_queued();
}

uint64_t client::impl::read_ok(command c, bool throw_on_error, status* out_status, std::optional<poll_window> window) {
  drain_queued();
  const frame_header h = read_header(window);
  const auto s = static_cast<status>(h.code);
  if (out_status) *out_status = s;
  if (s == status::ok || !throw_on_error) return h.size;
  if (h.size > max_message_bytes) fail(std::string(command_name(c)) + ": error reply of " + std::to_string(h.size) + " bytes");
  std::string msg(h.size, '\0');
  read_exact(msg.data(), msg.size());
  if (s == status::protocol || s == status::version_mismatch || s == status::auth_failed) close_locked();
  throw remote_error(s, "peer " + who + ": " + std::string(command_name(c)) + " failed (" +
                            std::string(status_name(s)) + "): " + msg);
}

std::vector<uint8_t> client::impl::call(command c, std::span<const uint8_t> payload, uint64_t max_reply) {
  send_frame(c, payload);
  const uint64_t n = read_ok(c);
  if (n > max_reply) fail(std::string(command_name(c)) + ": reply of " + std::to_string(n) + " bytes, expected at most " + std::to_string(max_reply));
  std::vector<uint8_t> out(n);
  read_exact(out.data(), n);
  return out;
}

}  // namespace troupe::rpc
