// The daemon's HTTP front: an OpenAI-compatible API over an engine (actors/engine.h).
//
//   troupe::engine eng(cfg.engine);
//   http::daemon d(eng, cfg);
//   const int port = d.bind();          // listening; /health answers 503 "loading"
//   std::thread t([&] { d.serve(); });  // returns once stop() has drained the requests
//   d.load_models();                    // loads the configured models; /health turns 200
//   ...  d.stop();                      // from any thread (the signal watcher)
//
// Files: daemon.cpp (binding, loading, stopping), routes.cpp (authentication, errors, access log, the
// reporting routes), completion.cpp (the completions), embeddings.cpp (the embeddings, on the same
// sessions), session_pool.h (a model's sessions and queue), front.h (the HTTP/1.1 event loop every
// connection lives on: deadlines, the connection limit).
//
// Routes: POST /v1/chat/completions, POST /v1/completions (streaming as server-sent events or not), POST
// /v1/embeddings, GET /v1/models, GET /health, GET /metrics (Prometheus), GET /v1/memory (the memory
// breakdown as JSON). Every route but /health needs a bearer key when keys are configured.
//
// Connections: an event loop (server.io_threads) holds every connection and reads each request whole
// under deadlines; idle and slow clients hold no thread. A request that has arrived goes to a worker: the
// completions and embeddings to a pool of http_threads, the rest (/health, /metrics, ...) to a pool of
// their own. Beyond server.max_connections a connection is answered 503 and closed.
//
// Models load on demand (on_demand.cpp): the first model (and those with load = "startup") at start, the
// others when a request first names them; an idle model unloads after its keep_alive, and the least recently
// used idle ones unload when a load needs their room in a device's memory budget (server.memory_budget_mib).
//
// Concurrency: each model has n_seq_max sessions (its parallel slots), opened on first use and reused (a
// session keeps its conversation's cached prefix). A request takes a free session or waits for one in a
// bounded queue (server.queue_limit, server.queue_timeout_s; beyond either: 503). Sessions that decode at
// the same time are batched by the model's decoder actor. A client that goes away cancels its answer: a
// streamed answer notices on the next write; a plain answer is sent with chunked encoding and a space before
// the JSON every 100 ms while it is generated, so a closed connection is noticed there too (whitespace
// before a JSON value is valid JSON).
//
// Errors use the OpenAI shape: 400 bad JSON or fields (naming the field) and prompts longer than the
// session's context, 401 missing or wrong key, 404 unknown model or route, 503 queue full, loading or
// shutting down, 500 anything else. A failure after a streamed answer started is sent as an SSE event with
// an "error" object; the daemon keeps serving.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "actors/engine.h"
#include "net/http/daemon_config.h"
#include "net/http/front.h"
#include "net/http/metrics.h"
#include "net/http/openai.h"
#include "net/http/responses.h"

namespace troupe::http {

struct model_slots;  // a model's sessions and queue (net/http/session_pool.h)
class model_use;     // a request's hold on a loaded model (net/http/session_pool.h)

class daemon {
 public:
  daemon(engine& eng, daemon_config cfg);
  ~daemon();
  daemon(const daemon&) = delete;
  daemon& operator=(const daemon&) = delete;

  // Binds server.host:server.port (0: any free port); returns the port. Throws troupe::error when it cannot.
  int bind();
  // Answers requests until stop(); returns when every in-flight request has ended.
  void serve();
  // Loads every model that loads at start (blocking, one after another; the others load on demand). Throws
  // actors::request_error naming the model that failed.
  void load_models();
  // Unloads the model now if nothing uses it (ollama's keep_alive 0); false when it is not loaded or in use.
  bool unload_now(const std::string& name);
  // Stops accepting, lets in-flight answers finish for server.shutdown_grace_s, then cancels them, closes
  // the sessions. Safe from any thread, more than once. serve() returns afterwards.
  void stop();

  // Where the layers of models with placement = "cluster" go (the cluster's placer), asked when they load
  // (first) and again by replace_model. Set before load_models().
  using placement_fn = std::function<std::vector<actors::device_layers>(const actors::model_settings&, bool first)>;
  void set_placement(placement_fn f) { placement_ = std::move(f); }
  // The model lost its placement (a node it used is down): its requests get 503 naming why until it is
  // loaded again where placement says now. Blocks until then, retrying every second, or until stop().
  void replace_model(const std::string& name, const std::string& why);

  // The cluster this daemon coordinates, as GET /v1/cluster answers it (JSON); unset: 404 (no [cluster]).
  // Set before serve().
  void set_cluster_status(std::function<std::string()> f) { cluster_status_ = std::move(f); }

  bool stopping() const { return stopping_.load(); }
  std::vector<model_gauges> gauges() const;

 private:
  struct answer_state;  // one completion's request, session and progress (completion.cpp)

  // The routes (routes.cpp): every request that arrived (authentication, routing, counting), the errors the
  // front answers itself, the access log, and the routes that report.
  void handle(const front::request& req, front::response& res);
  void route(const front::request& req, front::response& res);
  std::string front_error(const front::request& req, int status, const std::string& message);
  void access_log(const front::request& req, int status, double seconds);
  void health(front::response& res) const;
  void list_models(front::response& res) const;
  // A completion request (completion.cpp): checked and given a session, then answered by the response's
  // writer.
  void complete(bool chat, const front::request& req, front::response& res);
  // An embeddings request (embeddings.cpp): checked, then computed on a session of the model.
  void embeddings(const front::request& req, front::response& res);
  // The embeddings of a request's inputs, in OpenAI's shape (/v1/embeddings, ollama's /api/embed); throws api_error.
  json embed(const embedding_request& r);
  // POST /v1/messages and /v1/messages/count_tokens (Anthropic's Messages API, anthropic.h).
  void messages(const front::request& req, front::response& res);
  void count_tokens(const front::request& req, front::response& res);
  // POST /v1/responses, GET and DELETE /v1/responses/{id} (OpenAI's Responses API, responses.h).
  void responses(const front::request& req, front::response& res);
  void stored_response(const front::request& req, front::response& res);
  // Ollama's API (ollama.h): /api/chat and /api/generate answers, /api/embed, and the model listings.
  void ollama_answer(bool generate, const front::request& req, front::response& res);
  void ollama_route(const front::request& req, front::response& res);
  // llama-server's /tokenize, /detokenize, /apply-template and /props (server_utils.cpp).
  void utility_route(const front::request& req, front::response& res);
  // The answer of a request begun with begin_answer, written by a writer on the handler's thread.
  void respond(const std::shared_ptr<answer_state>& st, front::response& res);
  // On-demand loading (on_demand.cpp). The model a request names, held loaded while the use lives: loaded
  // first when it is not (waiting up to server.load_timeout_s; 507 when it cannot fit even alone).
  model_use use_model(const std::string& name);
  void init_on_demand();
  void load_on_demand(model_slots& ms, std::chrono::steady_clock::time_point deadline);
  // Unloads a loaded model nothing uses (false: it is in use, pinned or not loaded). Under load_mutex_.
  bool unload_idle(model_slots& ms, const std::string& why, bool only_expired = false);
  void reap_idle_models();
  // The bytes models hold on each device now (the memory accountant's figures), and a device's budget.
  std::vector<std::pair<std::string, uint64_t>> memory_by_device();
  std::optional<uint64_t> budget_of(const std::string& device, uint64_t used_now) const;
  // The model of that name or alias (or either with ":latest"); null when none.
  model_slots* find_model(const std::string& name) const;
  // A parsed request given a session (its model's chat template rendered, its cells reserved); throws api_error.
  std::shared_ptr<answer_state> begin_answer(completion_request request, std::string endpoint, const std::string& id_prefix);
  bool write_choices(answer_state& st, front::body_sink& sink);
  bool write_answer(answer_state& st, front::body_sink& sink);
  // Counts the request being handled on this thread (once): before its response's last byte leaves, so a
  // client that has its answer finds it in /metrics.
  void count_request(const std::string& endpoint, int status);
  void finish_stop();

  engine& eng_;
  std::function<std::string()> cluster_status_;
  placement_fn placement_;
  // The settings s loads with: placed by placement_ for placement = "cluster".
  actors::model_settings placed(const actors::model_settings& s, bool first);
  daemon_config cfg_;
  std::unique_ptr<front::listener> svr_;
  response_store stored_responses_;  // /v1/responses kept for previous_response_id and GET
  std::vector<std::unique_ptr<model_slots>> models_;
  daemon_metrics metrics_;
  std::atomic<bool> ready_{false};
  std::atomic<bool> stopping_{false};
  std::atomic<bool> cancel_all_{false};
  std::atomic<uint64_t> next_id_{1};
  int port_ = -1;
  std::mutex stop_mutex_;
  bool stopped_ = false;
  std::thread watchdog_;  // cancels what is still answering when a shutdown's grace period ends
  // One load or unload of a model at a time (on_demand.cpp): a lock whose waits can be bounded (a mutex and a
  // condition variable: std::timed_mutex's timed wait goes through pthread_mutex_clocklock, which
  // ThreadSanitizer does not see, so its unlock looks like a bug there).
  class turn_lock {
   public:
    void lock() {
      std::unique_lock l(m_);
      cv_.wait(l, [this] { return !held_; });
      held_ = true;
    }
    bool try_lock() {
      std::lock_guard l(m_);
      return !held_ && (held_ = true);
    }
    template <class Clock, class Duration>
    bool try_lock_until(const std::chrono::time_point<Clock, Duration>& until) {
      std::unique_lock l(m_);
      if (!cv_.wait_until(l, until, [this] { return !held_; })) return false;
      held_ = true;
      return true;
    }
    void unlock() {
      {
        std::lock_guard l(m_);
        held_ = false;
      }
      cv_.notify_one();
    }

   private:
    std::mutex m_;
    std::condition_variable cv_;
    bool held_ = false;
  };
  turn_lock load_mutex_;
  std::mutex reaper_mutex_;
  std::condition_variable reaper_cv_;
  std::thread reaper_;  // unloads models idle past their keep_alive
};

}  // namespace troupe::http
