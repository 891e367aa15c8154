// The control connection of an rpc::client (backends/rpc/detail/client_impl.h): a second connection to the same
// peer, opened with the hello's control flag, which the peer serves on a thread that never runs a graph.
// Health checks use it while the data connection is busy (a request in flight, graphs queued), and
// capability questions (supports_op) always do, so neither waits behind a graph and a hung peer fails both
// within their timeouts.
#include <algorithm>

#include "backends/rpc/detail/client_impl.h"
#include "runtime/log.h"

namespace troupe::rpc {

std::shared_ptr<client> client::impl::control_client() {
  std::lock_guard l(control_mu);
  if (!control) {
    client_options o = initial_opts;
    o.control = true;
    o.auto_reconnect = true;
    // A control question is answered at once by a peer that is alive: it gets the connect timeout.
    o.io_timeout = std::min(o.io_timeout, std::max(o.connect_timeout, std::chrono::milliseconds(1)));
    control = std::make_shared<client>(std::move(o));
  }
  return control;
}

void client::impl::drop_control(bool interrupt) {
  std::shared_ptr<client> c;
  {
    std::lock_guard l(control_mu);
    c = std::move(control);
    control.reset();
  }
  // A question in flight on it fails now (interrupt) or ends on its own; the connection closes when its last
  // user lets go of it.
  if (c && interrupt) c->impl_->io.interrupt();
}

bool client::impl::probe_once(const client_options& opts, std::chrono::milliseconds timeout) {
  client_options o = opts;
  o.control = true;
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

bool client::impl::control_ping(std::chrono::milliseconds timeout) {
  if (down.load()) return false;
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  const std::shared_ptr<client> c = control_client();
  impl& ci = *c->impl_;
  std::unique_lock l(ci.mu, std::try_to_lock);
  if (!l.owns_lock()) return probe_once(initial_opts, timeout);  // a question is in flight on it
  const auto saved_connect = ci.opts.connect_timeout;
  const auto saved_io = ci.opts.io_timeout;
  bool ok = false;
  try {
    if (!ci.up) {
      ci.opts.connect_timeout = timeout;
      ci.connect_locked();
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    ci.opts.io_timeout = std::max(left, std::chrono::milliseconds(1));
    ci.call(command::device_count, {}, max_small_payload * 256);
    ok = true;
  } catch (const std::exception&) {
    ok = false;  // (the control connection is closed; the next check connects it again)
  }
  ci.opts.connect_timeout = saved_connect;
  ci.opts.io_timeout = saved_io;
  return ok;
}

bool client::supports_op(uint32_t device, std::span<const uint8_t> question) {
  impl_->throw_if_down();
  const std::shared_ptr<client> c = impl_->control_client();
  impl& ci = *c->impl_;
  std::vector<uint8_t> p;
  writer w(p);
  w.u32(device);
  w.bytes(question.data(), question.size());
  std::vector<uint8_t> rep;
  {
    std::lock_guard l(ci.mu);
    try {
      ci.ensure_up(true);
      rep = ci.call(command::supports_op, p, 8);
    } catch (const remote_error&) {
      throw;  // "peer host:port: supports_op failed (bad request): supports_op: node (op id ...): ..."
    } catch (const std::exception& e) {
      throw unavailable_error(std::string(e.what()) + " (supports_op for device " + std::to_string(device) +
                              ", on the control connection)");
    }
  }
  impl_->op_questions += 1;
  if (rep.size() != 1 || rep[0] > 1) {
    throw backend_error("peer " + impl_->who + ": supports_op: a reply of " + std::to_string(rep.size()) +
                        " bytes, expected one byte (0 or 1)");
  }
  return rep[0] == 1;
}

}  // namespace troupe::rpc
