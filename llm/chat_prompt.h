// A chat as the prompt a model was trained on: the model's own Jinja chat template (tokenizer.chat_template,
// or its tool_use variant when tools are given), rendered with the conversation in OpenAI's shape, the
// tools, bos_token / eos_token from the vocabulary and the caller's template arguments (enable_thinking, ...);
// a built-in family (llm/chat_template.h) only where the file has no template or it does not parse.
//
//   llm::chat_prompt p = llm::chat_prompt::for_model(file, vocab, /*family=*/"", /*template_text=*/"");
//   nlohmann::ordered_json msgs = nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}])");
//   std::string prompt = p.render(msgs, /*tools=*/nullptr, /*add_generation_prompt=*/true);  // throws chat_prompt_error
//   auto ids = llm::chat_tokens(vocab, prompt);   // control tokens parsed, a BOS the template wrote not doubled
//
// The parts (chat_prompt::parts) are plain strings so that a daemon can rebuild the same renderer from a
// model's description sent over the network.
//
// Messages: role, content (a string, or an array of {"type": "text", "text"} parts, joined), tool_calls
// (OpenAI's: {"id", "type": "function", "function": {"name", "arguments"}}; arguments given as JSON text are
// passed to the template as the object, as Hugging Face templates expect), tool_call_id and name (a tool
// result's name is filled in from the call it answers when absent), reasoning_content (a past turn's reasoning,
// also given as `thinking` and `reasoning` for templates that read those). A template that has no system
// role (it refuses one, as Gemma's do, or drops it) gets the system message at the head of the first user
// turn, as the gemma family writes it.
//
// Tools through a template that has no tool format of its own (no tool call syntax detected, or it never
// reads `tools`): the instructions and the tool list go into the system message in the syntax of the family
// (Hermes for ChatML-like templates, Llama 3's JSON for Llama 3, the generic JSON format otherwise), and
// past calls and results are written into the messages in that syntax, as before templates were run.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "llm/chat_template.h"
#include "llm/reasoning.h"
#include "llm/tool_calls.h"
#include "llm/vocab.h"

namespace troupe {
class gguf_file;
}

namespace troupe::llm {

namespace jinja {
class template_;
}

// The template refused the conversation (raise_exception, an error in the template, a limit): the
// request's fault, answered with 400 and the template's message.
class chat_prompt_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class chat_prompt {
 public:
  struct parts {
    std::string jinja;           // the template's Jinja source ("": none)
    std::string jinja_tool_use;  // the tool_use variant ("": none)
    std::string family;          // a family name ("chatml", "llama3", "raw", ...): used when jinja is empty
    std::string bos_token, eos_token;
    friend bool operator==(const parts&, const parts&) = default;
  };

  // The model's own template (tokenizer.chat_template, tokenizer.chat_template.tool_use) with its vocabulary's
  // BOS / EOS text. `family` (a name, see chat_template::named) replaces the template; `template_text` (a
  // --chat-template-file's contents) replaces the model's. Throws troupe::error for an unknown family or a
  // template_text that does not parse.
  static chat_prompt for_model(const gguf_file& file, const vocab& v, std::string_view family = {},
                               std::string_view template_text = {});
  // From parts: a jinja source that does not parse falls back to its family (detected by substrings) with a
  // warning in the log, as a model without a template does.
  explicit chat_prompt(parts p);
  ~chat_prompt();
  chat_prompt(chat_prompt&&) noexcept;
  chat_prompt& operator=(chat_prompt&&) noexcept;

  const parts& source() const { return parts_; }
  // Whether the model's own Jinja template is rendered (false: a built-in family).
  bool jinja() const { return main_ != nullptr; }
  // "jinja" or the family's name ("chatml", "llama3", ...).
  std::string name() const;
  // The tool call syntax answers are parsed with, and whether the template writes the tools itself.
  tool_syntax tool_format() const { return tools_; }
  bool template_renders_tools() const { return template_tools_; }
  // The markers around reasoning ("<think>" ... "</think>"); empty for models that do not think.
  const reasoning_markers& reasoning() const { return reasoning_; }

  // The prompt for a conversation (an array of OpenAI messages); tools: an array of OpenAI tools, or
  // null / empty; kwargs: an object of extra template variables (chat_template_kwargs), or null.
  // Throws chat_prompt_error where the template refuses, naming its message.
  std::string render(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                     bool add_generation_prompt, const nlohmann::ordered_json& kwargs = nullptr) const;
  // role/content messages only.
  std::string apply(std::span<const chat_message> messages, bool add_generation_prompt) const;

 private:
  void init();
  std::string render_family(const nlohmann::ordered_json& messages, const nlohmann::ordered_json& tools,
                            bool add_generation_prompt) const;

  parts parts_;
  std::shared_ptr<const jinja::template_> main_, tool_use_;
  std::unique_ptr<chat_template> family_;
  tool_syntax tools_ = tool_syntax::hermes;
  bool template_tools_ = false;
  bool fold_system_ = false;  // the template has no system role: the system message joins the first user turn
  reasoning_markers reasoning_;
};

// A rendered chat to token ids: control tokens written as text are parsed as the tokens, BOS added as the
// vocabulary wants it, and a BOS the template wrote itself not doubled.
std::vector<token_id> chat_tokens(const vocab& v, std::string_view prompt);

}  // namespace troupe::llm
