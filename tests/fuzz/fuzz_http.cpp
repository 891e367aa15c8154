// libFuzzer entry point for the daemon's request reading and validation: the bytes of a connection as the
// HTTP front parses them (first byte 0xf0 and above), the OpenAI JSON of /v1/chat/completions,
// /v1/completions and /v1/embeddings, the tools rendered for both syntaxes, the grammars those requests
// compile (response_format, grammar, forced tool calls), the answers' tool-call parsing, and GBNF / JSON
// Schema directly. Build with clang (see tests/fuzz/CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -DTROUPE_FUZZ=ON -DTROUPE_CUDA=OFF -DTROUPE_VULKAN=OFF
//   cmake --build build-fuzz --target fuzz_http
//   ./build-fuzz/tests/fuzz/fuzz_http -max_len=8192 -dict=tests/fuzz/http.dict tests/fuzz/http/
// The first byte picks the surface (below 0xf0: its value modulo 8). Any input must be accepted or refused with api_error / grammar_error;
// anything else (another exception, a sanitizer report, a crash, a hang) is a bug.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "net/http/front.h"
#include "net/http/openai.h"
#include "llm/grammar.h"
#include "llm/tool_calls.h"

using namespace troupe;

namespace {

void request(std::string_view body, bool chat, std::string_view tmpl) {
  http::completion_request r = http::parse_completion_request(body, chat);
  http::prepare_tools(r, tmpl);
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
        request(r.body, r.path == "/v1/chat/completions", "chatml");
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
      case 0: request(in, true, "chatml"); break;
      case 1: request(in, true, "llama3"); break;
      case 2: request(in, false, "chatml"); break;
      case 3: (void)http::parse_embedding_request(in); break;
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
        for (const auto syn : {llm::tool_syntax::hermes, llm::tool_syntax::llama3}) {
          (void)llm::parse_tool_calls(syn, in, tools);
          (void)llm::streamable_content(syn, in);
        }
        break;
      }
      default: {
        // Tools given as the input (a function list's JSON), rendered and compiled to a forced call.
        const std::string body = R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required", "tools": )" +
                                 std::string(in) + "}";
        request(body, true, "chatml");
        break;
      }
    }
  } catch (const http::api_error&) {
  } catch (const llm::grammar_error&) {
  }
  return 0;
}
