// Ollama's routes on the daemon (net/http/ollama.h): the answers go through ollama_answer (completion.cpp);
// here the embeddings and the model listings, from the daemon's model table.
#include <algorithm>
#include <filesystem>
#include <cstdio>
#include <ctime>

#include "net/http/daemon.h"
#include "net/http/detail/daemon_internals.h"
#include "net/http/ollama.h"
#include "net/http/session_pool.h"

namespace troupe::http {

namespace {

// The version of ollama's API this daemon speaks (clients check it for features).
constexpr const char* ollama_api_version = "0.12.0";

std::string iso_time(int64_t unix_seconds) {
  return ollama_time(std::chrono::system_clock::time_point(std::chrono::seconds(unix_seconds)));
}

// ollama's "135M", "1.2B".
std::string parameter_size(uint64_t n) {
  char buf[32];
  if (n >= 1'000'000'000) {
    std::snprintf(buf, sizeof buf, "%.1fB", static_cast<double>(n) / 1e9);
  } else {
    std::snprintf(buf, sizeof buf, "%.0fM", static_cast<double>(n) / 1e6);
  }
  return buf;
}

json details(const actors::model_info& info) {
  return {{"parent_model", ""},
          {"format", "gguf"},
          {"family", info.arch},
          {"families", json::array({info.arch})},
          {"parameter_size", parameter_size(info.n_params)},
          {"quantization_level", ""}};
}

}  // namespace

void daemon::ollama_route(const front::request& req, front::response& res) {
  const std::string& p = req.path;
  const bool post = req.method == "POST";
  const bool get = req.method == "GET" || req.method == "HEAD";
  const auto fail = [&](const api_error& e) {
    res.status = e.status();
    res.set_content(dump(ollama_error(e)), "application/json");
  };
  try {
    if (post && (p == "/api/chat" || p == "/api/generate")) {
      ollama_answer(p == "/api/generate", req, res);
    } else if (post && (p == "/api/embed" || p == "/api/embeddings")) {
      const auto t0 = detail::clock_type::now();
      const embedding_request r = parse_ollama_embed(req.body);
      const json out = embed(r);
      json vectors = json::array();
      for (const json& d : out["data"]) vectors.push_back(d["embedding"]);
      if (p == "/api/embeddings") {  // the older route: one vector
        res.set_content(dump(json{{"embedding", vectors.empty() ? json::array() : vectors[0]}}), "application/json");
        return;
      }
      const int64_t ns = std::chrono::duration_cast<std::chrono::nanoseconds>(detail::clock_type::now() - t0).count();
      res.set_content(dump(json{{"model", r.model},
                                {"embeddings", vectors},
                                {"total_duration", ns},
                                {"load_duration", 0},
                                {"prompt_eval_count", out["usage"]["prompt_tokens"]}}),
                      "application/json");
    } else if (get && (p == "/api/tags" || p == "/api/ps")) {
      // tags: every model the table serves, by name and alias; ps: those loaded.
      json models = json::array();
      for (const auto& ms : models_) {
        // A snapshot under the model's lock (it may load or unload meanwhile).
        bool loaded = false;
        actors::model_info info;
        int64_t created = 0;
        uint32_t n_ctx = ms->config.n_ctx;
        std::chrono::steady_clock::time_point expires;
        {
          std::lock_guard l(ms->m);
          loaded = ms->at == model_slots::phase::loaded && ms->model;
          if (loaded) {
            info = ms->info;
            created = ms->created;
            n_ctx = ms->model->settings.n_ctx;
            expires = ms->users > 0 ? std::chrono::steady_clock::now() + std::chrono::milliseconds(std::max<int64_t>(ms->keep_alive_ms, 0))
                                    : ms->expires;
            if (ms->keep_alive_ms < 0) expires = std::chrono::steady_clock::time_point::max();
          }
        }
        if (p == "/api/ps" && !loaded) continue;
        std::vector<std::string> names = {ms->config.name};
        names.insert(names.end(), ms->config.aliases.begin(), ms->config.aliases.end());
        std::error_code ec;
        const uint64_t file_bytes = std::filesystem::file_size(ms->config.path, ec);
        for (const std::string& n : names) {
          const std::string tagged = n.find(':') == std::string::npos ? n + ":latest" : n;
          json m = {{"name", tagged}, {"model", tagged}, {"size", loaded ? info.weight_bytes : (ec ? 0 : file_bytes)}, {"digest", ""}, {"details", details(info)}};
          if (p == "/api/tags") {
            m["modified_at"] = iso_time(loaded ? created : detail::unix_now());
          } else {
            // When it unloads: its keep_alive after the last use (a model kept for ever: far ahead, as ollama says it).
            m["expires_at"] = expires == std::chrono::steady_clock::time_point::max()
                                  ? std::string("2318-01-01T00:00:00Z")
                                  : iso_time(detail::unix_now() + std::chrono::duration_cast<std::chrono::seconds>(expires - std::chrono::steady_clock::now()).count());
            m["size_vram"] = 0;
            m["context_length"] = n_ctx;
          }
          models.push_back(std::move(m));
          if (p == "/api/ps") break;  // one entry per loaded model
        }
      }
      res.set_content(dump(json{{"models", models}}), "application/json");
    } else if (post && p == "/api/show") {
      json body;
      try {
        body = json::parse(req.body);
      } catch (const json::exception& e) {
        throw bad_request(std::string("the body is not valid JSON: ") + e.what());
      }
      const std::string name = body.is_object() && body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>()
                               : body.is_object() && body.contains("name") && body["name"].is_string() ? body["name"].get<std::string>()
                                                                                                      : "";
      if (name.empty()) throw bad_request("'model' is required", "model");
      const model_use use = use_model(name);
      model_slots& ms = use.slots();
      const std::shared_ptr<const actors::loaded_model>& lm = use.model();
      const llm::chat_prompt& chat = *lm->chat;
      json caps = json::array({"completion"});
      if (chat.tool_format() != llm::tool_syntax::generic || chat.template_renders_tools()) caps.push_back("tools");
      if (!chat.reasoning().empty()) caps.push_back("thinking");
      const std::string& arch = ms.info.arch;
      res.set_content(dump(json{{"modelfile", "# troupe serves " + ms.config.path + "\nFROM " + ms.config.path + "\n"},
                                {"parameters", ""},
                                {"template", chat.source().jinja},
                                {"details", details(ms.info)},
                                {"model_info",
                                 {{"general.architecture", arch},
                                  {"general.parameter_count", ms.info.n_params},
                                  {arch + ".context_length", ms.info.n_ctx_train},
                                  {arch + ".block_count", ms.info.n_layer}}},
                                {"capabilities", caps},
                                {"modified_at", iso_time(ms.created)}}),
                      "application/json");
    } else if (get && p == "/api/version") {
      res.set_content(dump(json{{"version", ollama_api_version}}), "application/json");
    } else if (p == "/api/pull" || p == "/api/push" || p == "/api/create" || p == "/api/delete" || p == "/api/copy" ||
               p.rfind("/api/blobs/", 0) == 0) {
      fail(api_error(501, "invalid_request_error",
                     "troupe serves the GGUF files its configuration names and does not download or build models: add a [[model]] "
                     "table with the file's path (and aliases = [\"name:tag\"] for ollama's names) and restart the daemon"));
    } else {
      fail(api_error(404, "invalid_request_error", "no route " + req.method + " " + p));
    }
  } catch (const api_error& e) {
    fail(e);
  }
}

}  // namespace troupe::http
