// libFuzzer entry point for the daemon's request reading and validation: the bytes of a connection as the
// HTTP front parses them (first byte 0xf0 and above), the OpenAI JSON of /v1/chat/completions,
// /v1/completions and /v1/embeddings (and Anthropic's messages, OpenAI's responses and ollama's requests), the chats rendered through the ChatML and Llama 3 families and a Jinja
// template that knows tools and reasoning, the grammars those requests compile (response_format, grammar,
// forced and lazy tool calls), the answers' tool-call parsing in every syntax, the reasoning split, and GBNF /
// JSON Schema directly. Build with clang (see tests/fuzz/CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -DTROUPE_FUZZ=ON -DTROUPE_CUDA=OFF -DTROUPE_VULKAN=OFF
//   cmake --build build-fuzz --target fuzz_http
//   ./build-fuzz/tests/fuzz/fuzz_http -max_len=8192 -dict=tests/fuzz/http.dict tests/fuzz/http/
// The first byte picks the surface (below 0xf0: its value modulo 8). Any input must be accepted or refused with api_error / grammar_error;
// anything else (another exception, a sanitizer report, a crash, a hang) is a bug.
#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/http/front.h"
#include "net/http/anthropic.h"
#include "net/http/ollama.h"
#include "net/http/openai.h"
#include "net/http/responses.h"
#include "llm/grammar.h"
#include "llm/reasoning.h"
#include "llm/tool_calls.h"

using namespace troupe;

namespace {

// The chat renderers requests go through: two built-in families and a Jinja template with tools and reasoning.
const llm::chat_prompt& renderer(int which) {
  static const llm::chat_prompt chatml(llm::chat_prompt::parts{.family = "chatml"});
  static const llm::chat_prompt llama3(llm::chat_prompt::parts{.family = "llama3"});
  static const llm::chat_prompt jinja(llm::chat_prompt::parts{
      .jinja = "{% if tools %}<tools>{{ tools | tojson }}</tools>{% endif %}{% for m in messages %}<|im_start|>{{ m.role }}\n"
               "{% if m.reasoning_content %}<think>{{ m.reasoning_content }}</think>{% endif %}{{ m.content }}"
               "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}<|im_end|>\n{% endfor %}"
               "{% if add_generation_prompt %}<|im_start|>assistant\n{% if enable_thinking is not false %}<think>\n{% endif %}{% endif %}"});
  return which == 0 ? chatml : which == 1 ? llama3 : jinja;
}

void request(std::string_view body, bool chat, int tmpl) {
  http::completion_request r = http::parse_completion_request(body, chat);
  http::prepare_chat(r, renderer(tmpl));
  if (!r.params.grammar.empty()) {
    // What the request compiled must be a grammar that parses and matches from its start.
    llm::grammar_matcher m(llm::grammar::parse(r.params.grammar));
    (void)m.bytes_to_end();
  }
  // An answer holding the body's own text (calls or not) goes through the response builders.
  actors::generate_reply reply;
  reply.text = std::string(body.substr(0, 512));
  reply.finish = "stop";
  (void)http::dump(http::completion_response(r, "id", 0, reply));
  (void)http::dump(http::stream_chunk(r, "id", 0, reply.text, true));
  if (r.chat) {
    http::chat_stream s(r, "id");
    for (size_t i = 0; i < reply.text.size(); i += 7) (void)s.feed(std::string_view(reply.text).substr(i, 7));
    (void)s.finish();
  }
}

void grammar_text(std::string_view text) {
  const auto g = llm::grammar::parse(text);
  llm::grammar_matcher m(g);
  // Feed the grammar's own text a byte at a time (a cheap source of plausible bytes).
  for (const char c : text.substr(0, 256)) {
    if (!m.accept(std::string_view(&c, 1))) break;
  }
  (void)m.can_end();
  (void)m.bytes_to_end();
}

// A connection's bytes through the front's parser; the requests it yields go on to the validation.
void connection_bytes(std::string_view bytes) {
  http::front::options o;
  o.max_header_bytes = 4096;
  o.max_body_bytes = 16384;
  o.keep_alive_max = 64;
  const http::front::parse_outcome out = http::front::parse(bytes, o);
  if (out.status != 0 && out.status != 400 && out.status != 413 && out.status != 431) __builtin_trap();
  if ((out.status == 0) != out.message.empty()) __builtin_trap();
  for (const http::front::request& r : out.requests) {
    if (r.method.empty() || r.path.find('?') != std::string::npos || r.body.size() > o.max_body_bytes) __builtin_trap();
    (void)r.header("Authorization");
    if (r.method == "POST" && (r.path == "/v1/chat/completions" || r.path == "/v1/completions")) {
      try {
        request(r.body, r.path == "/v1/chat/completions", 0);
      } catch (const http::api_error&) {
      } catch (const llm::grammar_error&) {
      }
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view in(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] >= 0xf0) {
    connection_bytes(in);
    return 0;
  }
  try {
    switch (data[0] % 8) {
      case 0: request(in, true, 0); break;
      case 1: request(in, true, in.size() % 2 == 0 ? 1 : 2); break;
      case 2: request(in, false, 0); break;
      case 3: {
        // The other APIs' request readers: each input is refused with api_error or read; a read one renders.
        const auto attempt = [&](auto read) {
          try {
            read();
          } catch (const http::api_error&) {
          } catch (const llm::grammar_error&) {
          }
        };
        attempt([&] { (void)http::parse_embedding_request(in); });
        attempt([&] { (void)http::parse_ollama_embed(in); });
        attempt([&] {
          http::completion_request r = http::parse_messages_request(in);
          http::prepare_chat(r, renderer(2));
        });
        attempt([&] {
          http::completion_request r = http::parse_ollama_request(in, in.size() % 2 == 0);
          http::prepare_chat(r, renderer(0));
        });
        attempt([&] {
          static http::response_store store;
          http::responses_request r = http::parse_responses_request(in, store);
          http::prepare_chat(r.chat, renderer(2));
        });
        break;
      }
      case 4: grammar_text(in); break;
      case 5: {
        // A schema that compiles gives a grammar that parses.
        const std::string g = llm::json_schema_to_gbnf(in);
        llm::grammar_matcher m(llm::grammar::parse(g));
        (void)m.bytes_to_end();
        break;
      }
      case 6: {
        const std::vector<llm::tool_function> tools = {{"get_weather", "", R"({"properties": {"city": {"type": "string"}}})"}, {"f", "", "{}"}};
        for (int k = 0;; ++k) {
          const auto syn = llm::tool_syntax_named(std::array{"hermes", "llama3", "mistral", "deepseek-r1", "deepseek-v3.1", "dsml",
                                                             "functionary-v3.1", "functionary-v3.2", "granite", "command-r7b", "gpt-oss",
                                                             "qwen3-coder", "glm4", "kimi-k2", "apriel", "generic"}[k]);
          if (!syn) __builtin_trap();
          (void)llm::parse_tool_calls(*syn, in, tools);
          if (llm::streamable_content(*syn, in) > in.size()) __builtin_trap();
          if (k == 15) break;
        }
        // The reasoning split, whole and streamed.
        const llm::reasoning_markers m{"<think>", "</think>", {"<response>"}};
        (void)llm::split_reasoning(m, in, in.size() % 2 == 0);
        llm::reasoning_stream rs(m, in.size() % 2 == 0);
        for (size_t i = 0; i < in.size(); i += 3) (void)rs.feed(in.substr(i, 3));
        (void)rs.finish();
        break;
      }
      default: {
        // Tools given as the input (a function list's JSON), rendered and compiled to a forced call.
        const std::string body = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "tools": )" +
                                 std::string(in) + "}";
        request(body, true, in.size() % 2 == 0 ? 0 : 2);
        break;
      }
    }
  } catch (const http::api_error&) {
  } catch (const llm::grammar_error&) {
  }
  return 0;
}
