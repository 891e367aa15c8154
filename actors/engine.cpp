#include "actors/engine.h"

#include <caf/all.hpp>

#include <optional>
#include <thread>

#include "backends/cpu_instance.h"
#include "backends/registry.h"
#include "runtime/log.h"

namespace troupe {

namespace {

// One blocking round trip: the reply, or request_error.
template <class T, class Handle, class... Ts>
T ask(caf::actor_system& sys, const Handle& h, Ts&&... xs) {
  caf::scoped_actor self{sys};
  std::optional<T> out;
  caf::error err;
  self->request(h, caf::infinite, std::forward<Ts>(xs)...)
      .receive([&](T& v) { out = std::move(v); }, [&](caf::error& e) { err = std::move(e); });
  if (err) throw actors::request_error(err);
  return std::move(*out);
}

// A scoped actor's monitor of a long-lived actor, removed when the round trip ends (however it ends). The
// monitored actor keeps a reference to each monitor it has; a scoped actor per request that never
// demonitors is memory the daemon never gets back (half a KiB per request).
template <class Handle>
class monitor_guard {
 public:
  monitor_guard(caf::scoped_actor& self, const Handle& of) : self_(self), of_(of) { self_->monitor(of_); }
  ~monitor_guard() { self_->demonitor(of_.address()); }
  monitor_guard(const monitor_guard&) = delete;
  monitor_guard& operator=(const monitor_guard&) = delete;

 private:
  caf::scoped_actor& self_;
  Handle of_;
};

}  // namespace

// ---- engine ----

engine::engine(const actors::engine_config& cfg) : cfg_(cfg) {
  own_cfg_ = std::make_unique<caf::actor_system_config>();
  actors::add_message_types(*own_cfg_);
  if (cfg_.caf_threads > 0) own_cfg_->set("scheduler.max-threads", cfg_.caf_threads);
  if (cfg_.caf_policy != "sharing" && cfg_.caf_policy != "stealing") {
    throw error("engine: caf_policy must be \"sharing\" or \"stealing\", not \"" + cfg_.caf_policy + "\"");
  }
  own_cfg_->set("scheduler.policy", cfg_.caf_policy == "sharing" ? caf::atom("sharing") : caf::atom("stealing"));
  own_sys_ = std::make_unique<caf::actor_system>(*own_cfg_);
  sys_ = own_sys_.get();
  start();
}

engine::engine(caf::actor_system& sys, const actors::engine_config& cfg) : cfg_(cfg), sys_(&sys) { start(); }

void engine::start() {
  register_builtin_backends();
  std::vector<std::string> devices = cfg_.devices;
  if (devices.empty()) devices = builtin_device_names();  // the CPU and every local GPU
  for (int i = 1; i <= cfg_.cpu_instances; ++i) {
    device_i& d = add_cpu_instance({.index = i, .memory = cfg_.cpu_instance_memory, .n_threads = cfg_.n_threads});
    if (cfg_.devices.empty()) devices.emplace_back(d.name());
  }
  env_ = std::make_shared<actors::engine_env>();
  // Configured remote peers: one actor each. A peer that is up within its connect timeout has registered
  // its devices, which get device actors like local ones (models place layers on "RPC[host:port]#i"); one
  // that is not stays down and keeps retrying (engine_status says why), the runtime starts anyway, and the
  // supervisor gives the peer's devices actors when it comes up.
  std::vector<actors::peer_actor> peers;
  for (const actors::peer_params& pc : cfg_.peers) {
    const actors::peer_params pp = actors::load_peer_key(pc);
    actors::peer_actor p = actors::spawn_peer_actor(*sys_, pp);
    peers.push_back(p);
    actors::peer_status s;
    const auto until = std::chrono::steady_clock::now() + pp.connect_timeout + std::chrono::seconds(1);
    do {
      s = ask<actors::peer_status>(*sys_, p, actors::get_atom_v, actors::status_atom_v);
      if (s.state == "connecting") std::this_thread::sleep_for(std::chrono::milliseconds(20));
    } while (s.state == "connecting" && std::chrono::steady_clock::now() < until);
    if (s.state == "up") {
      for (const std::string& d : s.devices) devices.push_back(d);
      TROUPE_LOG(info, "peer " << s.name << " (" << s.address << ") is up with " << s.devices.size() << " device(s)");
    } else {
      TROUPE_LOG(warn, "peer " << s.name << " (" << s.address << ") is " << s.state
                               << (s.last_error.empty() ? std::string() : ": " + s.last_error)
                               << "; its devices join when it comes up");
    }
  }
  supervisor_ = actors::spawn_supervisor(*sys_, env_,
                                         {.devices = devices,
                                          .n_threads = cfg_.n_threads,
                                          .max_restarts = cfg_.max_restarts,
                                          .flush_delay = std::chrono::microseconds(cfg_.flush_delay_us),
                                          .dispatch_splits = cfg_.dispatch_splits,
                                          .peers = peers,
                                          .reload_on_reconnect = cfg_.reload_on_peer_reconnect});
}

// The peer actor at address ("host:port"), or an empty handle.
actors::peer_actor engine::peer_at(const std::string& address) {
  const auto dir = ask<actors::actor_directory>(*sys_, supervisor_, actors::get_atom_v, actors::directory_atom_v);
  for (const actors::peer_actor& p : dir.peers) {
    if (ask<actors::peer_status>(*sys_, p, actors::get_atom_v, actors::status_atom_v).address == address) return p;
  }
  return {};
}

bool engine::park_peer(const std::string& address, const std::string& why) {
  const actors::peer_actor p = peer_at(address);
  if (!p) return false;
  caf::anon_send(p, actors::park_atom_v, why);
  return true;
}

std::vector<std::string> engine::add_peer(const actors::peer_params& pp) {
  actors::peer_actor p = peer_at(pp.host + ":" + std::to_string(pp.port));
  if (p) {
    ask<actors::peer_status>(*sys_, p, actors::check_atom_v);  // connect now (or check now, when up)
  } else {
    p = actors::spawn_peer_actor(*sys_, pp);
    ask<bool>(*sys_, supervisor_, actors::connect_atom_v, p);
  }
  actors::peer_status s;
  const auto until = std::chrono::steady_clock::now() + pp.connect_timeout + std::chrono::seconds(1);
  do {
    s = ask<actors::peer_status>(*sys_, p, actors::get_atom_v, actors::status_atom_v);
    if (s.state != "up") std::this_thread::sleep_for(std::chrono::milliseconds(20));
  } while (s.state != "up" && std::chrono::steady_clock::now() < until);
  if (s.state != "up") {
    throw actors::request_error(actors::make_error(actors::errc::down, "peer " + s.name + " (" + s.address + ") is " + s.state +
                                                                           (s.last_error.empty() ? "" : ": " + s.last_error)));
  }
  // Its devices get actors when the supervisor hears it is up: wait until the directory has them.
  const auto devices_until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  for (;;) {
    const auto dir = ask<actors::actor_directory>(*sys_, supervisor_, actors::get_atom_v, actors::directory_atom_v);
    const bool all = std::all_of(s.devices.begin(), s.devices.end(), [&](const std::string& d) {
      return std::find(dir.device_names.begin(), dir.device_names.end(), d) != dir.device_names.end();
    });
    if (all) break;
    if (std::chrono::steady_clock::now() > devices_until) {
      throw actors::request_error(actors::make_error(actors::errc::down, "peer " + s.name + ": its devices got no actors"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  TROUPE_LOG(info, "peer " << s.name << " (" << s.address << ") is up with " << s.devices.size() << " device(s)");
  return s.devices;
}

engine::~engine() {
  try {
    shutdown();
  } catch (const std::exception&) {
    // The actors report errors to their requesters; at destruction there is nobody left to tell.
  }
  own_sys_.reset();
}

actors::model_info engine::load_model(const std::string& name, const std::string& path, actors::model_settings s,
                                      const progress_callback& progress) {
  s.name = name;
  s.path = path;
  return load_model(s, progress);
}

actors::model_info engine::load_model(const actors::model_settings& s, const progress_callback& progress) {
  actors::load_request r{s, {}};
  if (!progress) return ask<actors::model_info>(*sys_, supervisor_, actors::load_atom_v, r);
  // Progress messages come to this thread's scoped actor, with the reply. (A scoped actor is untyped: it
  // is the listener because the receive below handles the listener's message.)
  caf::scoped_actor self{*sys_};
  r.progress = caf::actor_cast<actors::progress_listener>(self);
  std::optional<actors::model_info> info;
  caf::error err;
  // An asynchronous message: its reply (or error) arrives as an ordinary message, after the progress.
  monitor_guard watching(self, supervisor_);
  self->send(supervisor_, actors::load_atom_v, r);
  bool done = false;
  self->receive_while([&] { return !done; })(
      [&](actors::progress_atom, const actors::load_progress& p) { progress(p.done, p.total); },
      [&](actors::model_info& i) {
        info = std::move(i);
        done = true;
      },
      [&](caf::error& e) {
        err = std::move(e);
        done = true;
      },
      [&](caf::down_msg& dm) {
        err = actors::make_error(actors::errc::down, "the runtime terminated: " + caf::to_string(dm.reason));
        done = true;
      });
  if (err) throw actors::request_error(err);
  return std::move(*info);
}

void engine::load_configured_models() {
  for (const actors::model_settings& m : cfg_.models) load_model(m);
}

void engine::unload_model(const std::string& name) {
  if (!ask<bool>(*sys_, supervisor_, actors::unload_atom_v, name)) {
    throw actors::request_error(actors::make_error(actors::errc::not_found, "no model named '" + name + "' is loaded"));
  }
}

session engine::open_session(const std::string& model) {
  return session(*sys_, ask<actors::session_actor>(*sys_, supervisor_, actors::open_atom_v, actors::session_request{model}));
}

actors::memory_breakdown engine::memory() {
  return ask<actors::memory_breakdown>(*sys_, supervisor_, actors::get_atom_v, actors::breakdown_atom_v);
}

actors::engine_status engine::status() {
  return ask<actors::engine_status>(*sys_, supervisor_, actors::get_atom_v, actors::status_atom_v);
}

std::vector<actors::decoder_stats> engine::decoding_stats() {
  const auto dir = ask<actors::actor_directory>(*sys_, supervisor_, actors::get_atom_v, actors::directory_atom_v);
  std::vector<actors::decoder_stats> out;
  for (const actors::decoder_actor& s : dir.decoders) {
    out.push_back(ask<actors::decoder_stats>(*sys_, s, actors::get_atom_v, actors::stats_atom_v));
  }
  return out;
}

actors::memory_breakdown engine::shutdown() {
  if (stopped_) return {};
  stopped_ = true;
  return ask<actors::memory_breakdown>(*sys_, supervisor_, actors::shutdown_atom_v);
}

// ---- session ----

session& session::operator=(session&& other) noexcept {
  if (this != &other) {
    close();
    sys_ = other.sys_;
    handle_ = std::move(other.handle_);
    other.handle_ = nullptr;
  }
  return *this;
}

session::~session() { close(); }

void session::close() {
  if (!handle_) return;
  // A round trip, so that the sequence is free for the next session when close() returns.
  caf::scoped_actor self{*sys_};
  self->request(handle_, std::chrono::seconds(30), actors::close_atom_v).receive([](bool) {}, [](caf::error&) {});
  handle_ = nullptr;
}

void session::cancel() {
  if (handle_) caf::anon_send(handle_, actors::cancel_atom_v);
}

void session::reset() {
  if (!handle_) throw actors::request_error(actors::make_error(actors::errc::not_found, "session is closed"));
  ask<bool>(*sys_, handle_, actors::reset_atom_v);
}

void session::share_prefix(const session& other) {
  if (!handle_ || !other.handle_) throw actors::request_error(actors::make_error(actors::errc::not_found, "session is closed"));
  const auto prefix = ask<actors::session_prefix>(*sys_, other.handle_, actors::get_atom_v, actors::prefix_atom_v);
  ask<bool>(*sys_, handle_, actors::share_atom_v, prefix);
}

std::vector<float> session::embed(const std::vector<int32_t>& tokens) {
  if (!handle_) throw actors::request_error(actors::make_error(actors::errc::not_found, "session is closed"));
  caf::scoped_actor self{*sys_};
  std::optional<actors::embed_reply> reply;
  caf::error err;
  self->request(handle_, caf::infinite, actors::embed_atom_v, actors::embed_request{tokens})
      .receive([&](actors::embed_reply& r) { reply = std::move(r); }, [&](caf::error& e) { err = std::move(e); });
  // A session or decoder actor that terminated bounces the request: the model is down (being unloaded or
  // loaded again), as a session's answer reports it.
  if (err == caf::sec::request_receiver_down) {
    throw actors::request_error(actors::make_error(actors::errc::down, "session terminated: " + caf::to_string(err)));
  }
  if (err) throw actors::request_error(err);
  return std::move(reply->embedding);
}

actors::generate_reply session::generate(const std::string& prompt, const actors::generation_params& p,
                                         const token_callback& on_piece) {
  actors::generate_request r;
  r.prompt = prompt;
  r.params = p;
  return run_pieces(std::move(r), on_piece);
}

actors::generate_reply session::chat(const std::vector<actors::chat_message>& messages, const actors::generation_params& p,
                                     const token_callback& on_piece) {
  actors::generate_request r;
  r.chat = true;
  r.messages = messages;
  r.params = p;
  return run_pieces(std::move(r), on_piece);
}

actors::generate_reply session::run_pieces(actors::generate_request r, const token_callback& on_piece) {
  if (!on_piece) return run(std::move(r), token_event_callback{});
  return run(std::move(r), [&on_piece](const actors::token_event& e) { return on_piece(e.piece); });
}

actors::generate_reply session::run(actors::generate_request r, const token_event_callback& on_piece) {
  if (!handle_) throw actors::request_error(actors::make_error(actors::errc::not_found, "session is closed"));
  // This thread's scoped actor is the subscriber: pieces and the reply arrive in order, and the callback
  // runs here. (A scoped actor is untyped: it subscribes because the receive below handles tokens.)
  caf::scoped_actor self{*sys_};
  monitor_guard watching(self, handle_);
  r.subscriber = caf::actor_cast<actors::token_subscriber>(self);
  std::string text;
  std::vector<int32_t> tokens;
  std::optional<actors::generate_reply> reply;
  caf::error err;
  bool done = false;
  bool stopped = false;  // the callback ended the answer
  // An asynchronous message: its reply (or error) arrives as an ordinary message, after the pieces.
  self->send(handle_, actors::generate_atom_v, std::move(r));
  self->receive_while([&] { return !done; })(
      [&](actors::token_atom, const actors::token_event& e) {
        if (stopped) return;  // nothing after the piece the callback stopped at reaches the caller
        text += e.piece;
        if (e.token >= 0) tokens.push_back(e.token);
        if (on_piece && !on_piece(e)) {
          caf::anon_send(handle_, actors::cancel_atom_v);
          stopped = true;
        }
      },
      [&](actors::generate_reply& rep) {
        reply = std::move(rep);
        done = true;
      },
      [&](caf::error& e) {
        err = std::move(e);
        done = true;
      },
      [&](caf::down_msg& dm) {
        err = actors::make_error(actors::errc::down, "session terminated: " + caf::to_string(dm.reason));
        done = true;
      });
  // A stop from the callback ends the answer at that piece, whether the session heard of it before its last
  // token or not (the session generates ahead of the caller): the reply is what the caller was given.
  if (stopped || (err && actors::is(err, actors::errc::cancelled))) {
    actors::generate_reply c = reply ? std::move(*reply) : actors::generate_reply{};
    c.text = std::move(text);
    c.tokens = std::move(tokens);
    if (c.logprobs.size() > c.tokens.size()) c.logprobs.resize(c.tokens.size());
    c.finish = "cancelled";
    return c;
  }
  if (err) throw actors::request_error(err);
  return std::move(*reply);
}

}  // namespace troupe
