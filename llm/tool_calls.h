// Function calling: tools described to the model in its family's own format, its calls parsed back out of
// the answer, and a grammar that forces a call whose arguments match the function's schema.
//
//   std::vector<llm::tool_function> tools = {{"get_weather", "Weather of a city", R"({"type": "object", ...})"}};
//   const llm::tool_syntax syn = llm::tool_syntax_for("chatml");              // hermes
//   std::string system = llm::tools_prompt(syn, tools);                      // appended to the system message
//   std::string gbnf = llm::tool_call_gbnf(syn, tools, /*parallel=*/false);  // tool_choice "required"
//   llm::tool_output out = llm::parse_tool_calls(syn, answer_text, tools);   // out.calls, out.content
//
// Two syntaxes, as the model families were trained:
//   hermes  (ChatML models: Qwen 2.5 / 3, SmolLM2, Hermes): the tools as JSON inside <tools></tools> in the
//           system message; a call is <tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>; a tool's
//           result comes back in a user turn as <tool_response>\n...\n</tool_response>.
//   llama3  (Llama 3.1+): the tools as JSON in the system message with the instruction to answer with
//           {"name": ..., "parameters": {...}}; a result comes back in an "ipython" turn.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "llm/chat_template.h"

namespace troupe::llm {

struct tool_function {
  std::string name;
  std::string description;
  std::string parameters = "{}";  // a JSON Schema (JSON text), in its own key order
};

struct tool_call {
  std::string id;         // "call_..." (the caller's naming)
  std::string name;
  std::string arguments;  // a JSON object (text)
  friend bool operator==(const tool_call&, const tool_call&) = default;
};

enum class tool_syntax { hermes, llama3 };

// The syntax of a chat template family ("llama3" -> llama3; every other family -> hermes).
tool_syntax tool_syntax_for(std::string_view template_name);

// The instructions and tool list for the system message.
std::string tools_prompt(tool_syntax syntax, std::span<const tool_function> tools);
// An assistant turn's calls as the model writes them (for the conversation history).
std::string render_tool_calls(tool_syntax syntax, std::span<const tool_call> calls);
// A tool's result as a message of the conversation (role and content the template renders).
chat_message render_tool_result(tool_syntax syntax, std::string_view content);

// GBNF for an answer that is one call (or, with parallel, one or more) of one of `tools`, the arguments
// following each function's parameters schema. Throws grammar_error naming the function whose schema
// cannot be compiled.
std::string tool_call_gbnf(tool_syntax syntax, std::span<const tool_function> tools, bool parallel);

struct tool_output {
  std::string content;          // the text outside the calls (trimmed)
  std::vector<tool_call> calls; // in order; ids left empty
};
// The calls in an answer: each well-formed call of a function in `tools` (others are left in content).
tool_output parse_tool_calls(tool_syntax syntax, std::string_view text, std::span<const tool_function> tools);
// How many bytes of `text` (an answer so far) are content that no call can begin in: what a streamed
// answer may send as content now. The rest is held back (a call's start, or what may become one).
size_t streamable_content(tool_syntax syntax, std::string_view text);

}  // namespace troupe::llm
