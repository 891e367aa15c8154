#include <httplib.h>

#include <set>
#include <string>

#include "net/http/detail/daemon_internals.h"
#include "net/http/server.h"
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
  if (path == "/v1/memory") return "memory";
  if (path == "/v1/cluster") return "cluster";
  if (path == "/v1/embeddings") return "embeddings";
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

void daemon::routes() {
  middleware();
  httplib::Server& s = *svr_;
  s.Get("/", [](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-cache");
    res.set_header("Content-Security-Policy", "default-src 'self'; script-src 'unsafe-inline'; style-src 'unsafe-inline'");
    res.set_content(web_page.data(), web_page.size(), "text/html; charset=utf-8");
  });
  s.Get("/health", [this](const httplib::Request&, httplib::Response& res) { health(res); });
  s.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) { list_models(res); });
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
  s.Get("/v1/cluster", [this](const httplib::Request&, httplib::Response& res) {
    if (!cluster_status_) {
      send_error(res, api_error(404, "invalid_request_error", "this daemon coordinates no cluster (no [cluster] table)", {},
                                "not_found"));
      return;
    }
    res.set_content(cluster_status_(), "application/json");
  });
  s.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(true, req, res); });
  s.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) { complete(false, req, res); });
  s.Post("/v1/embeddings", [this](const httplib::Request& req, httplib::Response& res) { embeddings(req, res); });
}

void daemon::middleware() {
  httplib::Server& s = *svr_;
  const std::vector<std::string>& keys = cfg_.server.api_keys;

  s.set_pre_routing_handler([this, &keys](const httplib::Request& req, httplib::Response& res) {
    detail::request_start = clock_type::now();
    detail::client_gone = false;
    detail::request_counted = false;
    // The page is public (it asks for the key and sends it with its API calls); the API is not.
    const bool open = keys.empty() || req.path == "/health" || (req.path == "/" && req.method == "GET");
    if (open) return httplib::Server::HandlerResponse::Unhandled;
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

  // Before the response is written: a response with its body in hand is counted now (an answer written by
  // a content provider counts itself before its last chunk, write_answer).
  s.set_post_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (!res.is_chunked_content_provider_) count_request(endpoint_of(req.path), res.status);
  });

  s.set_logger([this](const httplib::Request& req, const httplib::Response& res) {
    const double secs = std::chrono::duration<double>(clock_type::now() - detail::request_start).count();
    const int status = detail::client_gone ? 499 : res.status;  // 499: the client closed the connection (nginx)
    count_request(endpoint_of(req.path), status);  // a no-op unless nothing counted it yet (a client gone)
    detail::request_counted = false;
    if (cfg_.logging.access_log) {
      TROUPE_LOG(info, "http: " << req.remote_addr << " " << req.method << " " << req.path << " " << status << " "
                                << static_cast<int64_t>(secs * 1000) << " ms");
    }
  });
}

void daemon::count_request(const std::string& endpoint, int status) {
  if (detail::request_counted) return;
  detail::request_counted = true;
  metrics_.request_done(endpoint, status, std::chrono::duration<double>(clock_type::now() - detail::request_start).count());
}

void daemon::health(httplib::Response& res) const {
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
}

void daemon::list_models(httplib::Response& res) const {
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
}

}  // namespace troupe::http
