#include "llm/tool_calls.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <functional>
#include <utility>

#include "llm/grammar.h"

namespace troupe::llm {

namespace {

// Walks JSON text from `from`, outside its strings (escapes respected): on(i, c) for each bracket, until it
// returns true; the position it stopped at, or npos.
template <class F>
size_t each_bracket(std::string_view s, size_t from, F on) {
  bool in_string = false, escaped = false;
  for (size_t i = from; i < s.size(); ++i) {
    const char c = s[i];
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
    } else if (c == '"') {
      in_string = true;
    } else if ((c == '{' || c == '[' || c == '}' || c == ']') && on(i, c)) {
      return i;
    }
  }
  return std::string_view::npos;
}

}  // namespace

int json_nesting(std::string_view text) {
  int depth = 0, deepest = 0;
  each_bracket(text, 0, [&](size_t, char c) {
    if (c == '{' || c == '[') {
      deepest = std::max(deepest, ++depth);
    } else {
      --depth;
    }
    return false;
  });
  return deepest;
}
namespace {

using ojson = nlohmann::ordered_json;
using sv = std::string_view;
constexpr size_t npos = sv::npos;

// The markers of the formats.
constexpr sv call_open = "<tool_call>", call_close = "</tool_call>", python_tag = "<|python_tag|>";
constexpr sv mistral_calls = "[TOOL_CALLS]", mistral_args = "[ARGS]", mistral_call_id = "[CALL_ID]";
constexpr sv ds_calls_begin = "<｜tool▁calls▁begin｜>", ds_calls_end = "<｜tool▁calls▁end｜>",
             ds_call_begin = "<｜tool▁call▁begin｜>", ds_call_end = "<｜tool▁call▁end｜>", ds_sep = "<｜tool▁sep｜>";
constexpr sv dsml_function_calls = "<｜DSML｜function_calls>", dsml_tool_calls = "<｜DSML｜tool_calls>",
             dsml_invoke = "<｜DSML｜invoke name=\"", dsml_invoke_end = "</｜DSML｜invoke>",
             dsml_param = "<｜DSML｜parameter name=\"", dsml_param_end = "</｜DSML｜parameter>";
constexpr sv fn_open = "<function=", fn_close = "</function>", param_open = "<parameter=", param_close = "</parameter>";
constexpr sv v32_mark = ">>>";
constexpr sv granite_open = "<|tool_call|>";
constexpr sv action_open = "<|START_ACTION|>", action_close = "<|END_ACTION|>";
constexpr sv oss_to = " to=functions.", oss_channel_call = "<|channel|>commentary to=functions.",
             oss_start = "<|start|>", oss_channel = "<|channel|>", oss_message = "<|message|>";
constexpr sv arg_key = "<arg_key>", arg_key_end = "</arg_key>", arg_value = "<arg_value>", arg_value_end = "</arg_value>";
constexpr sv kimi_begin = "<|tool_calls_section_begin|>", kimi_begin2 = "<|tool_call_section_begin|>",
             kimi_end = "<|tool_calls_section_end|>", kimi_end2 = "<|tool_call_section_end|>",
             kimi_call = "<|tool_call_begin|>", kimi_arg = "<|tool_call_argument_begin|>", kimi_call_end = "<|tool_call_end|>";
constexpr sv apriel_open = "<tool_calls>", apriel_close = "</tool_calls>";

bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

sv trim(sv s) {
  while (!s.empty() && is_ws(s.front())) s.remove_prefix(1);
  while (!s.empty() && is_ws(s.back())) s.remove_suffix(1);
  return s;
}

// s[a, b), clamped (never throws).
sv slice(sv s, size_t a, size_t b = npos) {
  a = std::min(a, s.size());
  b = std::min(std::max(a, b), s.size());
  return s.substr(a, b - a);
}

bool at(sv s, size_t pos, sv p) { return pos <= s.size() && s.substr(pos).substr(0, p.size()) == p; }

size_t skip_ws(sv s, size_t pos) {
  while (pos < s.size() && is_ws(s[pos])) ++pos;
  return pos;
}

// The end of the JSON object or array that starts at s[pos] (just past its closing bracket), strings and
// escapes respected; npos when it does not close.
size_t json_end(sv s, size_t pos) {
  if (pos >= s.size() || (s[pos] != '{' && s[pos] != '[')) return npos;
  int depth = 0;
  const size_t close = each_bracket(s, pos, [&](size_t, char c) {
    if (c == '{' || c == '[') {
      ++depth;
      return false;
    }
    return --depth == 0;
  });
  return close == npos ? npos : close + 1;
}

// JSON text, or null where it is not JSON (or nests deeper than any arguments should: dump recurses).
ojson parse_or_null(sv text) {
  if (json_nesting(text) > 128) return nullptr;
  try {
    return ojson::parse(text);
  } catch (const ojson::exception&) {
    return nullptr;
  }
}

std::string compact(const ojson& j) { return j.dump(-1, ' ', false, ojson::error_handler_t::replace); }

ojson tool_json(const tool_function& t) {
  ojson params = parse_or_null(t.parameters);
  if (params.is_null()) params = ojson::object();
  return ojson{{"type", "function"},
               {"function", {{"name", t.name}, {"description", t.description}, {"parameters", params}}}};
}

const tool_function* find_tool(std::span<const tool_function> tools, sv name) {
  for (const tool_function& t : tools) {
    if (t.name == name) return &t;
  }
  return nullptr;
}

// A call of a known function with these arguments (a JSON object, or a string holding one), or nullopt.
std::optional<tool_call> make_call(std::span<const tool_function> tools, sv name, ojson args, std::string id = "") {
  if (find_tool(tools, name) == nullptr) return std::nullopt;
  if (args.is_string()) args = parse_or_null(args.get_ref<const std::string&>());
  if (!args.is_object()) return std::nullopt;
  return tool_call{std::move(id), std::string(name), compact(args)};
}

// A call object {name_key: "f", args_key: {...}} (args_key: the first of arguments_keys present).
std::optional<tool_call> call_of(const ojson& j, std::span<const tool_function> tools, const char* name_key = "name",
                                 std::initializer_list<const char*> arguments_keys = {"arguments", "parameters"}) {
  if (!j.is_object()) return std::nullopt;
  const auto name = j.find(name_key);
  if (name == j.end() || !name->is_string()) return std::nullopt;
  ojson args = ojson::object();
  for (const char* key : arguments_keys) {
    const auto a = j.find(key);
    if (a == j.end()) continue;
    args = *a;
    break;
  }
  return make_call(tools, name->get_ref<const std::string&>(), std::move(args));
}

// Every element of a JSON array a call object (at least one), or nullopt.
std::optional<std::vector<tool_call>> calls_of_array(const ojson& j, std::span<const tool_function> tools,
                                                     const char* name_key = "name",
                                                     std::initializer_list<const char*> arguments_keys = {"arguments", "parameters"}) {
  if (!j.is_array() || j.empty()) return std::nullopt;
  std::vector<tool_call> calls;
  for (const ojson& e : j) {
    auto c = call_of(e, tools, name_key, arguments_keys);
    if (!c) return std::nullopt;
    calls.push_back(std::move(*c));
  }
  return calls;
}

// The top-level {...} spans of text (strings and escapes respected).
std::vector<std::pair<size_t, size_t>> object_spans(sv s) {
  std::vector<std::pair<size_t, size_t>> out;
  int depth = 0;  // of braces only: a bracket does not end an object
  size_t start = 0;
  each_bracket(s, 0, [&](size_t i, char c) {
    if (c == '{') {
      if (depth++ == 0) start = i;
    } else if (c == '}' && depth > 0) {
      if (--depth == 0) out.emplace_back(start, i + 1);
    }
    return false;
  });
  return out;
}

// Whether the function's schema gives parameter `key` the type "string" (alone or among others).
bool string_parameter(const tool_function& t, sv key) {
  const ojson schema = parse_or_null(t.parameters);
  if (!schema.is_object()) return false;
  const auto props = schema.find("properties");
  if (props == schema.end() || !props->is_object()) return false;
  const auto p = props->find(std::string(key));
  if (p == props->end() || !p->is_object()) return false;
  const auto type = p->find("type");
  if (type == p->end()) return false;
  if (type->is_string()) return type->get_ref<const std::string&>() == "string";
  if (type->is_array()) {
    return std::any_of(type->begin(), type->end(), [](const ojson& x) { return x.is_string() && x.get_ref<const std::string&>() == "string"; });
  }
  return false;
}

// An XML-parameter value: a string where the schema says so or where it is not JSON, else its JSON.
ojson xml_value(const tool_function& t, sv key, sv raw) {
  if (string_parameter(t, key)) return ojson(std::string(raw));
  ojson v = parse_or_null(trim(raw));
  if (v.is_discarded() || (v.is_null() && trim(raw) != "null")) return ojson(std::string(raw));
  return v;
}

// An argument's text in an XML-parameter format: strings as they are, other values as JSON.
std::string value_text(const ojson& v) { return v.is_string() ? v.get<std::string>() : compact(v); }

ojson args_object(const std::string& arguments) {
  ojson args = parse_or_null(arguments);
  return args.is_object() ? args : ojson::object();
}

// ---- Parsing: a scan over the openings of blocks ----

struct block {
  size_t begin;  // where the block starts (its opening, or a header just before it)
  size_t end;    // just past it (> the opening)
  std::optional<std::vector<tool_call>> calls;  // nullopt: malformed (its text stays content)
};

// Content and calls: each block that parses is taken out of the text, the rest is content.
tool_output scan(sv text, std::span<const sv> openings, const std::function<block(sv, size_t, sv)>& parse_block) {
  tool_output out;
  std::string content;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t open = npos;
    sv which;
    for (const sv o : openings) {
      const size_t p = text.find(o, pos);
      if (p < open) open = p, which = o;
    }
    if (open == npos) break;
    block b = parse_block(text, open, which);
    b.begin = std::clamp(b.begin, pos, open);
    b.end = std::clamp(b.end, open + 1, text.size());
    content += slice(text, pos, b.begin);
    if (b.calls) {
      for (tool_call& c : *b.calls) out.calls.push_back(std::move(c));
    } else {
      content += slice(text, b.begin, b.end);
    }
    pos = b.end;
  }
  content += slice(text, pos);
  out.content = std::string(trim(content));
  return out;
}

using calls_t = std::optional<std::vector<tool_call>>;

calls_t one(std::optional<tool_call> c) {
  if (!c) return std::nullopt;
  return std::vector<tool_call>{std::move(*c)};
}

// hermes: <tool_call> {json} </tool_call> (the close may be missing at the end).
block hermes_block(sv text, size_t open, std::span<const tool_function> tools) {
  const size_t inner = open + call_open.size();
  const size_t close = text.find(call_close, inner);
  const size_t end = close == npos ? text.size() : close + call_close.size();
  return {open, end, one(call_of(parse_or_null(trim(slice(text, inner, close))), tools))};
}

// qwen3_coder's <function=f> <parameter=k>\nv\n</parameter>... </function>, the whole of s (blanks around).
std::optional<tool_call> qwen_function(sv s, std::span<const tool_function> tools) {
  s = trim(s);
  if (!at(s, 0, fn_open)) return std::nullopt;
  const size_t name_end = s.find('>', fn_open.size());
  if (name_end == npos) return std::nullopt;
  const tool_function* t = find_tool(tools, trim(slice(s, fn_open.size(), name_end)));
  if (t == nullptr) return std::nullopt;
  ojson args = ojson::object();
  size_t pos = name_end + 1;
  while (true) {
    pos = skip_ws(s, pos);
    if (pos >= s.size()) break;  // no </function>: tolerated at the end
    if (at(s, pos, fn_close)) {
      if (skip_ws(s, pos + fn_close.size()) != s.size()) return std::nullopt;
      break;
    }
    if (!at(s, pos, param_open)) return std::nullopt;
    const size_t key_end = s.find('>', pos + param_open.size());
    if (key_end == npos) return std::nullopt;
    const sv key = trim(slice(s, pos + param_open.size(), key_end));
    const size_t value_end = s.find(param_close, key_end + 1);
    if (value_end == npos || key.empty()) return std::nullopt;
    sv raw = slice(s, key_end + 1, value_end);
    if (!raw.empty() && raw.front() == '\n') raw.remove_prefix(1);
    if (!raw.empty() && raw.back() == '\n') raw.remove_suffix(1);
    args[std::string(key)] = xml_value(*t, key, raw);
    pos = value_end + param_close.size();
  }
  return tool_call{"", t->name, compact(args)};
}

block qwen3_coder_block(sv text, size_t open, sv which, std::span<const tool_function> tools) {
  if (which == call_open) {
    const size_t inner = open + call_open.size();
    const size_t close = text.find(call_close, inner);
    const size_t end = close == npos ? text.size() : close + call_close.size();
    return {open, end, one(qwen_function(slice(text, inner, close), tools))};
  }
  const size_t close = text.find(fn_close, open);
  const size_t end = close == npos ? text.size() : close + fn_close.size();
  return {open, end, one(qwen_function(slice(text, open, end), tools))};
}

// glm4: <tool_call>f<arg_key>k</arg_key><arg_value>v</arg_value>...</tool_call>.
block glm4_block(sv text, size_t open, std::span<const tool_function> tools) {
  const size_t inner = open + call_open.size();
  const size_t close = text.find(call_close, inner);
  const size_t end = close == npos ? text.size() : close + call_close.size();
  const sv body = slice(text, inner, close);
  const size_t first_key = body.find(arg_key);
  const tool_function* t = find_tool(tools, trim(slice(body, 0, first_key)));
  if (t == nullptr) return {open, end, std::nullopt};
  ojson args = ojson::object();
  size_t pos = first_key == npos ? body.size() : first_key;
  while (true) {
    pos = skip_ws(body, pos);
    if (pos >= body.size()) break;
    if (!at(body, pos, arg_key)) return {open, end, std::nullopt};
    const size_t key_end = body.find(arg_key_end, pos);
    if (key_end == npos) return {open, end, std::nullopt};
    const sv key = trim(slice(body, pos + arg_key.size(), key_end));
    pos = skip_ws(body, key_end + arg_key_end.size());
    if (!at(body, pos, arg_value)) return {open, end, std::nullopt};
    const size_t value_end = body.find(arg_value_end, pos);
    if (value_end == npos || key.empty()) return {open, end, std::nullopt};
    args[std::string(key)] = xml_value(*t, key, slice(body, pos + arg_value.size(), value_end));
    pos = value_end + arg_value_end.size();
  }
  return {open, end, one(tool_call{"", t->name, compact(args)})};
}

// dsml: a <｜DSML｜function_calls> / <｜DSML｜tool_calls> block of invokes (all well-formed, or none taken).
block dsml_block(sv text, size_t open, sv which, std::span<const tool_function> tools) {
  const std::string close_tag = "</" + std::string(which.substr(1));
  const size_t inner = open + which.size();
  const size_t close = text.find(close_tag, inner);
  const size_t end = close == npos ? text.size() : close + close_tag.size();
  const sv body = slice(text, inner, close);
  std::vector<tool_call> calls;
  size_t pos = 0;
  while (true) {
    pos = skip_ws(body, pos);
    if (pos >= body.size()) break;
    if (!at(body, pos, dsml_invoke)) return {open, end, std::nullopt};
    const size_t name_end = body.find("\">", pos + dsml_invoke.size());
    if (name_end == npos) return {open, end, std::nullopt};
    const tool_function* t = find_tool(tools, slice(body, pos + dsml_invoke.size(), name_end));
    if (t == nullptr) return {open, end, std::nullopt};
    ojson args = ojson::object();
    pos = name_end + 2;
    while (true) {
      pos = skip_ws(body, pos);
      if (at(body, pos, dsml_invoke_end)) {
        pos += dsml_invoke_end.size();
        break;
      }
      if (!at(body, pos, dsml_param)) return {open, end, std::nullopt};
      const size_t key_end = body.find('"', pos + dsml_param.size());
      const size_t header_end = key_end == npos ? npos : body.find('>', key_end);
      if (header_end == npos) return {open, end, std::nullopt};
      const sv key = slice(body, pos + dsml_param.size(), key_end);
      const sv attrs = slice(body, key_end + 1, header_end);
      const size_t value_end = body.find(dsml_param_end, header_end + 1);
      if (value_end == npos || key.empty()) return {open, end, std::nullopt};
      const sv raw = slice(body, header_end + 1, value_end);
      if (attrs.find("string=\"true\"") != npos) {
        args[std::string(key)] = std::string(raw);
      } else if (attrs.find("string=\"false\"") != npos) {
        ojson v = parse_or_null(trim(raw));
        if (v.is_null() && trim(raw) != "null") v = std::string(raw);
        args[std::string(key)] = std::move(v);
      } else {
        args[std::string(key)] = xml_value(*t, key, raw);
      }
      pos = value_end + dsml_param_end.size();
    }
    calls.push_back({"", t->name, compact(args)});
  }
  if (calls.empty()) return {open, end, std::nullopt};
  return {open, end, std::move(calls)};
}

// DeepSeek: the text between <｜tool▁call▁begin｜> and <｜tool▁call▁end｜>, in R1's form
// (function<｜tool▁sep｜>f\n```json\n{...}\n```) or V3.1's (f<｜tool▁sep｜>{...}).
std::optional<tool_call> deepseek_call(sv c, std::span<const tool_function> tools) {
  const size_t sep = c.find(ds_sep);
  if (sep == npos) return std::nullopt;
  const sv before = trim(slice(c, 0, sep)), after = slice(c, sep + ds_sep.size());
  sv name, args;
  const size_t nl = after.find('\n');
  if (nl != npos && find_tool(tools, trim(slice(after, 0, nl))) != nullptr && find_tool(tools, before) == nullptr) {
    name = trim(slice(after, 0, nl));
    args = trim(slice(after, nl));
  } else {
    name = before;
    args = trim(after);
  }
  if (at(args, 0, "```")) {
    const size_t line = args.find('\n');
    args = line == npos ? sv() : slice(args, line + 1);
    args = trim(args);
    if (args.size() >= 3 && args.substr(args.size() - 3) == "```") args.remove_suffix(3);
    args = trim(args);
  }
  if (args.empty() || args.front() != '{') return std::nullopt;
  return make_call(tools, name, parse_or_null(args));
}

block deepseek_block(sv text, size_t open, sv which, std::span<const tool_function> tools) {
  if (which == ds_call_begin) {  // a call outside a section
    const size_t close = text.find(ds_call_end, open);
    const size_t end = close == npos ? text.size() : close + ds_call_end.size();
    return {open, end, one(deepseek_call(slice(text, open + ds_call_begin.size(), close), tools))};
  }
  const size_t inner = open + ds_calls_begin.size();
  const size_t close = text.find(ds_calls_end, inner);
  const size_t end = close == npos ? text.size() : close + ds_calls_end.size();
  const sv body = slice(text, inner, close);
  std::vector<tool_call> calls;
  size_t pos = 0;
  while (true) {
    pos = skip_ws(body, pos);
    if (pos >= body.size()) break;
    if (!at(body, pos, ds_call_begin)) return {open, end, std::nullopt};
    const size_t call_end = body.find(ds_call_end, pos);
    auto c = deepseek_call(slice(body, pos + ds_call_begin.size(), call_end), tools);
    if (!c) return {open, end, std::nullopt};
    calls.push_back(std::move(*c));
    pos = call_end == npos ? body.size() : call_end + ds_call_end.size();
  }
  if (calls.empty()) return {open, end, std::nullopt};
  return {open, end, std::move(calls)};
}

// kimi_k2: a section of <|tool_call_begin|>functions.f:0<|tool_call_argument_begin|>{...}<|tool_call_end|>.
block kimi_block(sv text, size_t open, sv which, std::span<const tool_function> tools) {
  const size_t inner = open + which.size();
  size_t close = text.find(kimi_end, inner);
  sv close_tag = kimi_end;
  if (const size_t c2 = text.find(kimi_end2, inner); c2 < close) close = c2, close_tag = kimi_end2;
  const size_t end = close == npos ? text.size() : close + close_tag.size();
  const sv body = slice(text, inner, close);
  std::vector<tool_call> calls;
  size_t pos = 0;
  while (true) {
    pos = skip_ws(body, pos);
    if (pos >= body.size()) break;
    if (!at(body, pos, kimi_call)) return {open, end, std::nullopt};
    const size_t arg = body.find(kimi_arg, pos);
    if (arg == npos) return {open, end, std::nullopt};
    const sv id = trim(slice(body, pos + kimi_call.size(), arg));
    sv name = id;
    if (at(name, 0, "functions.")) name.remove_prefix(10);
    if (const size_t colon = name.rfind(':'); colon != npos) name = name.substr(0, colon);
    const size_t call_end = body.find(kimi_call_end, arg);
    auto c = make_call(tools, name, parse_or_null(trim(slice(body, arg + kimi_arg.size(), call_end))), std::string(id));
    if (!c) return {open, end, std::nullopt};
    calls.push_back(std::move(*c));
    pos = call_end == npos ? body.size() : call_end + kimi_call_end.size();
  }
  if (calls.empty()) return {open, end, std::nullopt};
  return {open, end, std::move(calls)};
}

// apriel: <tool_calls>[{...}, ...]</tool_calls>, or objects without the brackets (one a line).
block apriel_block(sv text, size_t open, std::span<const tool_function> tools) {
  const size_t inner = open + apriel_open.size();
  const size_t close = text.find(apriel_close, inner);
  const size_t end = close == npos ? text.size() : close + apriel_close.size();
  const sv body = trim(slice(text, inner, close));
  if (!body.empty() && body.front() == '[') return {open, end, calls_of_array(parse_or_null(body), tools)};
  std::vector<tool_call> calls;
  size_t pos = 0;
  for (const auto& [a, b] : object_spans(body)) {
    const sv between = trim(slice(body, pos, a));
    if (!between.empty() && between != ",") return {open, end, std::nullopt};
    auto c = call_of(parse_or_null(slice(body, a, b)), tools);
    if (!c) return {open, end, std::nullopt};
    calls.push_back(std::move(*c));
    pos = b;
  }
  if (calls.empty() || !trim(slice(body, pos)).empty()) return {open, end, std::nullopt};
  return {open, end, std::move(calls)};
}

// A JSON array (or object) right after the marker: granite's <|tool_call|>[...], command_r7b's action.
block json_after(sv text, size_t open, sv marker, sv close_tag, std::span<const tool_function> tools,
                 const char* name_key, std::initializer_list<const char*> arguments_keys) {
  const size_t start = skip_ws(text, open + marker.size());
  const size_t json_stop = json_end(text, start);
  if (json_stop == npos) {
    const bool opened = start < text.size() && (text[start] == '[' || text[start] == '{');
    return {open, opened ? text.size() : open + marker.size(), std::nullopt};
  }
  size_t end = json_stop;
  if (!close_tag.empty()) {
    const size_t c = skip_ws(text, end);
    if (at(text, c, close_tag)) end = c + close_tag.size();
  }
  const ojson j = parse_or_null(slice(text, start, json_stop));
  if (j.is_object()) return {open, end, one(call_of(j, tools, name_key, arguments_keys))};
  return {open, end, calls_of_array(j, tools, name_key, arguments_keys)};
}

// mistral: [TOOL_CALLS][{...}, ...] (Nemo, ids kept) or [TOOL_CALLS]f[CALL_ID]id[ARGS]{...} (newer).
block mistral_block(sv text, size_t open, std::span<const tool_function> tools) {
  const size_t start = skip_ws(text, open + mistral_calls.size());
  if (start < text.size() && (text[start] == '[' || text[start] == '{')) {
    const size_t stop = json_end(text, start);
    if (stop == npos) return {open, text.size(), std::nullopt};
    const ojson j = parse_or_null(slice(text, start, stop));
    const ojson list = j.is_object() ? ojson::array({j}) : j;
    auto calls = calls_of_array(list, tools);
    if (calls) {
      for (size_t i = 0; i < calls->size(); ++i) {
        const auto id = list[i].find("id");
        if (id != list[i].end() && id->is_string()) (*calls)[i].id = id->get<std::string>();
      }
    }
    return {open, stop, std::move(calls)};
  }
  const size_t args_at = text.find(mistral_args, start);
  if (args_at == npos) return {open, open + mistral_calls.size(), std::nullopt};
  sv head = slice(text, start, args_at);
  std::string id;
  if (const size_t id_at = head.find(mistral_call_id); id_at != npos) {
    id = std::string(trim(slice(head, id_at + mistral_call_id.size())));
    head = slice(head, 0, id_at);
  }
  const sv name = trim(head);
  if (name.empty() || std::any_of(name.begin(), name.end(), [](char c) { return is_ws(c) || c == '[' || c == ']'; })) {
    return {open, open + mistral_calls.size(), std::nullopt};
  }
  const size_t obj = skip_ws(text, args_at + mistral_args.size());
  const size_t stop = json_end(text, obj);
  if (stop == npos) {
    return {open, obj < text.size() && text[obj] == '{' ? text.size() : args_at + mistral_args.size(), std::nullopt};
  }
  return {open, stop, one(make_call(tools, name, parse_or_null(slice(text, obj, stop)), id))};
}

// functionary_v31: <function=f>{...}</function>, or <|python_tag|>code (the tool "python").
block functionary_v31_block(sv text, size_t open, sv which, std::span<const tool_function> tools) {
  if (which == python_tag) {
    const size_t code_at = open + python_tag.size();
    size_t stop = text.size();
    for (const sv e : {sv("<|eom_id|>"), sv("<|eot_id|>")}) stop = std::min(stop, text.find(e, code_at));
    const sv code = trim(slice(text, code_at, stop));
    if (find_tool(tools, "python") == nullptr || code.empty()) return {open, code_at, std::nullopt};
    ojson j = parse_or_null(code);
    if (j.is_string()) j = parse_or_null(j.get_ref<const std::string&>());
    if (!j.is_object()) j = ojson{{"code", std::string(code)}};
    return {open, stop, one(make_call(tools, "python", std::move(j)))};
  }
  const size_t name_end = text.find('>', open + fn_open.size());
  if (name_end == npos) return {open, open + fn_open.size(), std::nullopt};
  const sv name = slice(text, open + fn_open.size(), name_end);
  const size_t obj = skip_ws(text, name_end + 1);
  const size_t stop = json_end(text, obj);
  if (stop == npos) {
    return {open, obj < text.size() && text[obj] == '{' ? text.size() : name_end + 1, std::nullopt};
  }
  size_t end = stop;
  if (const size_t c = skip_ws(text, stop); at(text, c, fn_close)) end = c + fn_close.size();
  return {open, end, one(make_call(tools, trim(name), parse_or_null(slice(text, obj, stop))))};
}

// gpt_oss: [<|start|>assistant][<|channel|>commentary] to=functions.f <|constrain|>json<|message|>{...}<|call|>.
block gpt_oss_block(sv text, size_t open, sv which, std::span<const tool_function> tools) {
  const size_t to = which == oss_to ? open : open + which.size() - oss_to.size();
  const size_t name_at = to + oss_to.size();
  size_t name_end = name_at;
  while (name_end < text.size() && !is_ws(text[name_end]) && text[name_end] != '<') ++name_end;
  const sv name = slice(text, name_at, name_end);
  const size_t msg = text.find(oss_message, name_end);
  const block fail{open, name_at, std::nullopt};
  if (msg == npos) return fail;
  const sv header = slice(text, name_end, msg);
  for (const sv bad : {sv("<|end|>"), sv("<|call|>"), sv("<|start|>"), sv("<|return|>"), sv("<|message|>")}) {
    if (header.find(bad) != npos) return fail;
  }
  const size_t body = msg + oss_message.size();
  size_t stop = text.size(), end = text.size();
  for (const sv e : {sv("<|call|>"), sv("<|end|>"), sv("<|return|>")}) {
    const size_t p = text.find(e, body);
    if (p < stop) stop = p, end = p + e.size();
  }
  auto c = make_call(tools, name, parse_or_null(trim(slice(text, body, stop))));
  if (!c) return fail;
  // The header before " to=": this message's <|channel|>... and <|start|>assistant.
  size_t begin = open;
  if (which == oss_to) {
    const sv before = slice(text, 0, open);
    if (const size_t ch = before.rfind(oss_channel); ch != npos && slice(before, ch + oss_channel.size()).find("<|") == npos) begin = ch;
    const sv head = slice(text, 0, begin);
    if (const size_t st = head.rfind(oss_start); st != npos && trim(slice(head, st + oss_start.size())) == "assistant") begin = st;
  } else {
    const sv head = slice(text, 0, open);
    if (const size_t st = head.rfind(oss_start); st != npos && trim(slice(head, st + oss_start.size())) == "assistant") begin = st;
  }
  return {begin, end, one(std::move(c))};
}

// functionary_v32: >>>f\n{...} segments, >>>all\ntext content; the first segment may lack its >>>.
tool_output parse_functionary_v32(sv text, std::span<const tool_function> tools) {
  tool_output out;
  std::string content;
  size_t pos = 0;
  bool first = true;
  while (pos <= text.size()) {
    size_t mark, start;
    if (first) {
      mark = start = 0;
      first = false;
    } else {
      mark = text.find(v32_mark, pos);
      if (mark == npos) break;
      content += slice(text, pos, mark);
      start = mark + v32_mark.size();
    }
    const size_t nl = text.find('\n', start);
    const sv name = nl == npos ? sv() : trim(slice(text, start, nl));
    if (name == "all") {
      const size_t next = std::min(text.find(v32_mark, nl + 1), text.size());
      content += slice(text, nl + 1, next);
      pos = next;
      continue;
    }
    if (!name.empty() && find_tool(tools, name) != nullptr) {
      const size_t obj = skip_ws(text, nl + 1);
      const size_t stop = json_end(text, obj);
      std::optional<tool_call> c;
      size_t end = stop;
      if (stop != npos) {
        c = make_call(tools, name, parse_or_null(slice(text, obj, stop)));
      } else if (name == "python") {  // raw code up to the next segment
        end = std::min(text.find(v32_mark, nl + 1), text.size());
        const sv code = trim(slice(text, nl + 1, end));
        if (!code.empty()) c = make_call(tools, name, ojson{{"code", std::string(code)}});
      }
      if (c) {
        out.calls.push_back(std::move(*c));
        pos = end;
        continue;
      }
    }
    // Not a segment: its marker stays content.
    content += slice(text, mark, start);
    pos = start;
  }
  content += slice(text, pos);
  out.content = std::string(trim(content));
  return out;
}

// llama3: the answer is nothing but call objects (separated by blanks or ';'), perhaps after <|python_tag|>.
tool_output parse_llama3(sv text, std::span<const tool_function> tools) {
  tool_output out;
  sv body = trim(text);
  if (at(body, 0, python_tag)) body = trim(body.substr(python_tag.size()));
  const auto spans = object_spans(body);
  std::vector<tool_call> calls;
  size_t pos = 0;
  bool all = !spans.empty();
  for (const auto& [a, b] : spans) {
    const sv between = trim(slice(body, pos, a));
    if (!between.empty() && between != ";") all = false;
    auto c = call_of(parse_or_null(slice(body, a, b)), tools);
    if (!c) all = false;
    if (c) calls.push_back(std::move(*c));
    pos = b;
    if (!all) break;
  }
  if (all && trim(slice(body, pos)).empty()) {
    out.calls = std::move(calls);
  } else {
    out.content = std::string(trim(text));
  }
  return out;
}

// generic: the whole answer is {"tool_calls": [...]} (or {"tool_call": {...}}) or {"response": "..."}.
tool_output parse_generic(sv text, std::span<const tool_function> tools) {
  tool_output out;
  out.content = std::string(trim(text));
  sv body = trim(text);
  if (at(body, 0, "```")) {  // a fenced answer
    const size_t line = body.find('\n');
    body = line == npos ? sv() : trim(slice(body, line + 1));
    if (body.size() >= 3 && body.substr(body.size() - 3) == "```") body = trim(body.substr(0, body.size() - 3));
  }
  const ojson j = parse_or_null(body);
  if (!j.is_object()) return out;
  const auto text_of = [](const ojson& v) { return v.is_string() ? v.get<std::string>() : compact(v); };
  if (const auto calls = j.find("tool_calls"); calls != j.end()) {
    auto parsed = calls_of_array(*calls, tools);
    if (!parsed) return out;
    out.calls = std::move(*parsed);
    const auto c = j.find("content");
    out.content = c != j.end() && !c->is_null() ? std::string(trim(text_of(*c))) : "";
  } else if (const auto call = j.find("tool_call"); call != j.end()) {
    auto parsed = call_of(*call, tools);
    if (!parsed) return out;
    out.calls.push_back(std::move(*parsed));
    out.content.clear();
  } else if (const auto r = j.find("response"); r != j.end()) {
    out.content = std::string(trim(text_of(*r)));
  }
  return out;
}

// Where calls may begin, for parsing and streaming (a superset of the triggers).
std::vector<sv> openings(tool_syntax syntax) {
  switch (syntax) {
    case tool_syntax::hermes:
    case tool_syntax::glm4: return {call_open};
    case tool_syntax::llama3: return {python_tag, "{"};
    case tool_syntax::mistral: return {mistral_calls};
    case tool_syntax::deepseek_r1:
    case tool_syntax::deepseek_v31: return {ds_calls_begin, ds_call_begin};
    case tool_syntax::dsml: return {dsml_function_calls, dsml_tool_calls};
    case tool_syntax::functionary_v31: return {fn_open, python_tag};
    case tool_syntax::functionary_v32: return {v32_mark};
    case tool_syntax::granite: return {granite_open};
    case tool_syntax::command_r7b: return {action_open};
    case tool_syntax::gpt_oss: return {"<|start|>assistant<|channel|>commentary to=functions.", "<|start|>assistant to=functions.", oss_channel_call, oss_to};
    case tool_syntax::qwen3_coder: return {call_open, fn_open};
    case tool_syntax::kimi_k2: return {kimi_begin, kimi_begin2};
    case tool_syntax::apriel: return {apriel_open};
    case tool_syntax::generic: return {"{"};
  }
  return {};
}

// ---- Grammars ----

// A GBNF literal for bytes.
std::string lit(sv s) { return gbnf_literal(s); }

// A JSON string's text (quoted and escaped).
std::string json_quote(sv s) { return compact(ojson(std::string(s))); }

bool xml_syntax(tool_syntax s) { return s == tool_syntax::dsml || s == tool_syntax::qwen3_coder || s == tool_syntax::glm4; }

// The parameters of an XML-parameter format, in the schema's order: each its key, whether it is a string,
// whether it is required and the rule of its (non-string) value.
struct xml_param {
  std::string key;
  bool is_string, required;
  std::string value_rule;
};

std::vector<xml_param> xml_params(const tool_function& t, const std::string& rule, std::string& rules) {
  std::vector<xml_param> out;
  const ojson schema = parse_or_null(t.parameters);
  if (!schema.is_object()) return out;
  const auto props = schema.find("properties");
  if (props == schema.end() || !props->is_object()) return out;
  std::vector<std::string> required;
  if (const auto r = schema.find("required"); r != schema.end() && r->is_array()) {
    for (const ojson& k : *r) {
      if (k.is_string()) required.push_back(k.get<std::string>());
    }
  }
  size_t j = 0;
  for (const auto& [key, sub] : props->items()) {
    xml_param p{key, string_parameter(t, key), std::find(required.begin(), required.end(), key) != required.end(), "json-value"};
    if (!p.is_string) {
      const std::string name = rule + "-p" + std::to_string(j);
      try {
        rules += json_schema_gbnf_rules(compact(sub), name);
        p.value_rule = name;
      } catch (const grammar_error&) {  // a $ref into the whole schema, ...: any JSON value
      }
    }
    out.push_back(std::move(p));
    ++j;
  }
  return out;
}

// The GBNF sequence of a function's parameters, each written by `param(key literal part, is_string, value rule)`.
std::string xml_sequence(const std::vector<xml_param>& params, const std::function<std::string(const xml_param&)>& param,
                         const std::string& any_param) {
  if (params.empty()) return " ( " + any_param + " )*";
  std::string out;
  for (const xml_param& p : params) {
    const std::string one = param(p);
    out += p.required ? " " + one : " ( " + one + " )?";
  }
  return out;
}

}  // namespace

tool_syntax tool_syntax_for(std::string_view template_name) {
  return template_name == "llama3" ? tool_syntax::llama3 : tool_syntax::hermes;
}

tool_syntax detect_tool_syntax(std::string_view src) {
  const auto has = [&](sv s) { return src.find(s) != npos; };
  if (has("｜DSML｜")) return tool_syntax::dsml;
  if (has(kimi_begin) || has(kimi_begin2)) return tool_syntax::kimi_k2;
  if (has(arg_key)) return tool_syntax::glm4;
  if (has(fn_open) && has(param_open)) return tool_syntax::qwen3_coder;
  if (has(fn_open)) return tool_syntax::functionary_v31;
  if (has(">>>all")) return tool_syntax::functionary_v32;
  if (has(mistral_calls)) return tool_syntax::mistral;
  if (has(action_open)) return tool_syntax::command_r7b;
  if (has(granite_open)) return tool_syntax::granite;
  if (has(oss_channel) && has("to=functions")) return tool_syntax::gpt_oss;
  if (has(ds_call_begin)) {
    // R1 writes the call's type ("function") before the separator and fences the arguments.
    return has("function<｜tool▁sep｜>") || has("```json") || has("['type'] + '<｜tool▁sep｜>'") ? tool_syntax::deepseek_r1
                                                                                               : tool_syntax::deepseek_v31;
  }
  if (has(apriel_open)) return tool_syntax::apriel;
  // <tool_call> around MiniMax M3's <invoke name=...> is another format.
  if (has(call_open) && !has("<invoke name=")) return tool_syntax::hermes;
  if (has(python_tag) || (has("ipython") && has("<|start_header_id|>"))) return tool_syntax::llama3;
  return tool_syntax::generic;
}

namespace {
constexpr std::array<std::pair<tool_syntax, sv>, 16> syntax_names = {{
    {tool_syntax::hermes, "hermes"},
    {tool_syntax::llama3, "llama3"},
    {tool_syntax::mistral, "mistral"},
    {tool_syntax::deepseek_r1, "deepseek-r1"},
    {tool_syntax::deepseek_v31, "deepseek-v3.1"},
    {tool_syntax::dsml, "dsml"},
    {tool_syntax::functionary_v31, "functionary-v3.1"},
    {tool_syntax::functionary_v32, "functionary-v3.2"},
    {tool_syntax::granite, "granite"},
    {tool_syntax::command_r7b, "command-r7b"},
    {tool_syntax::gpt_oss, "gpt-oss"},
    {tool_syntax::qwen3_coder, "qwen3-coder"},
    {tool_syntax::glm4, "glm4"},
    {tool_syntax::kimi_k2, "kimi-k2"},
    {tool_syntax::apriel, "apriel"},
    {tool_syntax::generic, "generic"},
}};
}  // namespace

std::string_view tool_syntax_name(tool_syntax syntax) {
  for (const auto& [s, name] : syntax_names) {
    if (s == syntax) return name;
  }
  return "hermes";
}

std::optional<tool_syntax> tool_syntax_named(std::string_view name) {
  for (const auto& [s, n] : syntax_names) {
    if (n == name) return s;
  }
  return std::nullopt;
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
  if (syntax == tool_syntax::generic) {
    return "You have access to the following tools:\n" + list +
           "\nRespond with a JSON object and nothing else. To call one or more tools, respond with\n"
           "{\"tool_calls\": [{\"name\": <tool name>, \"arguments\": <arguments object>}]}\n"
           "and to answer the user directly, respond with\n{\"response\": <your answer>}";
  }
  if (syntax == tool_syntax::hermes) {
    return "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function "
           "signatures within <tools></tools> XML tags:\n<tools>\n" +
           list +
           "</tools>\n\nFor each function call, return a json object with function name and arguments within "
           "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n"
           "</tool_call>";
  }
  const std::vector<tool_call> example = {{"", "function_name", R"({"argument_name": "value"})"}};
  return "# Tools\n\nYou may call one or more functions to assist with the user query. The functions, as JSON:\n" + list +
         "\nCall a function by writing, for example:\n" + render_tool_calls(syntax, example);
}

std::string render_tool_calls(tool_syntax syntax, std::span<const tool_call> calls) {
  std::string out;
  const auto json_call = [](const tool_call& c, sv key, const std::string& tail = "") {
    return "{\"name\": " + json_quote(c.name) + ", \"" + std::string(key) + "\": " + compact(args_object(c.arguments)) + tail + "}";
  };
  const auto json_list = [&](sv key) {
    std::string list;
    for (const tool_call& c : calls) list += (list.empty() ? "" : ", ") + json_call(c, key);
    return "[" + list + "]";
  };
  switch (syntax) {
    case tool_syntax::hermes:
    case tool_syntax::llama3:
      for (const tool_call& c : calls) {
        if (!out.empty()) out += "\n";
        out += syntax == tool_syntax::llama3 ? json_call(c, "parameters")
                                             : std::string(call_open) + "\n" + json_call(c, "arguments") + "\n" + std::string(call_close);
      }
      return out;
    case tool_syntax::mistral:
      for (const tool_call& c : calls) {
        out += std::string(mistral_calls) + c.name + std::string(mistral_args) + compact(args_object(c.arguments));
      }
      return out;
    case tool_syntax::deepseek_r1:
    case tool_syntax::deepseek_v31:
      out = ds_calls_begin;
      for (size_t i = 0; i < calls.size(); ++i) {
        const std::string args = compact(args_object(calls[i].arguments));
        if (syntax == tool_syntax::deepseek_r1) {
          out += (i > 0 ? "\n" : "") + std::string(ds_call_begin) + "function" + std::string(ds_sep) + calls[i].name +
                 "\n```json\n" + args + "\n```" + std::string(ds_call_end);
        } else {
          out += std::string(ds_call_begin) + calls[i].name + std::string(ds_sep) + args + std::string(ds_call_end);
        }
      }
      return out + std::string(ds_calls_end);
    case tool_syntax::dsml:
      out = std::string(dsml_tool_calls) + "\n";
      for (const tool_call& c : calls) {
        out += std::string(dsml_invoke) + c.name + "\">\n";
        for (const ojson args = args_object(c.arguments); const auto& [k, v] : args.items()) {
          out += std::string(dsml_param) + k + "\" string=\"" + (v.is_string() ? "true" : "false") + "\">" + value_text(v) +
                 std::string(dsml_param_end) + "\n";
        }
        out += std::string(dsml_invoke_end) + "\n";
      }
      return out + "</" + std::string(dsml_tool_calls.substr(1));
    case tool_syntax::functionary_v31:
      for (const tool_call& c : calls) out += std::string(fn_open) + c.name + ">" + compact(args_object(c.arguments)) + std::string(fn_close);
      return out;
    case tool_syntax::functionary_v32:
      for (const tool_call& c : calls) out += std::string(v32_mark) + c.name + "\n" + compact(args_object(c.arguments));
      return out;
    case tool_syntax::granite: return std::string(granite_open) + json_list("arguments");
    case tool_syntax::command_r7b: {
      std::string list;
      for (size_t i = 0; i < calls.size(); ++i) {
        list += (i > 0 ? ", " : "") + std::string("{\"tool_call_id\": \"") + std::to_string(i) + "\", \"tool_name\": " +
                json_quote(calls[i].name) + ", \"parameters\": " + compact(args_object(calls[i].arguments)) + "}";
      }
      return std::string(action_open) + "[" + list + "]" + std::string(action_close);
    }
    case tool_syntax::gpt_oss:
      for (size_t i = 0; i < calls.size(); ++i) {
        out += (i > 0 ? "<|start|>assistant" : "") + std::string(oss_channel_call) + calls[i].name + " <|constrain|>json" +
               std::string(oss_message) + compact(args_object(calls[i].arguments)) + "<|call|>";
      }
      return out;
    case tool_syntax::qwen3_coder:
      for (const tool_call& c : calls) {
        if (!out.empty()) out += "\n";
        out += std::string(call_open) + "\n" + std::string(fn_open) + c.name + ">\n";
        for (const ojson args = args_object(c.arguments); const auto& [k, v] : args.items()) {
          out += std::string(param_open) + k + ">\n" + value_text(v) + "\n" + std::string(param_close) + "\n";
        }
        out += std::string(fn_close) + "\n" + std::string(call_close);
      }
      return out;
    case tool_syntax::glm4:
      for (const tool_call& c : calls) {
        out += std::string(call_open) + c.name;
        for (const ojson args = args_object(c.arguments); const auto& [k, v] : args.items()) {
          out += std::string(arg_key) + k + std::string(arg_key_end) + std::string(arg_value) + value_text(v) + std::string(arg_value_end);
        }
        out += call_close;
      }
      return out;
    case tool_syntax::kimi_k2:
      out = kimi_begin;
      for (size_t i = 0; i < calls.size(); ++i) {
        out += std::string(kimi_call) + "functions." + calls[i].name + ":" + std::to_string(i) + std::string(kimi_arg) +
               compact(args_object(calls[i].arguments)) + std::string(kimi_call_end);
      }
      return out + std::string(kimi_end);
    case tool_syntax::apriel: return std::string(apriel_open) + json_list("arguments") + std::string(apriel_close);
    case tool_syntax::generic: return "{\"tool_calls\": " + json_list("arguments") + "}";
  }
  return out;
}

chat_message render_tool_result(tool_syntax syntax, std::string_view content) {
  if (syntax == tool_syntax::llama3) return {"ipython", std::string(content)};
  return {"user", "<tool_response>\n" + std::string(content) + "\n</tool_response>"};
}

std::vector<std::string> tool_call_triggers(tool_syntax syntax) {
  switch (syntax) {
    case tool_syntax::hermes:
    case tool_syntax::qwen3_coder:
    case tool_syntax::glm4: return {std::string(call_open)};
    case tool_syntax::llama3: return {"{\"name\"", std::string(python_tag)};
    case tool_syntax::mistral: return {std::string(mistral_calls)};
    case tool_syntax::deepseek_r1:
    case tool_syntax::deepseek_v31: return {std::string(ds_calls_begin)};
    case tool_syntax::dsml: return {std::string(dsml_function_calls), std::string(dsml_tool_calls)};
    case tool_syntax::functionary_v31: return {std::string(fn_open)};
    case tool_syntax::functionary_v32: return {std::string(v32_mark)};
    case tool_syntax::granite: return {std::string(granite_open)};
    case tool_syntax::command_r7b: return {std::string(action_open)};
    case tool_syntax::gpt_oss: return {std::string(oss_channel_call), std::string(oss_to)};
    case tool_syntax::kimi_k2: return {std::string(kimi_begin)};
    case tool_syntax::apriel: return {std::string(apriel_open)};
    case tool_syntax::generic: return {"{"};
  }
  return {};
}

std::vector<std::string> tool_call_markers(tool_syntax syntax) {
  std::vector<std::string> out;
  const auto add = [&](std::initializer_list<sv> m) {
    for (const sv s : m) out.emplace_back(s);
  };
  switch (syntax) {
    case tool_syntax::hermes: add({call_open, call_close}); break;
    case tool_syntax::qwen3_coder: add({call_open, call_close, fn_open, fn_close, param_open, param_close}); break;
    case tool_syntax::glm4: add({call_open, call_close, arg_key, arg_key_end, arg_value, arg_value_end}); break;
    case tool_syntax::llama3: add({python_tag}); break;
    case tool_syntax::mistral: add({mistral_calls, mistral_args, mistral_call_id}); break;
    case tool_syntax::deepseek_r1:
    case tool_syntax::deepseek_v31: add({ds_calls_begin, ds_calls_end, ds_call_begin, ds_call_end, ds_sep}); break;
    case tool_syntax::dsml: add({dsml_function_calls, dsml_tool_calls}); break;
    case tool_syntax::functionary_v31: add({python_tag}); break;
    case tool_syntax::functionary_v32: break;
    case tool_syntax::granite: add({granite_open}); break;
    case tool_syntax::command_r7b: add({action_open, action_close}); break;
    case tool_syntax::gpt_oss: add({oss_start, oss_channel, oss_message, "<|constrain|>", "<|call|>", "<|end|>"}); break;
    case tool_syntax::kimi_k2: add({kimi_begin, kimi_begin2, kimi_end, kimi_end2, kimi_call, kimi_arg, kimi_call_end}); break;
    case tool_syntax::apriel: add({apriel_open, apriel_close}); break;
    case tool_syntax::generic: break;
  }
  return out;
}

std::string tool_call_gbnf(tool_syntax syntax, std::span<const tool_function> tools, bool parallel) {
  if (tools.empty()) throw grammar_error("tools: no function to call");
  std::string rules, alts;
  bool any_xml_param = false;
  for (size_t i = 0; i < tools.size(); ++i) {
    const tool_function& t = tools[i];
    const std::string rule = "fn" + std::to_string(i);
    std::string args = rule + "-args", body;
    try {
      const std::string schema_rules = json_schema_gbnf_rules(t.parameters, args);
      if (!xml_syntax(syntax)) rules += schema_rules;
    } catch (const grammar_error& e) {
      throw grammar_error("tools: function '" + t.name + "': " + e.what());
    }
    const std::string name = lit(t.name);
    const auto json_call = [&](sv key) {
      return lit("{\"name\": " + json_quote(t.name) + ", \"" + std::string(key) + "\": ") + " " + args + " " + lit("}");
    };
    std::vector<xml_param> params;
    if (xml_syntax(syntax)) params = xml_params(t, rule, rules);
    switch (syntax) {
      case tool_syntax::hermes: body = lit("<tool_call>\n") + " " + json_call("arguments") + " " + lit("\n</tool_call>"); break;
      case tool_syntax::llama3: body = json_call("parameters"); break;
      case tool_syntax::granite:
      case tool_syntax::apriel:
      case tool_syntax::generic: body = json_call("arguments"); break;
      case tool_syntax::mistral: {
        // Nemo's list element (rule fnN-nemo) and the newer [TOOL_CALLS]f[ARGS]{...} (fnN).
        rules += rule + "-nemo ::= " + lit("{\"name\": " + json_quote(t.name) + ", \"arguments\": ") + " " + args + " ( " +
                 lit(", \"id\": \"") + " [a-zA-Z0-9]{9} " + lit("\"") + " )? " + lit("}") + "\n";
        body = lit(std::string(mistral_calls) + t.name + std::string(mistral_args)) + " " + args;
        break;
      }
      case tool_syntax::deepseek_r1:
        body = lit(std::string(ds_call_begin) + "function" + std::string(ds_sep) + t.name + "\n```json\n") + " " + args + " " +
               lit("\n```" + std::string(ds_call_end));
        break;
      case tool_syntax::deepseek_v31:
        body = lit(std::string(ds_call_begin) + t.name + std::string(ds_sep)) + " " + args + " " + lit(ds_call_end);
        break;
      case tool_syntax::functionary_v31: body = lit(std::string(fn_open) + t.name + ">") + " " + args + " " + lit(fn_close); break;
      case tool_syntax::functionary_v32: body = lit(std::string(v32_mark) + t.name + "\n") + " " + args; break;
      case tool_syntax::command_r7b:
        body = lit("{\"tool_call_id\": \"") + " [0-9]{1,3} " + lit("\", \"tool_name\": " + json_quote(t.name) + ", \"parameters\": ") +
               " " + args + " " + lit("}");
        break;
      case tool_syntax::gpt_oss:
        body = lit(std::string(oss_to) + t.name + " <|constrain|>json" + std::string(oss_message)) + " " + args + " " + lit("<|call|>");
        break;
      case tool_syntax::kimi_k2:
        body = lit(std::string(kimi_call) + "functions." + t.name + ":") + " [0-9]{1,3} " + lit(kimi_arg) + " " + args + " " +
               lit(kimi_call_end);
        break;
      case tool_syntax::dsml:
        body = lit(std::string(dsml_invoke) + t.name + "\">\n") +
               xml_sequence(params,
                            [](const xml_param& p) {
                              return lit(std::string(dsml_param) + p.key + "\" string=\"" + (p.is_string ? "true" : "false") + "\">") + " " +
                                     (p.is_string ? "xml-text" : p.value_rule) + " " + lit(std::string(dsml_param_end) + "\n");
                            },
                            lit(dsml_param) + " xml-key " + lit("\" string=\"true\">") + " xml-text " + lit(std::string(dsml_param_end) + "\n")) +
               " " + lit(std::string(dsml_invoke_end) + "\n");
        any_xml_param = true;
        break;
      case tool_syntax::qwen3_coder:
        body = lit(std::string(call_open) + "\n" + std::string(fn_open) + t.name + ">\n") +
               xml_sequence(params,
                            [](const xml_param& p) {
                              return lit(std::string(param_open) + p.key + ">\n") + " " + (p.is_string ? "xml-text" : p.value_rule) + " " +
                                     lit("\n" + std::string(param_close) + "\n");
                            },
                            lit(param_open) + " xml-key " + lit(">\n") + " xml-text " + lit("\n" + std::string(param_close) + "\n")) +
               " " + lit(std::string(fn_close) + "\n" + std::string(call_close));
        any_xml_param = true;
        break;
      case tool_syntax::glm4:
        body = lit(std::string(call_open) + t.name) +
               xml_sequence(params,
                            [](const xml_param& p) {
                              return "\"\\n\"? " + lit(std::string(arg_key) + p.key + std::string(arg_key_end)) + " \"\\n\"? " +
                                     lit(arg_value) + " " + (p.is_string ? "xml-text" : p.value_rule) + " " + lit(arg_value_end);
                            },
                            "\"\\n\"? " + lit(arg_key) + " xml-key " + lit(arg_key_end) + " \"\\n\"? " + lit(arg_value) + " xml-text " +
                                lit(arg_value_end)) +
               " \"\\n\"? " + lit(call_close);
        any_xml_param = true;
        break;
    }
    rules += rule + " ::= " + body + "\n";
    alts += (alts.empty() ? "" : " | ") + rule;
  }
  std::string root;
  const auto seq = [&](const std::string& open, const std::string& call, const std::string& sep, const std::string& close) {
    std::string s = open.empty() ? "" : open + " ";
    s += call;
    if (parallel) s += " ( " + (sep.empty() ? "" : sep + " ") + call + " )*";
    return close.empty() ? s : s + " " + close;
  };
  switch (syntax) {
    case tool_syntax::hermes:
    case tool_syntax::qwen3_coder: root = seq("", "call", "\"\\n\"", ""); break;
    case tool_syntax::llama3: root = seq(lit(python_tag) + "?", "call", "\"\\n\"", ""); break;
    case tool_syntax::glm4: root = seq("", "call", "\"\\n\"?", ""); break;
    case tool_syntax::mistral: {
      std::string nemo;
      for (size_t i = 0; i < tools.size(); ++i) nemo += (i > 0 ? " | " : "") + ("fn" + std::to_string(i) + "-nemo");
      rules += "nemo-call ::= " + nemo + "\n";
      root = "( " + seq(lit(std::string(mistral_calls) + "["), "nemo-call", lit(", "), lit("]")) + " ) | ( " + seq("", "call", "", "") + " )";
      break;
    }
    case tool_syntax::deepseek_r1: root = seq(lit(ds_calls_begin), "call", "\"\\n\"?", lit(ds_calls_end)); break;
    case tool_syntax::deepseek_v31: root = seq(lit(ds_calls_begin), "call", "", lit(ds_calls_end)); break;
    case tool_syntax::dsml:
      root = "( " + seq(lit(std::string(dsml_function_calls) + "\n"), "call", "", lit("</" + std::string(dsml_function_calls.substr(1)))) +
             " ) | ( " + seq(lit(std::string(dsml_tool_calls) + "\n"), "call", "", lit("</" + std::string(dsml_tool_calls.substr(1)))) + " )";
      break;
    case tool_syntax::functionary_v31:
    case tool_syntax::functionary_v32: root = seq("", "call", "", ""); break;
    case tool_syntax::granite: root = seq(lit(std::string(granite_open) + "["), "call", lit(", "), lit("]")); break;
    case tool_syntax::command_r7b: root = seq(lit(std::string(action_open) + "[") + " ws", "call", "ws \",\" ws", "ws " + lit(std::string("]") + std::string(action_close))); break;
    case tool_syntax::gpt_oss: root = seq(lit("<|channel|>commentary") + "?", "call", lit("<|start|>assistant<|channel|>commentary"), ""); break;
    case tool_syntax::kimi_k2: root = seq(lit(kimi_begin), "call", "", lit(kimi_end)); break;
    case tool_syntax::apriel: root = seq(lit(std::string(apriel_open) + "["), "call", lit(", "), lit("]" + std::string(apriel_close))); break;
    case tool_syntax::generic: root = seq(lit("{\"tool_calls\": ["), "call", lit(", "), lit("]}")); break;
  }
  std::string xml;
  if (any_xml_param) xml = "xml-text ::= [^<]*\nxml-key ::= [a-zA-Z0-9_.-]+\n";
  return "root ::= " + root + "\ncall ::= " + alts + "\n" + rules + xml + std::string(json_gbnf_rules());
}

tool_output parse_tool_calls(tool_syntax syntax, std::string_view text, std::span<const tool_function> tools) {
  try {
    if (syntax == tool_syntax::llama3) return parse_llama3(text, tools);
    if (syntax == tool_syntax::generic) return parse_generic(text, tools);
    if (syntax == tool_syntax::functionary_v32) return parse_functionary_v32(text, tools);
    const std::vector<sv> opens = openings(syntax);
    std::function<block(sv, size_t, sv)> parse_block;
    switch (syntax) {
      case tool_syntax::hermes: parse_block = [&](sv t, size_t o, sv) { return hermes_block(t, o, tools); }; break;
      case tool_syntax::qwen3_coder: parse_block = [&](sv t, size_t o, sv w) { return qwen3_coder_block(t, o, w, tools); }; break;
      case tool_syntax::glm4: parse_block = [&](sv t, size_t o, sv) { return glm4_block(t, o, tools); }; break;
      case tool_syntax::dsml: parse_block = [&](sv t, size_t o, sv w) { return dsml_block(t, o, w, tools); }; break;
      case tool_syntax::deepseek_r1:
      case tool_syntax::deepseek_v31: parse_block = [&](sv t, size_t o, sv w) { return deepseek_block(t, o, w, tools); }; break;
      case tool_syntax::kimi_k2: parse_block = [&](sv t, size_t o, sv w) { return kimi_block(t, o, w, tools); }; break;
      case tool_syntax::apriel: parse_block = [&](sv t, size_t o, sv) { return apriel_block(t, o, tools); }; break;
      case tool_syntax::granite:
        parse_block = [&](sv t, size_t o, sv) { return json_after(t, o, granite_open, "", tools, "name", {"arguments", "parameters"}); };
        break;
      case tool_syntax::command_r7b:
        parse_block = [&](sv t, size_t o, sv) { return json_after(t, o, action_open, action_close, tools, "tool_name", {"parameters", "arguments"}); };
        break;
      case tool_syntax::mistral: parse_block = [&](sv t, size_t o, sv) { return mistral_block(t, o, tools); }; break;
      case tool_syntax::functionary_v31: parse_block = [&](sv t, size_t o, sv w) { return functionary_v31_block(t, o, w, tools); }; break;
      case tool_syntax::gpt_oss: parse_block = [&](sv t, size_t o, sv w) { return gpt_oss_block(t, o, w, tools); }; break;
      case tool_syntax::llama3:
      case tool_syntax::generic:
      case tool_syntax::functionary_v32: break;
    }
    tool_output out = scan(text, opens, parse_block);
    if (syntax == tool_syntax::command_r7b) {  // the response's markers are not content
      for (const sv m : {sv("<|START_RESPONSE|>"), sv("<|END_RESPONSE|>")}) {
        for (size_t p = out.content.find(m); p != npos; p = out.content.find(m, p)) out.content.erase(p, m.size());
      }
      out.content = std::string(trim(out.content));
    }
    return out;
  } catch (const std::exception&) {  // not expected (every step is checked): the whole answer as content
    tool_output out;
    out.content = std::string(trim(text));
    return out;
  }
}

size_t streamable_content(tool_syntax syntax, std::string_view text) {
  if (syntax == tool_syntax::llama3 || syntax == tool_syntax::generic) {
    const sv t = trim(text);
    if (t.empty() || t.front() == '{') return 0;
    if (syntax == tool_syntax::llama3 && python_tag.substr(0, std::min(t.size(), python_tag.size())) == t.substr(0, std::min(t.size(), python_tag.size()))) return 0;
    return text.size();
  }
  const std::vector<sv> opens = openings(syntax);
  size_t first = npos;
  for (const sv o : opens) first = std::min(first, text.find(o));
  if (first != npos) return first;
  // Hold back the longest tail that may begin an opening.
  size_t held = 0;
  for (const sv o : opens) {
    for (size_t k = std::min(o.size() - 1, text.size()); k > held; --k) {
      if (text.substr(text.size() - k) == o.substr(0, k)) {
        held = k;
        break;
      }
    }
  }
  return text.size() - held;
}

}  // namespace troupe::llm
