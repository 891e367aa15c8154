#include <set>
#include <string>

#include "net/http/detail/daemon_internals.h"
#include "net/http/anthropic.h"
#include "net/http/daemon.h"
#include "net/http/session_pool.h"
#include "runtime/log.h"

namespace troupe::http {

extern const std::string_view web_page;  // web/index.html (web_page.cpp, generated)

using detail::clock_type;
using detail::send_error;

namespace {

std::string endpoint_of(const std::string& path) {
  if (path == "/v1/chat/completions") return "chat";
  if (path == "/v1/completions") return "completions";
  if (path == "/v1/models") return "models";
  if (path == "/health") return "health";
  if (path == "/") return "page";
  if (path == "/metrics") return "metrics";
  if (path == "/slots") return "slots";
  if (path == "/v1/memory") return "memory";
  if (path == "/v1/cluster") return "cluster";
  if (path == "/v1/embeddings") return "embeddings";
  if (path == "/v1/messages") return "messages";
  if (path == "/v1/messages/count_tokens") return "count_tokens";
  if (path.rfind("/v1/responses", 0) == 0) return "responses";
  if (path.rfind("/api/", 0) == 0) return "ollama";
  if (path == "/tokenize" || path == "/detokenize" || path == "/apply-template" || path == "/props") return "utility";
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

}  // namespace

void daemon::handle(const front::request& req, front::response& res) {
  detail::request_start = clock_type::now();
  detail::request_counted = false;
  try {
    // The page is public (it asks for the key and sends it with its API calls); the API is not.
    const std::vector<std::string>& keys = cfg_.server.api_keys;
    const bool open = keys.empty() || req.path == "/health" || (req.path == "/" && req.method == "GET");
    bool ok = open;
    const std::string auth = open ? std::string() : req.header("Authorization");
    // Anthropic's clients send the key as x-api-key.
    const std::string api_key = open ? std::string() : req.header("x-api-key");
    constexpr std::string_view bearer = "Bearer ";
    if (!ok && auth.size() > bearer.size() && std::string_view(auth).substr(0, bearer.size()) == bearer) {
      const std::string_view given = std::string_view(auth).substr(bearer.size());
      for (const std::string& k : keys) ok |= constant_time_equal(given, k);
    }
    if (!ok && !api_key.empty()) {
      for (const std::string& k : keys) ok |= constant_time_equal(api_key, k);
    }
    if (ok) {
      route(req, res);
    } else {
      const api_error e(401, "invalid_request_error",
                        auth.empty() && api_key.empty() ? "missing API key: send 'Authorization: Bearer KEY' or 'x-api-key: KEY'"
                                                        : "invalid API key",
                        {}, "invalid_api_key");
      if (req.path.rfind("/v1/messages", 0) == 0) {
        res.status = e.status();
        res.set_content(dump(messages_error(e)), "application/json");
      } else {
        send_error(res, e);
      }
    }
  } catch (const std::exception& e) {
    TROUPE_LOG(error, "http: " << req.method << " " << req.path << ": " << e.what());
    res = front::response{};
    send_error(res, api_error(500, "server_error", e.what()));
  }
  // A response with its body in hand is counted now, before it is written (an answer written by a writer
  // counts itself before its last chunk, write_answer).
  if (!res.writer) count_request(endpoint_of(req.path), res.status);
}

void daemon::route(const front::request& req, front::response& res) {
  const bool get = req.method == "GET" || req.method == "HEAD";
  const bool post = req.method == "POST";
  const std::string& p = req.path;
  if (get && p == "/") {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'");
    res.set_content(std::string(web_page), "text/html; charset=utf-8");
  } else if (get && p == "/health") {
    health(res);
  } else if (get && p == "/v1/models") {
    list_models(res);
  } else if (get && p == "/metrics") {
    actors::memory_breakdown mem;
    std::vector<actors::decoder_stats> sched;
    try {
      mem = eng_.memory();
      sched = eng_.decoding_stats();
    } catch (const std::exception& e) {
      TROUPE_LOG(warn, "metrics: " << e.what());
    }
    res.set_content(metrics_.render(gauges(), mem, sched), "text/plain; version=0.0.4");
  } else if (get && p == "/slots") {
    // GET /slots (like llama-server's): each session sequence of each model, the positions it holds in the KV cache,
    // whether it is answering.
    json out = json::array();
    std::vector<actors::decoder_stats> sched;
    try {
      sched = eng_.decoding_stats();
    } catch (const std::exception& e) {
      TROUPE_LOG(warn, "slots: " << e.what());
    }
    for (const actors::decoder_stats& s : sched) {
      uint32_t n_ctx = 0;
      for (const auto& ms : models_) {
        if (ms->config.name != s.model) continue;
        std::lock_guard l(ms->m);  // (it may unload meanwhile)
        if (ms->model) n_ctx = ms->model->settings.n_ctx_seq;
      }
      for (const actors::slot_status& slot : s.slots) {
        out.push_back({{"id", slot.id},
                       {"model", s.model},
                       {"n_ctx", n_ctx},
                       {"is_processing", slot.is_processing},
                       {"attached", slot.attached},
                       {"n_tokens", slot.n_tokens}});
      }
    }
    res.set_content(out.dump(), "application/json");
  } else if (get && p == "/v1/memory") {
    res.set_content(eng_.memory().json, "application/json");
  } else if (get && p == "/v1/cluster") {
    if (!cluster_status_) {
      send_error(res, api_error(404, "invalid_request_error", "this daemon coordinates no cluster (no [cluster] table)", {},
                                "not_found"));
      return;
    }
    res.set_content(cluster_status_(), "application/json");
  } else if (post && p == "/v1/chat/completions") {
    complete(true, req, res);
  } else if (post && p == "/v1/completions") {
    complete(false, req, res);
  } else if (post && p == "/v1/embeddings") {
    embeddings(req, res);
  } else if (post && p == "/v1/messages") {
    messages(req, res);
  } else if (post && p == "/v1/messages/count_tokens") {
    count_tokens(req, res);
  } else if ((post && (p == "/tokenize" || p == "/detokenize" || p == "/apply-template")) || (get && p == "/props")) {
    utility_route(req, res);
  } else if (p.rfind("/api/", 0) == 0) {
    ollama_route(req, res);
  } else if (post && p == "/v1/responses") {
    responses(req, res);
  } else if ((get || req.method == "DELETE") && p.rfind("/v1/responses/", 0) == 0) {
    stored_response(req, res);
  } else {
    send_error(res, api_error(404, "invalid_request_error", "no route " + req.method + " " + req.path, {}, "not_found"));
  }
}

std::string daemon::front_error(const front::request& req, int status, const std::string& message) {
  metrics_.request_done(endpoint_of(req.path), status, 0);
  if (cfg_.logging.access_log) {
    TROUPE_LOG(info, "http: " << req.remote_addr << " " << (req.method.empty() ? "-" : req.method) << " "
                              << (req.path.empty() ? "-" : req.path) << " " << status << " (" << message << ")");
  }
  return dump(api_error(status, status == 503 ? "unavailable_error" : "invalid_request_error", message).body());
}

void daemon::access_log(const front::request& req, int status, double seconds) {
  if (!cfg_.logging.access_log) return;
  // 499: the client closed the connection before the answer's end (nginx's code).
  TROUPE_LOG(info, "http: " << req.remote_addr << " " << req.method << " " << req.path << " " << status << " "
                            << static_cast<int64_t>(seconds * 1000) << " ms");
}

void daemon::count_request(const std::string& endpoint, int status) {
  if (detail::request_counted) return;
  detail::request_counted = true;
  metrics_.request_done(endpoint, status, std::chrono::duration<double>(clock_type::now() - detail::request_start).count());
}

void daemon::health(front::response& res) const {
  json j;
  json models = json::array();
  size_t ready = 0;
  const std::vector<model_gauges> gs = gauges();
  for (const model_gauges& g : gs) {
    models.push_back({{"name", g.model}, {"ready", g.ready}, {"state", g.state}});
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
}

void daemon::list_models(front::response& res) const {
  json data = json::array();
  const std::vector<model_gauges> gs = gauges();
  for (size_t i = 0; i < models_.size(); ++i) {
    const auto& ms = models_[i];
    // A snapshot under the model's lock: it may load or unload meanwhile.
    std::unique_lock l(ms->m);
    if (ms->at != model_slots::phase::loaded || !ms->model) {
      // A model not loaded now: its state (loading, unloaded: loads on demand, unavailable), and why.
      const std::string& state = gs[i].state;
      const std::string why = !ms->unavailable.empty() ? ms->unavailable : ms->load_error;
      data.push_back({{"id", ms->config.name},
                      {"object", "model"},
                      {"created", ms->created},
                      {"owned_by", "troupe"},
                      {"meta",
                       {{"state", state},
                        {"n_ctx", ms->config.n_ctx},
                        {"parallel", ms->slots},
                        {"load", ms->on_demand ? "on_demand" : "startup"},
                        {"error", why.empty() ? json(nullptr) : json(why)}}}});
      continue;
    }
    data.push_back({{"id", ms->config.name},
                    {"object", "model"},
                    {"created", ms->created},
                    {"owned_by", "troupe"},
                    {"meta",
                     {{"state", "loaded"},
                      {"arch", ms->info.arch},
                      {"n_params", ms->info.n_params},
                      {"n_vocab", ms->info.n_vocab},
                      {"n_ctx_train", ms->info.n_ctx_train},
                      {"n_ctx", ms->model->settings.n_ctx},
                      {"n_ctx_seq", ms->model->settings.n_ctx_seq},
                      {"parallel", ms->slots},
                      {"cache_type_k", ms->model->settings.kv_type},
                      {"cache_type_v", ms->model->settings.kv_type_v.empty() ? ms->model->settings.kv_type
                                                                             : ms->model->settings.kv_type_v},
                      {"flash_attn", ms->model->settings.flash_attn},
                      {"context_shift", ms->model->settings.context_shift},
                      {"prompt_cache_mib", ms->model->settings.prompt_cache_mib},
                      {"chat_template", ms->info.chat_template},
                      {"tool_call_format", std::string(llm::tool_syntax_name(ms->model->chat->tool_format()))},
                      {"reasoning", ms->model->chat->reasoning().empty()
                                        ? json(nullptr)
                                        : json{{"start", ms->model->chat->reasoning().start}, {"end", ms->model->chat->reasoning().end}}},
                      {"weight_bytes", ms->info.weight_bytes},
                      {"load", ms->on_demand ? "on_demand" : "startup"},
                      {"keep_alive_ms", ms->keep_alive_ms}}}});
  }
  res.set_content(dump(json{{"object", "list"}, {"data", data}}), "application/json");
}

}  // namespace troupe::http
