// The OpenAI-format requests (net/http/openai.h): the bodies of /v1/chat/completions, /v1/completions and
// /v1/embeddings parsed and checked field by field, the errors in OpenAI's shape, and the tools rendered into
// a chat for the model's template. The JSON of the answers is made in openai_response.cpp.
#include "net/http/openai.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdio>
#include <random>

#include "llm/grammar.h"

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

// Values nested deeper than any request needs are refused before parsing: copying and printing JSON
// values recurses.
void refuse_deep(std::string_view text) {
  constexpr int max_depth = 64;
  if (llm::json_nesting(text) > max_depth) {
    throw bad_request("the body nests arrays and objects deeper than " + std::to_string(max_depth) + " levels");
  }
}

// A field of the body in its own key order (templates print JSON as the client wrote it); a body with
// duplicate keys may read differently that way: then as checked.
nlohmann::ordered_json ordered_field(std::string_view text, const json& body, const char* key) {
  try {
    nlohmann::ordered_json v = nlohmann::ordered_json::parse(text).at(key);
    if (v.type() == body.at(key).type() && v.size() == body.at(key).size()) return v;
  } catch (const nlohmann::ordered_json::exception&) {
  }
  return nlohmann::ordered_json::parse(body.at(key).dump());
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
  refuse_deep(text);
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double
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
      std::vector<llm::tool_call> calls;
      if (role == "assistant" && m.contains("tool_calls") && !m["tool_calls"].is_null()) {
        const json& tc = m["tool_calls"];
        if (!tc.is_array()) throw bad_request("'" + p + ".tool_calls' must be an array", p + ".tool_calls");
        for (size_t k = 0; k < tc.size(); ++k) {
          const std::string q = p + ".tool_calls[" + std::to_string(k) + "]";
          const json& c = tc[k];
          if (!c.is_object() || !c.contains("function") || !c["function"].is_object() || !c["function"].contains("name") ||
              !c["function"]["name"].is_string()) {
            throw bad_request("'" + q + "' must be {\"type\": \"function\", \"function\": {\"name\", \"arguments\"}}", q);
          }
          llm::tool_call call;
          call.id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "";
          call.name = c["function"]["name"].get<std::string>();
          const json& a = c["function"].contains("arguments") ? c["function"]["arguments"] : json("{}");
          call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
          calls.push_back(std::move(call));
        }
      }
      if (!m.contains("content") && calls.empty()) throw bad_request("'" + p + ".content' is required", p + ".content");
      if (role == "tool" && (!m.contains("content") || m["content"].is_null())) {
        throw bad_request("'" + p + ".content' is required for a tool message", p + ".content");
      }
      r.messages.push_back({role == "developer" ? "system" : role,
                            m.contains("content") ? content_text(m["content"], p + ".content") : std::string()});
      r.message_calls.push_back(std::move(calls));
      if (m.contains("reasoning_content") && !m["reasoning_content"].is_null() && !m["reasoning_content"].is_string()) {
        throw bad_request("'" + p + ".reasoning_content' must be a string", p + ".reasoning_content");
      }
    }
    // The messages again in their own key order for the template (tool call arguments, tojson).
    r.template_messages = ordered_field(text, body, "messages");
    if (present(body, "chat_template_kwargs")) {
      if (!body["chat_template_kwargs"].is_object()) {
        throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
      }
      r.template_kwargs = ordered_field(text, body, "chat_template_kwargs");
    }
    if (present(body, "reasoning_format")) {
      const json& f = body["reasoning_format"];
      if (!f.is_string() || (f != "none" && f != "auto" && f != "deepseek")) {
        throw bad_request("'reasoning_format' must be 'none', 'auto' or 'deepseek'", "reasoning_format");
      }
      r.reasoning_format = f.get<std::string>();
    }
    if (present(body, "reasoning_budget")) {
      r.reasoning_budget = static_cast<int32_t>(in_range(body, "reasoning_budget", -1, INT32_MAX, true));
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
  // llama-server's n_keep: prompt tokens a context shift keeps (-1: all); used where the model has context_shift.
  if (present(body, "n_keep")) g.n_keep = static_cast<int32_t>(in_range(body, "n_keep", -1, INT32_MAX, true));
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
  if (present(body, "n") && !body["n"].is_null()) r.n = static_cast<int32_t>(in_range(body, "n", 1, 16, true));
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
  // Constrained output: response_format json_object / json_schema, or a GBNF grammar (llama-server's
  // extension), compiled here so a bad one is a 400 naming the field before anything is generated.
  if (present(body, "response_format") && !body["response_format"].is_null()) {
    const json& rf = body["response_format"];
    if (!rf.is_object() || !rf.contains("type") || !rf["type"].is_string()) {
      throw bad_request("'response_format' must be an object with a string 'type'", "response_format");
    }
    const std::string type = rf["type"].get<std::string>();
    if (type == "json_object") {
      g.grammar = std::string(llm::json_object_gbnf());
    } else if (type == "json_schema") {
      if (!rf.contains("json_schema") || !rf["json_schema"].is_object()) {
        throw bad_request("'response_format.json_schema' must be an object with a 'schema'", "response_format.json_schema");
      }
      const json& js = rf["json_schema"];
      if (!js.contains("schema")) {
        throw bad_request("'response_format.json_schema.schema' is missing", "response_format.json_schema.schema");
      }
      // The schema again in its own key order (properties are generated in the order the schema lists them).
      std::string schema = js["schema"].dump();
      const nlohmann::ordered_json ordered = ordered_field(text, body, "response_format");
      if (ordered.contains("json_schema") && ordered["json_schema"].contains("schema")) schema = ordered["json_schema"]["schema"].dump();
      try {
        g.grammar = llm::json_schema_to_gbnf(schema);
      } catch (const llm::grammar_error& e) {
        throw bad_request(e.what(), "response_format.json_schema.schema");
      }
    } else if (type != "text") {
      throw bad_request("'response_format' type must be 'text', 'json_object' or 'json_schema', got '" + type + "'",
                        "response_format");
    }
  }
  if (present(body, "grammar") && !body["grammar"].is_null()) {
    if (!body["grammar"].is_string()) throw bad_request("'grammar' must be a string (GBNF)", "grammar");
    if (!g.grammar.empty()) throw bad_request("'grammar' and 'response_format' cannot be used together", "grammar");
    g.grammar = body["grammar"].get<std::string>();
  }
  if (!g.grammar.empty()) {
    try {
      (void)llm::grammar::parse(g.grammar);
    } catch (const llm::grammar_error& e) {
      throw bad_request(e.what(), present(body, "grammar") ? "grammar" : "response_format");
    }
  }
  if (present(body, "tools") && !body["tools"].is_null()) {
    if (!chat) throw bad_request("'tools' is for /v1/chat/completions", "tools");
    const json& tools = body["tools"];
    if (!tools.is_array()) throw bad_request("'tools' must be an array", "tools");
    if (tools.size() > 128) throw bad_request("'tools' may hold at most 128 functions", "tools");
    const nlohmann::ordered_json ordered = ordered_field(text, body, "tools");
    for (size_t i = 0; i < tools.size(); ++i) {
      const std::string p = "tools[" + std::to_string(i) + "]";
      const json& t = tools[i];
      if (!t.is_object() || !t.contains("type") || t["type"] != "function" || !t.contains("function") || !t["function"].is_object()) {
        throw bad_request("'" + p + "' must be {\"type\": \"function\", \"function\": {...}}", p);
      }
      const json& f = t["function"];
      if (!f.contains("name") || !f["name"].is_string()) throw bad_request("'" + p + ".function.name' must be a string", p + ".function.name");
      llm::tool_function fn;
      fn.name = f["name"].get<std::string>();
      const bool name_ok = !fn.name.empty() && fn.name.size() <= 64 &&
                           std::all_of(fn.name.begin(), fn.name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-'; });
      if (!name_ok) {
        throw bad_request("'" + p + ".function.name' must be 1 to 64 letters, digits, '_' or '-'", p + ".function.name");
      }
      for (const llm::tool_function& other : r.tools) {
        if (other.name == fn.name) throw bad_request("'" + p + ".function.name' '" + fn.name + "' is given twice", p + ".function.name");
      }
      if (f.contains("description") && f["description"].is_string()) fn.description = f["description"].get<std::string>();
      if (f.contains("parameters") && !f["parameters"].is_null()) {
        if (!f["parameters"].is_object()) throw bad_request("'" + p + ".function.parameters' must be a JSON Schema object", p + ".function.parameters");
        // In the schema's own key order; a body with duplicate keys may read differently that way: then as checked.
        fn.parameters = f["parameters"].dump();
        try {
          const nlohmann::ordered_json& op = ordered.at(i).at("function").at("parameters");
          if (op.is_object()) fn.parameters = op.dump();
        } catch (const nlohmann::ordered_json::exception&) {
        }
      }
      r.tools.push_back(std::move(fn));
    }
    r.template_tools = ordered;
  }
  if (present(body, "tool_choice") && !body["tool_choice"].is_null()) {
    const json& tc = body["tool_choice"];
    if (tc.is_string()) {
      r.tool_choice = tc.get<std::string>();
      if (r.tool_choice != "auto" && r.tool_choice != "none" && r.tool_choice != "required") {
        throw bad_request("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\"}}", "tool_choice");
      }
    } else if (tc.is_object() && tc.contains("function") && tc["function"].is_object() && tc["function"].contains("name") &&
               tc["function"]["name"].is_string()) {
      r.tool_choice = "function";
      r.tool_choice_name = tc["function"]["name"].get<std::string>();
      if (std::none_of(r.tools.begin(), r.tools.end(), [&](const llm::tool_function& f) { return f.name == r.tool_choice_name; })) {
        throw bad_request("'tool_choice' names '" + r.tool_choice_name + "', which is not in 'tools'", "tool_choice");
      }
    } else {
      throw bad_request("'tool_choice' must be 'auto', 'none', 'required' or {\"type\": \"function\", \"function\": {\"name\"}}", "tool_choice");
    }
    if (r.tool_choice != "none" && r.tool_choice != "auto" && r.tools.empty()) {
      throw bad_request("'tool_choice' '" + r.tool_choice + "' needs 'tools'", "tool_choice");
    }
  }
  if (present(body, "parallel_tool_calls")) r.parallel_tool_calls = boolean(body, "parallel_tool_calls");
  if (r.tools_active() && (r.tool_choice == "required" || r.tool_choice == "function") && !g.grammar.empty()) {
    throw bad_request("'tool_choice' '" + r.tool_choice + "' cannot be combined with 'response_format' or 'grammar'", "tool_choice");
  }
  return r;
}

void prepare_chat(completion_request& r, const llm::chat_prompt& p) {
  if (!r.chat) return;
  r.syntax = p.tool_format();
  r.reasoning = p.reasoning();
  nlohmann::ordered_json kwargs = r.template_kwargs;
  // A budget of 0 switches thinking off where the template has the switch (Qwen 3, Granite, ...).
  if (r.reasoning_budget == 0 && !kwargs.contains("enable_thinking")) kwargs["enable_thinking"] = false;
  try {
    r.prompt = p.render(r.template_messages, r.tools_active() ? r.template_tools : nlohmann::ordered_json(nullptr), true, kwargs);
  } catch (const llm::chat_prompt_error& e) {
    throw bad_request(e.what(), "messages");
  }
  r.messages.clear();  // the session tokenizes the rendered chat
  r.reasoning_open = llm::prompt_opens_reasoning(r.reasoning, r.prompt);
  actors::generation_params& g = r.params;
  // The markers the parsers look for print as text where the vocabulary has them as control tokens.
  for (const std::string* m : {&r.reasoning.start, &r.reasoning.end}) {
    if (!m->empty()) g.preserved_tokens.push_back(*m);
  }
  if (r.split_reasoning()) g.preserved_tokens.insert(g.preserved_tokens.end(), r.reasoning.strip.begin(), r.reasoning.strip.end());
  if (r.tools_active()) {
    for (std::string& m : llm::tool_call_markers(r.syntax)) g.preserved_tokens.push_back(std::move(m));
  }
  if (!r.reasoning.empty()) {
    // The block is followed as the answer is generated: a grammar applies after it, a budget ends it.
    g.reasoning_budget = r.reasoning_budget;
    g.reasoning_start = r.reasoning.start;
    g.reasoning_end = r.reasoning.end;
    g.reasoning_open = r.reasoning_open;
  }
  if (!r.tools_active()) return;
  std::vector<llm::tool_function> which;
  for (const llm::tool_function& f : r.tools) {
    if (r.tool_choice != "function" || f.name == r.tool_choice_name) which.push_back(f);
  }
  if (r.tool_choice == "required" || r.tool_choice == "function") {
    try {
      g.grammar = llm::tool_call_gbnf(r.syntax, which, r.tool_choice == "required" && r.parallel_tool_calls);
      (void)llm::grammar::parse(g.grammar);
    } catch (const llm::grammar_error& e) {
      throw bad_request(e.what(), "tools");
    }
    return;
  }
  // tool_choice auto: the text is free; once a call's opening appears, the call follows the tools' schemas.
  // A schema the grammar compiler does not take leaves the answer unconstrained (the call is still parsed).
  if (!g.grammar.empty() || r.syntax == llm::tool_syntax::generic) return;
  try {
    std::string gbnf = llm::tool_call_gbnf(r.syntax, which, r.parallel_tool_calls);
    (void)llm::grammar::parse(gbnf);
    g.grammar = std::move(gbnf);
    g.grammar_triggers = llm::tool_call_triggers(r.syntax);
  } catch (const llm::grammar_error&) {
    g.grammar.clear();
  }
}

nlohmann::ordered_json parse_api_body(std::string_view text) {
  refuse_deep(text);
  nlohmann::ordered_json in;
  try {
    in = nlohmann::ordered_json::parse(text);
  } catch (const nlohmann::ordered_json::exception& e) {
    throw bad_request(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!in.is_object()) throw bad_request("the body must be a JSON object");
  if (!in.contains("model") || !in["model"].is_string()) throw bad_request("'model' is required and must be a string", "model");
  return in;
}

std::string text_field(const nlohmann::ordered_json& o, const char* key) {
  if (!o.is_object()) return {};
  const auto it = o.find(key);
  return it != o.end() && it->is_string() ? it->get<std::string>() : std::string();
}

bool true_field(const nlohmann::ordered_json& o, const char* key) {
  if (!o.is_object()) return false;
  const auto it = o.find(key);
  return it != o.end() && it->is_boolean() && it->get<bool>();
}

embedding_request parse_embedding_request(std::string_view text) {
  json body;
  refuse_deep(text);
  try {
    body = json::parse(text);
  } catch (const json::exception& e) {  // parse_error, and out_of_range for a number beyond double
    throw bad_request(std::string("the body is not valid JSON: ") + e.what());
  }
  if (!body.is_object()) throw bad_request("the body must be a JSON object");
  embedding_request r;
  if (!body.contains("model") || !body["model"].is_string() || body["model"].get<std::string>().empty()) {
    throw bad_request("'model' is required and must be a non-empty string", "model");
  }
  r.model = body["model"].get<std::string>();
  if (present(body, "messages")) {
    if (present(body, "input")) throw bad_request("'input' and 'messages' cannot be used together", "messages");
    const json& msgs = body["messages"];
    if (!msgs.is_array() || msgs.empty()) throw bad_request("'messages' must be a non-empty array of messages", "messages");
    for (size_t i = 0; i < msgs.size(); ++i) {
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (!msgs[i].is_object() || !msgs[i].contains("role") || !msgs[i]["role"].is_string()) {
        throw bad_request("'" + p + "' must be an object with a string 'role'", p);
      }
      (void)content_text(msgs[i].contains("content") ? msgs[i]["content"] : json(""), p + ".content");
    }
    r.messages = ordered_field(text, body, "messages");  // text parts are joined by the template's renderer
  } else if (!body.contains("input")) {
    throw bad_request("'input' is required", "input");
  }
  if (!present(body, "messages")) {
    const json& in = body["input"];
    const auto ids = [&](const json& a, const std::string& where) {
      std::vector<int32_t> out;
      if (a.empty()) throw bad_request("'" + where + "' must not be empty", "input");
      for (const json& t : a) {
        if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
          throw bad_request("'" + where + "' must hold token ids (integers >= 0)", "input");
        }
        out.push_back(static_cast<int32_t>(t.get<int64_t>()));
      }
      return out;
    };
    if (in.is_string()) {
      r.texts.push_back(in.get<std::string>());
    } else if (in.is_array() && !in.empty() && in[0].is_string()) {
      for (size_t i = 0; i < in.size(); ++i) {
        if (!in[i].is_string()) throw bad_request("'input[" + std::to_string(i) + "]' must be a string like the others", "input");
        r.texts.push_back(in[i].get<std::string>());
      }
    } else if (in.is_array() && !in.empty() && in[0].is_number()) {
      r.token_ids.push_back(ids(in, "input"));
    } else if (in.is_array() && !in.empty() && in[0].is_array()) {
      for (size_t i = 0; i < in.size(); ++i) {
        if (!in[i].is_array()) throw bad_request("'input[" + std::to_string(i) + "]' must be an array of token ids", "input");
        r.token_ids.push_back(ids(in[i], "input[" + std::to_string(i) + "]"));
      }
    } else {
      throw bad_request("'input' must be a string, an array of strings, an array of token ids or an array of them", "input");
    }
    const size_t n = r.texts.size() + r.token_ids.size();
    if (n > 2048) throw bad_request("'input' may hold at most 2048 inputs", "input");
    for (const std::string& t : r.texts) {
      if (t.empty()) throw bad_request("'input' strings must not be empty", "input");
    }
  }
  if (body.contains("encoding_format") && !body["encoding_format"].is_null()) {
    const json& f = body["encoding_format"];
    if (!f.is_string() || (f != "float" && f != "base64")) {
      throw bad_request("'encoding_format' must be 'float' or 'base64'", "encoding_format");
    }
    r.base64 = f == "base64";
  }
  if (body.contains("dimensions") && !body["dimensions"].is_null()) {
    throw bad_request("'dimensions' is not supported (the model's own width is returned)", "dimensions");
  }
  return r;
}

}  // namespace troupe::http
