// libFuzzer entry point for the Jinja engine of chat templates (llm/jinja): the input is a template, parsed
// and rendered over a conversation with tools, a tool call and reasoning (the shape of render.py's cases),
// with the strict sandbox or (odd lengths) the daemon's options (mutable lists and dicts, generation blocks).
// Build with clang (see tests/fuzz/CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -DTROUPE_FUZZ=ON -DTROUPE_CUDA=OFF -DTROUPE_VULKAN=OFF
//   cmake --build build-fuzz --target fuzz_jinja
//   ./build-fuzz/tests/fuzz/fuzz_jinja -max_len=4096 -dict=tests/fuzz/jinja.dict tests/fuzz/jinja/
// Any template must render or be refused with jinja::error, within the limits below; anything else (another
// exception, a sanitizer report, a crash, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include <nlohmann/json.hpp>

#include "llm/jinja/jinja.h"

using namespace troupe::llm;

namespace {

const nlohmann::ordered_json& context() {
  static const nlohmann::ordered_json ctx = nlohmann::ordered_json::parse(R"({
    "messages": [
      {"role": "system", "content": "You are terse."},
      {"role": "user", "content": "Weather in Paris? \"quotes\" & <tags> — é"},
      {"role": "assistant", "content": "", "reasoning_content": "Look it up.",
       "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
      {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "{\"temp\": 21}"},
      {"role": "user", "content": ["part", {"type": "text", "text": "Thanks"}]}
    ],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Current weather",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "enable_thinking": false, "n": 3, "x": 1.5
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view src(reinterpret_cast<const char*>(data), size);
  jinja::options o;
  o.max_steps = 200000;
  o.max_output = 1 << 20;
  o.max_depth = 64;
  o.fixed_time = 0;
  // Templates whose length is odd run as the daemon runs them: lists and dicts mutable, generation blocks.
  o.mutable_values = o.generation_tag = size % 2 == 1;
  try {
    const jinja::template_ t = jinja::template_::parse(src, o);
    const std::string out = t.render(context());
    if (out.size() > o.max_output) __builtin_trap();
  } catch (const jinja::error&) {
  }
  return 0;
}
