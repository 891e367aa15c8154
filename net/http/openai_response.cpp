// The JSON the daemon answers with in the OpenAI format (net/http/openai.h): whole responses, stream chunks
// (content, tool calls, the finish, the usage), logprobs, and the tool calls read from an answer. The
// requests are parsed in openai.cpp.
#include "net/http/openai.h"

#include <algorithm>
#include <string>
#include <vector>

namespace troupe::http {

llm::tool_output tool_calls_of(const completion_request& r, const std::string& id, const std::string& text) {
  llm::tool_output out = llm::parse_tool_calls(r.syntax, text, r.tools);
  if (!r.parallel_tool_calls && out.calls.size() > 1) out.calls.resize(1);
  for (size_t i = 0; i < out.calls.size(); ++i) out.calls[i].id = "call_" + id + "_" + std::to_string(i);
  return out;
}

namespace {
json call_json(const llm::tool_call& c) {
  return {{"id", c.id}, {"type", "function"}, {"function", {{"name", c.name}, {"arguments", c.arguments}}}};
}
}  // namespace

json stream_tool_call(const completion_request& r, const std::string& id, int64_t created, const llm::tool_call& call,
                      size_t index, bool first) {
  json j = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", r.model}, {"system_fingerprint", "troupe"}};
  json tc = call_json(call);
  tc["index"] = index;
  json delta = {{"tool_calls", json::array({tc})}};
  if (first) delta["role"] = "assistant";
  if (first) delta["content"] = nullptr;
  j["choices"] = json::array({{{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}, {"delta", delta}}});
  return j;
}

std::vector<json> stream_tool_call_chunks(const completion_request& r, const std::string& id, int64_t created,
                                          const llm::tool_call& call, size_t index, bool first) {
  std::vector<json> out;
  llm::tool_call head = call;
  head.arguments.clear();
  out.push_back(stream_tool_call(r, id, created, head, index, first));
  // The arguments in pieces of up to 32 bytes, cut only between UTF-8 characters.
  const std::string& a = call.arguments;
  for (size_t at = 0; at < a.size();) {
    size_t n = std::min<size_t>(32, a.size() - at);
    while (at + n < a.size() && (static_cast<unsigned char>(a[at + n]) & 0xC0) == 0x80) ++n;
    json j = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", r.model}, {"system_fingerprint", "troupe"}};
    json tc = {{"index", index}, {"function", {{"arguments", a.substr(at, n)}}}};
    j["choices"] = json::array({{{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}, {"delta", {{"tool_calls", json::array({tc})}}}}});
    out.push_back(std::move(j));
    at += n;
  }
  return out;
}

json stream_reasoning_chunk(const completion_request& r, const std::string& id, int64_t created, std::string_view piece, bool first) {
  json j = {{"id", id}, {"object", "chat.completion.chunk"}, {"created", created}, {"model", r.model}, {"system_fingerprint", "troupe"}};
  json delta = {{"reasoning_content", std::string(piece)}};
  if (first) delta["role"] = "assistant";
  j["choices"] = json::array({{{"index", 0}, {"finish_reason", nullptr}, {"logprobs", nullptr}, {"delta", delta}}});
  return j;
}

chat_stream::chat_stream(const completion_request& r, std::string id) : r_(r), id_(std::move(id)) {
  if (r.split_reasoning()) reasoning_.emplace(r.reasoning, r.reasoning_open);
}

chat_stream::deltas chat_stream::content(std::string_view piece, bool last) {
  deltas d;
  if (!r_.tools_active()) {
    d.content = std::string(piece);
    return d;
  }
  text_ += piece;
  // Content: what no call can begin in.
  const size_t streamable = llm::streamable_content(r_.syntax, text_);
  const size_t safe = std::max(content_sent_, streamable);
  d.content = text_.substr(content_sent_, safe - content_sent_);
  content_sent_ = safe;
  content_out_ += d.content;
  // Calls: parsed only once an opening is there. Where calls are marked (an opening and a close), one is
  // complete once a later one began (its text can only grow); bare JSON (llama3, generic) may still turn out
  // to be content, so its calls wait for the end.
  const bool marked = r_.syntax != llm::tool_syntax::llama3 && r_.syntax != llm::tool_syntax::generic;
  if (!last && (!marked || streamable >= text_.size())) return d;
  const llm::tool_output sofar = tool_calls_of(r_, id_, text_);
  const size_t complete = last ? sofar.calls.size() : (sofar.calls.empty() ? 0 : sofar.calls.size() - 1);
  d.first_index = calls_sent_;
  for (size_t i = calls_sent_; i < complete; ++i) d.calls.push_back(sofar.calls[i]);
  calls_sent_ = std::max(calls_sent_, complete);
  if (last) {
    // The rest of the content: all of the text when no call came; else the parsed content beyond what went out.
    std::string rest;
    if (sofar.calls.empty()) {
      rest = text_.substr(content_sent_);
    } else if (sofar.content.size() > content_out_.size() && sofar.content.compare(0, content_out_.size(), content_out_) == 0) {
      rest = sofar.content.substr(content_out_.size());
    }
    d.content += rest;
    content_out_ += rest;
    content_sent_ = text_.size();
  }
  return d;
}

chat_stream::deltas chat_stream::feed(std::string_view piece) {
  if (!reasoning_) return content(piece, false);
  llm::reasoning_split s = reasoning_->feed(piece);
  deltas d = content(s.content, false);
  d.reasoning = std::move(s.reasoning);
  return d;
}

chat_stream::deltas chat_stream::finish() {
  if (!reasoning_) return content("", true);
  llm::reasoning_split s = reasoning_->finish();
  deltas d = content(s.content, true);
  d.reasoning = std::move(s.reasoning);
  return d;
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
    std::string text = reply.text;
    choice["message"] = {{"role", "assistant"}, {"content", text}};
    if (r.split_reasoning()) {
      llm::reasoning_split s = llm::split_reasoning(r.reasoning, text, r.reasoning_open);
      text = std::move(s.content);
      choice["message"]["content"] = text;
      if (!s.reasoning.empty()) choice["message"]["reasoning_content"] = s.reasoning;
    }
    if (r.tools_active()) {
      const llm::tool_output t = tool_calls_of(r, id, text);
      if (!t.calls.empty()) {
        json calls = json::array();
        for (const llm::tool_call& c : t.calls) calls.push_back(call_json(c));
        choice["message"]["content"] = t.content.empty() ? json(nullptr) : json(t.content);
        choice["message"]["tool_calls"] = calls;
        choice["finish_reason"] = "tool_calls";
      }
    }
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
                  const std::vector<llm::token_logprob>* logprobs, size_t text_offset, size_t index) {
  json j = envelope(r, id, created, true);
  json choice = {{"index", index}, {"finish_reason", nullptr}, {"logprobs", nullptr}};
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

json stream_finish(const completion_request& r, const std::string& id, int64_t created, const std::string& finish,
                   bool tool_calls, size_t index) {
  json j = envelope(r, id, created, true);
  json choice = {{"index", index}, {"finish_reason", tool_calls ? "tool_calls" : finish_reason(finish)}, {"logprobs", nullptr}};
  if (r.chat) {
    choice["delta"] = json::object();
  } else {
    choice["text"] = "";
  }
  j["choices"] = json::array({choice});
  return j;
}

json completion_response(const completion_request& r, const std::string& id, int64_t created,
                         const std::vector<actors::generate_reply>& replies) {
  json j = completion_response(r, id, created, replies.at(0));
  int64_t completion = 0;
  for (size_t i = 0; i < replies.size(); ++i) {
    completion += static_cast<int64_t>(replies[i].tokens.size());
    if (i == 0) continue;
    json c = completion_response(r, id, created, replies[i])["choices"][0];
    c["index"] = i;
    j["choices"].push_back(c);
  }
  j["usage"]["completion_tokens"] = completion;
  j["usage"]["total_tokens"] = replies[0].n_prompt + completion;
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
