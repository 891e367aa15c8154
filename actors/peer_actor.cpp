#include "actors/peer_actor.h"

#include <caf/all.hpp>

#include <algorithm>
#include <cmath>
#include <memory>
#include <random>
#include <set>

#include "actors/errors.h"
#include "actors/engine_config.h"
#include "backends/rpc/rpc.h"
#include "runtime/log.h"

namespace troupe::actors {

std::chrono::milliseconds backoff_delay(const backoff_params& b, uint32_t failures, double u) {
  const double initial = static_cast<double>(std::max<int64_t>(1, b.initial.count()));
  const double max = static_cast<double>(std::max<int64_t>(b.initial.count(), b.max.count()));
  const uint32_t steps = std::min<uint32_t>(failures == 0 ? 0 : failures - 1, 62);
  const double d = std::min(max, initial * std::ldexp(1.0, static_cast<int>(steps)));
  const double jitter = std::clamp(b.jitter, 0.0, 1.0);
  const double f = 1.0 - jitter * std::clamp(u, 0.0, 1.0);
  return std::chrono::milliseconds(static_cast<int64_t>(std::max(1.0, std::floor(d * f))));
}

namespace {

using clock = std::chrono::steady_clock;

// The text of an error (troupe's errors carry it as their context), without the category's code name.
std::string error_text(const caf::error& e) {
  if (e.category() == error_category && e.context().match_elements<std::string>()) return e.context().get_as<std::string>(0);
  return describe(e);
}

// ---- the helper: every blocking call on the client, one at a time, on a thread of its own ----

caf::behavior peer_worker(caf::event_based_actor*, std::shared_ptr<rpc::client> client) {
  return {
      // Connects (or reconnects) and registers the peer's devices; replies (epoch, device names).
      [client](connect_atom) -> caf::result<uint64_t, std::vector<std::string>> {
        try {
          client->reconnect();
          std::vector<std::string> names;
          for (device_i* d : rpc::add_peer(client)) {
            if (rpc::client_of(*d) != client) {
              return make_error(errc::failed, "peer " + client->address() + ": its devices are already registered over "
                                              "another connection (rpc::add_peer); not using them twice");
            }
            names.emplace_back(d->name());
          }
          return caf::result<uint64_t, std::vector<std::string>>(client->epoch(), std::move(names));
        } catch (const std::exception& e) {
          return make_error(errc::down, e.what());
        }
      },
      [client](check_atom, uint64_t timeout_ms) { return client->health_check(std::chrono::milliseconds(timeout_ms)); },
      [client](memory_atom, const std::vector<std::string>& names) -> caf::result<peer_memory> {
        try {
          peer_memory out;
          out.peer = client->address();
          for (uint32_t i = 0; i < names.size(); ++i) {
            const device_memory m = client->memory(i);
            device_status s;
            s.name = names[i];
            s.total = m.total;
            s.free = m.free;
            out.devices.push_back(std::move(s));
          }
          return out;
        } catch (const std::exception& e) {
          return make_error(errc::down, e.what());
        }
      },
  };
}

// ---- the peer actor ----

struct peer_state {
  peer_params params;
  std::shared_ptr<rpc::client> client;
  caf::actor worker;
  peer_status status;
  std::set<std::string> models;
  std::vector<peer_subscriber> subscribers;
  uint64_t generation = 0;  // of the scheduled retry or check; bumping it cancels the pending one
  clock::time_point retry_at{};
  bool busy = false;        // an attempt or a check is in flight on the worker
  std::vector<caf::typed_response_promise<peer_status>> waiting;  // check requests, answered after it
  std::mt19937_64 rng{std::random_device{}()};
  std::string parked;       // why it was told to stop trying; empty: not parked

  ~peer_state() {
    if (client) client->set_on_lost(nullptr);
    for (auto& rp : waiting) rp.deliver(make_error(errc::down, "the peer actor of " + status.address + " terminated"));
  }

  static inline const char* name = "troupe.peer";
};

using peer_ptr = peer_actor::stateful_pointer<peer_state>;

peer_status snapshot(peer_ptr self) {
  auto& st = self->state;
  peer_status s = st.status;
  s.models.assign(st.models.begin(), st.models.end());
  s.retry_in_ms = 0;
  if (s.state == "down") {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(st.retry_at - clock::now()).count();
    s.retry_in_ms = static_cast<uint64_t>(std::max<int64_t>(0, left));
  }
  return s;
}

// Answers the check requests waiting (unless an attempt or check is still in flight) and, when the state,
// epoch or models changed (`changed`), tells the subscribers.
void publish(peer_ptr self, bool changed = true) {
  auto& st = self->state;
  const peer_status s = snapshot(self);
  // With this actor as the sender: subscribers such as the supervisor tell peers apart by it.
  if (changed) {
    for (const peer_subscriber& sub : st.subscribers) self->send(sub, update_atom_v, s);
  }
  if (!st.busy) {
    for (auto& rp : st.waiting) rp.deliver(s);
    st.waiting.clear();
  }
}

std::string down_message(peer_ptr self) {
  auto& st = self->state;
  std::string m = "peer " + st.status.name + " (" + st.status.address + ") is " + st.status.state;
  if (!st.status.last_error.empty()) m += ": " + st.status.last_error;
  return m;
}

void attempt(peer_ptr self);

void schedule_retry(peer_ptr self) {
  auto& st = self->state;
  if (!st.parked.empty()) {  // no more attempts: parked until a check asks for one
    st.status.state = "parked";
    ++st.generation;
    return;
  }
  const auto d = backoff_delay(st.params.backoff, std::max<uint32_t>(1, st.status.failures),
                               std::uniform_real_distribution<double>(0.0, 1.0)(st.rng));
  st.retry_at = clock::now() + d;
  self->delayed_send(self, d, retry_atom_v, ++st.generation);
}

void schedule_check(peer_ptr self) {
  auto& st = self->state;
  self->delayed_send(self, st.params.health_interval, check_atom_v, ++st.generation);
}

// The peer stopped answering or its connection dropped: requests on it fail from now on, retry later.
void went_down(peer_ptr self, const std::string& why) {
  auto& st = self->state;
  if (st.status.state == "down" || st.status.state == "parked") return;
  TROUPE_LOG(warn, "peer " << st.status.name << " (" << st.status.address << ") is down: " << why
                            << (st.models.empty() ? std::string() : "; models using it: " + [&] {
                                 std::string m;
                                 for (const auto& x : st.models) m += (m.empty() ? "" : ", ") + x;
                                 return m;
                               }()));
  st.client->mark_down(why);
  st.status.state = "down";
  st.status.last_error = why;
  st.status.failures = 1;
  schedule_retry(self);
  publish(self);
}

void attempt(peer_ptr self) {
  auto& st = self->state;
  st.busy = true;
  st.status.state = "connecting";
  ++st.generation;  // cancels a pending retry
  publish(self);
  // Connecting may take connect_timeout, the registration a few small requests more.
  const auto limit = st.params.connect_timeout * 2 + std::chrono::seconds(5);
  self->request(st.worker, limit, connect_atom_v)
      .then(
          [self](uint64_t epoch, const std::vector<std::string>& devices) {
            auto& s = self->state;
            s.busy = false;
            s.status.state = "up";
            s.status.epoch = epoch;
            s.status.failures = 0;
            s.status.devices = devices;
            TROUPE_LOG(info, "peer " << s.status.name << " (" << s.status.address << ") is up (connection " << epoch
                                     << ", " << devices.size() << " devices)");
            schedule_check(self);
            publish(self);
          },
          [self](const caf::error& e) {
            auto& s = self->state;
            s.busy = false;
            s.client->mark_down(error_text(e));
            s.status.state = "down";
            s.status.last_error = error_text(e);
            s.status.failures += 1;
            schedule_retry(self);
            publish(self);
          });
}

void health_check(peer_ptr self) {
  auto& st = self->state;
  st.busy = true;
  const uint64_t epoch = st.status.epoch;
  const auto timeout = st.params.health_timeout;
  // The worker may be busy with a request on a hung peer: a check that does not come back in time fails too.
  self->request(st.worker, timeout + timeout / 2 + std::chrono::milliseconds(100), check_atom_v,
                static_cast<uint64_t>(timeout.count()))
      .then(
          [self, epoch, timeout](bool ok) {
            auto& s = self->state;
            s.busy = false;
            if (s.status.state != "up" || s.status.epoch != epoch) {
              publish(self, false);
              return;
            }
            if (ok) {
              s.status.health_checks += 1;
              schedule_check(self);
              publish(self, false);
            } else {
              went_down(self, "health check failed: no answer within " + std::to_string(timeout.count()) + " ms");
            }
          },
          [self, epoch, timeout](const caf::error&) {
            auto& s = self->state;
            s.busy = false;
            if (s.status.state == "up" && s.status.epoch == epoch) {
              went_down(self, "health check failed: no answer within " + std::to_string(timeout.count()) + " ms");
            } else {
              publish(self, false);
            }
          });
}

peer_actor::behavior_type peer(peer_ptr self, peer_params p) {
  auto& init = self->state;
  init.params = std::move(p);
  init.status.address = init.params.host + ":" + std::to_string(init.params.port);
  init.status.name = init.params.name.empty() ? init.status.address : init.params.name;
  init.status.state = "connecting";
  rpc::client_options o = init.params;  // the connection's settings, without the actor's own
  o.auto_reconnect = false;              // only this actor reconnects, with backoff
  init.client = std::make_shared<rpc::client>(std::move(o));
  // The client reports a lost connection from the thread whose request failed.
  const caf::actor_addr me = self->address();
  const std::weak_ptr<rpc::client> weak = init.client;
  init.client->set_on_lost([me, weak](const std::string& why) {
    auto c = weak.lock();
    auto h = caf::actor_cast<peer_actor>(me);  // the actor if it still lives (the client holds no reference)
    if (c && h) caf::anon_send(h, lost_atom_v, c->epoch(), why);
  });
  init.worker = self->spawn<caf::detached + caf::linked>(peer_worker, init.client);
  attempt(self);

  return {
      [self](get_atom, status_atom) { return snapshot(self); },
      [self](check_atom) -> caf::result<peer_status> {
        auto& st = self->state;
        auto rp = self->make_response_promise<peer_status>();
        st.waiting.push_back(rp);
        st.parked.clear();  // asked to connect: no longer parked
        if (!st.busy) {
          if (st.status.state == "up") {
            ++st.generation;  // the periodic check restarts after this one
            health_check(self);
          } else {
            attempt(self);
          }
        }
        return rp;
      },
      [self](memory_atom) -> caf::result<peer_memory> {
        auto& st = self->state;
        if (st.status.state != "up") return make_error(errc::down, down_message(self));
        auto rp = self->make_response_promise<peer_memory>();
        self->request(st.worker, st.params.io_timeout, memory_atom_v, st.status.devices)
            .then([rp](const peer_memory& v) mutable { rp.deliver(v); },
                  [self, rp](const caf::error& e) mutable {
                    auto& s = self->state;
                    rp.deliver(make_error(errc::down, s.status.state == "up" ? error_text(e) : down_message(self)));
                  });
        return rp;
      },
      [self](attach_atom, const std::string& model) {
        if (self->state.models.insert(model).second) publish(self);
      },
      [self](detach_atom, const std::string& model) {
        if (self->state.models.erase(model) > 0) publish(self);
      },
      [self](park_atom, const std::string& why) {
        auto& st = self->state;
        if (!st.parked.empty()) return;
        st.parked = why.empty() ? std::string("parked") : why;
        TROUPE_LOG(info, "peer " << st.status.name << " (" << st.status.address << ") parked: " << st.parked
                                 << "; no more connection attempts");
        st.client->mark_down(st.parked);
        st.status.last_error = st.parked;
        if (st.busy && st.status.state == "connecting") return;  // the attempt in flight parks it when it fails
        st.status.state = "parked";
        ++st.generation;  // cancels the pending retry or health check
        publish(self);
      },
      [self](subscribe_atom, const peer_subscriber& a) {
        auto& subs = self->state.subscribers;
        if (std::find(subs.begin(), subs.end(), a) == subs.end()) subs.push_back(a);
        self->send(a, update_atom_v, snapshot(self));
        return true;
      },
      [self](unsubscribe_atom, const peer_subscriber& a) {
        auto& subs = self->state.subscribers;
        subs.erase(std::remove(subs.begin(), subs.end(), a), subs.end());
      },
      [self](retry_atom, uint64_t gen) {
        auto& st = self->state;
        if (gen != st.generation || st.status.state != "down") return;
        if (st.busy) {  // a check still in flight: try again once it is back
          self->delayed_send(self, std::chrono::milliseconds(50), retry_atom_v, gen);
          return;
        }
        attempt(self);
      },
      [self](check_atom, uint64_t gen) {
        auto& st = self->state;
        if (gen != st.generation || st.busy || st.status.state != "up") return;
        health_check(self);
      },
      [self](lost_atom, uint64_t epoch, const std::string& why) {
        auto& st = self->state;
        if (st.status.state != "up" || epoch != st.status.epoch) return;
        went_down(self, why);
      },
  };
}

}  // namespace

peer_actor spawn_peer_actor(caf::actor_system& sys, const peer_params& params) {
  if (params.port == 0) throw error("peer " + params.name + ": no port given (host:port)");
  if (params.host.empty()) throw error("peer " + params.name + ": no host given (host:port)");
  return sys.spawn(peer, params);
}

}  // namespace troupe::actors
