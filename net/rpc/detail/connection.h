// One connection of the peer server (net/rpc/peer_server.cpp): its frame loop over a stream, and the three
// ways its commands run. Internal to troupe_net_rpc.
//
//   direct_runner     on the calling thread: the greeting and hello (control thread), control connections
//   watched_runner    on the calling thread, an io thread: plain TCP data connections (a graph occupies its
//                     connection's io thread, and no hand-off costs a wake-up per decode step); the command is
//                     marked in a compute_watch, from which the control thread sends progress frames while it
//                     runs long
//   offload_runner    on the compute pool, the connection's own thread sending progress frames meanwhile: TLS
//                     data connections, whose stream stays on the control thread
//
// Progress frames (status progress, payload u32: milliseconds since the command began) tell a client whose
// request runs long that the peer is alive and at work; each restarts the client's timeout for the reply.
#pragma once

#include <asio.hpp>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <exception>
#include <memory>
#include <mutex>
#include <optional>
#include <type_traits>
#include <vector>

#include "backends/rpc/wire/busy_poll.h"
#include "backends/rpc/wire/protocol.h"
#include "net/rpc/frame_handler.h"
#include "runtime/log.h"

namespace troupe::rpc::detail {

using tcp = asio::ip::tcp;
using clock = std::chrono::steady_clock;

// TCP options: no delay, 4 MiB buffers, keep-alive probes (a client that vanishes is found in about two minutes).
void tune(tcp::socket& s);

// set_tensor frames larger than this are received straight into their buffer.
inline constexpr uint64_t stream_threshold = 1u << 20;

// What one connection shares with its hello watchdog and with peer_server::stop(), on the connection's executor.
struct conn_state {
  explicit conn_state(const asio::any_io_executor& ex) : timer(ex) {}
  asio::steady_timer timer;
  tcp::socket* socket = nullptr;  // the lowest layer, valid while alive
  bool alive = true;
  bool hello_done = false;

  void close() {
    if (alive && socket != nullptr) {
      std::error_code ec;
      socket->shutdown(tcp::socket::shutdown_both, ec);
      socket->close(ec);
    }
  }
};

// A progress frame: header (status progress, 4 bytes) and the milliseconds since the command began.
inline std::array<uint8_t, frame_header_size + 4> progress_frame(clock::duration elapsed) {
  std::array<uint8_t, frame_header_size + 4> f{};
  encode_header(f.data(), static_cast<uint8_t>(status::progress), 4);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(elapsed).count();
  store_le(f.data() + frame_header_size, static_cast<uint32_t>(std::min<int64_t>(ms, UINT32_MAX)));
  return f;
}

template <class Stream>
asio::awaitable<void> send_reply(Stream& stream, const reply& r, peer_server_stats& stats) {
  uint8_t hdr[frame_header_size];
  encode_header(hdr, static_cast<uint8_t>(r.st), r.size());
  const std::array<asio::const_buffer, 3> bufs{asio::buffer(hdr), asio::buffer(r.body),
                                               asio::buffer(r.tail.data(), r.tail.size())};
  co_await asio::async_write(stream, bufs, asio::use_awaitable);
  stats.bytes_sent += frame_header_size + r.size();
}

// When a connection's reads poll the socket before sleeping on it (see busy_poll.h): for up to `window`,
// and only while the connection is alone on its io thread (polling would hold up the others).
struct poll_policy {
  std::chrono::microseconds window{0};
  const std::atomic<int>* conns_on_thread = nullptr;
  std::atomic<uint64_t>* polled = nullptr;  // counts reads that polling answered
  bool active() const {
    return window.count() > 0 && conns_on_thread != nullptr && conns_on_thread->load(std::memory_order_relaxed) == 1;
  }
};

// Bytes received ahead of the frame being read: one read usually brings a whole small frame (header and
// payload), so a request costs one receive and one send. Moves with its connection to an io thread.
class read_ahead {
 public:
  explicit read_ahead(poll_policy p = {}) : poll_(p) {}
  void set_poll(poll_policy p) { poll_ = p; }

  // Reads exactly n bytes into dst: what is buffered first, then from the stream (large reads go straight to
  // dst).
  template <class Stream>
  asio::awaitable<void> read(Stream& stream, uint8_t* dst, size_t n) {
    const size_t take = std::min(n, end_ - begin_);
    std::memcpy(dst, buf_.data() + begin_, take);
    begin_ += take;
    dst += take;
    n -= take;
    if (n == 0) co_return;
    if (n >= buf_.size() / 2) {
      co_await asio::async_read(stream, asio::buffer(dst, n), asio::use_awaitable);
      co_return;
    }
    begin_ = end_ = 0;
    std::optional<clock::time_point> poll_until;
    while (end_ < n) {
      if constexpr (std::is_same_v<Stream, tcp::socket>) {
        // The socket is non-blocking (data connections); an error is left for async_read_some to report.
        if (poll_.active()) {
          if (!poll_until) poll_until = clock::now() + poll_.window;
          std::error_code ec;
          size_t k = 0;
          busy_poll(*poll_until, [&] {
            k = stream.read_some(asio::buffer(buf_.data() + end_, buf_.size() - end_), ec);
            return ec != asio::error::would_block && ec != asio::error::try_again;
          });
          if (!ec && k > 0) {
            end_ += k;
            if (poll_.polled != nullptr) poll_.polled->fetch_add(1, std::memory_order_relaxed);
            continue;
          }
        }
      }
      end_ += co_await stream.async_read_some(asio::buffer(buf_.data() + end_, buf_.size() - end_), asio::use_awaitable);
    }
    std::memcpy(dst, buf_.data(), n);
    begin_ = n;
  }

 private:
  poll_policy poll_;
  std::vector<uint8_t> buf_ = std::vector<uint8_t>(64u << 10);
  size_t begin_ = 0;
  size_t end_ = 0;
};

// A plain TCP data connection's command in progress, as the control thread sees it: while one runs longer
// than the progress interval, tick() writes a progress frame on the socket (the io thread is inside the
// command then, so nothing else writes). begin()/end() bracket each command on the io thread; the reply is
// written only after end(), which waits for a tick in progress.
class compute_watch {
 public:
  explicit compute_watch(int fd) : fd_(fd) {}
  void begin() {
    std::lock_guard l(mu_);
    running_ = true;
    started_ = last_ = clock::now();
  }
  void end() {
    std::lock_guard l(mu_);
    running_ = false;
  }
  // The connection is closing: no more frames (the descriptor may be reused after this).
  void detach() {
    std::lock_guard l(mu_);
    fd_ = -1;
  }
  // On the control thread: a progress frame when the command has run `interval` since the last one.
  void tick(std::chrono::milliseconds interval, peer_server_stats& stats);

 private:
  std::mutex mu_;
  int fd_;
  bool running_ = false;
  clock::time_point started_{};
  clock::time_point last_{};
};

struct direct_runner {
  static constexpr bool inline_call = true;
  template <class F>
  auto call(F&& f) {
    return f();
  }
};

struct watched_runner {
  static constexpr bool inline_call = true;
  compute_watch* watch = nullptr;
  template <class F>
  auto call(F&& f) {
    struct ender {
      compute_watch* w;
      ~ender() { w->end(); }
    };
    watch->begin();
    ender e{watch};
    return f();
  }
};

struct offload_runner {
  static constexpr bool inline_call = false;
  asio::any_io_executor pool;  // the compute pool's executor
  std::chrono::milliseconds interval{500};
  peer_server_stats* stats = nullptr;

  // Runs f() on the pool; until it is done, writes a progress frame on the stream every interval (this
  // coroutine is the stream's only writer). Always waits for f, even when the stream fails meanwhile.
  template <class Stream, class F>
  asio::awaitable<std::invoke_result_t<F&>> run(Stream& stream, F f) {
    using R = std::invoke_result_t<F&>;
    const auto ex = co_await asio::this_coro::executor;
    asio::steady_timer wake(ex);
    std::optional<R> result;
    std::exception_ptr failed;
    bool done = false;
    const auto started = clock::now();
    asio::post(pool, [&] {
      try {
        result.emplace(f());
      } catch (...) {
        failed = std::current_exception();
      }
      asio::post(ex, [&] {
        done = true;
        wake.cancel();
      });
    });
    std::exception_ptr write_failed;
    while (!done) {
      wake.expires_after(interval);
      std::error_code ec;
      co_await wake.async_wait(asio::redirect_error(asio::use_awaitable, ec));
      if (done || write_failed) continue;
      try {
        const auto frame = progress_frame(clock::now() - started);
        co_await asio::async_write(stream, asio::buffer(frame), asio::use_awaitable);
        if (stats != nullptr) stats->progress_frames += 1;
      } catch (...) {
        write_failed = std::current_exception();
      }
    }
    if (failed) std::rethrow_exception(failed);
    if (write_failed) std::rethrow_exception(write_failed);
    co_return std::move(*result);
  }
};

template <class Stream, class Runner, class F>
asio::awaitable<std::invoke_result_t<F&>> run_command(Stream& stream, Runner& runner, F f) {
  if constexpr (Runner::inline_call) {
    co_return runner.call(f);
  } else {
    co_return co_await runner.run(stream, std::move(f));
  }
}

// The greeting frame (status ok) a connection starts with.
template <class Stream>
asio::awaitable<void> send_greeting(Stream& stream, frame_handler& s, peer_server_stats& stats) {
  reply g;
  g.body = s.greeting();
  co_await send_reply(stream, g, stats);
}

// The frame loop of one connection; with until_hello, it returns once the hello is done (or the connection
// is to close: s.ready() says which).
template <class Stream, class Runner>
asio::awaitable<void> serve_frames(Stream& stream, frame_handler& s, conn_state& st, peer_server_stats& stats,
                                   read_ahead& in, Runner& runner, bool until_hello) {
  uint8_t hdr[frame_header_size];
  std::vector<uint8_t> payload;
  std::vector<uint8_t> staging;
  for (;;) {
    co_await in.read(stream, hdr, sizeof hdr);
    const frame_header h = decode_header(hdr);
    stats.bytes_received += frame_header_size + h.size;
    if (auto bad = s.check_header(h.code, h.size)) {
      co_await send_reply(stream, *bad, stats);
      co_return;
    }
    if (h.code == static_cast<uint8_t>(command::set_tensor) && h.size > stream_threshold) {
      // Streamed: the bytes go straight into the buffer once the prefix has been checked. (Smaller uploads
      // go through frame_handler::handle, where a bad prefix is reported with the next reply.)
      stats.frames += 1;
      uint8_t prefix[set_tensor_prefix];
      co_await in.read(stream, prefix, sizeof prefix);
      frame_handler::set_target t;
      try {
        t = s.begin_set_tensor(prefix, h.size - set_tensor_prefix);
      } catch (const std::exception& e) {
        TROUPE_LOG(error, "rpc " << s.peer() << ": " << e.what() << "; closing the connection (the " << h.size
                                 << " bytes that follow cannot be skipped safely)");
        co_return;
      }
      if (t.host != nullptr) {
        co_await in.read(stream, t.host, t.size);
        co_await run_command(stream, runner, [&] {
          s.end_set_tensor(t, {});
          return 0;
        });
      } else {
        staging.resize(t.size);
        co_await in.read(stream, staging.data(), staging.size());
        co_await run_command(stream, runner, [&] {
          s.end_set_tensor(t, staging);
          return 0;
        });
      }
      s.debug_set_tensor(prefix, t.size, true);
      continue;
    }
    payload.resize(h.size);  // bounded by check_header
    co_await in.read(stream, payload.data(), payload.size());
    const reply r = co_await run_command(stream, runner, [&] { return s.handle(h.code, payload); });
    if (s.ready() && !st.hello_done) {
      st.hello_done = true;
      st.timer.cancel();
    }
    if (r.send) co_await send_reply(stream, r, stats);
    if (r.close) co_return;
    if (until_hello && s.ready()) co_return;
  }
}

}  // namespace troupe::rpc::detail
