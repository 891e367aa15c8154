#include <cstring>

#include "backends/rpc/detail/client_impl.h"
#include "backends/rpc/wire/auth.h"
#include "runtime/log.h"

namespace troupe::rpc {

void client::impl::throw_if_down() const {
  if (!down.load(std::memory_order_acquire)) return;
  std::string why;
  {
    std::lock_guard l(down_mu);
    why = down_reason;
  }
  throw unavailable_error("peer " + who + " is down" + (why.empty() ? std::string() : ": " + why));
}

std::unique_lock<std::mutex> client::impl::enter() {
  throw_if_down();
  std::unique_lock<std::mutex> l(mu);
  throw_if_down();
  return l;
}

void client::impl::fail(const std::string& what) {
  const bool was_up = established;
  std::string msg = "peer " + who + ": " + what;
  if (down.load(std::memory_order_acquire)) {
    // Marked down under this request (mark_down shut its socket): that is the news, not the closed socket.
    std::lock_guard l(down_mu);
    msg = "peer " + who + " is down" + (down_reason.empty() ? std::string() : ": " + down_reason) +
          " (the request in flight was cut off)";
  }
  closing_reason = msg;
  close_locked();
  if (was_up) notify_lost(msg);
  throw unavailable_error(msg);
}

void client::impl::notify_lost(const std::string& why) {
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

void client::impl::close_locked() {
  if (up && opts.debug) TROUPE_LOG(debug, "rpc client " << addr << ": close");
  up = false;
  established = false;
  last_graph.clear();
  recompute_latency.clear();
  held.clear();
  drop_outputs();
  // The queued graphs' replies will never come: their tickets fail with the reason.
  const auto lost = std::make_exception_ptr(backend_error(
      closing_reason.empty() ? "peer " + who + ": the connection closed before the graph's reply came" : closing_reason));
  for (const queued_graph& q : queued) ticket_failures[q.id] = lost;
  queued.clear();
  drop_log.clear();
  closing_reason.clear();
  io.close();
}

void client::impl::ensure_up(bool may_reconnect) {
  throw_if_down();
  if (up) return;
  if (may_reconnect && opts.auto_reconnect) {
    connect_locked();
    return;
  }
  throw unavailable_error("peer " + who + ": not connected");
}

void client::impl::check(remote_buffer b) const {
  if (!up || b.epoch != epoch) {
    throw unavailable_error("peer " + who + ": buffer " + std::to_string(b.handle) + " was lost when its connection dropped");
  }
}

void client::impl::connect_locked() {
  close_locked();
  try {
    io.connect(opts);
  } catch (const transport_error& e) {
    throw unavailable_error("peer " + who + ": " + e.what());
  }
  up = true;  // from here on, fail() closes
  if (opts.debug) TROUPE_LOG(debug, "rpc client " << addr << ": connected" << (opts.tls ? " (TLS)" : ""));
  try {
    handshake_locked();
  } catch (const std::exception& e) {
    if (opts.debug) TROUPE_LOG(debug, "rpc client " << addr << ": hello failed: " << e.what());
    close_locked();
    throw;
  }
  epoch += 1;
  st.connects += 1;
  heard = {};
  drop_control(false);  // the peer may be another process now: its control connection is made anew
  last_graph.clear();
  ticket_failures.clear();  // tickets of the old connection fail by their epoch
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
    server_ver = read_version(r);
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
  w.u32(opts.control ? uint32_t{hello_control} : 0u);
  w.bytes(cn.data(), cn.size());
  const mac proof = opts.key.empty() ? mac{} : client_proof(opts.key, server_nonce, cn, opts.client_version);
  w.bytes(proof.data(), proof.size());
  std::vector<uint8_t> rep;
  try {
    rep = call(command::hello, hello, 64);
  } catch (const remote_error& e) {
    if (e.code() != status::version_mismatch) throw;
    // (The peer closed the connection.) Say which side is older.
    const bool peer_older = server_ver.major < opts.client_version.major ||
                            (server_ver.major == opts.client_version.major && server_ver.minor < opts.client_version.minor);
    throw remote_error(e.code(), std::string(e.what()) + "; the peer speaks protocol " + to_string(server_ver) +
                                     " and this troupe " + to_string(opts.client_version) +
                                     (peer_older ? ": run a troupe as new as this one on the peer" : ": upgrade troupe here"));
  }
  try {
    reader r(rep);
    const version v = read_version(r);
    mac sp{};
    std::memcpy(sp.data(), r.bytes(sp.size()).data(), sp.size());
    r.done("hello reply");
    if (!compatible(opts.client_version, v)) {
      fail("protocol " + to_string(v) + " of the peer is incompatible with ours (" + to_string(opts.client_version) + ")");
    }
    if (!opts.key.empty() && !equal_macs(sp, server_proof(opts.key, cn, server_nonce))) {
      fail("the peer did not prove that it knows the shared key; refusing it");
    }
    if (opts.debug) {
      TROUPE_LOG(debug, "rpc client " << addr << ": hello client " << to_string(opts.client_version) << " -> ok, server "
                                      << to_string(v) << (opts.key.empty() ? "" : ", authenticated"));
    }
  } catch (const protocol_error& e) {
    fail(std::string("bad hello reply: ") + e.what());
  }
}

client::client(client_options opts) : impl_(std::make_unique<impl>()) {
  impl_->opts = std::move(opts);
  impl_->initial_opts = impl_->opts;
  impl_->addr = impl_->opts.host + ":" + std::to_string(impl_->opts.port);
  impl_->who = impl_->opts.name.empty() ? impl_->addr : impl_->opts.name + " (" + impl_->addr + ")";
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
  {
    std::lock_guard lock(impl_->mu);
    impl_->close_locked();
  }
  impl_->drop_control(false);
}

bool client::connected() const { return impl_->up.load() && !impl_->down.load(); }

void client::reconnect() { connect(); }

void client::mark_down(const std::string& reason) {
  {
    std::lock_guard l(impl_->down_mu);
    impl_->down_reason = reason;
    impl_->down = true;
  }
  // Wakes a request blocked on the socket (its poll sees the hang-up, the read fails): it throws, and
  // closes the connection, on its own thread. The same for a question on the control connection.
  impl_->io.interrupt();
  impl_->drop_control(true);
  // Nothing in flight: close now.
  std::unique_lock lock(impl_->mu, std::try_to_lock);
  if (lock.owns_lock()) impl_->close_locked();
}

void client::set_on_lost(std::function<void(const std::string&)> f) {
  std::lock_guard l(impl_->down_mu);
  impl_->on_lost = std::move(f);
}

bool client::health_check(std::chrono::milliseconds timeout) {
  if (impl_->down.load()) return false;
  std::unique_lock lock(impl_->mu, std::try_to_lock);
  if (!lock.owns_lock() || !impl_->queued.empty()) {
    // A request is in flight, or graphs are queued (a graph may compute for long): ask on the control
    // connection, which the peer serves on a thread of its own, so that a busy peer answers and a hung
    // one is found while they wait.
    if (lock.owns_lock()) lock.unlock();
    return impl_->control_ping(timeout);
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

bool client::probe(std::chrono::milliseconds timeout) { return impl::probe_once(impl_->initial_opts, timeout); }

uint64_t client::epoch() const { return impl_->epoch.load(); }

std::string client::address() const { return impl_->addr; }

version client::server_version() const {
  std::lock_guard lock(impl_->mu);
  return impl_->server_ver;
}

client_stats client::stats() const {
  std::lock_guard lock(impl_->mu);
  client_stats s = impl_->st;
  s.op_questions = impl_->op_questions.load();
  std::lock_guard out_lock(impl_->outputs_mu);
  s.outputs_served = impl_->outputs_served;
  return s;
}

void client::reset_stats() {
  std::lock_guard lock(impl_->mu);
  const uint64_t connects = impl_->st.connects;
  impl_->st = {};
  impl_->st.connects = connects;
  impl_->op_questions = 0;
  std::lock_guard out_lock(impl_->outputs_mu);
  impl_->outputs_served = 0;
}

}  // namespace troupe::rpc
