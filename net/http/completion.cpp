// POST /v1/chat/completions and /v1/completions: a request is checked and given a session (begin_answer),
// then its answer is generated while it is written out, streamed as server-sent events or as one JSON body
// (write_answer, from the response's content provider).
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "actors/session_actor.h"
#include "net/http/detail/daemon_internals.h"
#include "net/http/server.h"
#include "net/http/session_pool.h"
#include "runtime/log.h"

namespace troupe::http {

using detail::clock_type;

namespace {

// Counts a request in flight for as long as it lives.
class in_flight_count {
 public:
  explicit in_flight_count(daemon_metrics& mx) : m_(mx) { m_.in_flight.fetch_add(1); }
  ~in_flight_count() { m_.in_flight.fetch_sub(1); }
  in_flight_count(const in_flight_count&) = delete;
  in_flight_count& operator=(const in_flight_count&) = delete;

 private:
  daemon_metrics& m_;
};

// Writes to the client until it goes away (then every later write is a no-op that says so).
struct answer_sink {
  httplib::DataSink& sink;
  bool gone = false;
  bool write(const std::string& text) {
    if (!gone && !sink.write(text.data(), text.size())) gone = true;
    return !gone;
  }
};

// The HTTP error for a failed answer: a full context is the request's fault (400), a model that is down
// (its peer is gone, it is being loaded again) is a 503 to retry later, anything else a 500.
// What the session actor is asked for a parsed request.
actors::generate_request generate_request_of(const completion_request& r) {
  actors::generate_request gr;
  gr.chat = r.chat;
  gr.prompt = r.prompt;
  gr.prompt_ids = r.prompt_ids;
  gr.messages = r.messages;
  gr.params = r.params;
  return gr;
}

api_error error_for(const actors::request_error& e) {
  if (e.is(actors::errc::capacity)) return api_error(400, "invalid_request_error", e.what());
  if (e.is(actors::errc::bad_request)) return api_error(400, "invalid_request_error", e.what());
  if (e.is(actors::errc::down)) return api_error(503, "unavailable_error", e.what());
  return api_error(500, "server_error", e.what());
}

}  // namespace

// What a streamed or plain answer needs after the handler returned (the content provider runs later on
// the same thread; the shared state keeps the lease, and the request counted in flight, until the response
// is gone).
struct daemon::answer_state {
  explicit answer_state(daemon_metrics& mx) : counted(mx) {}
  completion_request request;
  std::unique_ptr<lease> claim;
  std::string id;
  int64_t created = 0;
  clock_type::time_point deadline = clock_type::time_point::max();
  in_flight_count counted;
};

void daemon::complete(bool chat, const httplib::Request& req, httplib::Response& res) {
  try {
    const std::shared_ptr<answer_state> st = begin_answer(chat, req.body);
    const auto provider = [this, st](size_t, httplib::DataSink& sink) { return write_answer(*st, sink); };
    if (st->request.stream) {
      res.set_header("Cache-Control", "no-cache");
      res.set_header("X-Accel-Buffering", "no");
      res.set_chunked_content_provider("text/event-stream", provider);
    } else {
      res.set_chunked_content_provider("application/json", provider);
    }
  } catch (const api_error& e) {
    detail::send_error(res, e);
  }
}

std::shared_ptr<daemon::answer_state> daemon::begin_answer(bool chat, const std::string& body) {
  if (stopping_.load()) throw api_error(503, "unavailable_error", "the server is shutting down");
  auto st = std::make_shared<answer_state>(metrics_);
  st->request = parse_completion_request(body, chat);
  const completion_request& r = st->request;
  const auto it = std::find_if(models_.begin(), models_.end(), [&](const auto& m) { return m->config.name == r.model; });
  if (it == models_.end()) {
    throw api_error(404, "invalid_request_error", "the model '" + r.model + "' does not exist", "model", "model_not_found");
  }
  model_slots& ms = **it;
  if (!ms.loaded.load()) {
    std::string why;
    {
      std::lock_guard l(ms.m);
      why = ms.unavailable;
    }
    throw api_error(503, "unavailable_error",
                    "the model '" + r.model + "' is " + (why.empty() ? std::string("still loading") : "unavailable: " + why));
  }
  // Tools, their calls and results in the model family's syntax (and the grammar of a forced call).
  prepare_tools(st->request, ms.info.chat_template);
  // The prompt must leave room for at least one token of answer in the session's context.
  const actors::generate_request gr = generate_request_of(r);
  size_t n_prompt = 0;
  try {
    n_prompt = actors::prompt_tokens(*ms.model, gr).size();
  } catch (const std::exception& e) {
    throw bad_request(std::string("cannot tokenize the prompt: ") + e.what(), chat ? "messages" : "prompt");
  }
  // Token ids the request names must exist (checked here: once the answer starts, its status is 200).
  const int32_t n_vocab = ms.model->vocab->n_tokens();
  for (const llm::token_bias& b : r.params.logit_bias) {
    if (b.token >= n_vocab) {
      throw bad_request("'logit_bias' names token " + std::to_string(b.token) + ", outside the vocabulary (0.." +
                            std::to_string(n_vocab - 1) + ")",
                        "logit_bias");
    }
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
  st->created = detail::unix_now();
  if (cfg_.server.request_timeout_s > 0) st->deadline = clock_type::now() + std::chrono::seconds(cfg_.server.request_timeout_s);
  return st;
}

bool daemon::write_answer(answer_state& st, httplib::DataSink& sink) {
  const completion_request& req = st.request;
  answer_sink out{sink};
  const std::string endpoint = req.chat ? "chat" : "completions";
  bool first = true;  // nothing of a streamed answer went out yet
  auto last_beat = clock_type::now();
  size_t text_offset = 0;  // of the streamed text so far (the completions' legacy logprobs)
  // With tools, the answer's text is kept and only what cannot begin a call is streamed as content; the
  // calls go out as tool_calls deltas at the end.
  const bool hold_calls = req.stream && req.tools_active();
  std::string answer_text;
  size_t content_sent = 0;
  const auto on_event = [&](const actors::token_event& e) -> bool {
    if (cancel_all_.load() || clock_type::now() >= st.deadline) return false;
    if (hold_calls) {
      answer_text += e.piece;
      const size_t safe = std::max(content_sent, llm::streamable_content(req.syntax, answer_text));
      const std::string piece = answer_text.substr(content_sent, safe - content_sent);
      content_sent = safe;
      if (piece.empty() && e.logprobs.empty()) return true;
      const bool ok = out.write("data: " + dump(stream_chunk(req, st.id, st.created, piece, first, &e.logprobs, text_offset)) + "\n\n");
      first = false;
      return ok;
    }
    if (req.stream) {
      const bool ok =
          out.write("data: " + dump(stream_chunk(req, st.id, st.created, e.piece, first, &e.logprobs, text_offset)) + "\n\n");
      for (const llm::token_logprob& t : e.logprobs) text_offset += t.text.size();
      first = false;
      return ok;
    }
    // A plain answer: a space every 100 ms notices a client that went away (whitespace before JSON is valid).
    const auto now = clock_type::now();
    if (now - last_beat >= std::chrono::milliseconds(100)) {
      last_beat = now;
      return out.write(" ");
    }
    return true;
  };

  actors::generate_reply reply;
  for (int attempt = 0;; ++attempt) {
    try {
      session& sess = st.claim->get();
      reply = sess.run(generate_request_of(req), on_event);
      break;
    } catch (const actors::request_error& e) {
      // The session's actor is gone (its model was loaded again after a peer reconnected, say) and nothing
      // of the answer went out (a plain answer's heartbeat spaces do not count): once more, on a fresh
      // session.
      if (attempt == 0 && first && e.is(actors::errc::down)) {
        try {
          st.claim->replace(std::make_unique<session>(eng_.open_session(st.claim->model())));
          TROUPE_LOG(info, "http: " << st.id << ": " << e.what() << "; retrying on a new session");
          continue;
        } catch (const std::exception&) {
          // the model itself is down: the first error says why
        }
      }
      if (e.is(actors::errc::down) || e.is(actors::errc::busy)) st.claim->broken();
      const api_error ae = error_for(e);
      TROUPE_LOG(warn, "http: " << st.id << ": " << e.what());
      st.claim.reset();  // the session is free (or closed) before the client hears of it
      count_request(endpoint, 200);  // the status line went out with the first byte
      out.write(req.stream ? "data: " + dump(ae.body()) + "\n\n" : dump(ae.body()));
      if (!out.gone) sink.done();
      return !out.gone;
    }
  }

  if (reply.finish == "cancelled") {
    metrics_.cancelled();
    if (out.gone) {
      detail::client_gone = true;
      TROUPE_LOG(info, "http: " << st.id << ": client went away; answer cancelled after " << reply.tokens.size() << " tokens");
      return false;
    }
    // A timeout or a shutdown: the answer so far, finish "length".
  }
  metrics_.tokens(static_cast<uint64_t>(std::max(0, reply.n_prompt)), reply.tokens.size(), reply.gen_seconds);
  // Before the answer's last bytes: a client that has them finds its session free and its request counted.
  st.claim.reset();
  count_request(endpoint, 200);
  if (req.stream) {
    bool called = false;
    if (hold_calls) {
      const llm::tool_output calls = tool_calls_of(req, st.id, reply.text);
      if (calls.calls.empty()) {
        if (content_sent < reply.text.size()) {
          out.write("data: " + dump(stream_chunk(req, st.id, st.created, std::string_view(reply.text).substr(content_sent), first)) + "\n\n");
          first = false;
        }
      } else {
        for (size_t i = 0; i < calls.calls.size(); ++i) {
          out.write("data: " + dump(stream_tool_call(req, st.id, st.created, calls.calls[i], i, first)) + "\n\n");
          first = false;
        }
        called = true;
      }
    }
    out.write("data: " + dump(stream_finish(req, st.id, st.created, reply.finish, called)) + "\n\n");
    if (req.include_usage) out.write("data: " + dump(stream_usage(req, st.id, st.created, reply)) + "\n\n");
    out.write("data: [DONE]\n\n");
  } else {
    out.write(dump(completion_response(req, st.id, st.created, reply)));
  }
  if (out.gone) {
    detail::client_gone = true;
    return false;
  }
  sink.done();
  return true;
}

}  // namespace troupe::http
