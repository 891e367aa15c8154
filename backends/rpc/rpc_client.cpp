#include "backends/rpc/rpc_client.h"

#include <asio.hpp>
#include <asio/ssl.hpp>

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <climits>
#include <cstring>
#include <atomic>
#include <functional>
#include <map>
#include <mutex>
#include <optional>

#include "net/rpc/auth.h"
#include "net/rpc/busy_poll.h"
#include "net/rpc/cache.h"
#include "runtime/log.h"

namespace troupe::rpc {
namespace {

using asio::ip::tcp;

constexpr uint64_t max_reply_bytes = uint64_t{1} << 40;  // raw requests (tests): anything sane

std::string ms(std::chrono::milliseconds d) { return std::to_string(d.count()) + " ms"; }

}  // namespace

struct client::impl {
  // When a read polls the socket (see net/rpc/busy_poll.h) rather than sleeping on it: from `from` (it
  // sleeps until then) to `until`.
  struct poll_window {
    std::chrono::steady_clock::time_point from, until;
  };

  client_options opts;
  client_options initial_opts;  // as constructed (probe connections use these; opts.io_timeout varies)
  std::string addr;
  mutable std::mutex mu;
  asio::io_context ioc;
  std::unique_ptr<tcp::socket> sock;
  std::unique_ptr<asio::ssl::context> ssl_ctx;
  std::unique_ptr<asio::ssl::stream<tcp::socket>> tls;
  std::atomic<bool> up{false};
  bool established = false;  // hello done: losing the connection now is news for on_lost
  std::atomic<uint64_t> epoch{0};
  version server_ver;
  client_stats st;
  std::map<uint32_t, std::vector<uint8_t>> last_graph;  // per device: the last graph the peer holds
  // Per device: how long graph_recompute took to answer lately, and how much that varies (moving averages
  // of the latency and of its deviation, as TCP estimates round-trip times). A decode step takes about as
  // long as the last ones, so the reply is polled for from two deviations before the expected time to two
  // after it, and slept on before (waking up costs tens of microseconds on a virtual machine).
  struct latency_estimate {
    std::chrono::nanoseconds mean{0};
    std::chrono::nanoseconds deviation{0};
  };
  std::map<uint32_t, latency_estimate> recompute_latency;
  poll_window recompute_window(uint32_t device, std::chrono::steady_clock::time_point sent) const {
    const auto it = recompute_latency.find(device);
    if (it == recompute_latency.end() || it->second.mean <= opts.busy_poll) return {sent, sent + opts.busy_poll};
    const latency_estimate& e = it->second;
    const std::chrono::nanoseconds margin = std::max<std::chrono::nanoseconds>(opts.busy_poll, 2 * e.deviation);
    return {sent + e.mean - std::min(margin, e.mean), sent + e.mean + margin};
  }
  void note_recompute(uint32_t device, std::chrono::nanoseconds took) {
    auto [it, fresh] = recompute_latency.try_emplace(device, latency_estimate{took, took / 8});
    if (fresh) return;
    latency_estimate& e = it->second;
    const std::chrono::nanoseconds error = took - e.mean;
    e.mean += error / 8;
    e.deviation += (std::chrono::abs(error) - e.deviation) / 4;
  }

  // Down (mark_down): every request fails at once, without waiting for the mutex or reconnecting.
  std::atomic<bool> down{false};
  mutable std::mutex down_mu;  // down_reason, fd, on_lost
  std::string down_reason;
  int fd = -1;                 // the connected socket, for mark_down's shutdown from another thread
  std::function<void(const std::string&)> on_lost;

  void set_fd(int v) {
    std::lock_guard l(down_mu);
    fd = v;
  }

  void throw_if_down() const {
    if (!down.load(std::memory_order_acquire)) return;
    std::string why;
    {
      std::lock_guard l(down_mu);
      why = down_reason;
    }
    throw backend_error("peer " + addr + " is down" + (why.empty() ? std::string() : ": " + why));
  }

  // The lock for one request: fails fast while the peer is marked down (before and after waiting).
  std::unique_lock<std::mutex> enter() {
    throw_if_down();
    std::unique_lock<std::mutex> l(mu);
    throw_if_down();
    return l;
  }

  [[noreturn]] void fail(const std::string& what) {
    const bool was_up = established;
    close_locked();
    const std::string msg = "peer " + addr + ": " + what;
    if (was_up) notify_lost(msg);
    throw backend_error(msg);
  }

  // Tells the owner (the remote-peer actor) that an established connection was lost.
  void notify_lost(const std::string& why) {
    std::function<void(const std::string&)> cb;
    {
      std::lock_guard l(down_mu);
      cb = on_lost;
    }
    if (cb) {
      try {
        cb(why);
      } catch (...) {
        // a notification must not turn into another failure
      }
    }
  }

  void close_locked() {
    if (up) TROUPE_LOG(debug, "rpc client: closing the connection to " << addr);
    up = false;
    established = false;
    last_graph.clear();
    recompute_latency.clear();
    held.clear();
    outputs.clear();
    set_fd(-1);  // before closing: mark_down must never shut down a reused descriptor
    std::error_code ec;
    if (tls) {
      tls->next_layer().close(ec);
    } else if (sock) {
      sock->close(ec);
    }
    // Let any cancelled handler run, then drop the streams.
    ioc.restart();
    ioc.poll();
    tls.reset();
    sock.reset();
  }

  // Runs one asynchronous operation to completion within timeout, or fails (closing the connection).
  template <class Start>
  void run(Start&& start, std::chrono::milliseconds timeout, const char* what) {
    std::error_code result;
    bool done = false;
    start([&](const std::error_code& ec, auto&&...) {
      result = ec;
      done = true;
    });
    ioc.restart();
    ioc.run_for(timeout);
    if (!done) {
      std::error_code ec;
      if (tls) tls->next_layer().close(ec);
      if (sock) sock->close(ec);
      ioc.restart();
      ioc.run();
      fail(std::string(what) + " timed out after " + ms(timeout));
    }
    if (result) {
      fail(std::string(what) + ": " + (result == asio::error::eof ? "connection lost (the peer closed it)"
                                                                  : "connection lost: " + result.message()));
    }
  }

  // Plain TCP goes without the io_context: non-blocking socket calls, and poll() for readiness within the
  // deadline (a request costs its system calls and nothing more). TLS goes through Asio's ssl stream.
  // Waits until the socket is ready for `events`. Past `deadline` the request has timed out (fails); with
  // `wake_at`, returns false at that time when the socket is not ready by then.
  bool wait_ready(short events, std::chrono::steady_clock::time_point deadline, const char* what,
                  std::optional<std::chrono::steady_clock::time_point> wake_at = std::nullopt) {
    for (;;) {
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) fail(std::string(what) + " timed out after " + ms(opts.io_timeout));
      if (wake_at && now >= *wake_at) return false;
      const auto left = std::chrono::duration_cast<std::chrono::nanoseconds>((wake_at ? std::min(*wake_at, deadline) : deadline) - now);
      const timespec ts{static_cast<time_t>(left.count() / 1000000000), static_cast<long>(left.count() % 1000000000)};
      pollfd p{sock->native_handle(), events, 0};
      const int r = ::ppoll(&p, 1, &ts, nullptr);
      if (r > 0) return true;
      if (r < 0 && errno != EINTR) fail(std::string(what) + ": poll failed: " + std::strerror(errno));
    }
  }

  [[noreturn]] void lost(const char* what, const std::error_code& ec) {
    fail(std::string(what) + ": " + (ec == asio::error::eof ? "connection lost (the peer closed it)"
                                                            : "connection lost: " + ec.message()));
  }

  void write_all(std::span<const asio::const_buffer> bufs, uint64_t total) {
    if (tls) {
      run([&](auto handler) { asio::async_write(*tls, bufs, handler); }, opts.io_timeout, "sending");
    } else {
      const auto deadline = std::chrono::steady_clock::now() + opts.io_timeout;
      std::array<asio::const_buffer, 8> rest{};
      size_t n_rest = 0;
      for (const auto& b : bufs) {
        if (b.size() > 0) rest[n_rest++] = b;
      }
      size_t first = 0;
      while (first < n_rest) {
        std::error_code ec;
        size_t n = sock->write_some(std::span<const asio::const_buffer>(rest.data() + first, n_rest - first), ec);
        if (ec == asio::error::would_block || ec == asio::error::try_again) {
          wait_ready(POLLOUT, deadline, "sending");
          continue;
        }
        if (ec) lost("sending", ec);
        while (n > 0 && first < n_rest) {
          const size_t take = std::min(n, rest[first].size());
          rest[first] += take;
          n -= take;
          if (rest[first].size() == 0) ++first;
        }
      }
    }
    st.bytes_sent += total;
  }

  // The default poll window (see poll_window), for a reply expected soon: polling at once, for busy_poll.
  poll_window poll_soon() const {
    const auto now = std::chrono::steady_clock::now();
    return {now, now + opts.busy_poll};
  }

  void read_exact(void* p, size_t n, std::optional<poll_window> window = std::nullopt) {
    if (n == 0) return;
    if (tls) {
      run([&](auto handler) { asio::async_read(*tls, asio::buffer(p, n), handler); }, opts.io_timeout, "receiving");
    } else {
      const poll_window w = window ? *window : poll_soon();
      const auto deadline = std::chrono::steady_clock::now() + opts.io_timeout;
      size_t done = 0;
      while (done < n) {
        std::error_code ec;
        size_t k = 0;
        auto attempt = [&] {
          k = sock->read_some(asio::buffer(static_cast<uint8_t*>(p) + done, n - done), ec);
          return ec != asio::error::would_block && ec != asio::error::try_again;
        };
        if (!attempt()) {
          // Too early to poll: sleep until the window opens (or the bytes come).
          if (std::chrono::steady_clock::now() < w.from && wait_ready(POLLIN, deadline, "receiving", w.from)) continue;
          if (!busy_poll(w.until, attempt)) {
            wait_ready(POLLIN, deadline, "receiving");
            continue;
          }
          st.polled_reads += 1;
        }
        if (ec) lost("receiving", ec);
        done += k;
      }
    }
    st.bytes_received += n;
  }

  void send_frame(command c, std::span<const uint8_t> a, std::span<const uint8_t> b = {},
                  std::span<const uint8_t> d = {}) {
    uint8_t hdr[frame_header_size];
    const uint64_t size = a.size() + b.size() + d.size();
    encode_header(hdr, static_cast<uint8_t>(c), size);
    if (c != command::get_tensor) outputs.clear();  // anything else may change what they hold
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
  void hold_frame(command c, std::span<const uint8_t> a, std::span<const uint8_t> b) {
    if (held.size() + frame_header_size + a.size() + b.size() > max_held) {
      send_frame(c, a, b);
      return;
    }
    outputs.clear();
    uint8_t hdr[frame_header_size];
    encode_header(hdr, static_cast<uint8_t>(c), a.size() + b.size());
    held.insert(held.end(), hdr, hdr + frame_header_size);
    held.insert(held.end(), a.begin(), a.end());
    held.insert(held.end(), b.begin(), b.end());
    st.requests += 1;
  }

  // A graph reply carries its outputs' bytes: they answer get_tensor until anything else is sent.
  struct output_copy {
    output_request range;
    std::vector<uint8_t> bytes;
  };
  void receive_outputs(uint64_t n, uint64_t expected) {
    if (n != expected) fail("graph reply of " + std::to_string(n) + " bytes, expected " + std::to_string(expected));
    outputs.resize(pending_outputs.size());
    for (size_t i = 0; i < outputs.size(); ++i) {
      outputs[i].range = pending_outputs[i];
      outputs[i].bytes.resize(pending_outputs[i].size);
      read_exact(outputs[i].bytes.data(), outputs[i].bytes.size());
    }
  }
  bool from_outputs(remote_buffer b, uint64_t offset, void* out, uint64_t size) {
    for (const auto& o : outputs) {
      const output_request& r = o.range;
      if (r.buffer.handle == b.handle && r.buffer.epoch == b.epoch && offset >= r.offset &&
          size <= r.size && offset - r.offset <= r.size - size) {
        std::memcpy(out, o.bytes.data() + (offset - r.offset), size);
        st.outputs_served += 1;
        return true;
      }
    }
    return false;
  }
  std::vector<output_request> pending_outputs;
  std::vector<output_copy> outputs;

  static constexpr size_t max_held = 256u << 10;
  std::vector<uint8_t> held;  // frames not sent yet (see hold_frame)

  // Reads a reply header: (status, payload size). An error status's message is read and thrown.
  uint64_t read_ok(command c, bool throw_on_error = true, status* out_status = nullptr,
                   std::optional<poll_window> window = std::nullopt) {
    uint8_t hdr[frame_header_size];
    read_exact(hdr, sizeof hdr, window);
    st.round_trips += 1;
    const frame_header h = decode_header(hdr);
    const auto s = static_cast<status>(h.code);
    if (out_status) *out_status = s;
    if (s == status::ok || !throw_on_error) return h.size;
    if (h.size > max_message_bytes) fail(std::string(command_name(c)) + ": error reply of " + std::to_string(h.size) + " bytes");
    std::string msg(h.size, '\0');
    read_exact(msg.data(), msg.size());
    if (s == status::protocol || s == status::version_mismatch || s == status::auth_failed) close_locked();
    throw remote_error(s, "peer " + addr + ": " + std::string(command_name(c)) + " failed (" +
                              std::string(status_name(s)) + "): " + msg);
  }

  std::vector<uint8_t> call(command c, std::span<const uint8_t> payload, uint64_t max_reply) {
    send_frame(c, payload);
    const uint64_t n = read_ok(c);
    if (n > max_reply) fail(std::string(command_name(c)) + ": reply of " + std::to_string(n) + " bytes, expected at most " + std::to_string(max_reply));
    std::vector<uint8_t> out(n);
    read_exact(out.data(), n);
    return out;
  }

  void ensure_up(bool may_reconnect) {
    throw_if_down();
    if (up) return;
    if (may_reconnect && opts.auto_reconnect) {
      connect_locked();
      return;
    }
    throw backend_error("peer " + addr + ": not connected");
  }

  void check(remote_buffer b) {
    if (!up || b.epoch != epoch) {
      throw backend_error("peer " + addr + ": buffer " + std::to_string(b.handle) +
                          " was lost when its connection dropped");
    }
  }

  void connect_locked();
  void handshake_locked();
};

void client::impl::connect_locked() {
  close_locked();
  tcp::resolver res(ioc);
  std::error_code ec;
  const auto endpoints = res.resolve(opts.host, std::to_string(opts.port), ec);
  if (ec) throw backend_error("peer " + addr + ": cannot resolve " + opts.host + ": " + ec.message());
  sock = std::make_unique<tcp::socket>(ioc);
  run([&](auto handler) { asio::async_connect(*sock, endpoints, handler); }, opts.connect_timeout, "connecting");
  sock->set_option(tcp::no_delay(true), ec);
  sock->set_option(asio::socket_base::keep_alive(true), ec);
  // A decode step's reply (logits) in one write and one read: the default starting buffer (16 KiB) makes the
  // peer wait for this side to drain it several times per reply.
  sock->set_option(asio::socket_base::send_buffer_size(4 << 20), ec);
  sock->set_option(asio::socket_base::receive_buffer_size(4 << 20), ec);
  if (!opts.tls) sock->non_blocking(true, ec);
  set_fd(sock->native_handle());
  up = true;  // from here on, fail() closes
  if (opts.tls) {
    ssl_ctx = std::make_unique<asio::ssl::context>(asio::ssl::context::tls_client);
    ssl_ctx->set_options(asio::ssl::context::default_workarounds | asio::ssl::context::no_sslv2 |
                         asio::ssl::context::no_sslv3 | asio::ssl::context::no_tlsv1 | asio::ssl::context::no_tlsv1_1);
    try {
      if (opts.tls_verify) {
        ssl_ctx->set_verify_mode(asio::ssl::verify_peer);
        if (opts.tls_ca_file.empty()) {
          ssl_ctx->set_default_verify_paths();
        } else {
          ssl_ctx->load_verify_file(opts.tls_ca_file.string());
        }
      } else {
        ssl_ctx->set_verify_mode(asio::ssl::verify_none);
      }
    } catch (const std::system_error& e) {
      fail(std::string("TLS setup: ") + e.what());
    }
    tls = std::make_unique<asio::ssl::stream<tcp::socket>>(std::move(*sock), *ssl_ctx);
    sock.reset();
    if (opts.tls_verify) tls->set_verify_callback(asio::ssl::host_name_verification(opts.host));
    SSL_set_tlsext_host_name(tls->native_handle(), opts.host.c_str());
    run([&](auto handler) { tls->async_handshake(asio::ssl::stream_base::client, handler); }, opts.connect_timeout,
        "TLS handshake");
  }

  try {
    handshake_locked();
  } catch (...) {
    close_locked();
    throw;
  }
  epoch += 1;
  st.connects += 1;
  last_graph.clear();
  established = true;
}

void client::impl::handshake_locked() {
  // Greeting.
  uint8_t hdr[frame_header_size];
  read_exact(hdr, sizeof hdr);
  const frame_header gh = decode_header(hdr);
  if (gh.code != 0 || gh.size > 256) fail("not a troupe peer (unexpected greeting)");
  std::vector<uint8_t> g(gh.size);
  read_exact(g.data(), g.size());
  nonce server_nonce{};
  uint32_t flags = 0;
  try {
    reader r(g);
    if (r.u32() != greeting_magic) fail("not a troupe peer (bad greeting magic)");
    server_ver.major = r.u16();
    server_ver.minor = r.u16();
    server_ver.patch = r.u16();
    flags = r.u32();
    std::memcpy(server_nonce.data(), r.bytes(server_nonce.size()).data(), server_nonce.size());
  } catch (const protocol_error& e) {
    fail(std::string("bad greeting: ") + e.what());
  }
  if ((flags & 1u) && opts.key.empty()) {
    TROUPE_LOG(warn, "rpc client: peer " << addr << " requires a key and none was given");
  }

  // Hello.
  const nonce cn = random_nonce();
  std::vector<uint8_t> hello;
  writer w(hello);
  w.u16(opts.client_version.major);
  w.u16(opts.client_version.minor);
  w.u16(opts.client_version.patch);
  w.u32(0);
  w.bytes(cn.data(), cn.size());
  const mac proof = opts.key.empty() ? mac{} : client_proof(opts.key, server_nonce, cn, opts.client_version);
  w.bytes(proof.data(), proof.size());
  const std::vector<uint8_t> rep = call(command::hello, hello, 64);
  try {
    reader r(rep);
    version v;
    v.major = r.u16();
    v.minor = r.u16();
    v.patch = r.u16();
    mac sp{};
    std::memcpy(sp.data(), r.bytes(sp.size()).data(), sp.size());
    r.done("hello reply");
    if (!compatible(opts.client_version, v)) {
      fail("protocol " + to_string(v) + " of the peer is incompatible with ours (" + to_string(opts.client_version) + ")");
    }
    if (!opts.key.empty() && !equal_macs(sp, server_proof(opts.key, cn, server_nonce))) {
      fail("the peer did not prove that it knows the shared key; refusing it");
    }
  } catch (const protocol_error& e) {
    fail(std::string("bad hello reply: ") + e.what());
  }
}

client::client(client_options opts) : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(opts);
  impl_->initial_opts = impl_->opts;
  impl_->addr = impl_->opts.host + ":" + std::to_string(impl_->opts.port);
}

client::~client() {
  std::lock_guard lock(impl_->mu);
  impl_->close_locked();
}

void client::connect() {
  std::lock_guard lock(impl_->mu);
  impl_->connect_locked();
  std::lock_guard l(impl_->down_mu);
  impl_->down = false;
  impl_->down_reason.clear();
}

void client::close() {
  std::lock_guard lock(impl_->mu);
  impl_->close_locked();
}

bool client::connected() const { return impl_->up.load() && !impl_->down.load(); }

void client::reconnect() { connect(); }

void client::mark_down(const std::string& reason) {
  {
    std::lock_guard l(impl_->down_mu);
    impl_->down_reason = reason;
    impl_->down = true;
    // Wakes a request blocked on the socket (its poll sees the hang-up, the read fails): it throws, and
    // closes the connection, on its own thread. The descriptor stays valid: close_locked clears `fd`
    // under down_mu before closing it.
    if (impl_->fd >= 0) ::shutdown(impl_->fd, SHUT_RDWR);
  }
  // Nothing in flight: close now.
  std::unique_lock lock(impl_->mu, std::try_to_lock);
  if (lock.owns_lock()) impl_->close_locked();
}

bool client::is_down() const { return impl_->down.load(); }

std::string client::down_reason() const {
  std::lock_guard l(impl_->down_mu);
  return impl_->down_reason;
}

void client::set_on_lost(std::function<void(const std::string&)> f) {
  std::lock_guard l(impl_->down_mu);
  impl_->on_lost = std::move(f);
}

bool client::health_check(std::chrono::milliseconds timeout) {
  if (impl_->down.load()) return false;
  std::unique_lock lock(impl_->mu, std::try_to_lock);
  if (!lock.owns_lock()) {
    // A request is in flight (a graph may compute for long): ask the peer on a connection of its own
    // whether it still answers, so that a hung peer is found while the request waits.
    return probe(timeout);
  }
  if (!impl_->up) return false;
  const auto saved = impl_->opts.io_timeout;
  impl_->opts.io_timeout = timeout;
  bool ok = true;
  try {
    impl_->call(command::device_count, {}, max_small_payload * 256);
  } catch (const std::exception&) {
    ok = false;
  }
  impl_->opts.io_timeout = saved;
  return ok;
}

bool client::probe(std::chrono::milliseconds timeout) {
  client_options o = impl_->initial_opts;
  o.connect_timeout = timeout;
  o.io_timeout = timeout;
  o.auto_reconnect = false;
  client c(std::move(o));
  try {
    c.connect();
    c.impl_->call(command::device_count, {}, max_small_payload * 256);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

uint64_t client::epoch() const { return impl_->epoch.load(); }

std::string client::address() const { return impl_->addr; }

version client::server_version() const {
  std::lock_guard lock(impl_->mu);
  return impl_->server_ver;
}

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
    // The peer checked the request (device index, sizes); a refusal after that is its memory or its limits.
    if (e.code() == status::failed) throw out_of_memory_error(e.what());
    throw;
  }
  if (rep.size() != 16) impl_->fail("bad alloc_buffer reply");
  return {impl_->epoch, read_u64(rep)};
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
  impl_->call(command::free_buffer, p, 0);
}

void client::buffer_clear(remote_buffer b, uint8_t value) {
  auto lock = impl_->enter();
  impl_->check(b);
  std::vector<uint8_t> p;
  writer w(p);
  w.u64(b.handle);
  w.u8(value);
  impl_->call(command::buffer_clear, p, 0);
}

void client::set_tensor(remote_buffer b, uint64_t offset, const void* data, uint64_t size, bool cacheable) {
  auto lock = impl_->enter();
  impl_->check(b);
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
  impl_->call(command::copy_tensor, p, 0);
}

void client::compute(uint32_t device, std::vector<uint8_t> graph, const std::vector<output_request>& outputs) {
  auto lock = impl_->enter();
  impl_->ensure_up(false);
  const std::vector<uint8_t> dev = u32_payload(device);
  // The outputs to read back with the reply (dropped when they would be too large).
  std::vector<uint8_t> outs;
  uint64_t out_bytes = 0;
  {
    writer w(outs);
    std::vector<output_request> keep;
    for (const auto& o : outputs) {
      if (keep.size() >= max_graph_outputs || o.size > max_output_bytes - out_bytes) break;
      impl_->check(o.buffer);
      keep.push_back(o);
      out_bytes += o.size;
    }
    w.u32(static_cast<uint32_t>(keep.size()));
    for (const auto& o : keep) {
      w.u64(o.buffer.handle);
      w.u64(o.offset);
      w.u64(o.size);
    }
    impl_->pending_outputs = std::move(keep);
  }
  auto it = impl_->last_graph.find(device);
  if (it != impl_->last_graph.end() && it->second == graph) {
    impl_->send_frame(command::graph_recompute, dev, outs);
    const auto sent = std::chrono::steady_clock::now();
    status s = status::ok;
    const uint64_t n = impl_->read_ok(command::graph_recompute, false, &s, impl_->recompute_window(device, sent));
    if (s == status::ok) {
      if (impl_->opts.busy_poll.count() > 0) impl_->note_recompute(device, std::chrono::steady_clock::now() - sent);
      impl_->st.graphs_recomputed += 1;
      impl_->receive_outputs(n, out_bytes);
      return;
    }
    if (n > max_message_bytes) impl_->fail("graph_recompute: reply too large");
    std::string msg(n, '\0');
    impl_->read_exact(msg.data(), n);
    impl_->last_graph.erase(device);
    if (s != status::no_graph) {
      throw remote_error(s, "peer " + impl_->addr + ": graph_recompute failed (" + std::string(status_name(s)) + "): " + msg);
    }
  }
  impl_->last_graph.erase(device);
  impl_->send_frame(command::graph_compute, dev, graph, outs);
  impl_->st.graphs_sent += 1;
  const uint64_t n = impl_->read_ok(command::graph_compute);
  impl_->receive_outputs(n, out_bytes);
  impl_->last_graph[device] = std::move(graph);
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

std::pair<status, std::vector<uint8_t>> client::request(command c, std::span<const uint8_t> payload) {
  auto lock = impl_->enter();
  impl_->ensure_up(false);
  impl_->send_frame(c, payload);
  status s = status::ok;
  const uint64_t n = impl_->read_ok(c, false, &s);
  if (n > max_reply_bytes) impl_->fail("reply too large");
  std::vector<uint8_t> out(n);
  impl_->read_exact(out.data(), n);
  if (s == status::protocol || s == status::version_mismatch || s == status::auth_failed) impl_->close_locked();
  return {s, std::move(out)};
}

void client::send(command c, std::span<const uint8_t> payload) {
  auto lock = impl_->enter();
  impl_->ensure_up(false);
  impl_->send_frame(c, payload);
}

client_stats client::stats() const {
  std::lock_guard lock(impl_->mu);
  return impl_->st;
}

void client::reset_stats() {
  std::lock_guard lock(impl_->mu);
  const uint64_t connects = impl_->st.connects;
  impl_->st = {};
  impl_->st.connects = connects;
}

}  // namespace troupe::rpc
