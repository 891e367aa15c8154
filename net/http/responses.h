// OpenAI's Responses API (POST /v1/responses, GET / DELETE /v1/responses/{id}) on the daemon's chat
// machinery: a request (input as a string or items: messages, function_call, function_call_output;
// instructions; function tools; tool_choice; max_output_tokens; text.format) is read into the chat it means,
// continued from a stored response with previous_response_id, and answered as a response object (output items:
// reasoning, message with output_text, function_call) or its event stream (response.created,
// response.output_item.added, response.output_text.delta, response.function_call_arguments.delta, ...,
// response.completed). Responses are kept (store, default true) in a bounded in-memory store.
#pragma once

#include <list>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>

#include "net/http/openai.h"

namespace troupe::http {

namespace detail {
class answer_format;  // net/http/detail/daemon_internals.h
}

// Stored responses: the response object and the conversation it ends (the messages of its input, those of
// the responses before it, and its output as an assistant turn), the oldest dropped beyond the capacity.
// Thread-safe.
class response_store {
 public:
  struct entry {
    json response;
    nlohmann::ordered_json conversation;
  };
  explicit response_store(size_t capacity = 1024) : capacity_(capacity) {}
  void put(const std::string& id, entry e);
  std::optional<entry> get(const std::string& id) const;
  bool erase(const std::string& id);
  size_t size() const;

 private:
  size_t capacity_;
  mutable std::mutex m_;
  std::list<std::string> order_;  // oldest first
  std::unordered_map<std::string, std::pair<entry, std::list<std::string>::iterator>> items_;
};

// What a Responses request asks for besides the chat: whether to store the answer, the stored conversation it
// continues (and the messages it adds), and the fields the response object echoes.
struct responses_request {
  completion_request chat;
  bool store = true;
  std::string previous_response_id;
  nlohmann::ordered_json conversation;  // the messages up to this answer, without the instructions
  json echo;                            // instructions, tools, tool_choice, temperature, ... as given
};

// Throws api_error (400 naming the field in the Responses API's terms; 404 for an unknown
// previous_response_id).
responses_request parse_responses_request(std::string_view body, const response_store& store);

// A whole answer: the response object. chat: the request's chat as the daemon prepared it (prepare_chat).
json responses_object(const completion_request& chat, const responses_request& r, const std::string& id, int64_t created,
                      const actors::generate_reply& reply);

// How a Responses answer goes out (write_answer's format); the finished response is stored when asked.
std::unique_ptr<detail::answer_format> responses_format(const completion_request& chat, responses_request r, std::string id,
                                                        int64_t created, response_store& store);

}  // namespace troupe::http
