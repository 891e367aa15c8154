// The OpenAI-compatible wire format: request bodies of /v1/chat/completions and /v1/completions parsed and
// checked field by field, and the JSON the daemon answers with (responses, stream chunks, errors).
//
//   completion_request r = parse_completion_request(body, /*chat=*/true);   // throws api_error (400)
//   json j = completion_response(r, "chatcmpl-1", created, reply);
//
// Sampling fields: temperature (0: greedy), top_p, top_k, min_p, max_tokens (max_completion_tokens),
// stop (a string or up to 16 strings), seed (absent: a random one), presence_penalty, frequency_penalty,
// repeat_penalty, logit_bias ({"token id": bias in [-100, 100]}, -100 bans), stream, stream_options.include_usage. logprobs (chat: logprobs + top_logprobs 0..20; completions: logprobs N), streamed too. troupe's additions: return_tokens (the answer's
// token ids in choices[i].tokens). Unknown fields are ignored (clients send many); a known field with the
// wrong type or a value out of range is an error naming it. n: 1..16 choices.
#pragma once

#include <nlohmann/json.hpp>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "actors/messages.h"
#include "llm/chat_prompt.h"
#include "llm/reasoning.h"
#include "llm/tool_calls.h"

namespace troupe::http {

using json = nlohmann::json;

// An error in the OpenAI error shape: {"error": {"message", "type", "param", "code"}}.
class api_error : public std::runtime_error {
 public:
  api_error(int status, std::string type, std::string message, std::string param = {}, std::string code = {})
      : std::runtime_error(message), status_(status), type_(std::move(type)), param_(std::move(param)), code_(std::move(code)) {}
  int status() const { return status_; }
  const std::string& type() const { return type_; }
  const std::string& param() const { return param_; }
  json body() const;

 private:
  int status_;
  std::string type_, param_, code_;
};

api_error bad_request(std::string message, std::string param = {});

struct completion_request {
  bool chat = false;
  std::string model;
  std::string prompt;                         // /v1/completions
  std::vector<int32_t> prompt_ids;            // /v1/completions with a prompt of token ids
  std::vector<actors::chat_message> messages; // /v1/chat/completions
  actors::generation_params params;
  bool max_tokens_given = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool return_tokens = false;
  int32_t n = 1;  // choices: n answers to one prompt (its prefill shared), seeds seed, seed + 1, ...
  // How long the model stays loaded after this request (ollama's keep_alive, ms; -1 for ever);
  // keep_alive_default: the model's own.
  int64_t keep_alive_ms = actors::model_settings::keep_alive_default;
  // Function calling (chat): the tools, tool_choice ("auto", "none", "required", or "function" with
  // tool_choice_name), parallel_tool_calls; each message's tool calls (assistant turns) or tool_call_id.
  std::vector<llm::tool_function> tools;
  std::string tool_choice = "auto";
  std::string tool_choice_name;
  bool parallel_tool_calls = true;
  std::vector<std::vector<llm::tool_call>> message_calls;  // [messages.size()]
  llm::tool_syntax syntax = llm::tool_syntax::hermes;     // set for the model's template (prepare_chat)
  // The conversation and tools as sent (key order kept) for the model's chat template, and the template's
  // extra variables (chat_template_kwargs, e.g. {"enable_thinking": false}).
  nlohmann::ordered_json template_messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json template_tools = nullptr;
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  // Reasoning: reasoning_format "none" leaves it in content; "auto" / "deepseek" split it into
  // reasoning_content. reasoning_budget: tokens of reasoning at most (-1: no limit; 0: thinking switched
  // off through the template's enable_thinking). Set by prepare_chat: the model's markers, and whether the
  // rendered prompt opened the block.
  std::string reasoning_format = "auto";
  int32_t reasoning_budget = -1;
  llm::reasoning_markers reasoning;
  bool reasoning_open = false;
  bool split_reasoning() const { return chat && reasoning_format != "none" && !reasoning.empty(); }
  // Whether the answer may hold tool calls (tools given and tool_choice is not "none").
  bool tools_active() const { return !tools.empty() && tool_choice != "none"; }
};

// Throws api_error (400, invalid_request_error) naming the field.
completion_request parse_completion_request(std::string_view body, bool chat);

// The body of a request of another API (Anthropic's, OpenAI Responses', ollama's) in its own key order: not
// nested deeper than requests need, a JSON object with a string "model". Throws api_error (400).
nlohmann::ordered_json parse_api_body(std::string_view body);
// A body's field read without throwing: its text ("" unless a string), its truth (false unless true).
std::string text_field(const nlohmann::ordered_json& object, const char* key);
bool true_field(const nlohmann::ordered_json& object, const char* key);
// POST /v1/embeddings: the inputs as text or token ids (one of the two), the encoding.
struct embedding_request {
  std::string model;
  std::vector<std::string> texts;               // inputs given as text
  std::vector<std::vector<int32_t>> token_ids;  // or as token ids (one of the two is used)
  // Or a conversation ('messages' instead of 'input', OpenAI chat messages): rendered through the model's
  // chat template (no generation prompt) and embedded as one input.
  nlohmann::ordered_json messages;
  bool base64 = false;
};
// Throws api_error (400) naming the field.
embedding_request parse_embedding_request(std::string_view body);

// Once the model is known: renders the chat (messages, tools, kwargs) through the model's template into
// r.prompt (r.messages emptied: the session tokenizes the rendered chat), takes the model's tool call syntax
// and reasoning markers, and sets the grammar of a call: forced for a required or named call, lazy (on at
// the call's opening) for tool_choice auto. Throws api_error (400 where the template refuses).
void prepare_chat(completion_request& r, const llm::chat_prompt& p);
// The calls in an answer when r.tools_active() (ids "call_<answer id>_<i>").
llm::tool_output tool_calls_of(const completion_request& r, const std::string& id, const std::string& text);
// A streamed chunk with one call (delta.tool_calls[0], index i).
json stream_tool_call(const completion_request& r, const std::string& id, int64_t created, const llm::tool_call& call,
                      size_t index, bool first);

// A streamed chat answer's deltas: reasoning split off (r.split_reasoning()), content held back where a
// tool call may begin (r.tools_active()), each call handed out once it is complete (a later call began, or
// the answer ended). Fed the answer's pieces in order; the calls carry their ids (tool_calls_of's).
class chat_stream {
 public:
  chat_stream(const completion_request& r, std::string id);
  struct deltas {
    std::string reasoning, content;
    std::vector<llm::tool_call> calls;  // complete calls, in order
    size_t first_index = 0;             // the index of calls[0] among the answer's calls
  };
  deltas feed(std::string_view piece);
  // The end of the answer: what was held back, and the calls not handed out yet.
  deltas finish();
  size_t calls_sent() const { return calls_sent_; }

 private:
  deltas content(std::string_view piece, bool last);
  const completion_request& r_;
  std::string id_;
  std::optional<llm::reasoning_stream> reasoning_;
  std::string text_;         // the content so far (tools active)
  std::string content_out_;  // the content streamed
  size_t content_sent_ = 0, calls_sent_ = 0;
};

// The chunks of one streamed tool call as OpenAI sends them: the id, type and name first (arguments ""),
// then the arguments in pieces.
std::vector<json> stream_tool_call_chunks(const completion_request& r, const std::string& id, int64_t created,
                                          const llm::tool_call& call, size_t index, bool first);
// A streamed piece of reasoning: delta.reasoning_content.
json stream_reasoning_chunk(const completion_request& r, const std::string& id, int64_t created, std::string_view piece, bool first);

// The whole answer (stream false).
json completion_response(const completion_request& r, const std::string& id, int64_t created,
                         const actors::generate_reply& reply);
// One streamed piece: a delta with content (chat) or text (completions); finish_reason null.
// With r.params.logprobs >= 0, logprobs (the piece's tokens) go into choices[0].logprobs; text_offset: the
// bytes of answer streamed before this piece (the completions' legacy text_offset).
json stream_chunk(const completion_request& r, const std::string& id, int64_t created, std::string_view piece,
                  bool first, const std::vector<llm::token_logprob>* logprobs = nullptr, size_t text_offset = 0,
                  size_t index = 0);
// The whole answer of n choices (choices[i] from replies[i]; usage: the prompt once, every choice's tokens).
json completion_response(const completion_request& r, const std::string& id, int64_t created,
                         const std::vector<actors::generate_reply>& replies);
// The last chunk of choices: empty delta, the finish reason.
// With tool_calls, finish_reason is "tool_calls".
json stream_finish(const completion_request& r, const std::string& id, int64_t created, const std::string& finish,
                   bool tool_calls = false, size_t index = 0);
// The usage chunk (stream_options.include_usage): no choices.
json stream_usage(const completion_request& r, const std::string& id, int64_t created, const actors::generate_reply& reply);

// OpenAI's finish_reason for a reply's finish ("stop", "length"; a cancel by the server is "length").
std::string finish_reason(const std::string& finish);
// JSON text with invalid UTF-8 replaced (a model may produce any bytes).
std::string dump(const json& j);

}  // namespace troupe::http
