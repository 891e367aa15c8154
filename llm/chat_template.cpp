#include "llm/chat_template.h"

#include <cctype>
#include <utility>

#include "loader/gguf.h"
#include "runtime/log.h"

namespace troupe::llm {
namespace {

struct named_kind {
  std::string_view name;
  chat_template_kind kind;
};
constexpr named_kind kind_names[] = {
    {"chatml", chat_template_kind::chatml},
    {"llama2", chat_template_kind::llama2},
    {"llama2-sys", chat_template_kind::llama2_sys},
    {"llama2-sys-bos", chat_template_kind::llama2_sys_bos},
    {"llama2-sys-strip", chat_template_kind::llama2_sys_strip},
    {"llama3", chat_template_kind::llama3},
    {"gemma", chat_template_kind::gemma},
    {"raw", chat_template_kind::raw},
};

std::string trim(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  while (e > b && std::isspace(static_cast<unsigned char>(s[e - 1]))) --e;
  return std::string(s.substr(b, e - b));
}

// A ChatML template's fixed system message: the literal text in "<|im_start|>system\n...<|im_end|>" that
// contains no template code (quotes, braces, '+'), e.g. SmolLM2's
//   {% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are ...<|im_end|>\n' }}
// The newline may be a real one or the two characters \n of a Jinja string literal.
std::string find_default_system(std::string_view tmpl) {
  constexpr std::string_view open = "<|im_start|>system";
  constexpr std::string_view close = "<|im_end|>";
  for (size_t pos = tmpl.find(open); pos != std::string_view::npos; pos = tmpl.find(open, pos + 1)) {
    size_t body = pos + open.size();
    if (tmpl.substr(body, 1) == "\n") {
      body += 1;
    } else if (tmpl.substr(body, 2) == "\\n") {
      body += 2;
    } else {
      continue;
    }
    const size_t end = tmpl.find(close, body);
    if (end == std::string_view::npos) break;
    const std::string_view literal = tmpl.substr(body, end - body);
    if (literal.empty() || literal.find_first_of("'\"{}+") != std::string_view::npos) continue;
    std::string text;
    for (size_t i = 0; i < literal.size(); ++i) {
      if (literal[i] == '\\' && i + 1 < literal.size()) {
        const char c = literal[++i];
        text += c == 'n' ? '\n' : c == 't' ? '\t' : c;
      } else {
        text += literal[i];
      }
    }
    return text;
  }
  return {};
}

void apply_chatml(std::string& out, std::span<const chat_message> chat, bool add_assistant,
                  const std::string& default_system) {
  if (!chat.empty() && chat.front().role != "system" && !default_system.empty()) {
    out += "<|im_start|>system\n" + default_system + "<|im_end|>\n";
  }
  for (const chat_message& m : chat) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
  if (add_assistant) out += "<|im_start|>assistant\n";
}

void apply_llama3(std::string& out, std::span<const chat_message> chat, bool add_assistant) {
  for (const chat_message& m : chat) {
    out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
  }
  if (add_assistant) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
}

// [INST] <<SYS>>\n{system}\n<</SYS>>\n\n{user} [/INST]{assistant}</s>[INST] {user} [/INST]...
// No assistant prompt is added: the open "[/INST]" is where the answer starts.
void apply_llama2(std::string& out, std::span<const chat_message> chat, chat_template_kind kind) {
  const bool system_block = kind != chat_template_kind::llama2;
  const bool bos_in_history = kind == chat_template_kind::llama2_sys_bos;
  const bool strip = kind == chat_template_kind::llama2_sys_strip;
  bool inside_turn = true;
  out += "[INST] ";
  for (const chat_message& m : chat) {
    const std::string content = strip ? trim(m.content) : m.content;
    if (!inside_turn) {
      inside_turn = true;
      out += bos_in_history ? "<s>[INST] " : "[INST] ";
    }
    if (m.role == "system") {
      out += system_block ? "<<SYS>>\n" + content + "\n<</SYS>>\n\n" : content + "\n";
    } else if (m.role == "user") {
      out += content + " [/INST]";
    } else {
      out += content + "</s>";
      inside_turn = false;
    }
  }
}

void apply_gemma(std::string& out, std::span<const chat_message> chat, bool add_assistant) {
  std::string system;
  for (const chat_message& m : chat) {
    if (m.role == "system") {
      system += trim(m.content);
      continue;
    }
    const std::string role = m.role == "assistant" ? "model" : m.role;
    out += "<start_of_turn>" + role + "\n";
    if (!system.empty() && role != "model") {
      out += system + "\n\n";
      system.clear();
    }
    out += trim(m.content) + "<end_of_turn>\n";
  }
  if (add_assistant) out += "<start_of_turn>model\n";
}

}  // namespace

chat_template_kind detect_chat_template(std::string_view t) {
  for (const named_kind& n : kind_names) {
    if (t == n.name) return n.kind;
  }
  const auto has = [&](std::string_view s) { return t.find(s) != std::string_view::npos; };
  if (has("<|im_start|>")) {
    // Phi-4 (<|im_sep|>) and SmolVLM (<end_of_utterance>) use the markers differently.
    return has("<|im_sep|>") || has("<end_of_utterance>") ? chat_template_kind::unknown : chat_template_kind::chatml;
  }
  if (t.substr(0, 7) == "mistral" || has("[INST]")) {
    // Mistral's own formats are not Llama 2's.
    if (has("[SYSTEM_PROMPT]") || has("[AVAILABLE_TOOLS]") || has("' [INST] ' + system_message")) {
      return chat_template_kind::unknown;
    }
    if (has("content.strip()")) return chat_template_kind::llama2_sys_strip;
    if (has("bos_token + '[INST]")) return chat_template_kind::llama2_sys_bos;
    if (has("<<SYS>>")) return chat_template_kind::llama2_sys;
    return chat_template_kind::llama2;
  }
  if (has("<start_of_turn>")) return chat_template_kind::gemma;
  if (has("<|start_header_id|>") && has("<|end_header_id|>")) return chat_template_kind::llama3;
  return chat_template_kind::unknown;
}

std::string_view chat_template_name(chat_template_kind kind) {
  for (const named_kind& n : kind_names) {
    if (n.kind == kind) return n.name;
  }
  return "unknown";
}

chat_template::chat_template(std::string_view source) { init(source); }

chat_template chat_template::named(std::string_view name) {
  for (const named_kind& n : kind_names) {
    if (n.name == name) return chat_template(name);
  }
  throw error("unknown chat template '" + std::string(name) + "' (known: " + known_names() + ")");
}

std::string chat_template::known_names() {
  std::string out;
  for (const named_kind& n : kind_names) {
    if (!out.empty()) out += ", ";
    out += n.name;
  }
  return out;
}

chat_template::chat_template(const gguf_file& file) {
  const auto t = file.get<std::string>("tokenizer.chat_template");
  if (!t) {
    kind_ = chat_template_kind::chatml;
    fell_back_ = true;
    TROUPE_LOG(warn, "chat template: " << (file.source().empty() ? "the model" : file.source())
                                       << " has no tokenizer.chat_template; using ChatML");
    return;
  }
  init(*t);
}

void chat_template::init(std::string_view source) {
  kind_ = detect_chat_template(source);
  if (kind_ == chat_template_kind::unknown) {
    kind_ = chat_template_kind::chatml;
    fell_back_ = true;
    TROUPE_LOG(warn, "chat template not recognised (" << source.size() << " bytes, starting '"
                                                      << gguf_printable(source.substr(0, 40))
                                                      << "'); using ChatML");
    return;
  }
  if (kind_ == chat_template_kind::chatml) default_system_ = find_default_system(source);
}

std::string chat_template::apply(std::span<const chat_message> messages, bool add_assistant_prompt) const {
  std::string out;
  switch (kind_) {
    case chat_template_kind::chatml:
    case chat_template_kind::unknown:
      apply_chatml(out, messages, add_assistant_prompt, default_system_);
      break;
    case chat_template_kind::llama3:
      apply_llama3(out, messages, add_assistant_prompt);
      break;
    case chat_template_kind::llama2:
    case chat_template_kind::llama2_sys:
    case chat_template_kind::llama2_sys_bos:
    case chat_template_kind::llama2_sys_strip:
      apply_llama2(out, messages, kind_);
      break;
    case chat_template_kind::gemma:
      apply_gemma(out, messages, add_assistant_prompt);
      break;
    case chat_template_kind::raw:
      for (const chat_message& m : messages) {
        if (!out.empty()) out += '\n';
        out += m.content;
      }
      break;
  }
  return out;
}

}  // namespace troupe::llm
