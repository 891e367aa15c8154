// The daemon's configuration, the OpenAI request parser and the metrics text, without a server.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>

#include "net/http/daemon_config.h"
#include "net/http/anthropic.h"
#include "net/http/metrics.h"
#include "net/http/ollama.h"
#include "net/http/responses.h"
#include "net/http/openai.h"
#include "runtime/error.h"

using namespace troupe;
using namespace troupe::http;
using Catch::Matchers::Contains;

namespace {

std::string config_error(const std::string& text) {
  try {
    parse_daemon_config(text, "d.toml");
  } catch (const troupe::error& e) {
    return e.what();
  }
  return "(no error)";
}

api_error request_error(const std::string& body, bool chat = true) {
  try {
    parse_completion_request(body, chat);
  } catch (const api_error& e) {
    return e;
  }
  FAIL("no error for " << body);
  return api_error(0, "", "");
}

}  // namespace

TEST_CASE("daemon config: defaults, every section, and the example file", "[http][config]") {
  const daemon_config c = parse_daemon_config(R"(
[server]
port = 9000
api_keys = ["k1"]
queue_limit = 3
[logging]
level = "debug"
access_log = false
[runtime]
threads = 2
[[model]]
name = "m"
path = "m.gguf"
n_ctx = 1024
n_seq_max = 2
cache_type_k = "q8_0"
cache_type_v = "q4_0"
chat_template = "raw"
overrides = [{ pattern = "output", device = "CPU" }]
)",
                                              "d.toml", "/etc/troupe");
  CHECK(c.server.host == "127.0.0.1");
  CHECK(c.server.port == 9000);
  CHECK(c.server.api_keys == std::vector<std::string>{"k1"});
  CHECK(c.server.queue_limit == 3);
  CHECK(c.server.queue_timeout_s == 60);
  CHECK(c.logging.level == "debug");
  CHECK_FALSE(c.logging.access_log);
  CHECK(c.engine.n_threads == 2);
  REQUIRE(c.engine.models.size() == 1);
  const actors::model_settings& m = c.engine.models[0];
  CHECK(m.path == "/etc/troupe/m.gguf");  // relative to the configuration's folder
  CHECK(m.kv_type == "q8_0");  // cache_type_k, llama-server's name
  CHECK(m.kv_type_v == "q4_0");
  CHECK(m.kv_cache_type() == type::q8_0);
  CHECK(m.kv_cache_type_v() == type::q4_0);
  CHECK(m.chat_template == "raw");
  REQUIRE(m.overrides.size() == 1);
  CHECK(m.overrides[0].device == "CPU");
  const actors::model_settings lr = m.resolved();
  CHECK(lr.n_ctx_seq == 1024);  // n_ctx by default: one pool for the sessions

  // cpu_moe / n_cpu_moe: the experts' tensor overrides to the CPU, after the table's own.
  const daemon_config moe = parse_daemon_config(R"(
[[model]]
name = "a"
path = "a.gguf"
overrides = [{ pattern = "output", device = "Vulkan0" }]
cpu_moe = true
[[model]]
name = "b"
path = "b.gguf"
n_cpu_moe = 2
)",
                                                "d.toml");
  REQUIRE(moe.engine.models.size() == 2);
  const auto& ao = moe.engine.models[0].overrides;
  REQUIRE(ao.size() == 2);
  CHECK(ao[0].pattern == "output");
  CHECK(ao[1].device == "CPU");
  CHECK(std::regex_search("blk.7.ffn_up_exps.weight", std::regex(ao[1].pattern)));
  CHECK_FALSE(std::regex_search("blk.7.ffn_up.weight", std::regex(ao[1].pattern)));
  const auto& bo = moe.engine.models[1].overrides;
  REQUIRE(bo.size() == 2);
  CHECK(std::regex_search("blk.1.ffn_down_exps.weight", std::regex(bo[1].pattern)));
  CHECK_FALSE(std::regex_search("blk.2.ffn_down_exps.weight", std::regex(bo[0].pattern)));
  CHECK_FALSE(std::regex_search("blk.2.ffn_down_exps.weight", std::regex(bo[1].pattern)));
  CHECK_FALSE(std::regex_search("blk.10.ffn_gate_exps.weight", std::regex(bo[1].pattern)));

  // The shipped example parses (its model may not be downloaded: validation is separate).
  const daemon_config ex = load_daemon_config(std::filesystem::path(TROUPE_SOURCE_DIR) / "configs/daemon.toml");
  REQUIRE(ex.engine.models.size() == 1);
  CHECK(ex.engine.models[0].name == "smollm2");
  CHECK(ex.server.port == 8080);
  CHECK(ex.engine.models[0].kv_type == "f16");
  CHECK(ex.engine.models[0].flash_attn == "auto");
  CHECK_FALSE(ex.engine.models[0].context_shift);
  CHECK(ex.engine.models[0].prompt_cache_mib == 8192);
  CHECK(ex.engine.models[0].resolved().n_ctx_seq == 8192);
}

TEST_CASE("daemon config: errors name the file, the line and the key", "[http][config]") {
  CHECK_THAT(config_error("[server]\nport = 80\nprot = 1\n"), Contains("d.toml:3") && Contains("unknown key 'prot' in [server]"));
  CHECK_THAT(config_error("[server]\nport = \"eighty\"\n"), Contains("d.toml:2") && Contains("server.port"));
  CHECK_THAT(config_error("[server]\nport = 70000\n"), Contains("server.port must be an integer from 0 to 65535"));
  CHECK_THAT(config_error("[logging]\nlevel = \"loud\"\n"), Contains("d.toml:2") && Contains("logging.level"));
  CHECK_THAT(config_error("[sever]\nport = 1\n"), Contains("d.toml:1") && Contains("unknown key 'sever'"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nkv_type = \"q4\"\n"),
             Contains("d.toml:4") && Contains("model.kv_type"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nchat_template = \"jinja\"\n"),
             Contains("d.toml:4") && Contains("unknown chat template 'jinja'"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\noverrides = [{ pattern = \"(\", device = \"CPU\" }]\n"),
             Contains("invalid regex"));
  CHECK_THAT(config_error("[server]\napi_key_file = \"/nonexistent/keys\"\n"), Contains("server.api_key_file"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\ncpu_moe = \"yes\"\n"), Contains("d.toml:4") && Contains("cpu_moe"));
  CHECK_THAT(config_error("[[model]]\nname = \"m\"\npath = \"m.gguf\"\nn_cpu_moe = -1\n"), Contains("n_cpu_moe"));
  CHECK_THAT(config_error("[server\n"), Contains("d.toml:1"));
  CHECK_THAT(config_error("[[model]]\nname = \"a\"\npath = \"m.gguf\"\naliases = [\"b:1\"]\n[[model]]\nname = \"b:1\"\npath = \"m.gguf\"\n"),
             Contains("d.toml:5") && Contains("'b:1' is given to two models"));
  CHECK_THAT(config_error("[[model]]\nname = \"a\"\npath = \"m.gguf\"\naliases = \"b\"\n"), Contains("model.aliases must be an array"));
  CHECK_THAT(config_error("[[model]]\nname = \"a\"\npath = \"m.gguf\"\nchat_template = \"chatml\"\nchat_template_file = \"t.jinja\"\n"),
             Contains("chat_template_file and chat_template are exclusive"));

  daemon_config none = parse_daemon_config("", "d.toml");
  CHECK_THROWS_WITH(validate_daemon_config(none), Contains("no model to serve"));
  daemon_config missing = parse_daemon_config("[[model]]\nname = \"m\"\npath = \"/nonexistent/m.gguf\"\n", "d.toml");
  CHECK_THROWS_WITH(validate_daemon_config(missing), Contains("model 'm'") && Contains("/nonexistent/m.gguf"));
}

TEST_CASE("daemon config: api_key_file keys join api_keys", "[http][config]") {
  const auto dir = std::filesystem::temp_directory_path() / ("troupe-keys-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  std::ofstream(dir / "keys") << "# comment\n  alpha  \n\nbeta\n";
  const daemon_config c = parse_daemon_config("[server]\napi_keys = [\"k\"]\napi_key_file = \"keys\"\n", "d.toml", dir);
  CHECK(c.server.api_keys == std::vector<std::string>{"k", "alpha", "beta"});
  std::ofstream(dir / "empty") << "# nothing\n";
  CHECK_THROWS_WITH(parse_daemon_config("[server]\napi_key_file = \"empty\"\n", "d.toml", dir), Contains("holds no key"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("OpenAI requests: fields parsed, defaults kept", "[http][openai]") {
  const completion_request r = parse_completion_request(R"({
    "model": "m", "messages": [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": [{"type": "text", "text": "hi "}, {"type": "text", "text": "there"}]}],
    "temperature": 0, "top_p": 0.5, "top_k": 7, "min_p": 0.1, "max_tokens": 12, "stop": ["\n", "END"], "seed": 42,
    "presence_penalty": 0.5, "frequency_penalty": -0.5, "stream": true, "stream_options": {"include_usage": true},
    "user": "ignored", "logit_bias": {}})",
                                                        true);
  CHECK(r.model == "m");
  REQUIRE(r.messages.size() == 2);
  CHECK(r.messages[1].content == "hi there");
  CHECK(r.params.temperature == 0.0f);
  CHECK(r.params.top_p == 0.5f);
  CHECK(r.params.top_k == 7);
  CHECK(r.params.min_p == Approx(0.1f));
  CHECK(r.params.max_tokens == 12);
  CHECK(r.params.stop == std::vector<std::string>{"\n", "END"});
  CHECK(r.params.seed == 42u);
  CHECK(r.params.presence_penalty == 0.5f);
  CHECK(r.params.frequency_penalty == -0.5f);
  CHECK(r.stream);
  CHECK(r.include_usage);
  CHECK(r.params.logit_bias.empty());

  const completion_request b =
      parse_completion_request(R"({"model": "m", "prompt": "Once", "logit_bias": {"7": -100, "49000": 2.5}})", false);
  // In the parsed object's key order (nlohmann::json sorts keys as strings).
  CHECK(b.params.logit_bias == std::vector<llm::token_bias>{{49000, 2.5f}, {7, -100.0f}});

  CHECK(parse_completion_request(R"({"model": "m", "prompt": [1, 403, 407]})", false).prompt_ids ==
        std::vector<int32_t>{1, 403, 407});
  CHECK(parse_completion_request(R"({"model": "m", "prompt": [[1, 403]]})", false).prompt_ids == std::vector<int32_t>{1, 403});
  CHECK(parse_completion_request(R"({"model": "m", "prompt": ["Once"]})", false).prompt == "Once");
  CHECK(parse_completion_request(R"({"model": "m", "prompt": "Once", "logprobs": 5})", false).params.logprobs == 5);
  CHECK(parse_completion_request(R"({"model": "m", "prompt": "Once"})", false).params.logprobs == -1);
  CHECK(parse_completion_request(R"({"model": "m", "prompt": "Once", "response_format": {"type": "text"}})", false).prompt == "Once");
  CHECK(request_error(R"({"model": "m", "prompt": "Once", "logprobs": 21})", false).param() == "logprobs");
  CHECK(parse_completion_request(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true})", true)
            .params.logprobs == 0);
  CHECK(parse_completion_request(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": false})", true)
            .params.logprobs == -1);

  const completion_request c = parse_completion_request(R"({"model": "m", "prompt": "Once", "stop": "x"})", false);
  CHECK(c.prompt == "Once");
  CHECK(c.params.stop == std::vector<std::string>{"x"});
  CHECK_FALSE(c.stream);
  CHECK_FALSE(c.max_tokens_given);
  CHECK(c.params.temperature == actors::generation_params{}.temperature);
}

TEST_CASE("OpenAI requests: each bad field is a 400 naming it", "[http][openai]") {
  struct bad {
    const char* body;
    const char* param;
    const char* says;
  };
  const bad cases[] = {
      {"{\"model\": \"m\", ", "", "not valid JSON"},
      // Found by fuzz_http: a number beyond double is nlohmann's out_of_range, not a parse_error.
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": 1e999})", "", "not valid JSON"},
      {"[1, 2]", "", "must be a JSON object"},
      {R"({"messages": []})", "model", "'model' is required"},
      {R"({"model": "m"})", "messages", "'messages' is required"},
      {R"({"model": "m", "messages": []})", "messages", "at least one"},
      {R"({"model": "m", "messages": [{"role": "king", "content": "x"}]})", "messages[0].role", "not 'king'"},
      {R"({"model": "m", "messages": [{"role": "user"}]})", "messages[0].content", "required"},
      {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url"}]}]})", "messages[0].content[0].type",
       "not supported"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "temperature": "hot"})", "temperature",
       "must be a number, not a string"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_p": 1.5})", "top_p", "from 0 to 1"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 0})", "max_tokens", "from 1"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": 2.5})", "max_tokens", "integer"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_k": -1})", "top_k", "from 0"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": 5})", "stop", "string or an array"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "stop": [""]})", "stop", "not be empty"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "n": 17})", "n", "'n' must be"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream": "yes"})", "stream", "true or false"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "presence_penalty": 3})", "presence_penalty", "from -2 to 2"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "stream_options": 1})", "stream_options", "object"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": [1]})", "logit_bias", "must be an object"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})", "top_logprobs", "needs 'logprobs'"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "xml"}})", "response_format", "'text', 'json_object' or 'json_schema'"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "integer", "minimum": 1}}}})", "response_format.json_schema.schema", "'minimum' is not supported"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]})", "tools[0].function.name", "letters, digits"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice", "'auto', 'none', 'required'"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "response_format": "json"})", "response_format", "must be an object"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "grammar": "root ::= nope"})", "grammar", "'nope' is used"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs", "from 0 to 20"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs", "true or false"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"abc": 1}})", "logit_bias", "token ids"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"-3": 1}})", "logit_bias", "token ids"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"12": "up"}})", "logit_bias.12", "must be a number"},
      {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logit_bias": {"12": -101}})", "logit_bias.12", "[-100, 100]"},
  };
  for (const bad& b : cases) {
    INFO(b.body);
    const api_error e = request_error(b.body);
    CHECK(e.status() == 400);
    CHECK(e.type() == "invalid_request_error");
    CHECK(e.param() == b.param);
    CHECK_THAT(std::string(e.what()), Contains(b.says));
    const json j = e.body();
    CHECK(j["error"]["type"] == "invalid_request_error");
    CHECK(j["error"]["message"] == e.what());
  }
  // Duplicate keys: the last one counts (nlohmann), and the key-ordered reading of tools and schemas never
  // reads past what was checked.
  const completion_request dup = parse_completion_request(
      R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}, {"type": "function", "function": {"name": "g"}}]})",
      true);
  CHECK(dup.tools.size() == 2);
  CHECK(request_error(R"({"model": "m"})", false).param() == "prompt");
  CHECK(request_error(R"({"model": "m", "prompt": ""})", false).param() == "prompt");
  CHECK(request_error(R"({"model": "m", "prompt": 7})", false).param() == "prompt");
  CHECK(request_error(R"({"model": "m", "prompt": []})", false).param() == "prompt");
  CHECK(request_error(R"({"model": "m", "prompt": [1, -2]})", false).param() == "prompt");
  CHECK_THAT(std::string(request_error(R"({"model": "m", "prompt": [1, 2.5]})", false).what()), Contains("'prompt[1]'"));
  CHECK(request_error(R"({"model": "m", "prompt": ["a", "b"]})", false).param() == "prompt");
  CHECK(request_error(R"({"model": "m", "prompt": [[1], [2]]})", false).param() == "prompt");
}

TEST_CASE("OpenAI responses: shapes of answers, chunks and usage", "[http][openai]") {
  completion_request r;
  r.chat = true;
  r.model = "m";
  r.return_tokens = true;
  actors::generate_reply reply;
  reply.text = "hello";
  reply.finish = "stop";
  reply.tokens = {5, 6};
  reply.n_prompt = 4;
  reply.n_prompt_decoded = 1;
  const json j = completion_response(r, "chatcmpl-9", 100, reply);
  CHECK(j["object"] == "chat.completion");
  CHECK(j["choices"][0]["message"]["content"] == "hello");
  CHECK(j["choices"][0]["message"]["role"] == "assistant");
  CHECK(j["choices"][0]["finish_reason"] == "stop");
  CHECK(j["choices"][0]["tokens"] == json::array({5, 6}));
  CHECK(j["usage"]["prompt_tokens"] == 4);
  CHECK(j["usage"]["completion_tokens"] == 2);
  CHECK(j["usage"]["total_tokens"] == 6);
  CHECK(j["usage"]["prompt_tokens_details"]["cached_tokens"] == 3);

  const json first = stream_chunk(r, "chatcmpl-9", 100, "he", true);
  CHECK(first["object"] == "chat.completion.chunk");
  CHECK(first["choices"][0]["delta"]["role"] == "assistant");
  CHECK(first["choices"][0]["delta"]["content"] == "he");
  CHECK(first["choices"][0]["finish_reason"].is_null());
  CHECK_FALSE(stream_chunk(r, "chatcmpl-9", 100, "llo", false)["choices"][0]["delta"].contains("role"));
  CHECK(stream_finish(r, "chatcmpl-9", 100, "length")["choices"][0]["finish_reason"] == "length");
  CHECK(stream_usage(r, "chatcmpl-9", 100, reply)["choices"].empty());

  r.chat = false;
  CHECK(completion_response(r, "cmpl-1", 1, reply)["choices"][0]["text"] == "hello");
  CHECK(stream_chunk(r, "cmpl-1", 1, "x", true)["choices"][0]["text"] == "x");
  // Bytes that are not UTF-8 (a piece cut inside a character) do not break the JSON.
  CHECK_NOTHROW(json::parse(dump(json{{"t", std::string("\xe2\x82")}})));
}

TEST_CASE("OpenAI responses: a streamed chat answer gives the plain answer's reasoning, content and calls", "[http][openai][reasoning]") {
  completion_request r;
  r.chat = true;
  r.model = "m";
  r.tools = {{"get_weather", "", R"({"type": "object", "properties": {"city": {"type": "string"}}})"}, {"now", "", "{}"}};
  r.reasoning = {"<think>", "</think>", {}};
  struct answer {
    llm::tool_syntax syntax;
    bool open;
    std::string text;
    size_t calls;
  };
  const std::vector<answer> answers = {
      {llm::tool_syntax::hermes, false, "<think>Look it up.</think>\n\nLet me check. <tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call> Done.", 2},
      {llm::tool_syntax::hermes, true, "Thinking...</think>Sunny, 21 C.", 0},
      {llm::tool_syntax::hermes, false, "Text <tool_call>\n{\"name\": \"nope\", \"arguments\": {}}\n</tool_call>", 0},
      // Two calls then text: bare JSON that is not only calls is content, and no call may have gone out.
      {llm::tool_syntax::llama3, false, "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"now\", \"parameters\": {}} Thanks.", 0},
      {llm::tool_syntax::llama3, false, "{\"name\": \"now\", \"parameters\": {}}; {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Rome\"}}", 2},
      {llm::tool_syntax::mistral, false, "[TOOL_CALLS]now[ARGS]{}[TOOL_CALLS]get_weather[ARGS]{\"city\": \"Oslo\"}", 2},
  };
  for (const answer& a : answers) {
    for (const size_t piece : {1u, 3u, 7u, 1000u}) {
      INFO(a.text << " in pieces of " << piece);
      r.syntax = a.syntax;
      r.reasoning_open = a.open;
      actors::generate_reply reply;
      reply.text = a.text;
      reply.finish = "stop";
      const json plain = completion_response(r, "c1", 1, reply)["choices"][0]["message"];
      chat_stream s(r, "c1");
      std::string reasoning, content;
      std::vector<llm::tool_call> calls;
      const auto take = [&](const chat_stream::deltas& d) {
        reasoning += d.reasoning;
        content += d.content;
        CHECK(d.first_index == calls.size());
        calls.insert(calls.end(), d.calls.begin(), d.calls.end());
      };
      for (size_t i = 0; i < a.text.size(); i += piece) take(s.feed(std::string_view(a.text).substr(i, piece)));
      take(s.finish());
      CHECK(calls.size() == a.calls);
      CHECK(reasoning == plain.value("reasoning_content", ""));
      CHECK(content == (plain["content"].is_null() ? "" : plain["content"].get<std::string>()));
      REQUIRE(calls.size() == (plain.contains("tool_calls") ? plain["tool_calls"].size() : 0));
      for (size_t i = 0; i < calls.size(); ++i) {
        CHECK(calls[i].id == plain["tool_calls"][i]["id"]);
        CHECK(calls[i].name == plain["tool_calls"][i]["function"]["name"]);
        CHECK(calls[i].arguments == plain["tool_calls"][i]["function"]["arguments"]);
      }
    }
  }
  // The chunks of a streamed call: id, type and name first with empty arguments, then the arguments in pieces.
  const llm::tool_call call{"call_1", "get_weather", R"({"city": "a long city name that takes more than one piece"})"};
  const std::vector<json> chunks = stream_tool_call_chunks(r, "c1", 1, call, 0, false);
  REQUIRE(chunks.size() >= 3);
  const json head = chunks[0]["choices"][0]["delta"]["tool_calls"][0];
  CHECK(head["id"] == "call_1");
  CHECK(head["type"] == "function");
  CHECK(head["function"]["name"] == "get_weather");
  CHECK(head["function"]["arguments"] == "");
  std::string args;
  for (size_t i = 1; i < chunks.size(); ++i) {
    const json d = chunks[i]["choices"][0]["delta"]["tool_calls"][0];
    CHECK(d["index"] == 0);
    CHECK_FALSE(d.contains("id"));
    args += d["function"]["arguments"].get<std::string>();
  }
  CHECK(args == call.arguments);
  CHECK(stream_reasoning_chunk(r, "c1", 1, "hmm", true)["choices"][0]["delta"]["reasoning_content"] == "hmm");
}

TEST_CASE("Anthropic messages: requests read into the chat they mean, answers and errors in Anthropic's shapes", "[http][anthropic]") {
  const completion_request r = parse_messages_request(R"({"model": "m", "max_tokens": 50, "system": [{"type": "text", "text": "Be brief."}],
    "stop_sequences": ["END"], "temperature": 0.5, "top_k": 7, "stream": true,
    "tools": [{"name": "get_weather", "description": "Weather", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
    "messages": [
      {"role": "user", "content": "Weather in Paris?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Look it up.", "signature": "x"},
                                        {"type": "text", "text": "Checking."},
                                        {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Paris"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "21 C"}]},
                                   {"type": "text", "text": "And tomorrow?"}]}]})");
  CHECK(r.chat);
  CHECK(r.model == "m");
  CHECK(r.params.max_tokens == 50);
  CHECK(r.params.stop == std::vector<std::string>{"END"});
  CHECK(r.params.temperature == 0.5f);
  CHECK(r.params.top_k == 7);
  CHECK(r.stream);
  CHECK(r.tool_choice == "required");
  CHECK_FALSE(r.parallel_tool_calls);
  REQUIRE(r.tools.size() == 1);
  CHECK(r.tools[0].parameters == R"({"type":"object","properties":{"city":{"type":"string"}}})");
  const auto& m = r.template_messages;
  REQUIRE(m.size() == 5);
  CHECK(m[0] == nlohmann::ordered_json({{"role", "system"}, {"content", "Be brief."}}));
  CHECK(m[2]["content"] == "Checking.");
  CHECK(m[2]["reasoning_content"] == "Look it up.");
  CHECK(m[2]["tool_calls"][0]["id"] == "toolu_1");
  CHECK(m[2]["tool_calls"][0]["function"]["arguments"] == R"({"city":"Paris"})");
  CHECK(m[3] == nlohmann::ordered_json({{"role", "tool"}, {"tool_call_id", "toolu_1"}, {"content", "21 C"}}));
  CHECK(m[4] == nlohmann::ordered_json({{"role", "user"}, {"content", "And tomorrow?"}}));
  CHECK(parse_messages_request(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "tool", "name": "f"},
      "tools": [{"name": "f", "input_schema": {"type": "object"}}], "thinking": {"type": "disabled"}})").tool_choice_name == "f");

  // Each bad field is a 400 naming it, as Anthropic names it.
  const auto refused = [](const std::string& body) {
    try {
      (void)parse_messages_request(body);
    } catch (const api_error& e) {
      CHECK(e.status() == 400);
      return e.param() + ": " + e.what();
    }
    return std::string("accepted");
  };
  const std::string ok_msgs = R"("messages": [{"role": "user", "content": "x"}])";
  CHECK_THAT(refused(R"({"model": "m", )" + ok_msgs + "}"), Catch::StartsWith("max_tokens: 'max_tokens' is required"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 0, )" + ok_msgs + "}"), Catch::StartsWith("max_tokens:"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "messages": []})"), Catch::StartsWith("messages:"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "system", "content": "x"}]})"), Catch::StartsWith("messages[0].role:"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]})"),
             Catch::Contains("messages[0].content[0]") && Catch::Contains("no vision"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "stop_sequences": "END", )" + ok_msgs + "}"), Catch::StartsWith("stop_sequences:"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "tools": [{"name": "f"}], )" + ok_msgs + "}"), Catch::StartsWith("tools[0].input_schema:"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "tools": [{"type": "web_search_20250305", "name": "web_search"}], )" + ok_msgs + "}"),
             Catch::Contains("server tool"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "tool_choice": {"type": "sometimes"}, )" + ok_msgs + "}"), Catch::StartsWith("tool_choice:"));
  CHECK_THAT(refused(R"({"model": "m", "max_tokens": 5, "thinking": {"type": "maybe"}, )" + ok_msgs + "}"), Catch::StartsWith("thinking:"));
  CHECK_THAT(refused("{"), Catch::Contains("not valid JSON"));
  CHECK_THAT(refused(std::string(100, '[') + std::string(100, ']')), Catch::Contains("deeper than 64"));
  CHECK(parse_messages_request(R"({"model": "m", )" + ok_msgs + "}", /*count_tokens=*/true).model == "m");

  // A whole answer: thinking, text and tool_use blocks; stop_reason; usage with the cached prompt tokens.
  completion_request a = parse_messages_request(R"({"model": "m", "max_tokens": 50, "tools": [{"name": "now", "input_schema": {"type": "object"}}], )" + ok_msgs + "}");
  a.syntax = llm::tool_syntax::hermes;
  a.reasoning = {"<think>", "</think>", {}};
  actors::generate_reply reply;
  reply.text = "<think>Hm.</think>Sure. <tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
  reply.finish = "stop";
  reply.tokens = {1, 2, 3};
  reply.n_prompt = 10;
  reply.n_prompt_decoded = 4;
  const json j = messages_response(a, "msg_7", reply);
  CHECK(j["type"] == "message");
  CHECK(j["content"][0] == json({{"type", "thinking"}, {"thinking", "Hm."}, {"signature", ""}}));
  CHECK(j["content"][1] == json({{"type", "text"}, {"text", "Sure."}}));
  CHECK(j["content"][2]["type"] == "tool_use");
  CHECK(j["content"][2]["name"] == "now");
  CHECK(j["content"][2]["input"] == json::object());
  CHECK(j["stop_reason"] == "tool_use");
  CHECK(j["usage"] == json({{"input_tokens", 10}, {"output_tokens", 3}, {"cache_read_input_tokens", 6}, {"cache_creation_input_tokens", 0}}));
  reply.text = "Plain.";
  reply.stop_match = "END";
  CHECK(messages_response(a, "msg_7", reply)["stop_reason"] == "stop_sequence");
  CHECK(messages_response(a, "msg_7", reply)["stop_sequence"] == "END");
  reply.finish = "length";
  reply.stop_match.clear();
  CHECK(messages_response(a, "msg_7", reply)["stop_reason"] == "max_tokens");
  CHECK(messages_error(bad_request("nope"))["error"]["type"] == "invalid_request_error");
  CHECK(messages_error(api_error(503, "unavailable_error", "later"))["error"] == json({{"type", "overloaded_error"}, {"message", "later"}}));
  CHECK(messages_error(api_error(404, "invalid_request_error", "gone"))["type"] == "error");
}

TEST_CASE("OpenAI responses API: input items read into the chat, previous_response_id from the store, errors naming the field", "[http][responses]") {
  response_store store(2);
  const responses_request r = parse_responses_request(R"({"model": "m", "instructions": "Be brief.", "max_output_tokens": 20, "store": false,
    "input": [{"role": "user", "content": [{"type": "input_text", "text": "Weather?"}]},
              {"type": "reasoning", "summary": [{"type": "summary_text", "text": "Look it up."}]},
              {"type": "function_call", "call_id": "c1", "name": "get_weather", "arguments": "{\"city\": \"Paris\"}"},
              {"type": "function_call", "call_id": "c2", "name": "now", "arguments": "{}"},
              {"type": "function_call_output", "call_id": "c1", "output": "21 C"}],
    "text": {"format": {"type": "json_object"}}})", store);
  CHECK_FALSE(r.store);
  CHECK(r.chat.params.max_tokens == 20);
  CHECK_FALSE(r.chat.params.grammar.empty());  // json_object
  const auto& m = r.chat.template_messages;
  REQUIRE(m.size() == 4);
  CHECK(m[0] == nlohmann::ordered_json({{"role", "system"}, {"content", "Be brief."}}));
  CHECK(m[1]["content"] == "Weather?");
  CHECK(m[2]["role"] == "assistant");
  CHECK(m[2]["reasoning_content"] == "Look it up.");
  CHECK(m[2]["tool_calls"].size() == 2);  // consecutive calls are one turn
  CHECK(m[3] == nlohmann::ordered_json({{"role", "tool"}, {"tool_call_id", "c1"}, {"content", "21 C"}}));
  CHECK(r.conversation.size() == 3);  // without the instructions
  CHECK(r.echo["instructions"] == "Be brief.");

  // previous_response_id continues a stored conversation; the store keeps the newest `capacity`.
  store.put("resp_1", {json{{"id", "resp_1"}}, nlohmann::ordered_json::parse(R"([{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}])")});
  const responses_request next = parse_responses_request(R"({"model": "m", "input": "More?", "previous_response_id": "resp_1"})", store);
  REQUIRE(next.chat.template_messages.size() == 3);
  CHECK(next.chat.template_messages[1]["content"] == "Hello");
  CHECK(next.chat.template_messages[2]["content"] == "More?");
  store.put("resp_2", {});
  store.put("resp_3", {});
  CHECK_FALSE(store.get("resp_1"));
  CHECK(store.size() == 2);
  CHECK(store.erase("resp_2"));
  CHECK_FALSE(store.erase("resp_2"));

  const auto refused = [&](const std::string& body) {
    try {
      (void)parse_responses_request(body, store);
    } catch (const api_error& e) {
      return std::to_string(e.status()) + " " + e.param() + ": " + e.what();
    }
    return std::string("accepted");
  };
  CHECK_THAT(refused(R"({"model": "m"})"), Catch::StartsWith("400 input:"));
  CHECK_THAT(refused(R"({"model": "m", "input": 5})"), Catch::StartsWith("400 input:"));
  CHECK_THAT(refused(R"({"model": "m", "input": [{"type": "web_search_call"}]})"), Catch::StartsWith("400 input[0].type:"));
  CHECK_THAT(refused(R"({"model": "m", "input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]})"),
             Catch::Contains("text only"));
  CHECK_THAT(refused(R"({"model": "m", "input": "x", "previous_response_id": "resp_9"})"), Catch::StartsWith("404 previous_response_id:"));
  CHECK_THAT(refused(R"({"model": "m", "input": "x", "tools": [{"type": "web_search"}]})"), Catch::StartsWith("400 tools[0]:"));
  CHECK_THAT(refused(R"({"model": "m", "input": "x", "max_output_tokens": 0})"), Catch::StartsWith("400 max_output_tokens:"));
  CHECK_THAT(refused(R"({"model": "m", "input": "x", "text": {"format": {"type": "yaml"}}})"), Catch::StartsWith("400 text.format:"));

  // The response object: output items from the answer, status and usage.
  completion_request chat = r.chat;
  chat.model = "m";
  actors::generate_reply reply;
  reply.text = "Sunny.";
  reply.finish = "length";
  reply.tokens = {1, 2};
  reply.n_prompt = 9;
  reply.n_prompt_decoded = 9;
  const json o = responses_object(chat, r, "resp_5", 7, reply);
  CHECK(o["status"] == "incomplete");
  CHECK(o["incomplete_details"]["reason"] == "max_output_tokens");
  CHECK(o["output"][0]["type"] == "message");
  CHECK(o["output"][0]["content"][0] == json({{"type", "output_text"}, {"text", "Sunny."}, {"annotations", json::array()}}));
  CHECK(o["usage"]["total_tokens"] == 11);
  CHECK(o["store"] == false);
}

TEST_CASE("metrics: Prometheus text with requests, tokens, queue and memory", "[http][metrics]") {
  daemon_metrics m;
  m.request_done("chat", 200, 0.5);
  m.request_done("chat", 200, 1.5);
  m.request_done("chat", 400, 0.01);
  m.tokens(10, 7, 32, 0.25);
  m.cancelled();
  m.queue_depth = 3;
  actors::memory_breakdown mem;
  mem.entries.push_back({"CPU", "CPU", true, 1000, 200, 30});
  actors::decoder_stats st;
  st.model = "stories";
  st.n_steps = 40;
  st.n_batches = 25;
  st.max_steps = 3;
  st.reused_tokens = 120;
  st.kept_now = 2;
  st.kept_tokens_now = 300;
  st.kept_evictions = 5;
  const std::string t = m.render({{"stories", true, 1, 2, 4}}, mem, {st});
  CHECK_THAT(t, Contains("troupe_requests_total{endpoint=\"chat\",status=\"200\"} 2\n"));
  CHECK_THAT(t, Contains("troupe_requests_total{endpoint=\"chat\",status=\"400\"} 1\n"));
  CHECK_THAT(t, Contains("troupe_requests_cancelled_total 1\n"));
  CHECK_THAT(t, Contains("troupe_generated_tokens_total 32\n"));
  CHECK_THAT(t, Contains("troupe_prompt_tokens_total 10\n"));
  CHECK_THAT(t, Contains("troupe_prompt_tokens_cached_total 7\n"));
  CHECK_THAT(t, Contains("troupe_prompt_tokens_computed_total 3\n"));
  CHECK_THAT(t, Contains("troupe_prefix_reused_tokens_total{model=\"stories\"} 120\n"));
  CHECK_THAT(t, Contains("troupe_kept_conversations{model=\"stories\"} 2\n"));
  CHECK_THAT(t, Contains("troupe_kept_tokens{model=\"stories\"} 300\n"));
  CHECK_THAT(t, Contains("troupe_kept_evictions_total{model=\"stories\"} 5\n"));
  CHECK_THAT(t, Contains("troupe_tokens_per_second 3.2\n"));
  CHECK_THAT(t, Contains("troupe_queue_depth 3\n"));
  CHECK_THAT(t, Contains("troupe_request_duration_seconds_count 3\n"));
  CHECK_THAT(t, Contains("troupe_sessions{model=\"stories\",state=\"busy\"} 1\n"));
  CHECK_THAT(t, Contains("troupe_sessions{model=\"stories\",state=\"free\"} 1\n"));
  CHECK_THAT(t, Contains("troupe_model_ready{model=\"stories\"} 1\n"));
  CHECK_THAT(t, Contains("troupe_memory_bytes{buft=\"CPU\",device=\"CPU\",host=\"true\",kind=\"model\"} 1000\n"));
  CHECK_THAT(t, Contains("troupe_memory_bytes{buft=\"CPU\",device=\"CPU\",host=\"true\",kind=\"compute\"} 30\n"));
  CHECK_THAT(t, Contains("troupe_decode_steps_total{model=\"stories\"} 40\n"));
  CHECK_THAT(t, Contains("troupe_decode_batches_total{model=\"stories\"} 25\n"));
  CHECK_THAT(t, Contains("troupe_decode_batch_max{model=\"stories\"} 3\n"));
  CHECK(m.n_requests("chat", 200) == 2);
}

TEST_CASE("ollama requests: read into the requests they mean, each malformed body a 400 in ollama's shape naming the field", "[http][ollama]") {
  const completion_request r = parse_ollama_request(R"({"model": "smollm2:135m", "messages": [{"role": "user", "content": "hi"}],
    "options": {"temperature": 0.2, "num_predict": 7, "stop": ["END"]}, "keep_alive": "10m", "stream": false})", false);
  CHECK(r.chat);
  CHECK(r.model == "smollm2:135m");
  CHECK(r.params.max_tokens == 7);
  CHECK(r.params.stop == std::vector<std::string>{"END"});
  CHECK_FALSE(r.stream);
  CHECK(r.keep_alive_ms == 600000);
  CHECK(parse_ollama_request(R"({"model": "m", "prompt": "x", "keep_alive": -1})", true).keep_alive_ms == -1);
  CHECK(parse_ollama_request(R"({"model": "m", "prompt": "x", "keep_alive": 2.5})", true).keep_alive_ms == 2500);
  CHECK(parse_ollama_request(R"({"model": "m", "prompt": "x"})", true).keep_alive_ms == actors::model_settings::keep_alive_default);
  CHECK(ollama_load_only(R"({"model": "m", "keep_alive": "0"})", true).value()["done_reason"] == "unload");
  CHECK(ollama_load_only(R"({"model": "m", "messages": []})", false).value()["done_reason"] == "load");
  CHECK_FALSE(ollama_load_only(R"({"model": "m", "prompt": "x"})", true));

  const auto error_of = [](const std::string& body, bool generate) {
    try {
      (void)parse_ollama_request(body, generate);
    } catch (const api_error& e) {
      const json shaped = ollama_error(e);
      CHECK(e.status() == 400);
      CHECK(shaped.size() == 1);  // {"error": "..."}, as ollama answers
      return shaped["error"].get<std::string>();
    }
    FAIL("no error for " << body);
    return std::string();
  };
  CHECK_THAT(error_of("{not json", false), Contains("JSON"));
  CHECK_THAT(error_of("[1, 2]", false), Contains("object"));
  CHECK_THAT(error_of(R"({"messages": []})", false), Contains("model"));
  CHECK_THAT(error_of(R"({"model": "m", "messages": "hi"})", false), Contains("messages"));
  CHECK_THAT(error_of(R"({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["AAAA"]}]})", false), Contains("images"));
  CHECK_THAT(error_of(R"({"model": "m", "prompt": "x", "keep_alive": "soon"})", true), Contains("keep_alive"));
  CHECK_THAT(error_of(R"({"model": "m", "prompt": "x", "keep_alive": [1]})", true), Contains("keep_alive"));
  CHECK_THAT(error_of(R"({"model": "m", "prompt": "x", "suffix": "y"})", true), Contains("suffix"));
  CHECK_THAT(error_of(R"({"model": "m", "prompt": "x", "options": {"temperature": "hot"}})", true), Contains("temperature"));
  CHECK_THAT(error_of(R"({"model": "m", "prompt": "x", "format": 5})", true), Contains("format"));
  try {
    (void)parse_ollama_embed(R"({"model": "m"})");
    FAIL("no error");
  } catch (const api_error& e) {
    CHECK(e.status() == 400);
    CHECK_THAT(ollama_error(e)["error"].get<std::string>(), Contains("input"));
  }
}
