// Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) on the daemon's chat machinery:
// a request is read into the OpenAI chat request it means (system, content blocks, tool_use / tool_result,
// thinking, tools with input_schema, tool_choice, stop_sequences, thinking budget) and answered in Anthropic's
// shapes: a message with thinking / text / tool_use blocks, stop_reason and usage, or the stream of events
// (message_start, ping, content_block_start / _delta / _stop, message_delta, message_stop), errors as
// {"type": "error", "error": {"type", "message"}}.
//
//   completion_request r = parse_messages_request(body);            // throws api_error (400)
//   json j = messages_response(r, "msg_1", reply, n_prompt);        // a whole answer
#pragma once

#include <memory>
#include <string>
#include <string_view>

#include "net/http/detail/daemon_internals.h"
#include "net/http/openai.h"

namespace troupe::http {

// The chat request a Messages request means. count_tokens: max_tokens is not required. Throws api_error
// (400) naming the field in Anthropic's terms.
completion_request parse_messages_request(std::string_view body, bool count_tokens = false);

// A whole answer: {"id", "type": "message", "role": "assistant", "content": [...], "stop_reason", ...}.
json messages_response(const completion_request& r, const std::string& id, const actors::generate_reply& reply);

// An error in Anthropic's shape; its type from the status (400 invalid_request_error, 401 authentication_error,
// 404 not_found_error, 429 rate_limit_error, 503 overloaded_error, else api_error).
json messages_error(const api_error& e);

// How a Messages answer goes out (write_answer's format): n_prompt for message_start's usage.
std::unique_ptr<detail::answer_format> messages_format(const completion_request& r, std::string id, uint32_t n_prompt);

}  // namespace troupe::http
