// Function calling: tools described to the model, its calls parsed back out of the answer in the format
// the model was trained on, and a grammar that forces a call whose arguments match the function's schema.
//
//   std::vector<llm::tool_function> tools = {{"get_weather", "Weather of a city", R"({"type": "object", ...})"}};
//   const llm::tool_syntax syn = llm::detect_tool_syntax(template_source);  // the model's own chat template
//   std::string gbnf = llm::tool_call_gbnf(syn, tools, /*parallel=*/false);  // tool_choice "required"
//   auto triggers = llm::tool_call_triggers(syn);        // or: a lazy grammar, switched on at a trigger
//   llm::tool_output out = llm::parse_tool_calls(syn, answer_text, tools);   // out.calls, out.content
//
// The syntaxes (what a call looks like in the answer; "..." are the arguments, a JSON object):
//   hermes           Qwen 2.5 / 3, Hermes, QwQ, MiMo, Bielik, Granite 4:
//                    <tool_call>\n{"name": "f", "arguments": {...}}\n</tool_call>
//   llama3           Llama 3.x: the bare object {"name": "f", "parameters": {...}}, perhaps after <|python_tag|>;
//                    only an answer that is nothing but calls is calls
//   mistral          Mistral Nemo: [TOOL_CALLS][{"name": "f", "arguments": {...}, "id": "abcdef123"}, ...];
//                    Ministral 3, Devstral, Magistral: [TOOL_CALLS]f[ARGS]{...} once per call (both parse)
//   deepseek_r1      <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{...}\n```
//                    <｜tool▁call▁end｜>...<｜tool▁calls▁end｜>
//   deepseek_v31     DeepSeek V3.1: <｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{...}<｜tool▁call▁end｜>
//                    ...<｜tool▁calls▁end｜> (either DeepSeek form parses under both)
//   dsml             DeepSeek V3.2 / V4: a <｜DSML｜function_calls> (or <｜DSML｜tool_calls>) block of
//                    <｜DSML｜invoke name="f"> with <｜DSML｜parameter name="k" string="true|false">v
//                    </｜DSML｜parameter> each, then </｜DSML｜invoke>; string="false" values are JSON
//   functionary_v31  <function=f>{...}</function>; <|python_tag|>code calls the tool "python" ({"code": ...})
//   functionary_v32  >>>f\n{...} segments (the first may come without >>>, the prompt ends with it);
//                    >>>all\ntext is content
//   granite          Granite 3.x: <|tool_call|>[{"name": "f", "arguments": {...}}, ...]
//   command_r7b      <|START_ACTION|>[{"tool_call_id": "0", "tool_name": "f", "parameters": {...}}, ...]
//                    <|END_ACTION|>; the text of <|START_RESPONSE|>...<|END_RESPONSE|> is content
//   gpt_oss          harmony: <|channel|>commentary to=functions.f <|constrain|>json<|message|>{...}<|call|>,
//                    later calls after <|start|>assistant; the rest (analysis and final channels, their
//                    markup included) is left in content for the caller to split
//   qwen3_coder      Qwen3-Coder, Nemotron 3: <tool_call>\n<function=f>\n<parameter=k>\nv\n</parameter>\n
//                    </function>\n</tool_call>
//   glm4             GLM 4.5 / 4.6 / 4.7, Laguna: <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value>...
//                    </tool_call> (newlines after f and between pairs allowed)
//   kimi_k2          <|tool_calls_section_begin|><|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>
//                    {...}<|tool_call_end|>...<|tool_calls_section_end|>
//   apriel           Apriel (and MiniMax M1): <tool_calls>[{"name": "f", "arguments": {...}}, ...]</tool_calls>
//                    (objects one per line, without the brackets, parse too)
//   generic          templates with no tool format of their own: the model is told (tools_prompt) to answer
//                    with the JSON object {"tool_calls": [{"name": "f", "arguments": {...}}]} or
//                    {"response": "..."}; the whole answer is that object
// In the XML-parameter formats (dsml, qwen3_coder, glm4) a value is a string where the function's schema
// gives the parameter "type": "string" (dsml: string="true") or where it does not parse as JSON, otherwise
// the JSON value; qwen3_coder's values lose one newline at each end.
//
// Which syntax: detect_tool_syntax reads a chat template's source; tool_syntax_for maps troupe's own
// template families (no Jinja) to hermes or llama3, whose prompts tools_prompt writes (and generic's).
#pragma once

#include <optional>
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
  std::string id;         // the format's id where it carries one (Mistral Nemo's, Kimi's "functions.f:0"), else ""
  std::string name;
  std::string arguments;  // a JSON object (compact text, keys in the model's order)
  friend bool operator==(const tool_call&, const tool_call&) = default;
};

enum class tool_syntax {
  hermes,
  llama3,
  mistral,
  deepseek_r1,
  deepseek_v31,
  dsml,
  functionary_v31,
  functionary_v32,
  granite,
  command_r7b,
  gpt_oss,
  qwen3_coder,
  glm4,
  kimi_k2,
  apriel,
  generic,
};

// The syntax of a chat template family ("llama3" -> llama3; every other family -> hermes).
tool_syntax tool_syntax_for(std::string_view template_name);
// The syntax a Jinja chat template's source text writes calls in, by its distinctive markers (generic when
// it has none).
// The deepest nesting of arrays and objects in JSON text (strings skipped; not validated). Callers refuse
// deep values before parsing them: printing and copying nlohmann values recurses.
int json_nesting(std::string_view text);

tool_syntax detect_tool_syntax(std::string_view template_source);
// "hermes", "llama3", "mistral", "deepseek-r1", "deepseek-v3.1", "dsml", "functionary-v3.1",
// "functionary-v3.2", "granite", "command-r7b", "gpt-oss", "qwen3-coder", "glm4", "kimi-k2", "apriel",
// "generic"; tool_syntax_named is the inverse (nullopt for any other name).
std::string_view tool_syntax_name(tool_syntax syntax);
std::optional<tool_syntax> tool_syntax_named(std::string_view name);

// The instructions and tool list for the system message: the hermes and llama3 prompts, generic's JSON
// protocol; for the other syntaxes (whose templates describe the tools themselves) a list with an example.
std::string tools_prompt(tool_syntax syntax, std::span<const tool_function> tools);
// An assistant turn's calls as the model writes them (for the conversation history); starts with one of
// tool_call_triggers(syntax).
std::string render_tool_calls(tool_syntax syntax, std::span<const tool_call> calls);
// A tool's result as a message of the conversation (role and content the template renders): llama3's
// "ipython" turn, else hermes' <tool_response> in a user turn.
chat_message render_tool_result(tool_syntax syntax, std::string_view content);

// GBNF for an answer that is one call (or, with parallel, one or more) of one of `tools`, the arguments
// following each function's parameters schema (XML-parameter formats: strings are text without '<', other
// values JSON of the parameter's schema). Every sentence starts with one of tool_call_triggers(syntax), so
// the grammar may also be switched on lazily where a trigger appears. Throws grammar_error naming the
// function whose schema cannot be compiled.
std::string tool_call_gbnf(tool_syntax syntax, std::span<const tool_function> tools, bool parallel);
// The strings a call begins with: generation may run free until one appears, then tool_call_gbnf
// constrains the rest from the trigger's first byte on.
std::vector<std::string> tool_call_triggers(tool_syntax syntax);
// Every marker of the syntax (openings, separators, closings): where the vocabulary has one as a control
// token, the answer must show it as text for the parser to see it (generate_params::preserved_tokens).
std::vector<std::string> tool_call_markers(tool_syntax syntax);

struct tool_output {
  std::string content;          // the text outside the calls (trimmed)
  std::vector<tool_call> calls; // in order; ids where the format carries them
};
// The calls in an answer: each well-formed call of a function in `tools` (malformed calls and calls of
// other functions are left in content). Never throws, whatever the bytes.
tool_output parse_tool_calls(tool_syntax syntax, std::string_view text, std::span<const tool_function> tools);
// How many bytes of `text` (an answer so far) are content that no call can begin in: what a streamed
// answer may send as content now. The rest is held back (a call's start, or what may become one). For
// llama3 and generic, whose calls are the whole answer, nothing while the answer may be a call.
size_t streamable_content(tool_syntax syntax, std::string_view text);

}  // namespace troupe::llm
