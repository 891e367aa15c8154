// A Jinja template engine for chat templates (the tokenizer.chat_template of GGUF files), with the semantics
// of Python's Jinja2 as Hugging Face transformers runs it: trim_blocks and lstrip_blocks, loop controls,
// raise_exception, strftime_now, tojson keeping non-ASCII, an immutable sandbox (lists and dicts are not
// modified through their methods).
//
//   jinja::template_ t = jinja::template_::parse(source);          // throws jinja::error (with the line)
//   nlohmann::ordered_json ctx = {{"messages", msgs}, {"add_generation_prompt", true}, {"bos_token", "<s>"}};
//   std::string prompt = t.render(ctx);                               // throws jinja::error where it refuses
//
// A template is untrusted input (it comes from a downloaded file): rendering is bounded in output size,
// nesting depth and steps, and every failure is a jinja::error naming the line, never a crash or a hang.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "llm/jinja/value.h"

namespace troupe::llm::jinja {

struct options {
  bool trim_blocks = true;    // the first newline after a block tag or comment is removed
  bool lstrip_blocks = true;  // spaces and tabs before a block tag or comment on its line are removed
  size_t max_output = size_t{64} << 20;  // bytes a render may produce
  int max_depth = 256;                   // nested calls and blocks
  uint64_t max_steps = 50'000'000;       // statements and expressions evaluated in one render
  // Python's list.append / pop / insert / extend / clear and dict.update / pop / setdefault (as llama.cpp's
  // and vLLM's renderers allow; Kimi K2's template appends to a namespace's list). false: transformers'
  // immutable sandbox refuses them, as the reference does.
  bool mutable_values = false;
  // {% generation %} ... {% endgeneration %} (transformers' marker of assistant text for training masks)
  // rendered as its body. false: an unknown tag, as plain Jinja2 says.
  bool generation_tag = false;
  // strftime_now's clock: a fixed time (seconds since the epoch, UTC) for reproducible renders; < 0: now.
  int64_t fixed_time = -1;
};

struct node;  // the parsed template (internal)

class template_ {
 public:
  static template_ parse(std::string_view source, const options& opt = {});
  std::string render(const nlohmann::ordered_json& context) const;
  // With values beyond JSON's (functions): the context as a dict value.
  std::string render(const value& context) const;

 private:
  std::shared_ptr<const node> root_;
  options opt_;
};

// A JSON value as a template value (objects keep their key order), and back.
value from_json(const nlohmann::ordered_json& j);

}  // namespace troupe::llm::jinja
