// Anthropic's Messages API on the chat machinery (net/http/anthropic.h).
#include "net/http/anthropic.h"

#include <optional>

namespace troupe::http {

using ojson = nlohmann::ordered_json;

namespace {

// The text of a string or of an array of {"type": "text", "text"} blocks (other block types refused).
std::string block_text(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request("'" + where + "' must be a string or an array of text blocks", where);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& b = c[i];
    if (text_field(b, "type") != "text" || !b.contains("text") || !b["text"].is_string()) {
      throw bad_request("'" + where + "[" + std::to_string(i) + "]' must be a text block", where);
    }
    if (!out.empty()) out += "\n";
    out += b["text"].get<std::string>();
  }
  return out;
}

// One Anthropic message as the OpenAI messages it means (a user turn's tool results are tool messages).
void convert_message(const ojson& m, size_t i, ojson& out) {
  const std::string p = "messages[" + std::to_string(i) + "]";
  if (!m.is_object()) throw bad_request("'" + p + "' must be an object", p);
  const std::string role = text_field(m, "role");
  if (role != "user" && role != "assistant") throw bad_request("'" + p + ".role' must be 'user' or 'assistant'", p + ".role");
  if (!m.contains("content")) throw bad_request("'" + p + ".content' is required", p + ".content");
  const ojson& c = m["content"];
  if (c.is_string()) {
    out.push_back({{"role", role}, {"content", c}});
    return;
  }
  if (!c.is_array()) throw bad_request("'" + p + ".content' must be a string or an array of content blocks", p + ".content");
  std::string text, reasoning;
  ojson calls = ojson::array();
  for (size_t k = 0; k < c.size(); ++k) {
    const std::string q = p + ".content[" + std::to_string(k) + "]";
    const ojson& b = c[k];
    const std::string type = text_field(b, "type");
    if (type == "text") {
      if (!b.contains("text") || !b["text"].is_string()) throw bad_request("'" + q + ".text' must be a string", q + ".text");
      text += b["text"].get<std::string>();
    } else if (type == "image" || type == "document") {
      throw bad_request("'" + q + "' is a " + type + " block: this server's models read text only (no vision)", q);
    } else if (type == "tool_use" && role == "assistant") {
      if (!b.contains("id") || !b["id"].is_string() || !b.contains("name") || !b["name"].is_string()) {
        throw bad_request("'" + q + "' must have a string 'id' and 'name'", q);
      }
      const ojson input = b.contains("input") && b["input"].is_object() ? b["input"] : ojson::object();
      calls.push_back({{"id", b["id"]}, {"type", "function"}, {"function", {{"name", b["name"]}, {"arguments", input.dump()}}}});
    } else if (type == "tool_result" && role == "user") {
      if (!b.contains("tool_use_id") || !b["tool_use_id"].is_string()) throw bad_request("'" + q + ".tool_use_id' must be a string", q);
      std::string result = b.contains("content") ? block_text(b["content"], q + ".content") : "";
      if (true_field(b, "is_error")) result = "Error: " + result;
      out.push_back({{"role", "tool"}, {"tool_call_id", b["tool_use_id"]}, {"content", result}});
    } else if (type == "thinking" && role == "assistant") {
      if (b.contains("thinking") && b["thinking"].is_string()) reasoning += b["thinking"].get<std::string>();
    } else if (type == "redacted_thinking" && role == "assistant") {
      // Another model's encrypted reasoning: nothing a local template can use.
    } else {
      throw bad_request("'" + q + ".type' '" + type + "' is not a content block a " + role + " message may hold here", q + ".type");
    }
  }
  if (role == "user" && text.empty()) return;  // only tool results
  ojson msg = {{"role", role}, {"content", text}};
  if (!calls.empty()) msg["tool_calls"] = calls;
  if (!reasoning.empty()) msg["reasoning_content"] = reasoning;
  out.push_back(std::move(msg));
}

}  // namespace

completion_request parse_messages_request(std::string_view text, bool count_tokens) {
  ojson in = parse_api_body(text);
  ojson out = ojson::object();
  out["model"] = in["model"];
  if (!count_tokens) {
    if (!in.contains("max_tokens")) throw bad_request("'max_tokens' is required", "max_tokens");
    out["max_tokens"] = in["max_tokens"];
  }
  ojson msgs = ojson::array();
  if (in.contains("system") && !in["system"].is_null()) msgs.push_back({{"role", "system"}, {"content", block_text(in["system"], "system")}});
  if (!in.contains("messages") || !in["messages"].is_array() || in["messages"].empty()) {
    throw bad_request("'messages' is required and must be a non-empty array", "messages");
  }
  for (size_t i = 0; i < in["messages"].size(); ++i) convert_message(in["messages"][i], i, msgs);
  if (msgs.empty()) throw bad_request("'messages' holds no text or tool result", "messages");
  out["messages"] = std::move(msgs);
  for (const char* key : {"temperature", "top_p", "top_k", "stream"}) {
    if (in.contains(key)) out[key] = in[key];
  }
  if (in.contains("stop_sequences") && !in["stop_sequences"].is_null()) {
    if (!in["stop_sequences"].is_array()) throw bad_request("'stop_sequences' must be an array of strings", "stop_sequences");
    out["stop"] = in["stop_sequences"];
  }
  if (in.contains("tools") && !in["tools"].is_null()) {
    if (!in["tools"].is_array()) throw bad_request("'tools' must be an array", "tools");
    ojson tools = ojson::array();
    for (size_t i = 0; i < in["tools"].size(); ++i) {
      const ojson& t = in["tools"][i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (!t.is_object() || !t.contains("name") || !t["name"].is_string()) throw bad_request("'" + p + ".name' must be a string", p + ".name");
      if (t.contains("type") && t["type"].is_string() && t["type"] != "custom") {
        throw bad_request("'" + p + "' is Anthropic's server tool '" + t["type"].get<std::string>() + "': only custom tools (name, input_schema) run here", p);
      }
      ojson fn = {{"name", t["name"]}};
      if (t.contains("description")) fn["description"] = t["description"];
      if (!t.contains("input_schema") || !t["input_schema"].is_object()) {
        throw bad_request("'" + p + ".input_schema' must be a JSON Schema object", p + ".input_schema");
      }
      fn["parameters"] = t["input_schema"];
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    out["tools"] = std::move(tools);
  }
  if (in.contains("tool_choice") && !in["tool_choice"].is_null()) {
    const ojson& tc = in["tool_choice"];
    const std::string type = text_field(tc, "type");
    if (type == "auto" || type == "none") {
      out["tool_choice"] = type;
    } else if (type == "any") {
      out["tool_choice"] = "required";
    } else if (type == "tool" && tc.contains("name") && tc["name"].is_string()) {
      out["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      throw bad_request("'tool_choice' must be {\"type\": \"auto\" | \"any\" | \"none\"} or {\"type\": \"tool\", \"name\"}", "tool_choice");
    }
    if (true_field(tc, "disable_parallel_tool_use")) out["parallel_tool_calls"] = false;
  }
  if (in.contains("thinking") && !in["thinking"].is_null()) {
    const ojson& th = in["thinking"];
    const std::string type = text_field(th, "type");
    if (type == "disabled") {
      out["reasoning_budget"] = 0;
    } else if (type == "enabled") {
      if (th.contains("budget_tokens")) out["reasoning_budget"] = th["budget_tokens"];
    } else {
      throw bad_request("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\"} or {\"type\": \"disabled\"}", "thinking");
    }
  }
  try {
    return parse_completion_request(out.dump(), true);
  } catch (const api_error& e) {
    // The OpenAI field names of the translation, in Anthropic's terms.
    std::string param = e.param();
    if (param == "stop") param = "stop_sequences";
    if (param == "reasoning_budget") param = "thinking.budget_tokens";
    throw api_error(e.status(), "invalid_request_error", e.what(), param);
  }
}

namespace {

std::string stop_reason(const actors::generate_reply& reply, bool called) {
  if (called) return "tool_use";
  if (reply.finish != "stop") return "max_tokens";
  return reply.stop_match.empty() ? "end_turn" : "stop_sequence";
}

json usage_of(const actors::generate_reply& reply) {
  return {{"input_tokens", reply.n_prompt},
          {"output_tokens", reply.tokens.size()},
          {"cache_read_input_tokens", reply.n_prompt - reply.n_prompt_decoded},
          {"cache_creation_input_tokens", 0}};
}

json tool_use_block(const llm::tool_call& c) {
  json input = json::object();
  try {
    input = json::parse(c.arguments);
  } catch (const json::exception&) {
  }
  return {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", input}};
}

}  // namespace

json messages_response(const completion_request& r, const std::string& id, const actors::generate_reply& reply) {
  // The chat answer's reasoning, content and calls, as the OpenAI answer has them.
  const json m = completion_response(r, id, 0, reply)["choices"][0]["message"];
  json content = json::array();
  if (m.contains("reasoning_content")) content.push_back({{"type", "thinking"}, {"thinking", m["reasoning_content"]}, {"signature", ""}});
  if (m["content"].is_string() && !m["content"].get<std::string>().empty()) content.push_back({{"type", "text"}, {"text", m["content"]}});
  const bool called = m.contains("tool_calls");
  if (called) {
    for (const json& c : m["tool_calls"]) {
      content.push_back(tool_use_block({c["id"].get<std::string>(), c["function"]["name"].get<std::string>(),
                                        c["function"]["arguments"].get<std::string>()}));
    }
  }
  return {{"id", id},
          {"type", "message"},
          {"role", "assistant"},
          {"model", r.model},
          {"content", content},
          {"stop_reason", stop_reason(reply, called)},
          {"stop_sequence", reply.stop_match.empty() ? json(nullptr) : json(reply.stop_match)},
          {"usage", usage_of(reply)}};
}

json messages_error(const api_error& e) {
  const int s = e.status();
  const char* type = s == 400 || s == 413 ? "invalid_request_error"
                     : s == 401           ? "authentication_error"
                     : s == 403           ? "permission_error"
                     : s == 404           ? "not_found_error"
                     : s == 429           ? "rate_limit_error"
                     : s == 503           ? "overloaded_error"
                                          : "api_error";
  return {{"type", "error"}, {"error", {{"type", type}, {"message", e.what()}}}};
}

namespace {

// The stream: message_start and ping with the first piece, then a content block per kind (thinking, text,
// each tool_use) opened when its first delta comes and stopped when another kind begins.
class messages_stream : public detail::answer_format {
 public:
  messages_stream(const completion_request& r, std::string id, uint32_t n_prompt)
      : req_(r), id_(std::move(id)), n_prompt_(n_prompt), deltas_(r, id_) {}

  std::string stream(const actors::token_event& e) override {
    if (!req_.stream) return {};
    return write(deltas_.feed(e.piece));
  }

  std::string finish(const actors::generate_reply& reply) override {
    if (!req_.stream) return dump(messages_response(req_, id_, reply));
    std::string out = write(deltas_.finish());
    if (!started_) out += start();
    out += close();
    json delta = {{"stop_reason", stop_reason(reply, calls_ > 0)},
                  {"stop_sequence", reply.stop_match.empty() ? json(nullptr) : json(reply.stop_match)}};
    out += event("message_delta", {{"type", "message_delta"}, {"delta", delta}, {"usage", {{"output_tokens", reply.tokens.size()}}}});
    return out + event("message_stop", {{"type", "message_stop"}});
  }

  std::string error_body(const api_error& e) const override { return dump(messages_error(e)); }
  std::string stream_error(const api_error& e) const override { return event("error", messages_error(e)); }

 private:
  static std::string event(const char* name, const json& j) { return std::string("event: ") + name + "\ndata: " + dump(j) + "\n\n"; }

  std::string start() {
    started_ = true;
    const json msg = {{"id", id_},
                      {"type", "message"},
                      {"role", "assistant"},
                      {"model", req_.model},
                      {"content", json::array()},
                      {"stop_reason", nullptr},
                      {"stop_sequence", nullptr},
                      {"usage", {{"input_tokens", n_prompt_}, {"output_tokens", 0}}}};
    return event("message_start", {{"type", "message_start"}, {"message", msg}}) + event("ping", {{"type", "ping"}});
  }

  std::string close() {
    if (open_.empty()) return {};
    open_.clear();
    return event("content_block_stop", {{"type", "content_block_stop"}, {"index", index_++}});
  }

  // A delta of a block of this kind, opening it (and closing another kind's) first.
  std::string delta(const std::string& kind, const json& start_block, const json& d) {
    std::string out;
    if (open_ != kind) {
      out += close();
      open_ = kind;
      out += event("content_block_start", {{"type", "content_block_start"}, {"index", index_}, {"content_block", start_block}});
    }
    return out + event("content_block_delta", {{"type", "content_block_delta"}, {"index", index_}, {"delta", d}});
  }

  std::string write(const chat_stream::deltas& d) {
    if (d.reasoning.empty() && d.content.empty() && d.calls.empty()) return {};
    std::string out = started_ ? std::string() : start();
    if (!d.reasoning.empty()) {
      out += delta("thinking", {{"type", "thinking"}, {"thinking", ""}}, {{"type", "thinking_delta"}, {"thinking", d.reasoning}});
    }
    if (!d.content.empty()) out += delta("text", {{"type", "text"}, {"text", ""}}, {{"type", "text_delta"}, {"text", d.content}});
    for (const llm::tool_call& c : d.calls) {
      out += close();  // each call is a block of its own
      const json block = {{"type", "tool_use"}, {"id", c.id}, {"name", c.name}, {"input", json::object()}};
      out += delta("tool_use", block, {{"type", "input_json_delta"}, {"partial_json", c.arguments}});
      ++calls_;
    }
    return out;
  }

  const completion_request& req_;
  std::string id_;
  uint32_t n_prompt_;
  chat_stream deltas_;
  std::string open_;  // the kind of the open block ("" for none)
  size_t index_ = 0, calls_ = 0;
};

}  // namespace

std::unique_ptr<detail::answer_format> messages_format(const completion_request& r, std::string id, uint32_t n_prompt) {
  return std::make_unique<messages_stream>(r, std::move(id), n_prompt);
}

}  // namespace troupe::http
