// Ollama's API (/api/chat, /api/generate, /api/embed, /api/tags, /api/show, /api/ps, /api/version) on the
// daemon's machinery, for the tools that speak it (Open WebUI, Continue, LangChain's ChatOllama, the ollama
// clients): a request is read into the OpenAI request it means (messages with tool_calls and thinking, tools,
// format "json" or a schema, options mapped to sampling, think) and answered in ollama's shapes: NDJSON lines
// while streaming (ollama's default), one object otherwise, durations in nanoseconds, errors as
// {"error": "..."}. Models answer to their name, their aliases and NAME:latest.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "net/http/openai.h"

namespace troupe::http {

namespace detail {
class answer_format;  // net/http/detail/daemon_internals.h
}

// /api/chat (generate false) or /api/generate (true): the chat request it means; a raw /api/generate is a
// completion of the prompt as written. Streaming unless "stream": false. Throws api_error (400).
completion_request parse_ollama_request(std::string_view body, bool generate);
// A request that only asks for the model to be loaded (no messages; no prompt), or unloaded (keep_alive 0),
// as `ollama run` sends first: its answer ({"done": true, "done_reason": "load" | "unload"}); nullopt for a
// request to answer. Throws api_error (400) for a body that is not an object with a model.
std::optional<json> ollama_load_only(std::string_view body, bool generate);
// A request's keep_alive (seconds, or a duration such as "5m"; negative: for ever) in ms;
// keep_alive_default when absent. Throws api_error (400) naming it.
int64_t ollama_keep_alive(const nlohmann::ordered_json& request);
// /api/embed and /api/embeddings: input (a string or strings; the older "prompt") as an embeddings request.
embedding_request parse_ollama_embed(std::string_view body);

// How an ollama answer goes out (write_answer's format): "message" pieces (chat) or "response" pieces
// (generate), then the last line with done_reason and the counts.
std::unique_ptr<detail::answer_format> ollama_format(const completion_request& r, bool generate, int64_t started_ns);

// {"error": message}
json ollama_error(const api_error& e);
// A time as ollama writes it: RFC 3339 in UTC with microseconds ("2026-12-07T03:25:00.123456Z").
std::string ollama_time(std::chrono::system_clock::time_point t);

}  // namespace troupe::http
