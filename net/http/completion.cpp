// POST /v1/chat/completions and /v1/completions: a request is checked and given a session (begin_answer),
// then its answer is generated while it is written out, streamed as server-sent events or as one JSON body
// (write_answer, from the response's writer).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <optional>
#include <string>

#include "actors/session_actor.h"
#include "net/http/anthropic.h"
#include "net/http/ollama.h"
#include "net/http/detail/daemon_internals.h"
#include "net/http/daemon.h"
#include "net/http/session_pool.h"
#include "runtime/log.h"

namespace troupe::http {

using detail::clock_type;
using detail::error_for;
using detail::in_flight_count;

namespace {

// Writes to the client until it goes away (then every later write is a no-op that says so).
struct answer_sink {
  front::body_sink& sink;
  bool gone = false;
  bool write(const std::string& text) {
    if (!gone && !sink.write(text)) gone = true;
    return !gone;
  }
};

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

// An answer's error: its own status while nothing of the answer went out (a plain answer's heartbeat
// spaces and a stream's first event take that chance away); after that, a last stream event or the whole
// body of the 200, in the answer's format. `count` gets the status the client sees before the last byte is
// written (the metrics count a request before its last byte). Returns whether it was written.
bool send_error_answer(answer_sink& out, front::body_sink& sink, bool stream, const detail::answer_format& fmt,
                       const api_error& e, const std::function<void(int)>& count) {
  if (!sink.started()) {
    count(e.status());
    return sink.refuse(e.status(), fmt.error_body(e), "application/json");
  }
  count(200);  // the status line went out with the first byte
  out.write(stream ? fmt.stream_error(e) : fmt.error_body(e));
  return !out.gone && sink.done();
}

// OpenAI's chat.completion / text_completion, streamed as chunks after "data: ".
class openai_format : public detail::answer_format {
 public:
  openai_format(const completion_request& r, std::string id, int64_t created) : req_(r), id_(std::move(id)), created_(created) {
    // A chat answer with reasoning or tools goes through a chat_stream: reasoning_content deltas, content
    // held back where a call may begin, each call's deltas once it is complete.
    if (req_.stream && req_.chat && (req_.tools_active() || req_.split_reasoning())) deltas_.emplace(req_, id_);
  }

  std::string stream(const actors::token_event& e) override {
    if (deltas_) return write(deltas_->feed(e.piece), &e.logprobs);
    std::string out = event(stream_chunk(req_, id_, created_, e.piece, !started_, &e.logprobs, text_offset_));
    for (const llm::token_logprob& t : e.logprobs) text_offset_ += t.text.size();
    started_ = true;
    return out;
  }

  std::string finish(const actors::generate_reply& reply) override {
    if (!req_.stream) return dump(completion_response(req_, id_, created_, reply));
    std::string out = deltas_ ? write(deltas_->finish(), nullptr) : std::string();
    out += event(stream_finish(req_, id_, created_, reply.finish, calls_streamed_ > 0));
    if (req_.include_usage) out += event(stream_usage(req_, id_, created_, reply));
    return out + "data: [DONE]\n\n";
  }

  std::string error_body(const api_error& e) const override { return dump(e.body()); }
  std::string stream_error(const api_error& e) const override { return event(e.body()); }

 private:
  static std::string event(const json& j) { return "data: " + dump(j) + "\n\n"; }

  std::string write(const chat_stream::deltas& d, const std::vector<llm::token_logprob>* logprobs) {
    std::string out;
    if (!d.reasoning.empty()) {
      out += event(stream_reasoning_chunk(req_, id_, created_, d.reasoning, !started_));
      started_ = true;
    }
    if (!d.content.empty() || (logprobs != nullptr && !logprobs->empty())) {
      out += event(stream_chunk(req_, id_, created_, d.content, !started_, logprobs, text_offset_));
      started_ = true;
    }
    for (size_t i = 0; i < d.calls.size(); ++i) {
      for (const json& c : stream_tool_call_chunks(req_, id_, created_, d.calls[i], d.first_index + i, !started_)) {
        out += event(c);
        started_ = true;
      }
      ++calls_streamed_;
    }
    return out;
  }

  const completion_request& req_;
  std::string id_;
  int64_t created_;
  std::optional<chat_stream> deltas_;
  size_t text_offset_ = 0;  // of the streamed text so far (the completions' legacy logprobs)
  size_t calls_streamed_ = 0;
};

// The last bytes are written: the response is done, unless the client went away meanwhile.
bool finish_response(answer_sink& out, front::body_sink& sink) {
  if (out.gone) return false;
  return sink.done();
}

}  // namespace

// What a streamed or plain answer needs after the handler returned (the content provider runs later on
// the same thread; the shared state keeps the lease, and the request counted in flight, until the response
// is gone).
struct daemon::answer_state {
  explicit answer_state(daemon_metrics& mx) : counted(mx) {}
  completion_request request;
  model_use use;  // the model held loaded (released after the sessions below)
  std::unique_ptr<lease> claim;
  std::vector<std::unique_ptr<lease>> more;  // n > 1: the sessions of choices 1..n-1
  std::string id;
  std::string endpoint;  // the metrics' name of the route ("chat", "completions", "messages")
  int64_t created = 0;
  uint32_t n_prompt = 0;  // the prompt's tokens
  // How the answer goes out: made by make_format (OpenAI's shape when none), again for a retry on a fresh
  // session (a format keeps what it held back of the first try).
  std::function<std::unique_ptr<detail::answer_format>()> make_format;
  std::unique_ptr<detail::answer_format> format;
  clock_type::time_point deadline = clock_type::time_point::max();
  in_flight_count counted;
};

void daemon::complete(bool chat, const front::request& req, front::response& res) {
  try {
    respond(begin_answer(parse_completion_request(req.body, chat), chat ? "chat" : "completions", chat ? "chatcmpl-" : "cmpl-"), res);
  } catch (const api_error& e) {
    detail::send_error(res, e);
  }
}

void daemon::messages(const front::request& req, front::response& res) {
  try {
    const std::shared_ptr<answer_state> st = begin_answer(parse_messages_request(req.body), "messages", "msg_");
    st->make_format = [s = st.get()] { return messages_format(s->request, s->id, s->n_prompt); };
    respond(st, res);
  } catch (const api_error& e) {
    res.status = e.status();
    res.set_content(dump(messages_error(e)), "application/json");
  }
}

void daemon::responses(const front::request& req, front::response& res) {
  try {
    responses_request r = parse_responses_request(req.body, stored_responses_);
    completion_request chat = std::move(r.chat);
    const std::shared_ptr<answer_state> st = begin_answer(std::move(chat), "responses", "resp_");
    st->make_format = [s = st.get(), extras = std::make_shared<const responses_request>(std::move(r)), this] {
      return responses_format(s->request, *extras, s->id, s->created, stored_responses_);
    };
    respond(st, res);
  } catch (const api_error& e) {
    detail::send_error(res, e);
  }
}

void daemon::stored_response(const front::request& req, front::response& res) {
  const std::string id = req.path.substr(std::string_view("/v1/responses/").size());
  if (req.method == "DELETE") {
    if (!stored_responses_.erase(id)) {
      detail::send_error(res, api_error(404, "invalid_request_error", "no stored response '" + id + "'", {}, "not_found"));
      return;
    }
    res.set_content(dump(json{{"id", id}, {"object", "response.deleted"}, {"deleted", true}}), "application/json");
    return;
  }
  const auto e = stored_responses_.get(id);
  if (!e) {
    detail::send_error(res, api_error(404, "invalid_request_error", "no stored response '" + id + "'", {}, "not_found"));
    return;
  }
  res.set_content(dump(e->response), "application/json");
}

void daemon::ollama_answer(bool generate, const front::request& req, front::response& res) {
  try {
    if (std::optional<json> done = ollama_load_only(req.body, generate)) {
      // A load is answered once the model is there; an unload (keep_alive 0) once it is gone, or at once when
      // it is not loaded (or in use by other requests: it unloads when they end, as its keep_alive is 0).
      const std::string name = (*done)["model"].get<std::string>();
      if ((*done)["done_reason"] == "unload") {
        if (find_model(name) == nullptr) {
          throw api_error(404, "invalid_request_error", "the model '" + name + "' does not exist", "model", "model_not_found");
        }
        (void)unload_now(name);  // (in use: once the requests using it end)
      } else {
        model_use use = use_model(name);
        const int64_t keep = ollama_keep_alive(nlohmann::ordered_json::parse(req.body));
        if (keep != actors::model_settings::keep_alive_default) use.keep_alive(keep);
      }
      res.set_content(dump(*done), "application/json");
      return;
    }
    const std::shared_ptr<answer_state> st = begin_answer(parse_ollama_request(req.body, generate), generate ? "ollama_generate" : "ollama_chat",
                                                          "ollama-");
    st->make_format = [s = st.get(), generate] { return ollama_format(s->request, generate, 0); };
    respond(st, res);
  } catch (const api_error& e) {
    res.status = e.status();
    res.set_content(dump(ollama_error(e)), "application/json");
  }
}

void daemon::count_tokens(const front::request& req, front::response& res) {
  try {
    completion_request r = parse_messages_request(req.body, true);
    const model_use use = use_model(r.model);
    const std::shared_ptr<const actors::loaded_model>& lm = use.model();
    prepare_chat(r, *lm->chat);
    res.set_content(dump(json{{"input_tokens", actors::prompt_tokens(*lm, generate_request_of(r)).size()}}), "application/json");
  } catch (const api_error& e) {
    res.status = e.status();
    res.set_content(dump(messages_error(e)), "application/json");
  }
}

void daemon::respond(const std::shared_ptr<answer_state>& st, front::response& res) {
  // On this thread after the handler returns; false: the client went away (counted 499, nginx's code).
  const auto writer = [this, st](front::body_sink& sink) {
    const bool ok = write_answer(*st, sink);
    if (!ok) count_request(st->endpoint, 499);
    return ok;
  };
  if (st->request.stream) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("X-Accel-Buffering", "no");
    if (!st->format && st->make_format) st->format = st->make_format();
    res.set_chunked(st->format ? st->format->stream_type() : "text/event-stream", writer);
  } else {
    res.set_chunked("application/json", writer);
  }
}

model_slots* daemon::find_model(const std::string& name) const {
  // A model's name first, then an alias, then either without ollama's ":latest" tag (names are unique across
  // names and aliases: the configuration checks).
  const auto find = [&](const std::string& n) -> model_slots* {
    for (const auto& m : models_) {
      if (m->config.name == n) return m.get();
    }
    for (const auto& m : models_) {
      if (std::find(m->config.aliases.begin(), m->config.aliases.end(), n) != m->config.aliases.end()) return m.get();
    }
    return nullptr;
  };
  if (model_slots* m = find(name)) return m;
  constexpr std::string_view latest = ":latest";
  if (name.size() > latest.size() && name.compare(name.size() - latest.size(), latest.size(), latest) == 0) {
    return find(name.substr(0, name.size() - latest.size()));
  }
  return nullptr;
}

std::shared_ptr<daemon::answer_state> daemon::begin_answer(completion_request request, std::string endpoint,
                                                           const std::string& id_prefix) {
  if (stopping_.load()) throw api_error(503, "unavailable_error", "the server is shutting down");
  auto st = std::make_shared<answer_state>(metrics_);
  st->request = std::move(request);
  st->endpoint = std::move(endpoint);
  const completion_request& r = st->request;
  const bool chat = r.chat;
  st->use = use_model(r.model);
  if (r.keep_alive_ms != actors::model_settings::keep_alive_default) st->use.keep_alive(r.keep_alive_ms);
  model_slots& ms = st->use.slots();
  const actors::loaded_model& lm = *st->use.model();  // (held by the use)
  // The chat through the model's template (tools, their calls and results in its syntax; the grammar of a
  // call; the reasoning markers).
  prepare_chat(st->request, *lm.chat);
  // The prompt must leave room for at least one token of answer in the session's context.
  const actors::generate_request gr = generate_request_of(r);
  size_t n_prompt = 0;
  try {
    n_prompt = actors::prompt_tokens(lm, gr).size();
  } catch (const std::exception& e) {
    throw bad_request(std::string("cannot tokenize the prompt: ") + e.what(), chat ? "messages" : "prompt");
  }
  // Token ids the request names must exist (checked here: once the answer starts, its status is 200).
  const int32_t n_vocab = lm.vocab->n_tokens();
  for (const llm::token_bias& b : r.params.logit_bias) {
    if (b.token >= n_vocab) {
      throw bad_request("'logit_bias' names token " + std::to_string(b.token) + ", outside the vocabulary (0.." +
                            std::to_string(n_vocab - 1) + ")",
                        "logit_bias");
    }
  }
  const uint32_t n_ctx = lm.settings.n_ctx_seq;
  if (n_prompt >= n_ctx) {
    throw api_error(400, "invalid_request_error",
                    "the prompt has " + std::to_string(n_prompt) + " tokens; this model's sessions hold " +
                        std::to_string(n_ctx) + " tokens (prompt and answer together)",
                    chat ? "messages" : "prompt", "context_length_exceeded");
  }
  if (r.n > 1 && static_cast<uint32_t>(r.n) > ms.slots) {
    throw bad_request("'n' is " + std::to_string(r.n) + "; the model '" + r.model + "' answers with at most " +
                          std::to_string(ms.slots) + " sessions at once",
                      "n");
  }
  if (r.n > 1 && r.stream && r.tools_active()) {
    throw bad_request("'n' above 1 with tools is not supported when streaming", "n");
  }
  // The KV cells the answer may take are reserved in the model's pool (session_pool.h); an answer without
  // max_tokens ends at its reservation.
  const uint32_t n_answer = answer_cells(lm.settings, static_cast<uint32_t>(n_prompt), r.max_tokens_given,
                                         r.params.max_tokens);
  const uint32_t cells = static_cast<uint32_t>(n_prompt) + n_answer;
  actors::generation_params& gp = st->request.params;
  gp.n_ctx = static_cast<int32_t>(cells);
  gp.context_shift = lm.settings.context_shift;
  // Without max_tokens an answer ends at its reservation, or with context shift goes on within it.
  if (!r.max_tokens_given) gp.max_tokens = gp.context_shift ? INT32_MAX : static_cast<int32_t>(std::max<uint32_t>(n_answer, 1));
  if (r.n > 1 && static_cast<uint64_t>(cells) * static_cast<uint64_t>(r.n) > lm.settings.n_ctx) {
    throw bad_request("'n' is " + std::to_string(r.n) + " answers of " + std::to_string(cells) +
                          " KV cells each (prompt and max_tokens); the model '" + r.model + "' has " +
                          std::to_string(lm.settings.n_ctx) + " in all",
                      "n");
  }
  // The n answers' cells are reserved with the first session, so two requests for several answers never each
  // hold part of the room the other waits for.
  st->claim = acquire(eng_, ms, metrics_, cfg_.server, stopping_, cells * static_cast<uint32_t>(std::max(r.n, 1)));
  for (int32_t i = 1; i < r.n; ++i) st->more.push_back(acquire(eng_, ms, metrics_, cfg_.server, stopping_, 0));
  st->id = id_prefix + std::to_string(next_id_.fetch_add(1));
  st->n_prompt = static_cast<uint32_t>(n_prompt);
  st->created = detail::unix_now();
  if (cfg_.server.request_timeout_s > 0) st->deadline = clock_type::now() + std::chrono::seconds(cfg_.server.request_timeout_s);
  return st;
}

bool daemon::write_answer(answer_state& st, front::body_sink& sink) {
  if (!st.more.empty()) return write_choices(st, sink);
  const completion_request& req = st.request;
  answer_sink out{sink};
  if (!st.make_format) st.make_format = [&st] { return std::make_unique<openai_format>(st.request, st.id, st.created); };
  if (!st.format) st.format = st.make_format();
  detail::answer_format* fmt = st.format.get();
  auto last_beat = clock_type::now();
  const auto on_event = [&](const actors::token_event& e) -> bool {
    if (cancel_all_.load() || clock_type::now() >= st.deadline) return false;
    if (req.stream) {
      const std::string text = fmt->stream(e);
      return text.empty() || out.write(text);
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
      if (attempt == 0 && !fmt->started() && e.is(actors::errc::down)) {
        try {
          st.claim->replace(std::make_unique<session>(eng_.open_session(st.claim->model())));
          st.format = st.make_format();
          fmt = st.format.get();
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
      return send_error_answer(out, sink, req.stream, *fmt, ae, [&](int status) { count_request(st.endpoint, status); });
    }
  }

  if (reply.finish == "cancelled") {
    metrics_.cancelled();
    if (out.gone) {
      TROUPE_LOG(info, "http: " << st.id << ": client went away; answer cancelled after " << reply.tokens.size() << " tokens");
      return false;
    }
    // A timeout or a shutdown: the answer so far, finish "length".
  }
  metrics_.tokens(static_cast<uint64_t>(std::max(0, reply.n_prompt)),
                  static_cast<uint64_t>(std::max(0, reply.n_prompt - reply.n_prompt_decoded)), reply.tokens.size(),
                  reply.gen_seconds);
  // Before the answer's last bytes: a client that has them finds its session free and its request counted.
  st.claim.reset();
  count_request(st.endpoint, 200);
  out.write(fmt->finish(reply));
  return finish_response(out, sink);
}

// n > 1: the prompt is decoded once on the first session, the other sessions share its cells, and the n
// answers (seeds seed, seed + 1, ...) are decoded together by the model's scheduler, each on a thread of
// its own that hands its events to this one (the only writer of the response).
bool daemon::write_choices(answer_state& st, front::body_sink& sink) {
  const completion_request& req = st.request;
  answer_sink out{sink};
  const std::string endpoint = req.chat ? "chat" : "completions";
  const size_t n = st.more.size() + 1;
  std::vector<lease*> claims = {st.claim.get()};
  for (const auto& l : st.more) claims.push_back(l.get());
  const auto fail = [&](const actors::request_error& e) {
    for (lease* l : claims) {
      if (e.is(actors::errc::down) || e.is(actors::errc::busy)) l->broken();
    }
    const api_error ae = error_for(e);
    TROUPE_LOG(warn, "http: " << st.id << ": " << e.what());
    st.claim.reset();
    st.more.clear();
    const openai_format fmt(req, st.id, st.created);
    return send_error_answer(out, sink, req.stream, fmt, ae, [&](int status) { count_request(endpoint, status); });
  };
  try {
    actors::generate_request prefill = generate_request_of(req);
    prefill.params.max_tokens = 0;  // the prompt only: it stays in the first session's cache
    prefill.params.logprobs = -1;
    prefill.params.grammar.clear();
    claims[0]->get().run(prefill, {});
    for (size_t i = 1; i < n; ++i) claims[i]->get().share_prefix(claims[0]->get());
  } catch (const actors::request_error& e) {
    return fail(e);
  }

  struct event {
    size_t choice;
    actors::token_event e;
  };
  std::mutex mu;
  std::condition_variable cv;
  std::deque<event> events;
  std::vector<actors::generate_reply> replies(n);
  std::vector<std::optional<actors::request_error>> errors(n);
  size_t running = n;
  std::atomic<bool> stop{false};
  std::vector<std::thread> threads;
  for (size_t i = 0; i < n; ++i) {
    threads.emplace_back([&, i] {
      actors::generate_request gr = generate_request_of(req);
      gr.params.seed = req.params.seed + static_cast<uint32_t>(i);
      try {
        replies[i] = claims[i]->get().run(gr, [&](const actors::token_event& e) {
          if (stop.load() || cancel_all_.load() || clock_type::now() >= st.deadline) return false;
          std::lock_guard l(mu);
          events.push_back({i, e});
          cv.notify_one();
          return true;
        });
      } catch (const actors::request_error& e) {
        errors[i] = e;
      }
      std::lock_guard l(mu);
      --running;
      cv.notify_one();
    });
  }
  std::vector<bool> first(n, true);
  std::vector<size_t> offsets(n, 0);
  auto last_beat = clock_type::now();
  for (;;) {
    std::unique_lock l(mu);
    cv.wait_for(l, std::chrono::milliseconds(100), [&] { return !events.empty() || running == 0; });
    std::deque<event> batch;
    batch.swap(events);
    const bool all_done = running == 0;
    l.unlock();
    for (const event& ev : batch) {
      if (!req.stream) continue;
      const size_t i = ev.choice;
      if (!out.write("data: " + dump(stream_chunk(req, st.id, st.created, ev.e.piece, first[i], &ev.e.logprobs, offsets[i], i)) + "\n\n")) {
        stop = true;
      }
      for (const llm::token_logprob& t : ev.e.logprobs) offsets[i] += t.text.size();
      first[i] = false;
    }
    if (!req.stream && clock_type::now() - last_beat >= std::chrono::milliseconds(100)) {
      last_beat = clock_type::now();
      if (!out.write(" ")) stop = true;
    }
    if (all_done && batch.empty()) break;
  }
  for (std::thread& t : threads) t.join();
  for (size_t i = 0; i < n; ++i) {
    if (errors[i]) return fail(*errors[i]);
  }
  if (out.gone || stop.load()) {
    metrics_.cancelled();
    return false;
  }
  uint64_t generated = 0;
  for (const actors::generate_reply& r : replies) generated += r.tokens.size();
  metrics_.tokens(static_cast<uint64_t>(std::max(0, replies[0].n_prompt)),
                  static_cast<uint64_t>(std::max(0, replies[0].n_prompt - replies[0].n_prompt_decoded)), generated,
                  replies[0].gen_seconds);
  st.claim.reset();
  st.more.clear();
  count_request(endpoint, 200);
  if (req.stream) {
    for (size_t i = 0; i < n; ++i) out.write("data: " + dump(stream_finish(req, st.id, st.created, replies[i].finish, false, i)) + "\n\n");
    if (req.include_usage) {
      actors::generate_reply total = replies[0];
      for (size_t i = 1; i < n; ++i) total.tokens.insert(total.tokens.end(), replies[i].tokens.begin(), replies[i].tokens.end());
      out.write("data: " + dump(stream_usage(req, st.id, st.created, total)) + "\n\n");
    }
    out.write("data: [DONE]\n\n");
  } else {
    out.write(dump(completion_response(req, st.id, st.created, replies)));
  }
  return finish_response(out, sink);
}

}  // namespace troupe::http
