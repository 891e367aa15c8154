// OpenAI's Responses API on the chat machinery (net/http/responses.h).
#include "net/http/responses.h"

#include <utility>

#include "net/http/detail/daemon_internals.h"

namespace troupe::http {

using ojson = nlohmann::ordered_json;

void response_store::put(const std::string& id, entry e) {
  std::lock_guard l(m_);
  if (const auto it = items_.find(id); it != items_.end()) {
    order_.erase(it->second.second);
    items_.erase(it);
  }
  order_.push_back(id);
  items_.emplace(id, std::make_pair(std::move(e), std::prev(order_.end())));
  while (items_.size() > capacity_) {
    items_.erase(order_.front());
    order_.pop_front();
  }
}

std::optional<response_store::entry> response_store::get(const std::string& id) const {
  std::lock_guard l(m_);
  const auto it = items_.find(id);
  if (it == items_.end()) return std::nullopt;
  return it->second.first;
}

bool response_store::erase(const std::string& id) {
  std::lock_guard l(m_);
  const auto it = items_.find(id);
  if (it == items_.end()) return false;
  order_.erase(it->second.second);
  items_.erase(it);
  return true;
}

size_t response_store::size() const {
  std::lock_guard l(m_);
  return items_.size();
}

namespace {

// A message's content: a string, or input_text / output_text parts (others refused).
std::string parts_text(const ojson& c, const std::string& where) {
  if (c.is_string()) return c.get<std::string>();
  if (!c.is_array()) throw bad_request("'" + where + "' must be a string or an array of content parts", where);
  std::string out;
  for (size_t i = 0; i < c.size(); ++i) {
    const ojson& p = c[i];
    const std::string type = text_field(p, "type");
    if ((type == "input_text" || type == "output_text" || type == "text") && p.contains("text") && p["text"].is_string()) {
      out += p["text"].get<std::string>();
    } else if (type == "input_image" || type == "input_file" || type == "input_audio") {
      throw bad_request("'" + where + "[" + std::to_string(i) + "]' is " + type + ": this server's models read text only", where);
    } else {
      throw bad_request("'" + where + "[" + std::to_string(i) + "]' must be an input_text or output_text part", where);
    }
  }
  return out;
}

// The input items as chat messages: consecutive function calls are one assistant turn.
void convert_input(const ojson& input, ojson& msgs) {
  if (input.is_string()) {
    msgs.push_back({{"role", "user"}, {"content", input}});
    return;
  }
  if (!input.is_array()) throw bad_request("'input' must be a string or an array of items", "input");
  std::string pending_reasoning;
  for (size_t i = 0; i < input.size(); ++i) {
    const ojson& it = input[i];
    const std::string p = "input[" + std::to_string(i) + "]";
    if (!it.is_object()) throw bad_request("'" + p + "' must be an object", p);
    const std::string type = (text_field(it, "type").empty() ? std::string("message") : text_field(it, "type"));
    if (type == "message") {
      const std::string role = text_field(it, "role");
      if (role != "user" && role != "assistant" && role != "system" && role != "developer") {
        throw bad_request("'" + p + ".role' must be user, assistant, system or developer", p + ".role");
      }
      if (!it.contains("content")) throw bad_request("'" + p + ".content' is required", p + ".content");
      ojson m = {{"role", role == "developer" ? "system" : role}, {"content", parts_text(it["content"], p + ".content")}};
      if (role == "assistant" && !pending_reasoning.empty()) m["reasoning_content"] = std::exchange(pending_reasoning, {});
      msgs.push_back(std::move(m));
    } else if (type == "function_call") {
      for (const char* k : {"call_id", "name", "arguments"}) {
        if (!it.contains(k) || !it[k].is_string()) throw bad_request("'" + p + "." + k + "' must be a string", p + "." + k);
      }
      const ojson call = {{"id", it["call_id"]}, {"type", "function"}, {"function", {{"name", it["name"]}, {"arguments", it["arguments"]}}}};
      if (msgs.empty() || msgs.back().value("role", "") != "assistant" || !msgs.back().contains("tool_calls")) {
        ojson m = {{"role", "assistant"}, {"content", ""}, {"tool_calls", ojson::array()}};
        if (!pending_reasoning.empty()) m["reasoning_content"] = std::exchange(pending_reasoning, {});
        msgs.push_back(std::move(m));
      }
      msgs.back()["tool_calls"].push_back(call);
    } else if (type == "function_call_output") {
      if (!it.contains("call_id") || !it["call_id"].is_string()) throw bad_request("'" + p + ".call_id' must be a string", p + ".call_id");
      if (!it.contains("output")) throw bad_request("'" + p + ".output' is required", p + ".output");
      const std::string output = it["output"].is_string() ? it["output"].get<std::string>() : parts_text(it["output"], p + ".output");
      msgs.push_back({{"role", "tool"}, {"tool_call_id", it["call_id"]}, {"content", output}});
    } else if (type == "reasoning") {
      // A past turn's reasoning: its text goes with the assistant turn after it.
      for (const char* k : {"content", "summary"}) {
        if (!it.contains(k) || !it[k].is_array()) continue;
        for (const ojson& part : it[k]) {
          if (part.is_object() && part.contains("text") && part["text"].is_string()) pending_reasoning += part["text"].get<std::string>();
        }
      }
    } else {
      throw bad_request("'" + p + ".type' '" + type + "' is not an input item this server takes", p + ".type");
    }
  }
}

}  // namespace

responses_request parse_responses_request(std::string_view text, const response_store& store) {
  ojson in = parse_api_body(text);
  responses_request r;
  if (in.contains("store") && !in["store"].is_null()) {
    if (!in["store"].is_boolean()) throw bad_request("'store' must be true or false", "store");
    r.store = in["store"].get<bool>();
  }
  ojson conversation = ojson::array();
  if (in.contains("previous_response_id") && !in["previous_response_id"].is_null()) {
    if (!in["previous_response_id"].is_string()) throw bad_request("'previous_response_id' must be a string", "previous_response_id");
    r.previous_response_id = in["previous_response_id"].get<std::string>();
    const auto prev = store.get(r.previous_response_id);
    if (!prev) {
      throw api_error(404, "invalid_request_error", "no stored response '" + r.previous_response_id + "'", "previous_response_id",
                      "not_found");
    }
    conversation = prev->conversation;
  }
  if (!in.contains("input")) throw bad_request("'input' is required", "input");
  convert_input(in["input"], conversation);
  r.conversation = conversation;
  ojson out = {{"model", in["model"]}};
  ojson msgs = ojson::array();
  if (in.contains("instructions") && !in["instructions"].is_null()) {
    if (!in["instructions"].is_string()) throw bad_request("'instructions' must be a string", "instructions");
    msgs.push_back({{"role", "system"}, {"content", in["instructions"]}});
  }
  for (const ojson& m : conversation) msgs.push_back(m);
  out["messages"] = std::move(msgs);
  if (in.contains("max_output_tokens") && !in["max_output_tokens"].is_null()) out["max_tokens"] = in["max_output_tokens"];
  for (const char* key : {"temperature", "top_p", "stream", "parallel_tool_calls"}) {
    if (in.contains(key)) out[key] = in[key];
  }
  if (in.contains("tools") && !in["tools"].is_null()) {
    if (!in["tools"].is_array()) throw bad_request("'tools' must be an array", "tools");
    ojson tools = ojson::array();
    for (size_t i = 0; i < in["tools"].size(); ++i) {
      const ojson& t = in["tools"][i];
      const std::string p = "tools[" + std::to_string(i) + "]";
      if (text_field(t, "type") != "function") {
        throw bad_request("'" + p + "' must be a function tool (built-in tools such as web search do not run here)", p);
      }
      ojson fn = {{"name", t.contains("name") ? t["name"] : ojson(nullptr)}};
      if (t.contains("description")) fn["description"] = t["description"];
      if (t.contains("parameters")) fn["parameters"] = t["parameters"];
      tools.push_back({{"type", "function"}, {"function", std::move(fn)}});
    }
    out["tools"] = std::move(tools);
  }
  if (in.contains("tool_choice") && !in["tool_choice"].is_null()) {
    const ojson& tc = in["tool_choice"];
    if (text_field(tc, "type") == "function" && tc.contains("name")) {
      out["tool_choice"] = {{"type", "function"}, {"function", {{"name", tc["name"]}}}};
    } else {
      out["tool_choice"] = tc;
    }
  }
  if (in.contains("text") && in["text"].is_object() && in["text"].contains("format")) {
    const ojson& f = in["text"]["format"];
    const std::string type = text_field(f, "type");
    if (type == "json_schema") {
      if (!f.contains("schema")) throw bad_request("'text.format.schema' is missing", "text.format.schema");
      out["response_format"] = {{"type", "json_schema"}, {"json_schema", {{"name", text_field(f, "name").empty() ? std::string("answer") : text_field(f, "name")}, {"schema", f["schema"]}}}};
    } else if (type == "json_object") {
      out["response_format"] = {{"type", "json_object"}};
    } else if (type != "text") {
      throw bad_request("'text.format.type' must be text, json_object or json_schema", "text.format");
    }
  }
  try {
    r.chat = parse_completion_request(out.dump(), true);
  } catch (const api_error& e) {
    std::string param = e.param();
    if (param == "max_tokens") param = "max_output_tokens";
    if (param.rfind("response_format", 0) == 0) param = "text.format";
    if (param.rfind("messages", 0) == 0) param = "input";
    throw api_error(e.status(), e.type(), e.what(), param);
  }
  for (const char* key : {"instructions", "tools", "tool_choice", "temperature", "top_p", "max_output_tokens", "parallel_tool_calls",
                          "text", "metadata", "reasoning"}) {
    r.echo[key] = in.contains(key) ? json::parse(in[key].dump()) : json(nullptr);
  }
  return r;
}

namespace {

// The output items of an answer, from the chat answer's reasoning, content and calls.
json output_items(const std::string& id, const json& message) {
  json out = json::array();
  if (message.contains("reasoning_content")) {
    out.push_back({{"type", "reasoning"},
                   {"id", "rs_" + id},
                   {"summary", json::array()},
                   {"content", {{{"type", "reasoning_text"}, {"text", message["reasoning_content"]}}}}});
  }
  if (message["content"].is_string() && !message["content"].get<std::string>().empty()) {
    out.push_back({{"type", "message"},
                   {"id", "msg_" + id},
                   {"status", "completed"},
                   {"role", "assistant"},
                   {"content", {{{"type", "output_text"}, {"text", message["content"]}, {"annotations", json::array()}}}}});
  }
  if (message.contains("tool_calls")) {
    for (size_t i = 0; i < message["tool_calls"].size(); ++i) {
      const json& c = message["tool_calls"][i];
      out.push_back({{"type", "function_call"},
                     {"id", "fc_" + id + "_" + std::to_string(i)},
                     {"call_id", c["id"]},
                     {"name", c["function"]["name"]},
                     {"arguments", c["function"]["arguments"]},
                     {"status", "completed"}});
    }
  }
  return out;
}

json response_shell(const responses_request& r, const std::string& id, int64_t created, const std::string& model) {
  json j = {{"id", id},
            {"object", "response"},
            {"created_at", created},
            {"status", "in_progress"},
            {"error", nullptr},
            {"incomplete_details", nullptr},
            {"model", model},
            {"output", json::array()},
            {"previous_response_id", r.previous_response_id.empty() ? json(nullptr) : json(r.previous_response_id)},
            {"store", r.store},
            {"usage", nullptr}};
  for (const auto& [k, v] : r.echo.items()) j[k] = v;
  if (j["tools"].is_null()) j["tools"] = json::array();
  if (j["tool_choice"].is_null()) j["tool_choice"] = "auto";
  if (j["parallel_tool_calls"].is_null()) j["parallel_tool_calls"] = true;
  if (j["text"].is_null()) j["text"] = {{"format", {{"type", "text"}}}};
  return j;
}

}  // namespace

json responses_object(const completion_request& chat, const responses_request& r, const std::string& id, int64_t created,
                      const actors::generate_reply& reply) {
  const json message = completion_response(chat, id, created, reply)["choices"][0]["message"];
  json j = response_shell(r, id, created, chat.model);
  j["output"] = output_items(id, message);
  const bool complete = reply.finish == "stop";
  j["status"] = complete ? "completed" : "incomplete";
  if (!complete) j["incomplete_details"] = {{"reason", "max_output_tokens"}};
  const int64_t out_tokens = static_cast<int64_t>(reply.tokens.size());
  j["usage"] = {{"input_tokens", reply.n_prompt},
                {"input_tokens_details", {{"cached_tokens", reply.n_prompt - reply.n_prompt_decoded}}},
                {"output_tokens", out_tokens},
                {"output_tokens_details", {{"reasoning_tokens", 0}}},
                {"total_tokens", reply.n_prompt + out_tokens}};
  return j;
}

namespace {

class responses_stream : public detail::answer_format {
 public:
  responses_stream(const completion_request& chat, responses_request r, std::string id, int64_t created, response_store& store)
      : chat_(chat), r_(std::move(r)), id_(std::move(id)), created_(created), store_(store), deltas_(chat, id_) {}

  std::string stream(const actors::token_event& e) override {
    if (!chat_.stream) return {};
    return write(deltas_.feed(e.piece));
  }

  std::string finish(const actors::generate_reply& reply) override {
    const json done = responses_object(chat_, r_, id_, created_, reply);
    if (r_.store) {
      // The conversation so far and this answer as an assistant turn: what previous_response_id continues.
      ojson conversation = r_.conversation;
      // dump() replaces bytes that are not UTF-8 (an answer cut inside a character).
      ojson turn = ojson::parse(dump(completion_response(chat_, id_, created_, reply)["choices"][0]["message"]));
      if (turn["content"].is_null()) turn["content"] = "";
      conversation.push_back(std::move(turn));
      store_.put(id_, {done, std::move(conversation)});
    }
    if (!chat_.stream) return dump(done);
    std::string out = write(deltas_.finish());
    if (!started_) out += start();
    out += close();
    json streamed = done;
    streamed["output"] = items_;  // the items as the stream gave them
    return out + event({{"type", done["status"] == "completed" ? "response.completed" : "response.incomplete"}, {"response", streamed}});
  }

  std::string error_body(const api_error& e) const override { return dump(e.body()); }
  std::string stream_error(const api_error& e) const override {
    return "event: error\ndata: " + dump({{"type", "error"}, {"code", e.type()}, {"message", e.what()}, {"param", nullptr}}) + "\n\n";
  }

 private:
  // The open item's id: unique per output index (a text after calls is a message item of its own).
  std::string item_id(const char* prefix) const { return prefix + id_ + "_" + std::to_string(index_); }

  std::string event(json j) {
    j["sequence_number"] = seq_++;
    const std::string type = j["type"];
    return "event: " + type + "\ndata: " + dump(j) + "\n\n";
  }

  std::string start() {
    started_ = true;
    const json shell = response_shell(r_, id_, created_, chat_.model);
    return event({{"type", "response.created"}, {"response", shell}}) + event({{"type", "response.in_progress"}, {"response", shell}});
  }

  // The open item's closing events.
  std::string close() {
    std::string out;
    if (open_ == "reasoning") {
      out += event({{"type", "response.reasoning_text.done"}, {"item_id", item_id("rs_")}, {"output_index", index_}, {"content_index", 0}, {"text", text_}});
      const json item = {{"type", "reasoning"}, {"id", item_id("rs_")}, {"summary", json::array()},
                         {"content", {{{"type", "reasoning_text"}, {"text", text_}}}}};
      out += event({{"type", "response.output_item.done"}, {"output_index", index_}, {"item", item}});
      items_.push_back(item);
    } else if (open_ == "message") {
      const json part = {{"type", "output_text"}, {"text", text_}, {"annotations", json::array()}};
      out += event({{"type", "response.output_text.done"}, {"item_id", item_id("msg_")}, {"output_index", index_}, {"content_index", 0}, {"text", text_}});
      out += event({{"type", "response.content_part.done"}, {"item_id", item_id("msg_")}, {"output_index", index_}, {"content_index", 0}, {"part", part}});
      const json item = {{"type", "message"}, {"id", item_id("msg_")}, {"status", "completed"}, {"role", "assistant"}, {"content", {part}}};
      out += event({{"type", "response.output_item.done"}, {"output_index", index_}, {"item", item}});
      items_.push_back(item);
    }
    if (!open_.empty()) ++index_;
    open_.clear();
    text_.clear();
    return out;
  }

  std::string write(const chat_stream::deltas& d) {
    if (d.reasoning.empty() && d.content.empty() && d.calls.empty()) return {};
    std::string out = started_ ? std::string() : start();
    if (!d.reasoning.empty()) {
      if (open_ != "reasoning") {
        out += close();
        open_ = "reasoning";
        out += event({{"type", "response.output_item.added"}, {"output_index", index_},
                      {"item", {{"type", "reasoning"}, {"id", item_id("rs_")}, {"summary", json::array()}, {"content", json::array()}}}});
      }
      text_ += d.reasoning;
      out += event({{"type", "response.reasoning_text.delta"}, {"item_id", item_id("rs_")}, {"output_index", index_}, {"content_index", 0}, {"delta", d.reasoning}});
    }
    if (!d.content.empty()) {
      if (open_ != "message") {
        out += close();
        open_ = "message";
        out += event({{"type", "response.output_item.added"}, {"output_index", index_},
                      {"item", {{"type", "message"}, {"id", item_id("msg_")}, {"status", "in_progress"}, {"role", "assistant"}, {"content", json::array()}}}});
        out += event({{"type", "response.content_part.added"}, {"item_id", item_id("msg_")}, {"output_index", index_}, {"content_index", 0},
                      {"part", {{"type", "output_text"}, {"text", ""}, {"annotations", json::array()}}}});
      }
      text_ += d.content;
      out += event({{"type", "response.output_text.delta"}, {"item_id", item_id("msg_")}, {"output_index", index_}, {"content_index", 0}, {"delta", d.content}});
    }
    for (size_t i = 0; i < d.calls.size(); ++i) {
      out += close();
      const llm::tool_call& c = d.calls[i];
      const std::string call_item = "fc_" + id_ + "_" + std::to_string(d.first_index + i);
      json item = {{"type", "function_call"}, {"id", call_item}, {"call_id", c.id}, {"name", c.name}, {"arguments", ""}, {"status", "in_progress"}};
      out += event({{"type", "response.output_item.added"}, {"output_index", index_}, {"item", item}});
      out += event({{"type", "response.function_call_arguments.delta"}, {"item_id", call_item}, {"output_index", index_}, {"delta", c.arguments}});
      out += event({{"type", "response.function_call_arguments.done"}, {"item_id", call_item}, {"output_index", index_}, {"arguments", c.arguments}});
      item["arguments"] = c.arguments;
      item["status"] = "completed";
      out += event({{"type", "response.output_item.done"}, {"output_index", index_}, {"item", item}});
      items_.push_back(item);
      ++index_;
    }
    return out;
  }

  const completion_request& chat_;
  responses_request r_;
  std::string id_;
  int64_t created_;
  response_store& store_;
  chat_stream deltas_;
  std::string open_, text_;  // the open item's kind and its text so far
  json items_ = json::array();  // the items streamed, done: the final response's output
  size_t index_ = 0;
  int64_t seq_ = 0;
};

}  // namespace

std::unique_ptr<detail::answer_format> responses_format(const completion_request& chat, responses_request r, std::string id,
                                                        int64_t created, response_store& store) {
  return std::make_unique<responses_stream>(chat, std::move(r), std::move(id), created, store);
}

}  // namespace troupe::http
