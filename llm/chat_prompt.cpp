#include "llm/chat_prompt.h"

#include <map>

#include "llm/jinja/jinja.h"
#include "loader/gguf.h"
#include "runtime/error.h"
#include "runtime/log.h"

namespace troupe::llm {

using ojson = nlohmann::ordered_json;

namespace {

// As llama.cpp and vLLM render templates: lists and dicts may be modified (Kimi K2 appends to a namespace's
// list), {% generation %} blocks are rendered (LFM 2.5, Laguna).
jinja::options serving_options() {
  jinja::options o;
  o.mutable_values = true;
  o.generation_tag = true;
  return o;
}

std::shared_ptr<const jinja::template_> parse_template(std::string_view source) {
  return std::make_shared<const jinja::template_>(jinja::template_::parse(source, serving_options()));
}

std::string text_of(const ojson& content) {
  if (content.is_string()) return content.get<std::string>();
  std::string out;
  if (content.is_array()) {
    for (const ojson& part : content) {
      if (part.is_object() && part.contains("text") && part["text"].is_string()) out += part["text"].get<std::string>();
    }
  }
  return out;
}

std::vector<tool_function> functions_of(const ojson& tools) {
  std::vector<tool_function> out;
  if (!tools.is_array()) return out;
  for (const ojson& t : tools) {
    const ojson& f = t.contains("function") ? t["function"] : t;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    tool_function fn;
    fn.name = f["name"].get<std::string>();
    if (f.contains("description") && f["description"].is_string()) fn.description = f["description"].get<std::string>();
    if (f.contains("parameters") && f["parameters"].is_object()) fn.parameters = f["parameters"].dump();
    out.push_back(std::move(fn));
  }
  return out;
}

std::vector<tool_call> calls_of(const ojson& m) {
  std::vector<tool_call> out;
  if (!m.contains("tool_calls") || !m["tool_calls"].is_array()) return out;
  for (const ojson& c : m["tool_calls"]) {
    const ojson& f = c.contains("function") ? c["function"] : c;
    if (!f.is_object() || !f.contains("name") || !f["name"].is_string()) continue;
    tool_call call;
    call.id = c.contains("id") && c["id"].is_string() ? c["id"].get<std::string>() : "";
    call.name = f["name"].get<std::string>();
    const ojson a = f.contains("arguments") ? f["arguments"] : ojson::object();
    call.arguments = a.is_string() ? a.get<std::string>() : a.dump();
    out.push_back(std::move(call));
  }
  return out;
}

// The messages as Hugging Face templates expect them: content as text, a call's arguments as an object,
// a tool result's name from the call it answers, past reasoning under both names templates read.
ojson normalized(const ojson& messages) {
  ojson out = ojson::array();
  std::map<std::string, std::string> call_names;  // id -> function name
  for (const ojson& in : messages) {
    if (!in.is_object()) continue;
    ojson m = in;
    if (m.value("role", "") == "developer") m["role"] = "system";  // OpenAI's newer name
    // Content as text; none (an assistant turn of calls only) as "", which templates test as they test none.
    if (!m.contains("content") || !m["content"].is_string()) m["content"] = m.contains("content") ? text_of(m["content"]) : "";
    if (m.contains("tool_calls") && m["tool_calls"].is_array()) {
      for (ojson& c : m["tool_calls"]) {
        if (!c.is_object()) continue;
        if (!c.contains("type")) c["type"] = "function";
        if (c.contains("function") && c["function"].is_object()) {
          ojson& f = c["function"];
          if (f.contains("arguments") && f["arguments"].is_string() && json_nesting(f["arguments"].get<std::string>()) <= 64) {
            try {
              ojson a = ojson::parse(f["arguments"].get<std::string>());
              if (a.is_object()) f["arguments"] = std::move(a);
            } catch (const ojson::exception&) {
              // Not JSON: the template gets the text as it is.
            }
          }
          if (c.contains("id") && c["id"].is_string() && f.contains("name") && f["name"].is_string()) {
            call_names[c["id"].get<std::string>()] = f["name"].get<std::string>();
          }
        }
      }
    }
    if (m.value("role", "") == "tool" && !m.contains("name") && m.contains("tool_call_id") && m["tool_call_id"].is_string()) {
      const auto it = call_names.find(m["tool_call_id"].get<std::string>());
      if (it != call_names.end()) m["name"] = it->second;
    }
    if (m.contains("reasoning_content")) {
      for (const char* name : {"thinking", "reasoning"}) {
        if (!m.contains(name)) m[name] = m["reasoning_content"];
      }
    }
    out.push_back(std::move(m));
  }
  return out;
}

tool_syntax family_syntax(chat_template_kind kind) {
  switch (kind) {
    case chat_template_kind::llama3: return tool_syntax::llama3;
    case chat_template_kind::chatml:
    case chat_template_kind::unknown: return tool_syntax::hermes;
    default: return tool_syntax::generic;
  }
}

std::string token_text(const vocab& v, token_id id) { return id == token_null ? std::string() : v.token_to_piece(id, true); }

}  // namespace

chat_prompt chat_prompt::for_model(const gguf_file& file, const vocab& v, std::string_view family, std::string_view template_text) {
  parts p;
  p.bos_token = token_text(v, v.bos());
  p.eos_token = token_text(v, v.eos());
  if (!family.empty()) {
    (void)chat_template::named(family);  // throws naming the known families
    p.family = std::string(family);
    return chat_prompt(std::move(p));
  }
  if (!template_text.empty()) {
    try {
      (void)jinja::template_::parse(template_text, serving_options());
    } catch (const jinja::error& e) {
      throw error(std::string("chat template file: ") + e.what());
    }
    p.jinja = std::string(template_text);
    return chat_prompt(std::move(p));
  }
  if (const auto t = file.get<std::string>("tokenizer.chat_template")) p.jinja = *t;
  if (const auto t = file.get<std::string>("tokenizer.chat_template.tool_use")) p.jinja_tool_use = *t;
  if (p.jinja.empty()) {
    TROUPE_LOG(warn, "chat template: " << (file.source().empty() ? "the model" : file.source())
                                       << " has no tokenizer.chat_template; using ChatML");
    p.family = "chatml";
  }
  return chat_prompt(std::move(p));
}

chat_prompt::chat_prompt(parts p) : parts_(std::move(p)) { init(); }
chat_prompt::~chat_prompt() = default;
chat_prompt::chat_prompt(chat_prompt&&) noexcept = default;
chat_prompt& chat_prompt::operator=(chat_prompt&&) noexcept = default;

void chat_prompt::init() {
  if (!parts_.jinja.empty()) {
    try {
      main_ = parse_template(parts_.jinja);
    } catch (const jinja::error& e) {
      TROUPE_LOG(warn, "chat template does not parse (" << e.what() << "); using its family");
    }
    if (main_ && !parts_.jinja_tool_use.empty()) {
      try {
        tool_use_ = parse_template(parts_.jinja_tool_use);
      } catch (const jinja::error& e) {
        TROUPE_LOG(warn, "chat template tool_use does not parse (" << e.what() << "); using the main template");
      }
    }
  }
  if (main_) {
    const std::string_view src = tool_use_ ? parts_.jinja_tool_use : parts_.jinja;
    const tool_syntax own = detect_tool_syntax(src);
    template_tools_ = own != tool_syntax::generic && src.find("tools") != std::string_view::npos;
    tools_ = template_tools_ ? own : family_syntax(detect_chat_template(parts_.jinja));
    reasoning_ = detect_reasoning(parts_.jinja);
    // A template without a system role (Gemma's, Mistral's first ones refuse it; some drop it): the system
    // message goes into the first user turn, as the gemma family writes it.
    const auto renders = [&](const char* msgs, std::string* out) {
      try {
        *out = main_->render(ojson{{"messages", ojson::parse(msgs)}, {"add_generation_prompt", true},
                                   {"bos_token", parts_.bos_token}, {"eos_token", parts_.eos_token}});
        return true;
      } catch (const jinja::error&) {
        return false;
      }
    };
    std::string with_system, user_only;
    const bool system_ok = renders(R"([{"role": "system", "content": "Sys\u0001"}, {"role": "user", "content": "Hi"}])", &with_system);
    fold_system_ = renders(R"([{"role": "user", "content": "Hi"}])", &user_only) &&
                   (!system_ok || with_system.find("Sys\x01") == std::string::npos);
    return;
  }
  family_ = std::make_unique<chat_template>(parts_.family.empty() ? std::string_view(parts_.jinja)
                                                                  : std::string_view(parts_.family));
  tools_ = family_syntax(family_->kind());
  template_tools_ = false;
}

std::string chat_prompt::name() const { return main_ ? std::string("jinja") : std::string(family_->name()); }

std::string chat_prompt::render(const ojson& messages, const ojson& tools, bool add_generation_prompt, const ojson& kwargs) const {
  const bool have_tools = tools.is_array() && !tools.empty();
  if (!main_) return render_family(messages, tools, add_generation_prompt);
  ojson msgs = normalized(messages);
  ojson ctx = ojson::object();
  bool tool_turns = false;
  for (const ojson& m : msgs) tool_turns = tool_turns || m.value("role", "") == "tool" || m.contains("tool_calls");
  if (!template_tools_ && (have_tools || tool_turns)) {
    // The template knows no tool format: the instructions go into the system message, calls and results
    // into the messages, in the family's syntax.
    const std::vector<tool_function> fns = functions_of(tools);
    ojson out = ojson::array();
    for (const ojson& m : msgs) {
      const std::string role = m.value("role", "");
      if (role == "tool") {
        const chat_message t = render_tool_result(tools_, m.contains("content") ? text_of(m["content"]) : "");
        out.push_back({{"role", t.role}, {"content", t.content}});
        continue;
      }
      ojson c = m;
      const std::vector<tool_call> calls = calls_of(m);
      if (!calls.empty()) {
        const std::string text = m.contains("content") ? text_of(m["content"]) : "";
        const std::string rendered = render_tool_calls(tools_, calls);
        c.erase("tool_calls");
        c["content"] = text.empty() ? rendered : text + "\n" + rendered;
      }
      out.push_back(std::move(c));
    }
    if (have_tools) {
      const std::string instructions = tools_prompt(tools_, fns);
      if (!out.empty() && out[0].value("role", "") == "system") {
        out[0]["content"] = text_of(out[0]["content"]) + "\n\n" + instructions;
      } else {
        out.insert(out.begin(), ojson{{"role", "system"}, {"content", instructions}});
      }
    }
    msgs = std::move(out);
  } else if (have_tools) {
    ctx["tools"] = tools;
  }
  if (fold_system_ && msgs.size() >= 2 && msgs[0].value("role", "") == "system" && msgs[1].value("role", "") == "user") {
    msgs[1]["content"] = text_of(msgs[0]["content"]) + "\n\n" + text_of(msgs[1]["content"]);
    msgs.erase(msgs.begin());
  }
  if (kwargs.is_object()) {
    for (const auto& [k, v] : kwargs.items()) ctx[k] = v;
  }
  ctx["messages"] = std::move(msgs);
  ctx["add_generation_prompt"] = add_generation_prompt;
  ctx["bos_token"] = parts_.bos_token;
  ctx["eos_token"] = parts_.eos_token;
  // The tool_use variant for tools, and for a conversation with tool turns (which the main one may not know).
  const jinja::template_& t = (have_tools || tool_turns) && template_tools_ && tool_use_ ? *tool_use_ : *main_;
  try {
    return t.render(ctx);
  } catch (const jinja::error& e) {
    throw chat_prompt_error(std::string("the chat template refused the conversation: ") + e.what());
  }
}

std::string chat_prompt::render_family(const ojson& messages, const ojson& tools, bool add_generation_prompt) const {
  const bool have_tools = tools.is_array() && !tools.empty();
  std::vector<chat_message> chat;
  for (const ojson& m : messages) {
    if (!m.is_object()) continue;
    std::string role = m.value("role", "");
    std::string content = m.contains("content") ? text_of(m["content"]) : "";
    if (role == "tool") {
      chat.push_back(render_tool_result(tools_, content));
      continue;
    }
    const std::vector<tool_call> calls = calls_of(m);
    if (!calls.empty()) {
      const std::string rendered = render_tool_calls(tools_, calls);
      content = content.empty() ? rendered : content + "\n" + rendered;
    }
    chat.push_back({std::move(role), std::move(content)});
  }
  if (have_tools) {
    const std::string instructions = tools_prompt(tools_, functions_of(tools));
    if (!chat.empty() && chat.front().role == "system") {
      chat.front().content += "\n\n" + instructions;
    } else {
      chat.insert(chat.begin(), chat_message{"system", instructions});
    }
  }
  return family_->apply(chat, add_generation_prompt);
}

std::string chat_prompt::apply(std::span<const chat_message> messages, bool add_generation_prompt) const {
  if (!main_) return family_->apply(messages, add_generation_prompt);
  ojson msgs = ojson::array();
  for (const chat_message& m : messages) msgs.push_back({{"role", m.role}, {"content", m.content}});
  return render(msgs, nullptr, add_generation_prompt);
}

std::vector<token_id> chat_tokens(const vocab& v, std::string_view prompt) {
  std::vector<token_id> ids = v.tokenize(prompt, false, true);
  if (v.add_bos() && v.bos() != token_null && (ids.empty() || ids[0] != v.bos())) ids.insert(ids.begin(), v.bos());
  if (v.add_eos() && v.eos() != token_null) ids.push_back(v.eos());
  return ids;
}

}  // namespace troupe::llm
