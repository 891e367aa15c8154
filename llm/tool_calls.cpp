#include "llm/tool_calls.h"

#include <nlohmann/json.hpp>

#include "llm/grammar.h"

namespace troupe::llm {
namespace {

using ojson = nlohmann::ordered_json;

constexpr std::string_view call_open = "<tool_call>", call_close = "</tool_call>", python_tag = "<|python_tag|>";

std::string_view trim(std::string_view s) {
  const auto ws = [](char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; };
  while (!s.empty() && ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && ws(s.back())) s.remove_suffix(1);
  return s;
}

ojson parse_or_null(std::string_view text) {
  try {
    return ojson::parse(text);
  } catch (const ojson::exception&) {
    return nullptr;
  }
}

ojson tool_json(const tool_function& t) {
  ojson params = parse_or_null(t.parameters);
  if (params.is_null()) params = ojson::object();
  return ojson{{"type", "function"},
               {"function", {{"name", t.name}, {"description", t.description}, {"parameters", params}}}};
}

// A call object {"name": ..., "arguments" | "parameters": {...}} of a known function, or nullopt.
std::optional<tool_call> call_of(const ojson& j, std::span<const tool_function> tools) {
  if (!j.is_object() || !j.contains("name") || !j["name"].is_string()) return std::nullopt;
  const std::string name = j["name"].get<std::string>();
  if (std::none_of(tools.begin(), tools.end(), [&](const tool_function& t) { return t.name == name; })) return std::nullopt;
  ojson args = ojson::object();
  for (const char* key : {"arguments", "parameters"}) {
    if (!j.contains(key)) continue;
    args = j[key];
    if (args.is_string()) args = parse_or_null(args.get<std::string>());
    break;
  }
  if (!args.is_object()) return std::nullopt;
  return tool_call{"", name, args.dump(-1, ' ', false, ojson::error_handler_t::replace)};
}

// The top-level {...} spans of text (strings and escapes respected), with what lies between them.
std::vector<std::pair<size_t, size_t>> object_spans(std::string_view s) {
  std::vector<std::pair<size_t, size_t>> out;
  int depth = 0;
  bool in_string = false, escaped = false;
  size_t start = 0;
  for (size_t i = 0; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '{') {
      if (depth++ == 0) start = i;
    } else if (c == '}' && depth > 0) {
      if (--depth == 0) out.emplace_back(start, i + 1);
    }
  }
  return out;
}

}  // namespace

tool_syntax tool_syntax_for(std::string_view template_name) {
  return template_name == "llama3" ? tool_syntax::llama3 : tool_syntax::hermes;
}

std::string tools_prompt(tool_syntax syntax, std::span<const tool_function> tools) {
  std::string list;
  for (const tool_function& t : tools) list += tool_json(t).dump() + "\n";
  if (syntax == tool_syntax::llama3) {
    return "Environment: ipython\n\nYou have access to the following functions. To call a function, respond with a JSON "
           "object of the form {\"name\": function name, \"parameters\": dictionary of argument name and its value}, and "
           "nothing else. Do not use variables.\n\n" +
           list;
  }
  return "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
         "signatures within <tools></tools> XML tags:\n<tools>\n" +
         list +
         "</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
         "</tool_call>";
}

std::string render_tool_calls(tool_syntax syntax, std::span<const tool_call> calls) {
  std::string out;
  for (const tool_call& c : calls) {
    ojson args = parse_or_null(c.arguments);
    if (!args.is_object()) args = ojson::object();
    // As the forced-call grammar writes it: {"name": "f", "arguments": {...}}.
    const std::string obj = "{\"name\": " + ojson(c.name).dump() + ", \"" +
                            (syntax == tool_syntax::llama3 ? "parameters" : "arguments") + "\": " + args.dump() + "}";
    if (!out.empty()) out += "\n";
    out += syntax == tool_syntax::llama3 ? obj : std::string(call_open) + "\n" + obj + "\n" + std::string(call_close);
  }
  return out;
}

chat_message render_tool_result(tool_syntax syntax, std::string_view content) {
  if (syntax == tool_syntax::llama3) return {"ipython", std::string(content)};
  return {"user", "<tool_response>\n" + std::string(content) + "\n</tool_response>"};
}

std::string tool_call_gbnf(tool_syntax syntax, std::span<const tool_function> tools, bool parallel) {
  if (tools.empty()) throw grammar_error("tools: no function to call");
  std::string rules, alts;
  for (size_t i = 0; i < tools.size(); ++i) {
    const std::string rule = "fn" + std::to_string(i);
    try {
      rules += json_schema_gbnf_rules(tools[i].parameters, rule + "-args");
    } catch (const grammar_error& e) {
      throw grammar_error("tools: function '" + tools[i].name + "': " + e.what());
    }
    const std::string name = "\"{\\\"name\\\": \\\"" + tools[i].name + "\\\", \\\"" +
                             (syntax == tool_syntax::llama3 ? "parameters" : "arguments") + "\\\": \"";
    rules += rule + " ::= " + name + " " + rule + "-args \"}\"\n";
    alts += (alts.empty() ? "" : " | ") + rule;
  }
  std::string call = "call ::= " + alts + "\n";
  if (syntax == tool_syntax::hermes) {
    call = "call ::= \"<tool_call>\\n\" ( " + alts + " ) \"\\n</tool_call>\"\n";
  }
  const std::string root = parallel ? (syntax == tool_syntax::hermes ? "root ::= call ( \"\\n\" call )*\n"
                                                                     : "root ::= call ( \"\\n\" call )*\n")
                                    : "root ::= call\n";
  return root + call + rules + std::string(json_gbnf_rules());
}

tool_output parse_tool_calls(tool_syntax syntax, std::string_view text, std::span<const tool_function> tools) {
  tool_output out;
  if (syntax == tool_syntax::llama3) {
    std::string_view body = trim(text);
    if (body.substr(0, python_tag.size()) == python_tag) body = trim(body.substr(python_tag.size()));
    const auto spans = object_spans(body);
    // Calls only when the answer is nothing but call objects (separated by blanks or ';').
    std::vector<tool_call> calls;
    size_t at = 0;
    bool all = !spans.empty();
    for (const auto& [a, b] : spans) {
      const std::string_view between = trim(body.substr(at, a - at));
      if (!between.empty() && between != ";") all = false;
      const auto c = call_of(parse_or_null(body.substr(a, b - a)), tools);
      if (!c) all = false;
      if (c) calls.push_back(*c);
      at = b;
    }
    if (all && trim(body.substr(at)).empty()) {
      out.calls = std::move(calls);
    } else {
      out.content = std::string(trim(text));
    }
    return out;
  }
  std::string content;
  size_t at = 0;
  while (at < text.size()) {
    const size_t open = text.find(call_open, at);
    if (open == std::string_view::npos) break;
    size_t close = text.find(call_close, open);
    const size_t inner = open + call_open.size();
    const size_t end = close == std::string_view::npos ? text.size() : close + call_close.size();
    if (close == std::string_view::npos) close = text.size();
    const auto c = call_of(parse_or_null(trim(text.substr(inner, close - inner))), tools);
    content += text.substr(at, open - at);
    if (c) {
      out.calls.push_back(*c);
    } else {
      content += text.substr(open, end - open);
    }
    at = end;
  }
  content += text.substr(std::min(at, text.size()));
  out.content = std::string(trim(content));
  return out;
}

size_t streamable_content(tool_syntax syntax, std::string_view text) {
  if (syntax == tool_syntax::llama3) {
    const std::string_view t = trim(text);
    if (t.empty() || t.front() == '{') return 0;
    if (python_tag.substr(0, std::min(t.size(), python_tag.size())) == t.substr(0, std::min(t.size(), python_tag.size()))) return 0;
    return text.size();
  }
  const size_t open = text.find(call_open);
  if (open != std::string_view::npos) return open;
  // Hold back a tail that may begin "<tool_call>".
  for (size_t k = std::min(call_open.size() - 1, text.size()); k > 0; --k) {
    if (text.substr(text.size() - k) == call_open.substr(0, k)) return text.size() - k;
  }
  return text.size();
}

}  // namespace troupe::llm
