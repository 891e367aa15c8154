#include "net/http/openai.h"

#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <random>

namespace troupe::http {

json api_error::body() const {
  json e = {{"message", what()}, {"type", type_}};
  e["param"] = param_.empty() ? json(nullptr) : json(param_);
  e["code"] = code_.empty() ? json(nullptr) : json(code_);
  return json{{"error", e}};
}

api_error bad_request(std::string message, std::string param) {
  return api_error(400, "invalid_request_error", std::move(message), std::move(param));
}

namespace {

const char* type_name(const json& v) {
  switch (v.type()) {
    case json::value_t::null: return "null";
    case json::value_t::boolean: return "a boolean";
    case json::value_t::string: return "a string";
    case json::value_t::array: return "an array";
    case json::value_t::object: return "an object";
    default: return "a number";
  }
}

// The field's number, or an error naming it. `integer` refuses fractions.
double number(const json& body, const char* key, bool integer = false) {
  const json& v = body.at(key);
  if (!v.is_number()) throw bad_request(std::string("'") + key + "' must be a number, not " + type_name(v), key);
  const double d = v.get<double>();
  if (!std::isfinite(d)) throw bad_request(std::string("'") + key + "' must be finite", key);
  if (integer && d != std::floor(d)) throw bad_request(std::string("'") + key + "' must be an integer", key);
  return d;
}

std::string num(double v) {
  char b[32];
  std::snprintf(b, sizeof b, "%.9g", v);
  return b;
}

double in_range(const json& body, const char* key, double lo, double hi, bool integer = false) {
  const double d = number(body, key, integer);
  if (d < lo || d > hi) {
    throw bad_request(std::string("'") + key + "' must be from " + num(lo) + " to " + num(hi) + ", not " + num(d), key);
  }
  return d;
}

bool present(const json& body, const char* key) {
  const auto it = body.find(key);
  return it != body.end() && !it->is_null();
}

bool boolean(const json& body, const char* key) {
  const json& v = body.at(key);
  if (!v.is_boolean()) throw bad_request(std::string("'") + key + "' must be true or false, not " + type_name(v), key);
  return v.get<bool>();
}

// Chat message content: a string, or an array of {"type": "text", "text": ...} parts.
std::string content_text(const json& c, const std::string& param) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_null()) return {};
  if (!c.is_array()) throw bad_request("'" + param + "' must be a string or an array of text parts", param);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const json& part = c[i];
    const std::string p = param + "[" + std::to_string(i) + "]";
    if (!part.is_object() || !part.contains("type") || !part["type"].is_string()) {
      throw bad_request("'" + p + "' must be an object with a 'type'", p);
    }
    if (part["type"] != "text") {
      throw bad_request("'" + p + ".type' '" + part["type"].get<std::string>() + "' is not supported (text only)", p + ".type");
    }
    if (!part.contains("text") || !part["text"].is_string()) throw bad_request("'" + p + ".text' must be a string", p + ".text");
    out += part["text"].get<std::string>();
  }
  return out;
}

}  // namespace

completion_request parse_completion_request(std::string_view text, bool chat) {
  json body;
  try {
    body = json::parse(text);
  } catch (const json::parse_error& e) {
    throw bad_request(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw bad_request(std::string("the body must be a JSON object, not ") + type_name(body));
  completion_request r;
  r.chat = chat;
  if (!present(body, "model") || !body["model"].is_string() || body["model"].get<std::string>().empty()) {
    throw bad_request("'model' is required and must be a non-empty string", "model");
  }
  r.model = body["model"].get<std::string>();

  if (chat) {
    if (!present(body, "messages") || !body["messages"].is_array()) {
      throw bad_request("'messages' is required and must be an array", "messages");
    }
    const json& msgs = body["messages"];
    if (msgs.empty()) throw bad_request("'messages' must hold at least one message", "messages");
    for (size_t i = 0; i < msgs.size(); ++i) {
      const json& m = msgs[i];
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) throw bad_request("'" + p + "' must be an object", p);
      if (!m.contains("role") || !m["role"].is_string()) throw bad_request("'" + p + ".role' must be a string", p + ".role");
      const std::string role = m["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant" && role != "developer" && role != "tool") {
        throw bad_request("'" + p + ".role' must be system, user, assistant, developer or tool, not '" + role + "'", p + ".role");
      }
      if (!m.contains("content")) throw bad_request("'" + p + ".content' is required", p + ".content");
      r.messages.push_back({role == "developer" ? "system" : role, content_text(m["content"], p + ".content")});
    }
  } else {
    if (!present(body, "prompt")) throw bad_request("'prompt' is required", "prompt");
    const json& p = body["prompt"];
    // A string, an array of one string, an array of token ids, or an array of one array of token ids.
    const auto token_ids = [&](const json& a) {
      if (a.empty()) throw bad_request("'prompt' must not be empty", "prompt");
      for (size_t i = 0; i < a.size(); ++i) {
        const json& t = a[i];
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
          throw bad_request("'prompt[" + std::to_string(i) + "]' must be a token id (an integer >= 0)", "prompt");
        }
        r.prompt_ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
    };
    if (p.is_string()) {
      r.prompt = p.get<std::string>();
    } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
      r.prompt = p[0].get<std::string>();
    } else if (p.is_array() && !p.empty() && p[0].is_number()) {
      token_ids(p);
    } else if (p.is_array() && p.size() == 1 && p[0].is_array()) {
      token_ids(p[0]);
    } else {
      throw bad_request("'prompt' must be a string, an array of token ids, or an array of one of them (one prompt per request)",
                        "prompt");
    }
    if (r.prompt.empty() && r.prompt_ids.empty()) throw bad_request("'prompt' must not be empty", "prompt");
  }

  actors::generation_params& g = r.params;
  g.max_tokens = INT32_MAX;  // until the model stops or the session's context is full
  for (const char* key : {"max_tokens", "max_completion_tokens", "n_predict"}) {
    if (present(body, key)) {
      g.max_tokens = static_cast<int32_t>(in_range(body, key, 1, INT32_MAX, true));
      r.max_tokens_given = true;
    }
  }
  if (present(body, "temperature")) g.temperature = static_cast<float>(in_range(body, "temperature", 0, 100));
  if (present(body, "top_p")) g.top_p = static_cast<float>(in_range(body, "top_p", 0, 1));
  if (g.top_p == 0.0f) g.top_p = 1e-6f;  // OpenAI allows 0: keep only the most likely token
  if (present(body, "top_k")) g.top_k = static_cast<int32_t>(in_range(body, "top_k", 0, 1 << 20, true));
  if (present(body, "min_p")) g.min_p = static_cast<float>(in_range(body, "min_p", 0, 1));
  if (present(body, "presence_penalty")) g.presence_penalty = static_cast<float>(in_range(body, "presence_penalty", -2, 2));
  if (present(body, "frequency_penalty")) g.frequency_penalty = static_cast<float>(in_range(body, "frequency_penalty", -2, 2));
  if (present(body, "repeat_penalty")) g.repeat_penalty = static_cast<float>(in_range(body, "repeat_penalty", 0.01, 100));
  if (present(body, "seed")) {
    // OpenAI's seed is any 64-bit integer; the sampler takes 32 bits of it.
    const double s = number(body, "seed", true);
    g.seed = static_cast<uint32_t>(static_cast<uint64_t>(static_cast<int64_t>(s)));
  } else {
    static thread_local std::mt19937 rng{std::random_device{}()};
    g.seed = rng();
  }
  if (present(body, "stop")) {
    const json& s = body["stop"];
    if (s.is_string()) {
      g.stop.push_back(s.get<std::string>());
    } else if (s.is_array()) {
      if (s.size() > 16) throw bad_request("'stop' may hold at most 16 strings", "stop");
      for (const json& e : s) {
        if (!e.is_string()) throw bad_request("'stop' must be a string or an array of strings", "stop");
        g.stop.push_back(e.get<std::string>());
      }
    } else {
      throw bad_request("'stop' must be a string or an array of strings", "stop");
    }
    for (const std::string& st : g.stop) {
      if (st.empty()) throw bad_request("'stop' strings must not be empty", "stop");
    }
  }
  if (present(body, "logit_bias") && !body["logit_bias"].is_null()) {
    // {"token id": bias}: ids as decimal strings (JSON keys), biases in [-100, 100]; -100 bans the token.
    const json& lb = body["logit_bias"];
    if (!lb.is_object()) throw bad_request("'logit_bias' must be an object mapping token ids to biases", "logit_bias");
    if (lb.size() > 1024) throw bad_request("'logit_bias' may hold at most 1024 tokens", "logit_bias");
    for (const auto& [key, value] : lb.items()) {
      const std::string field = "logit_bias." + key;
      int64_t id = -1;
      const auto [end, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
      if (ec != std::errc() || end != key.data() + key.size() || id < 0 || id > INT32_MAX) {
        throw bad_request("'logit_bias' keys must be token ids (decimal integers >= 0), got '" + key + "'", "logit_bias");
      }
      if (!value.is_number()) throw bad_request("'" + field + "' must be a number", field);
      const double b = value.get<double>();
      if (!(b >= -100 && b <= 100)) throw bad_request("'" + field + "' must be in [-100, 100]", field);
      g.logit_bias.push_back({static_cast<int32_t>(id), static_cast<float>(b)});
    }
  }
  if (present(body, "n") && in_range(body, "n", 1, 1, true) != 1) throw bad_request("'n' must be 1", "n");
  if (present(body, "stream")) r.stream = boolean(body, "stream");
  if (present(body, "stream_options")) {
    const json& so = body["stream_options"];
    if (!so.is_object()) throw bad_request("'stream_options' must be an object", "stream_options");
    if (present(so, "include_usage")) {
      if (!so["include_usage"].is_boolean()) {
        throw bad_request("'stream_options.include_usage' must be true or false", "stream_options.include_usage");
      }
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  if (present(body, "return_tokens")) r.return_tokens = boolean(body, "return_tokens");
  // Log-probabilities: chat takes logprobs (true / false) and top_logprobs (0..20); completions the legacy
  // logprobs: N (0..20), the N most likely tokens at each position besides the sampled one.
  constexpr int max_lp = llm::generate_params::max_logprobs;
  if (chat) {
    const bool on = present(body, "logprobs") && boolean(body, "logprobs");
    if (present(body, "top_logprobs")) {
      const int n = static_cast<int>(in_range(body, "top_logprobs", 0, max_lp, true));
      if (!on) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
      g.logprobs = n;
    } else if (on) {
      g.logprobs = 0;
    }
  } else if (present(body, "logprobs")) {
    g.logprobs = static_cast<int32_t>(in_range(body, "logprobs", 0, max_lp, true));
  }
  // Constrained output is not there yet: refused rather than silently ignored (a client asking for JSON
  // would otherwise get prose).
  if (present(body, "response_format")) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      throw bad_request("'response_format' must be an object with a string 'type'", "response_format");
    }
    const std::string type = rf["type"].get<std::string>();
    if (type != "text") {
      throw bad_request("'response_format' type '" + type + "' is not supported yet (only 'text')", "response_format");
    }
  }
  if (present(body, "grammar")) throw bad_request("'grammar' is not supported yet", "grammar");
  if (present(body, "tools") && body["tools"].is_array() && !body["tools"].empty()) {
    throw bad_request("'tools' is not supported", "tools");
  }
  return r;
}

std::string finish_reason(const std::string& finish) { return finish == "stop" ? "stop" : "length"; }

namespace {

json envelope(const completion_request& r, const std::string& id, int64_t created, bool chunk) {
  return json{{"id", id},
              {"object", r.chat ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion"},
              {"created", created},
              {"model", r.model},
              {"system_fingerprint", "troupe"}};
}

json utf8_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

// choices[].logprobs: chat's {"content": [{token, logprob, bytes, top_logprobs}]}, or the completions' legacy
// {tokens, token_logprobs, top_logprobs, text_offset}; null when not asked for.
json logprobs_json(const completion_request& r, const std::vector<llm::token_logprob>& logprobs, size_t offset = 0) {
  if (r.params.logprobs < 0) return nullptr;
  if (r.chat) {
    json content = json::array();
    for (const llm::token_logprob& t : logprobs) {
      json top = json::array();
      for (const llm::token_prob& c : t.top) {
        top.push_back({{"token", c.text}, {"logprob", c.logprob}, {"bytes", utf8_bytes(c.text)}});
      }
      content.push_back({{"token", t.text}, {"logprob", t.logprob}, {"bytes", utf8_bytes(t.text)}, {"top_logprobs", top}});
    }
    return {{"content", content}, {"refusal", nullptr}};
  }
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const llm::token_logprob& t : logprobs) {
    tokens.push_back(t.text);
    lps.push_back(t.logprob);
    json top = json::object();
    for (const llm::token_prob& c : t.top) top[c.text] = c.logprob;
    tops.push_back(top);
    offsets.push_back(offset);
    offset += t.text.size();
  }
  return {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}, {"text_offset", offsets}};
}

json usage(const actors::generate_reply& reply) {
  const int64_t completion = static_cast<int64_t>(reply.tokens.size());
  return json{{"prompt_tokens", reply.n_prompt},
              {"completion_tokens", completion},
              {"total_tokens", reply.n_prompt + completion},
              {"prompt_tokens_details", {{"cached_tokens", reply.n_prompt - reply.n_prompt_decoded}}}};
}

}  // namespace

json completion_response(const completion_request& r, const std::string& id, int64_t created,
                         const actors::generate_reply& reply) {
  json j = envelope(r, id, created, false);
  json choice = {{"index", 0}, {"finish_reason", finish_reason(reply.finish)}, {"logprobs", logprobs_json(r, reply.logprobs)}};
  if (r.chat) {
    choice["message"] = {{"role", "assistant"}, {"content", reply.text}};
  } else {
    choice["text"] = reply.text;
  }
  if (r.return_tokens) choice["tokens"] = reply.tokens;
  j["choices"] = json::array({choice});
  j["usage"] = usage(reply);
  j["timings"] = {{"prompt_seconds", reply.prompt_seconds},
                  {"generation_seconds", reply.gen_seconds},
                  {"prompt_tokens_decoded", reply.n_prompt_decoded}};
  return j;
}

json stream_chunk(const completion_request& r, const std::string& id, int64_t created, std::string_view piece, bool first,
                  const std::vector<llm::token_logprob>* logprobs, size_t text_offset) {
  json j = envelope(r, id, created, true);
  json choice = {{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
  if (logprobs != nullptr) choice["logprobs"] = logprobs_json(r, *logprobs, text_offset);
  if (r.chat) {
    json delta = {{"content", std::string(piece)}};
    if (first) delta["role"] = "assistant";
    choice["delta"] = delta;
  } else {
    choice["text"] = std::string(piece);
  }
  j["choices"] = json::array({choice});
  return j;
}

json stream_finish(const completion_request& r, const std::string& id, int64_t created, const std::string& finish) {
  json j = envelope(r, id, created, true);
  json choice = {{"index", 0}, {"finish_reason", finish_reason(finish)}, {"logprobs", nullptr}};
  if (r.chat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  j["choices"] = json::array({choice});
  return j;
}

json stream_usage(const completion_request& r, const std::string& id, int64_t created, const actors::generate_reply& reply) {
  json j = envelope(r, id, created, true);
  j["choices"] = json::array();
  j["usage"] = usage(reply);
  return j;
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

}  // namespace troupe::http
