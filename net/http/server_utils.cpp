// llama-server's utility endpoints on the daemon: POST /tokenize (with_pieces), /detokenize, /apply-template
// and GET /props, for the tools written against llama-server. A request may name its model ("model");
// otherwise the first one of the table answers.
#include "llm/unicode.h"
#include "net/http/daemon.h"
#include "net/http/detail/daemon_internals.h"
#include "net/http/session_pool.h"

namespace troupe::http {

namespace {

json body_of(const front::request& req) {
  if (llm::json_nesting(req.body) > 64) throw bad_request("the body nests arrays and objects deeper than 64 levels");
  json j;
  try {
    j = json::parse(req.body.empty() ? std::string("{}") : req.body);
  } catch (const json::exception& e) {
    throw bad_request(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) throw bad_request("the body must be a JSON object");
  return j;
}

bool flag(const json& body, const char* key, bool fallback) {
  if (!body.contains(key) || body[key].is_null()) return fallback;
  if (!body[key].is_boolean()) throw bad_request(std::string("'") + key + "' must be true or false", key);
  return body[key].get<bool>();
}

}  // namespace

void daemon::utility_route(const front::request& req, front::response& res) {
  try {
    const json body = req.method == "POST" ? body_of(req) : json::object();
    std::string name = body.contains("model") && body["model"].is_string() ? body["model"].get<std::string>() : "";
    if (name.empty()) {
      if (models_.empty()) throw api_error(404, "invalid_request_error", "this daemon serves no model", "model", "model_not_found");
      name = models_.front()->config.name;
    }
    const model_use use = use_model(name);
    model_slots& ms = use.slots();
    const std::shared_ptr<const actors::loaded_model> held = use.model();
    const actors::loaded_model& lm = *held;
    const llm::vocab& v = *lm.vocab;
    const std::string& p = req.path;
    if (p == "/tokenize") {
      if (!body.contains("content") || !body["content"].is_string()) throw bad_request("'content' must be a string", "content");
      const std::string content = body["content"].get<std::string>();
      const bool special = flag(body, "parse_special", true);
      const std::vector<llm::token_id> ids = v.tokenize(content, flag(body, "add_special", false), special);
      json tokens = json::array();
      if (flag(body, "with_pieces", false)) {
        for (const llm::token_id id : ids) {
          // A piece that is not whole UTF-8 (a byte token) is given as its bytes, as llama-server does.
          const std::string piece = v.token_to_piece(id, true);
          json bytes = json::array();
          for (const unsigned char c : piece) bytes.push_back(static_cast<int>(c));
          tokens.push_back({{"id", id}, {"piece", llm::utf8_valid(piece) ? json(piece) : bytes}});
        }
      } else {
        tokens = ids;
      }
      res.set_content(dump(json{{"tokens", tokens}}), "application/json");
    } else if (p == "/detokenize") {
      if (!body.contains("tokens") || !body["tokens"].is_array()) throw bad_request("'tokens' must be an array of token ids", "tokens");
      std::string text;
      for (const json& t : body["tokens"]) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= v.n_tokens()) {
          throw bad_request("'tokens' must hold token ids of the vocabulary (0.." + std::to_string(v.n_tokens() - 1) + ")", "tokens");
        }
        text += v.token_to_piece(static_cast<llm::token_id>(t.get<int64_t>()), true);  // control tokens as their text, as llama-server
      }
      res.set_content(dump(json{{"content", text}}), "application/json");
    } else if (p == "/apply-template") {
      json chat = body;
      chat["model"] = name;
      completion_request r = parse_completion_request(chat.dump(), true);
      prepare_chat(r, *lm.chat);
      res.set_content(dump(json{{"prompt", r.prompt}}), "application/json");
    } else {  // GET /props
      const llm::chat_prompt& chat = *lm.chat;
      res.set_content(dump(json{{"model_path", ms.config.path},
                                {"model_alias", ms.config.name},
                                {"total_slots", ms.slots},
                                {"default_generation_settings", {{"n_ctx", lm.settings.n_ctx_seq}, {"model", ms.config.name}}},
                                {"chat_template", chat.source().jinja},
                                {"chat_template_family", chat.name()},
                                {"bos_token", chat.source().bos_token},
                                {"eos_token", chat.source().eos_token},
                                {"modalities", {{"vision", false}, {"audio", false}}},
                                {"build_info", "troupe"}}),
                      "application/json");
    }
  } catch (const api_error& e) {
    detail::send_error(res, e);
  }
}

}  // namespace troupe::http
