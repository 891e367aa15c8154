// Ollama's API on the daemon's machinery (net/http/ollama.h).
#include "net/http/ollama.h"

#include <chrono>
#include <cstdio>
#include <ctime>

#include "net/http/detail/daemon_internals.h"

namespace troupe::http {

using ojson = nlohmann::ordered_json;

namespace {


// options (ollama's sampling names) and format, think, stream into the OpenAI body.
void common_fields(const ojson& in, ojson& out) {
  out["stream"] = in.contains("stream") && in["stream"].is_boolean() ? in["stream"].get<bool>() : true;
  if (in.contains("options") && !in["options"].is_null()) {
    const ojson& o = in["options"];
    if (!o.is_object()) throw bad_request("'options' must be an object", "options");
    for (const char* key : {"temperature", "top_p", "top_k", "min_p", "seed", "repeat_penalty", "presence_penalty", "frequency_penalty", "stop"}) {
      if (o.contains(key) && !o[key].is_null()) out[key] = o[key];
    }
    if (o.contains("num_predict") && o["num_predict"].is_number_integer() && o["num_predict"].get<int64_t>() > 0) {
      out["max_tokens"] = o["num_predict"];
    }
  }
  if (in.contains("format") && !in["format"].is_null()) {
    const ojson& f = in["format"];
    if (f == "json") {
      out["response_format"] = {{"type", "json_object"}};
    } else if (f.is_object()) {
      out["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", "answer"}, {"schema", f}}}};
    } else if (f != "") {
      throw bad_request("'format' must be \"json\" or a JSON Schema object", "format");
    }
  }
  if (in.contains("think") && in["think"].is_boolean() && !in["think"].get<bool>()) out["reasoning_budget"] = 0;
  if (in.contains("tools") && !in["tools"].is_null()) out["tools"] = in["tools"];
}

void refuse_images(const ojson& m, const std::string& where) {
  if (m.contains("images") && m["images"].is_array() && !m["images"].empty()) {
    throw bad_request("'" + where + ".images': this server's models read text only (no vision)", where + ".images");
  }
}

}  // namespace

completion_request parse_ollama_request(std::string_view text, bool generate) {
  const ojson in = parse_api_body(text);
  ojson out = {{"model", in["model"]}};
  bool chat = true;
  if (generate) {
    refuse_images(in, "");
    if (in.contains("suffix") && in["suffix"].is_string() && !in["suffix"].get<std::string>().empty()) {
      throw bad_request("'suffix' (fill in the middle) is not supported", "suffix");
    }
    const std::string prompt = text_field(in, "prompt");
    if (true_field(in, "raw")) {
      chat = false;
      out["prompt"] = prompt;
    } else {
      ojson msgs = ojson::array();
      if (in.contains("system") && in["system"].is_string()) msgs.push_back({{"role", "system"}, {"content", in["system"]}});
      msgs.push_back({{"role", "user"}, {"content", prompt}});
      out["messages"] = std::move(msgs);
    }
  } else {
    if (!in.contains("messages") || !in["messages"].is_array()) throw bad_request("'messages' is required and must be an array", "messages");
    ojson msgs = ojson::array();
    size_t n_calls = 0;
    for (size_t i = 0; i < in["messages"].size(); ++i) {
      const ojson& m = in["messages"][i];
      const std::string p = "messages[" + std::to_string(i) + "]";
      if (!m.is_object()) throw bad_request("'" + p + "' must be an object", p);
      refuse_images(m, p);
      ojson o = {{"role", m.contains("role") ? m["role"] : ojson(nullptr)}, {"content", m.contains("content") ? m["content"] : ojson("")}};
      if (m.contains("thinking") && m["thinking"].is_string()) o["reasoning_content"] = m["thinking"];
      if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
        ojson calls = ojson::array();
        for (const ojson& c : m["tool_calls"]) {
          if (!c.is_object() || !c.contains("function") || !c["function"].is_object()) throw bad_request("'" + p + ".tool_calls' must hold {function: {name, arguments}}", p);
          const ojson& f = c["function"];
          const ojson args = f.contains("arguments") ? f["arguments"] : ojson::object();
          calls.push_back({{"id", c.contains("id") && c["id"].is_string() ? c["id"] : ojson("call_" + std::to_string(n_calls))},
                           {"type", "function"},
                           {"function", {{"name", f.contains("name") ? f["name"] : ojson(nullptr)}, {"arguments", args.is_string() ? args : ojson(args.dump())}}}});
          ++n_calls;
        }
        o["tool_calls"] = std::move(calls);
      }
      if (m.contains("tool_name") && m["tool_name"].is_string()) o["name"] = m["tool_name"];
      msgs.push_back(std::move(o));
    }
    out["messages"] = std::move(msgs);
  }
  common_fields(in, out);
  if (!chat) out.erase("tools");
  completion_request r = parse_completion_request(out.dump(), chat);
  r.keep_alive_ms = ollama_keep_alive(in);
  return r;
}

int64_t ollama_keep_alive(const nlohmann::ordered_json& in) {
  if (!in.contains("keep_alive") || in["keep_alive"].is_null()) return actors::model_settings::keep_alive_default;
  const ojson& k = in["keep_alive"];
  std::optional<int64_t> ms;
  if (k.is_number()) {
    const double seconds = k.get<double>();
    if (seconds < 0) {
      ms = -1;
    } else if (seconds < 1e12) {
      ms = static_cast<int64_t>(seconds * 1000);
    }
  } else if (k.is_string()) {
    ms = actors::parse_keep_alive(k.get<std::string>());
  }
  if (!ms) throw bad_request("'keep_alive' must be seconds or a duration such as \"5m\" (negative: for ever)", "keep_alive");
  return *ms;
}

std::optional<json> ollama_load_only(std::string_view text, bool generate) {
  const ojson in = parse_api_body(text);
  const bool empty = generate ? text_field(in, "prompt").empty() && !in.contains("suffix")
                              : !in.contains("messages") || (in["messages"].is_array() && in["messages"].empty());
  if (!empty) return std::nullopt;
  const bool unload = ollama_keep_alive(in) == 0;
  json done = {{"model", in["model"]}, {"created_at", ollama_time(std::chrono::system_clock::now())}, {"done", true},
               {"done_reason", unload ? "unload" : "load"}};
  if (generate) {
    done["response"] = "";
  } else {
    done["message"] = {{"role", "assistant"}, {"content", ""}};
  }
  return done;
}

embedding_request parse_ollama_embed(std::string_view text) {
  const ojson in = parse_api_body(text);
  ojson out = {{"model", in["model"]}};
  if (in.contains("input")) {
    out["input"] = in["input"];
  } else if (in.contains("prompt")) {
    out["input"] = in["prompt"];  // the older /api/embeddings
  } else {
    throw bad_request("'input' is required", "input");
  }
  return parse_embedding_request(out.dump());
}

json ollama_error(const api_error& e) { return {{"error", e.what()}}; }

std::string ollama_time(std::chrono::system_clock::time_point at) {
  const std::time_t t = std::chrono::system_clock::to_time_t(at);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(at.time_since_epoch()).count() % 1000000;
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
                tm.tm_min, tm.tm_sec, static_cast<long long>(us));
  return buf;
}

namespace {

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

class ollama_stream : public detail::answer_format {
 public:
  ollama_stream(const completion_request& r, bool generate, int64_t started_ns)
      : r_(r), generate_(generate), started_ns_(started_ns) {
    if (r.chat) deltas_.emplace(r, "ollama");
  }

  std::string stream(const actors::token_event& e) override {
    if (!r_.stream) return {};
    if (!deltas_) return piece("", e.piece, {});
    const chat_stream::deltas d = deltas_->feed(e.piece);
    return piece(d.reasoning, d.content, d.calls);
  }

  std::string finish(const actors::generate_reply& reply) override {
    std::string out;
    json last = base();
    if (r_.stream) {
      if (deltas_) {
        const chat_stream::deltas d = deltas_->finish();
        out = piece(d.reasoning, d.content, d.calls);
      }
      if (generate_) {
        last["response"] = "";
      } else {
        last["message"] = {{"role", "assistant"}, {"content", ""}};
      }
    } else if (r_.chat) {
      const json m = completion_response(r_, "ollama", 0, reply)["choices"][0]["message"];
      json msg = {{"role", "assistant"}, {"content", m["content"].is_string() ? m["content"] : json("")}};
      if (m.contains("reasoning_content")) msg["thinking"] = m["reasoning_content"];
      if (m.contains("tool_calls")) {
        for (const json& c : m["tool_calls"]) msg["tool_calls"].push_back(call_json(c["function"]["name"], c["function"]["arguments"]));
      }
      if (generate_) {
        last["response"] = msg["content"];
        if (msg.contains("thinking")) last["thinking"] = msg["thinking"];
      } else {
        last["message"] = msg;
      }
    } else {
      last["response"] = reply.text;
    }
    last["done"] = true;
    last["done_reason"] = reply.finish == "stop" ? "stop" : "length";
    last["total_duration"] = now_ns() - started_ns_;
    last["load_duration"] = 0;
    last["prompt_eval_count"] = reply.n_prompt;
    last["prompt_eval_duration"] = static_cast<int64_t>(reply.prompt_seconds * 1e9);
    last["eval_count"] = reply.tokens.size();
    last["eval_duration"] = static_cast<int64_t>(reply.gen_seconds * 1e9);
    return out + dump(last) + "\n";
  }

  std::string error_body(const api_error& e) const override { return dump(ollama_error(e)); }
  std::string stream_error(const api_error& e) const override { return dump(ollama_error(e)) + "\n"; }
  const char* stream_type() const override { return "application/x-ndjson"; }

 private:
  json base() const { return {{"model", r_.model}, {"created_at", ollama_time(std::chrono::system_clock::now())}}; }

  static json call_json(const json& name, const json& arguments) {
    json args = json::object();
    try {
      args = json::parse(arguments.get<std::string>());
    } catch (const json::exception&) {
    }
    return {{"function", {{"name", name}, {"arguments", args}}}};
  }

  std::string piece(const std::string& thinking, const std::string& content, const std::vector<llm::tool_call>& calls) {
    if (thinking.empty() && content.empty() && calls.empty()) return {};
    started_ = true;
    json j = base();
    if (generate_) {
      j["response"] = content;
      if (!thinking.empty()) j["thinking"] = thinking;
    } else {
      json msg = {{"role", "assistant"}, {"content", content}};
      if (!thinking.empty()) msg["thinking"] = thinking;
      for (const llm::tool_call& c : calls) msg["tool_calls"].push_back(call_json(c.name, c.arguments));
      j["message"] = msg;
    }
    j["done"] = false;
    return dump(j) + "\n";
  }

  const completion_request& r_;
  bool generate_;
  int64_t started_ns_;
  std::optional<chat_stream> deltas_;
};

}  // namespace

std::unique_ptr<detail::answer_format> ollama_format(const completion_request& r, bool generate, int64_t started_ns) {
  return std::make_unique<ollama_stream>(r, generate, started_ns == 0 ? now_ns() : started_ns);
}

}  // namespace troupe::http
