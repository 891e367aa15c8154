#include "net/http/server.h"

#include <httplib.h>
#include <sys/socket.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <thread>

#include "actors/session_actor.h"
#include "net/http/openai.h"
#include "runtime/log.h"

namespace troupe::http {

using clock_type = std::chrono::steady_clock;

// httplib's server with the listen backlog raised: 0.11 listens with a backlog of 5, and when a burst of
// clients connects at once (16 in the load test) the kernel's accept queue overflows, their handshakes are
// retried after seconds, and a request that arrives after the keep-alive wait is dropped.
class daemon::listener : public httplib::Server {
 public:
  void raise_backlog() {
    const socket_t s = svr_sock_.load();
    if (s != INVALID_SOCKET) ::listen(s, SOMAXCONN);
  }
};

struct daemon::model_slots {
  actors::model_settings config;
  uint32_t slots = 1;
  std::atomic<bool> loaded{false};
  actors::model_info info;
  int64_t created = 0;
  std::shared_ptr<const actors::loaded_model> model;

  mutable std::mutex m;
  std::condition_variable cv;
  std::vector<std::unique_ptr<session>> idle;
  std::vector<session*> active;  // sessions answering now (cancelled at the end of a shutdown's grace)
  uint32_t open = 0;             // sessions that exist (idle + busy + being opened)
  uint32_t busy = 0;
};

namespace {

// Per HTTP worker thread: when the request being handled started and whether its client went away (for
// the access log and the request counters, which run after the response on the same thread).
thread_local clock_type::time_point request_start;
thread_local bool client_gone = false;

int64_t unix_now() {
  return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void send_error(httplib::Response& res, const api_error& e) {
  res.status = e.status();
  res.set_content(dump(e.body()), "application/json");
}

std::string endpoint_of(const std::string& path) {
  if (path == "/v1/chat/completions") return "chat";
  if (path == "/v1/completions") return "completions";
  if (path == "/v1/models") return "models";
  if (path == "/health") return "health";
  if (path == "/metrics") return "metrics";
  if (path == "/v1/memory") return "memory";
  return "other";
}

bool constant_time_equal(std::string_view a, std::string_view b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

// One request's claim on a session of a model: returned to the model's idle sessions (or discarded when it
// failed) by the destructor.
class lease {
 public:
  lease(daemon::model_slots& ms, std::unique_ptr<session> s) : ms_(ms), s_(std::move(s)) {
    std::lock_guard l(ms_.m);
    ms_.active.push_back(s_.get());
  }
  ~lease() {
    std::unique_ptr<session> discard;
    {
      std::lock_guard l(ms_.m);
      ms_.active.erase(std::remove(ms_.active.begin(), ms_.active.end(), s_.get()), ms_.active.end());
      --ms_.busy;
      if (broken_) {
        --ms_.open;
        discard = std::move(s_);
      } else {
        ms_.idle.push_back(std::move(s_));
      }
    }
    ms_.cv.notify_one();
    discard.reset();  // closes it (a round trip) outside the lock
  }
  lease(const lease&) = delete;
  lease& operator=(const lease&) = delete;
  session& get() { return *s_; }
  const std::string& model() const { return ms_.config.name; }
  void broken() { broken_ = true; }
  // Swaps in a fresh session for one that stopped working (its model was loaded again, say); the old one
  // is closed outside the lock.
  void replace(std::unique_ptr<session> fresh) {
    std::unique_ptr<session> old;
    {
      std::lock_guard l(ms_.m);
      std::replace(ms_.active.begin(), ms_.active.end(), s_.get(), fresh.get());
      old = std::move(s_);
      s_ = std::move(fresh);
    }
    old.reset();
  }

 private:
  daemon::model_slots& ms_;
  std::unique_ptr<session> s_;
  bool broken_ = false;
};

// A free session of the model, waiting in the queue when there is none. Throws api_error 503 when the
// queue is full, the wait times out or the daemon stops.
std::unique_ptr<lease> acquire(engine& eng, daemon::model_slots& ms, daemon_metrics& mx, const server_config& sc,
                               const std::atomic<bool>& stopping) {
  const auto deadline = clock_type::now() + std::chrono::seconds(sc.queue_timeout_s);
  std::unique_lock l(ms.m);
  bool queued = false;
  const auto leave_queue = [&] {
    if (queued) mx.queue_depth.fetch_sub(1);
    queued = false;
  };
  for (;;) {
    if (stopping.load()) {
      leave_queue();
      throw api_error(503, "unavailable_error", "the server is shutting down");
    }
    if (!ms.idle.empty()) {
      std::unique_ptr<session> s = std::move(ms.idle.back());
      ms.idle.pop_back();
      ++ms.busy;
      leave_queue();
      l.unlock();
      return std::make_unique<lease>(ms, std::move(s));
    }
    if (ms.open < ms.slots) {
      ++ms.open;
      ++ms.busy;
      leave_queue();
      l.unlock();
      try {
        auto s = std::make_unique<session>(eng.open_session(ms.config.name));
        return std::make_unique<lease>(ms, std::move(s));
      } catch (const std::exception& e) {
        {
          std::lock_guard g(ms.m);
          --ms.open;
          --ms.busy;
        }
        ms.cv.notify_one();
        throw api_error(503, "unavailable_error", "model '" + ms.config.name + "': cannot open a session: " + e.what());
      }
    }
    if (!queued) {
      int64_t d = mx.queue_depth.load();
      do {
        if (d >= static_cast<int64_t>(sc.queue_limit)) {
          throw api_error(503, "unavailable_error",
                          "the request queue is full (" + std::to_string(sc.queue_limit) + " waiting); retry later");
        }
      } while (!mx.queue_depth.compare_exchange_weak(d, d + 1));
      queued = true;
    }
    if (ms.cv.wait_until(l, deadline) == std::cv_status::timeout && ms.idle.empty() && ms.open >= ms.slots) {
      leave_queue();
      throw api_error(503, "unavailable_error",
                      "no session of model '" + ms.config.name + "' became free within " +
                          std::to_string(sc.queue_timeout_s) + " s; retry later");
    }
  }
}

// What a streamed or plain answer needs after the handler returned (the content provider runs later on
// the same thread; the shared state keeps the lease until the response is gone).
struct answer_state {
  completion_request request;
  std::unique_ptr<lease> claim;
  std::string id;
  int64_t created = 0;
  clock_type::time_point deadline = clock_type::time_point::max();
};

}  // namespace

daemon::daemon(engine& eng, daemon_config cfg) : eng_(eng), cfg_(std::move(cfg)), svr_(std::make_unique<listener>()) {
  for (const actors::model_settings& m : cfg_.runtime.models) {
    auto ms = std::make_unique<model_slots>();
    ms->config = m;
    ms->slots = std::max<uint32_t>(1, m.n_seq_max);
    models_.push_back(std::move(ms));
  }
  uint32_t threads = cfg_.server.http_threads;
  if (threads == 0) {
    uint32_t slots = 0;
    for (const auto& ms : models_) slots += ms->slots;
    threads = slots + cfg_.server.queue_limit + 4;
  }
  svr_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  svr_->set_read_timeout(static_cast<time_t>(cfg_.server.read_timeout_s), 0);
  svr_->set_write_timeout(static_cast<time_t>(cfg_.server.write_timeout_s), 0);
  svr_->set_payload_max_length(cfg_.server.max_body_bytes);
  svr_->set_tcp_nodelay(true);
  svr_->set_keep_alive_max_count(1000);
  routes();
}

daemon::~daemon() {
  stop();
  finish_stop();
}

int daemon::bind() {
  const std::string& host = cfg_.server.host;
  if (cfg_.server.port == 0) {
    port_ = svr_->bind_to_any_port(host);
  } else {
    port_ = svr_->bind_to_port(host, cfg_.server.port) ? cfg_.server.port : -1;
  }
  if (port_ < 0) {
    throw error("cannot listen on " + host + ":" + std::to_string(cfg_.server.port) +
                " (address in use, or not an address of this machine)");
  }
  svr_->raise_backlog();
  return port_;
}

void daemon::serve() {
  svr_->listen_after_bind();
  finish_stop();
}

void daemon::load_models() {
  for (auto& ms : models_) {
    if (stopping_.load()) return;
    ms->info = eng_.load_model(ms->config);
    ms->model = eng_.env()->model(ms->config.name);
    ms->created = unix_now();
    ms->loaded.store(true);
    TROUPE_LOG(info, "model '" << ms->config.name << "' loaded: " << ms->info.arch << ", " << ms->info.n_params
                               << " parameters, " << ms->slots << " parallel sessions of "
                               << ms->model->settings.n_ctx_seq << " tokens, chat template "
                               << ms->info.chat_template << " (" << ms->info.load_seconds << " s)");
  }
  ready_.store(true);
}

std::vector<model_gauges> daemon::gauges() const {
  // Loaded and not down now (a model whose peer is gone, or that is being loaded again, is not serving).
  std::set<std::string> down;
  try {
    for (const actors::actor_status& a : eng_.status().actors) {
      if (!a.up && a.name.rfind("model:", 0) == 0) down.insert(a.name.substr(6));
    }
  } catch (const std::exception&) {
    // the runtime is stopping: what was loaded is what is reported
  }
  std::vector<model_gauges> out;
  for (const auto& ms : models_) {
    std::lock_guard l(ms->m);
    out.push_back({ms->config.name, ms->loaded.load() && !down.count(ms->config.name), ms->busy,
                   static_cast<uint32_t>(ms->idle.size()), ms->slots});
  }
  return out;
}

void daemon::stop() {
  std::lock_guard l(stop_mutex_);
  if (stopping_.exchange(true)) return;
  for (auto& ms : models_) {
    std::lock_guard g(ms->m);  // no waiter is between its check of stopping_ and its wait
    ms->cv.notify_all();
  }
  // Until serve() has returned: stop the listener (again: a stop() before the listener started running
  // would otherwise be lost), and once in-flight answers are done or the grace period is over, cancel
  // what is still answering.
  watchdog_ = std::thread([this, grace = cfg_.server.shutdown_grace_s] {
    const auto until = clock_type::now() + std::chrono::seconds(grace);
    bool cancelled = false;
    for (;;) {
      svr_->stop();
      {
        std::lock_guard g(stop_mutex_);
        if (stopped_) return;
        if (!cancelled && (metrics_.in_flight.load() == 0 || clock_type::now() >= until)) {
          cancelled = true;
          cancel_all_.store(true);
          for (auto& ms : models_) {
            std::lock_guard g2(ms->m);
            for (session* s : ms->active) s->cancel();
          }
        }
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
  });
}

void daemon::finish_stop() {
  std::thread watchdog;
  bool first = false;
  {
    std::lock_guard l(stop_mutex_);
    first = !stopped_;
    stopped_ = true;
    watchdog.swap(watchdog_);
  }
  if (watchdog.joinable()) watchdog.join();
  if (!first) return;
  // No request is in flight any more (the server's workers have ended): close every session.
  for (auto& ms : models_) {
    std::vector<std::unique_ptr<session>> idle;
    {
      std::lock_guard l(ms->m);
      idle.swap(ms->idle);
      ms->open -= static_cast<uint32_t>(idle.size());
    }
    idle.clear();
  }
}

void daemon::routes() {
  httplib::Server& s = *svr_;
  const std::vector<std::string>& keys = cfg_.server.api_keys;

  s.set_pre_routing_handler([this, &keys](const httplib::Request& req, httplib::Response& res) {
    request_start = clock_type::now();
    client_gone = false;
    if (keys.empty() || req.path == "/health") return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    constexpr std::string_view bearer = "Bearer ";
    bool ok = false;
    if (auth.size() > bearer.size() && std::string_view(auth).substr(0, bearer.size()) == bearer) {
      const std::string_view given = std::string_view(auth).substr(bearer.size());
      for (const std::string& k : keys) ok |= constant_time_equal(given, k);
    }
    if (ok) return httplib::Server::HandlerResponse::Unhandled;
    send_error(res, api_error(401, "invalid_request_error",
                              auth.empty() ? "missing API key: send 'Authorization: Bearer KEY'" : "invalid API key",
                              {}, "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });

  s.set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty() || res.status < 400) return;
    if (res.status == 404) {
      send_error(res, api_error(404, "invalid_request_error", "no route " + req.method + " " + req.path, {}, "not_found"));
    } else if (res.status == 413) {
      send_error(res, api_error(413, "invalid_request_error", "the request body is too large"));
    } else {
      send_error(res, api_error(res.status, "invalid_request_error", "bad request (HTTP " + std::to_string(res.status) + ")"));
    }
  });

  s.set_exception_handler([](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
    std::string what = "internal error";
    try {
      if (ep) std::rethrow_exception(ep);
    } catch (const std::exception& e) {
      what = e.what();
    } catch (...) {
    }
    TROUPE_LOG(error, "http: " << what);
    send_error(res, api_error(500, "server_error", what));
  });

  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    const double secs = std::chrono::duration<double>(clock_type::now() - request_start).count();
    const int status = client_gone ? 499 : res.status;  // 499: the client closed the connection (nginx)
    metrics_.request_done(endpoint_of(req.path), status, secs);
    if (cfg_.logging.access_log) {
      TROUPE_LOG(info, "http: " << req.remote_addr << " " << req.method << " " << req.path << " " << status << " "
                                << static_cast<int64_t>(secs * 1000) << " ms");
    }
  });

  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    json j;
    json models = json::array();
    size_t ready = 0;
    const std::vector<model_gauges> gs = gauges();
    for (const model_gauges& g : gs) {
      models.push_back({{"name", g.model}, {"ready", g.ready}});
      ready += g.ready ? 1 : 0;
    }
    if (stopping_.load()) {
      res.status = 503;
      j = {{"status", "shutting down"}};
    } else if (!ready_.load()) {
      res.status = 503;
      j = {{"status", "loading"}};
    } else if (ready == 0 && !gs.empty()) {
      res.status = 503;  // nothing can be served (every model's peer is down, say)
      j = {{"status", "unavailable"}};
    } else if (ready < gs.size()) {
      j = {{"status", "degraded"}};  // some models are down: /health's models say which
    } else {
      j = {{"status", "ok"}};
    }
    j["models"] = models;
    res.set_content(dump(j), "application/json");
  });

  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json data = json::array();
    for (const auto& ms : models_) {
      if (!ms->loaded.load()) continue;
      data.push_back({{"id", ms->config.name},
                      {"object", "model"},
                      {"created", ms->created},
                      {"owned_by", "troupe"},
                      {"meta",
                       {{"arch", ms->info.arch},
                        {"n_params", ms->info.n_params},
                        {"n_vocab", ms->info.n_vocab},
                        {"n_ctx_train", ms->info.n_ctx_train},
                        {"n_ctx_seq", ms->model->settings.n_ctx_seq},
                        {"parallel", ms->slots},
                        {"chat_template", ms->info.chat_template},
                        {"weight_bytes", ms->info.weight_bytes}}}});
    }
    res.set_content(dump(json{{"object", "list"}, {"data", data}}), "application/json");
  });

  s.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    actors::memory_breakdown mem;
    std::vector<actors::sched_stats> sched;
    try {
      mem = eng_.memory();
      sched = eng_.scheduler_stats();
    } catch (const std::exception& e) {
      TROUPE_LOG(warn, "metrics: " << e.what());
    }
    res.set_content(metrics_.render(gauges(), mem, sched), "text/plain; version=0.0.4");
  });

  s.Get("/v1/memory", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(eng_.memory().json, "application/json");
  });

  const auto completion = [this](bool chat) {
    return [this, chat](const httplib::Request& http_req, httplib::Response& res) {
      try {
        if (stopping_.load()) throw api_error(503, "unavailable_error", "the server is shutting down");
        auto st = std::make_shared<answer_state>();
        st->request = parse_completion_request(http_req.body, chat);
        const completion_request& r = st->request;
        const auto it = std::find_if(models_.begin(), models_.end(), [&](const auto& m) { return m->config.name == r.model; });
        if (it == models_.end()) {
          throw api_error(404, "invalid_request_error", "the model '" + r.model + "' does not exist", "model", "model_not_found");
        }
        model_slots& ms = **it;
        if (!ms.loaded.load()) throw api_error(503, "unavailable_error", "the model '" + r.model + "' is still loading");
        // The prompt must leave room for at least one token of answer in the session's context.
        actors::generate_request gr;
        gr.chat = r.chat;
        gr.prompt = r.prompt;
        gr.messages = r.messages;
        size_t n_prompt = 0;
        try {
          n_prompt = actors::prompt_tokens(*ms.model, gr).size();
        } catch (const std::exception& e) {
          throw bad_request(std::string("cannot tokenize the prompt: ") + e.what(), chat ? "messages" : "prompt");
        }
        const uint32_t n_ctx = ms.model->settings.n_ctx_seq;
        if (n_prompt >= n_ctx) {
          throw api_error(400, "invalid_request_error",
                          "the prompt has " + std::to_string(n_prompt) + " tokens; this model's sessions hold " +
                              std::to_string(n_ctx) + " tokens (prompt and answer together)",
                          chat ? "messages" : "prompt", "context_length_exceeded");
        }
        st->claim = acquire(eng_, ms, metrics_, cfg_.server, stopping_);
        st->id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_.fetch_add(1));
        st->created = unix_now();
        if (cfg_.server.request_timeout_s > 0) {
          st->deadline = clock_type::now() + std::chrono::seconds(cfg_.server.request_timeout_s);
        }
        // Counted in flight until the response (and with it the provider) is gone.
        struct in_flight_guard {
          explicit in_flight_guard(daemon_metrics& mx) : m(mx) { m.in_flight.fetch_add(1); }
          ~in_flight_guard() { m.in_flight.fetch_sub(1); }
          in_flight_guard(const in_flight_guard&) = delete;
          in_flight_guard& operator=(const in_flight_guard&) = delete;
          daemon_metrics& m;
        };
        auto guard = std::make_shared<in_flight_guard>(metrics_);

        const auto provider = [this, st, guard](size_t, httplib::DataSink& sink) -> bool {
          const completion_request& req = st->request;
          bool gone = false;
          const auto write = [&](const std::string& text) {
            if (!gone && !sink.write(text.data(), text.size())) gone = true;
            return !gone;
          };
          bool first = true;
          auto last_beat = clock_type::now();
          const auto on_piece = [&](std::string_view piece) -> bool {
            if (cancel_all_.load() || clock_type::now() >= st->deadline) return false;
            if (req.stream) {
              const bool ok = write("data: " + dump(stream_chunk(req, st->id, st->created, piece, first)) + "\n\n");
              first = false;
              return ok;
            }
            const auto now = clock_type::now();
            if (now - last_beat >= std::chrono::milliseconds(100)) {
              last_beat = now;
              return write(" ");
            }
            return true;
          };
          actors::generate_reply reply;
          for (int attempt = 0;; ++attempt) {
            try {
              session& sess = st->claim->get();
              reply = req.chat ? sess.chat(req.messages, req.params, on_piece) : sess.generate(req.prompt, req.params, on_piece);
              break;
            } catch (const actors::request_error& e) {
              // The session's actor is gone (its model was loaded again after a peer reconnected, say) and
              // nothing of the answer went out (a plain answer's heartbeat spaces do not count): once more,
              // on a fresh session.
              if (attempt == 0 && first && e.is(actors::errc::down)) {
                try {
                  st->claim->replace(std::make_unique<session>(eng_.open_session(st->claim->model())));
                  TROUPE_LOG(info, "http: " << st->id << ": " << e.what() << "; retrying on a new session");
                  continue;
                } catch (const std::exception&) {
                  // the model itself is down: the first error says why
                }
              }
              if (e.is(actors::errc::down) || e.is(actors::errc::busy)) st->claim->broken();
              // A model that is down (its peer is gone, it is being loaded again) is a 503: retry later.
              const api_error ae = e.is(actors::errc::capacity) ? api_error(400, "invalid_request_error", e.what())
                                   : e.is(actors::errc::down) ? api_error(503, "unavailable_error", e.what())
                                                              : api_error(500, "server_error", e.what());
              TROUPE_LOG(warn, "http: " << st->id << ": " << e.what());
              write(req.stream ? "data: " + dump(ae.body()) + "\n\n" : dump(ae.body()));
              if (!gone) sink.done();
              return !gone;
            }
          }
          if (reply.finish == "cancelled") {
            if (gone) {
              client_gone = true;
              metrics_.cancelled();
              TROUPE_LOG(info, "http: " << st->id << ": client went away; answer cancelled after " << reply.tokens.size()
                                        << " tokens");
              return false;
            }
            metrics_.cancelled();  // timeout or shutdown: the answer so far, finish "length"
          }
          metrics_.tokens(static_cast<uint64_t>(std::max(0, reply.n_prompt)), reply.tokens.size(), reply.gen_seconds);
          if (req.stream) {
            write("data: " + dump(stream_finish(req, st->id, st->created, reply.finish)) + "\n\n");
            if (req.include_usage) write("data: " + dump(stream_usage(req, st->id, st->created, reply)) + "\n\n");
            write("data: [DONE]\n\n");
          } else {
            write(dump(completion_response(req, st->id, st->created, reply)));
          }
          if (gone) {
            client_gone = true;
            return false;
          }
          sink.done();
          return true;
        };
        if (r.stream) {
          res.set_header("Cache-Control", "no-cache");
          res.set_header("X-Accel-Buffering", "no");
          res.set_chunked_content_provider("text/event-stream", provider);
        } else {
          res.set_chunked_content_provider("application/json", provider);
        }
      } catch (const api_error& e) {
        send_error(res, e);
      }
    };
  };
  s.Post("/v1/chat/completions", completion(true));
  s.Post("/v1/completions", completion(false));
}

}  // namespace troupe::http
