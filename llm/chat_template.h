// Chat templates: turning a conversation into the prompt text a chat model was trained on.
//
//   const llm::chat_template t(file);   // tokenizer.chat_template of a gguf_file; or chat_template(source)
//   std::vector<llm::chat_message> chat = {{"system", "Be brief."}, {"user", "Hi!"}};
//   std::string prompt = t.apply(chat, /*add_assistant_prompt=*/true);
//   auto ids = vocab.tokenize(prompt, /*add_special=*/true, /*parse_special=*/true);
//
// troupe does not run Jinja: it recognises the template's family by substrings, as llama.cpp's
// llm_chat_detect_template does, and formats that family itself. A template name ("chatml", "llama3",
// "llama2", "llama2-sys", "llama2-sys-bos", "llama2-sys-strip", "gemma") is accepted in place of a
// template. A template that is not recognised (or none) falls back to ChatML, with a warning in the log.
//
//   chatml   <|im_start|>role\ncontent<|im_end|>\n ...  [<|im_start|>assistant\n]   (SmolLM2, Qwen)
//            A template that writes a fixed system message when the chat has none (SmolLM2's "You are a
//            helpful AI assistant named SmolLM...") has it extracted and applied the same way.
//   llama3   <|start_header_id|>role<|end_header_id|>\n\ncontent<|eot_id|> ...  (content trimmed)
//            [<|start_header_id|>assistant<|end_header_id|>\n\n]
//   llama2   [INST] <<SYS>>\nsystem\n<</SYS>>\n\nuser [/INST]assistant</s>[INST] ...
//   gemma    <start_of_turn>user\n[system\n\n]content<end_of_turn>\n ... role "assistant" -> "model",
//            the system message folded into the first user turn (content trimmed) [<start_of_turn>model\n]
// The BOS token is never written: tokenize with add_special = true adds it.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace troupe {
class gguf_file;
}

namespace troupe::llm {

struct chat_message {
  std::string role;  // "system", "user", "assistant" (others are passed through where the family allows)
  std::string content;
};

enum class chat_template_kind {
  chatml,
  llama2,            // no system support: the system message is written as plain text in the first turn
  llama2_sys,        // <<SYS>> ... <</SYS>>
  llama2_sys_bos,    // and <s> before each later [INST]
  llama2_sys_strip,  // and contents trimmed
  llama3,
  gemma,
  raw,      // no markup: the messages' contents one after another, separated by newlines (base models);
            // chosen by name only, never detected
  unknown,  // detect_chat_template only: nothing matched
};

// The family of a template (or a template name), unknown when nothing matches.
chat_template_kind detect_chat_template(std::string_view source);
// "chatml", "llama2", "llama2-sys", ..., "llama3", "gemma", "unknown".
std::string_view chat_template_name(chat_template_kind kind);

class chat_template {
 public:
  // From a template's source (Jinja text or a name). Unrecognised or empty: ChatML and a warning.
  explicit chat_template(std::string_view source);
  // From tokenizer.chat_template of a GGUF file (absent: ChatML and a warning).
  explicit chat_template(const gguf_file& file);
  // A family by name ("chatml", "llama3", "raw", ...); throws troupe::error naming the known names for
  // anything else (a configuration's explicit choice must not silently fall back).
  static chat_template named(std::string_view name);
  // The names named() accepts, comma-separated.
  static std::string known_names();

  chat_template_kind kind() const { return kind_; }
  std::string_view name() const { return chat_template_name(kind_); }
  // True when the template was not recognised and ChatML is used instead.
  bool fell_back() const { return fell_back_; }
  // ChatML only: the system message written when the chat does not start with one ("" for none).
  const std::string& default_system() const { return default_system_; }

  // The prompt for `messages`; with add_assistant_prompt, ends with the opening of an assistant turn.
  std::string apply(std::span<const chat_message> messages, bool add_assistant_prompt) const;

 private:
  void init(std::string_view source);

  chat_template_kind kind_ = chat_template_kind::chatml;
  bool fell_back_ = false;
  std::string default_system_;
};

}  // namespace troupe::llm
