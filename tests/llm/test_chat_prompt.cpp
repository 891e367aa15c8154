// Chat prompts through the models' own Jinja templates (llm/chat_prompt.h): SmolLM2's template gives the
// bytes and token ids the built-in ChatML family gave; Gemma's the gemma family's; tools go through templates
// that know them and into the system message of those that do not; template arguments; refusals; the BOS a
// template writes is not doubled. And the two generation features the chat API builds on (llm/sequence.h):
// a lazy grammar and a reasoning budget, on a real model.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "llm/chat_prompt.h"
#include "llm/generator.h"
#include "llm/jinja/jinja.h"
#include "loader/gguf.h"
#include "tests/support/skip.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;
using ojson = nlohmann::ordered_json;

namespace {

std::optional<std::string> shared_template(const std::string& name) {
  const auto p = std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared" / "chat-templates" / name;
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::vector<chat_message> plain(const ojson& msgs) {
  std::vector<chat_message> out;
  for (const ojson& m : msgs) out.push_back({m["role"].get<std::string>(), m["content"].get<std::string>()});
  return out;
}

const ojson conversations = ojson::parse(R"([
  [{"role": "user", "content": "Hello!"}],
  [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a colour."}],
  [{"role": "user", "content": "Name a colour."}, {"role": "assistant", "content": "Blue."},
   {"role": "user", "content": "Another one, with \"quotes\" & <tags> \u2014 \u00e9"}]
])");

const ojson weather_tools = ojson::parse(R"([{"type": "function", "function": {"name": "get_weather",
  "description": "Weather of a city", "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
  "required": ["city"]}}}])");

}  // namespace

TEST_CASE("SmolLM2's own template gives the prompt and token ids the ChatML family gave", "[llm][chat_prompt]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  const gguf_file f = read_gguf(*path);
  const vocab v(f);
  const chat_prompt p = chat_prompt::for_model(f, v);
  REQUIRE(p.jinja());
  CHECK(p.name() == "jinja");
  CHECK(p.tool_format() == tool_syntax::hermes);
  CHECK_FALSE(p.template_renders_tools());
  CHECK(p.reasoning().empty());
  const chat_template family(f);
  for (const ojson& c : conversations) {
    for (const bool gen : {true, false}) {
      INFO(c.dump() << " add_generation_prompt " << gen);
      const std::string jinja = p.render(c, nullptr, gen);
      CHECK(jinja == family.apply(plain(c), gen));
      CHECK(chat_tokens(v, jinja) == v.tokenize(family.apply(plain(c), gen), true, true));
    }
  }
  // Tools: SmolLM2's template does not read them, so the Hermes instructions go into the system message, as
  // the daemon wrote them before templates were run.
  const ojson chat = ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"}])");
  const std::string with_tools = p.render(chat, weather_tools, true);
  CHECK_THAT(with_tools, Catch::StartsWith("<|im_start|>system\n# Tools\n") && Catch::Contains("<tools>\n{\"type\":\"function\"") &&
                             Catch::Contains("<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\":\"Paris\"}}\n</tool_call><|im_end|>") &&
                             Catch::Contains("<|im_start|>user\n<tool_response>\n21 C\n</tool_response><|im_end|>") &&
                             Catch::EndsWith("<|im_start|>assistant\n"));
  // A family by name replaces the template.
  const chat_prompt raw = chat_prompt::for_model(f, v, "raw");
  CHECK_FALSE(raw.jinja());
  CHECK(raw.render(conversations[1], nullptr, true) == "You are terse.\nName a colour.");
  CHECK_THROWS_WITH(chat_prompt::for_model(f, v, "jinja"), Catch::Contains("unknown chat template 'jinja'"));
  // A template file replaces it too; one that does not parse is refused naming the line.
  const chat_prompt own = chat_prompt::for_model(f, v, "", "{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}");
  CHECK(own.render(conversations[0], nullptr, true) == "[user] Hello!\n");
  CHECK_THROWS_WITH(chat_prompt::for_model(f, v, "", "{% if x %}"), Catch::Contains("chat template file: ") && Catch::Contains("line 1"));
}

TEST_CASE("Gemma's own template gives the gemma family's prompt, a system message in the first user turn", "[llm][chat_prompt]") {
  const auto src = shared_template("google-gemma-2-2b-it.jinja");
  if (!src) return test::skip_unless_ci("../shared/chat-templates is not here");
  const chat_prompt p(chat_prompt::parts{.jinja = *src, .bos_token = "<bos>", .eos_token = "<eos>"});
  REQUIRE(p.jinja());
  const chat_template family("gemma");
  for (const ojson& c : conversations) {
    const std::string jinja = p.render(c, nullptr, true);
    REQUIRE(jinja.rfind("<bos>", 0) == 0);  // the template writes the BOS; chat_tokens does not double it
    CHECK(jinja.substr(5) == family.apply(plain(c), true));
  }
  // The template itself refuses a system role (raise_exception): that is why it is folded.
  CHECK_THROWS_WITH(jinja::template_::parse(*src).render(ojson{{"messages", conversations[1]}}), Catch::Contains("System role not supported"));
  // A refusal reaches the caller as a chat_prompt_error with the template's message.
  const ojson alternating = ojson::parse(R"([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}])");
  CHECK_THROWS_AS(p.render(alternating, nullptr, true), chat_prompt_error);
  CHECK_THROWS_WITH(p.render(alternating, nullptr, true), Catch::Contains("Conversation roles must alternate"));
}

TEST_CASE("A template that knows tools renders them, with its own call syntax, arguments and switches", "[llm][chat_prompt]") {
  const auto src = shared_template("Qwen-Qwen3-0.6B.jinja");
  if (!src) return test::skip_unless_ci("../shared/chat-templates is not here");
  const chat_prompt p(chat_prompt::parts{.jinja = *src, .eos_token = "<|im_end|>"});
  CHECK(p.tool_format() == tool_syntax::hermes);
  CHECK(p.template_renders_tools());
  CHECK(p.reasoning().start == "<think>");
  CHECK(p.reasoning().end == "</think>");
  // Arguments given as JSON text reach the template as the object (Qwen 3 writes them with tojson).
  const ojson chat = ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"}])");
  const std::string prompt = p.render(chat, weather_tools, true);
  CHECK_THAT(prompt, Catch::Contains("<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\"") &&
                         Catch::Contains("<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>") &&
                         Catch::Contains("<tool_response>\n21 C\n</tool_response>"));
  // chat_template_kwargs: Qwen 3's thinking switch.
  const std::string off = p.render(conversations[0], nullptr, true, ojson{{"enable_thinking", false}});
  CHECK_THAT(off, Catch::EndsWith("<|im_start|>assistant\n<think>\n\n</think>\n\n"));
  CHECK_FALSE(prompt_opens_reasoning(p.reasoning(), off));
  // The tool_use variant is rendered when tools are given.
  const chat_prompt variant(chat_prompt::parts{.jinja = "plain:{{ messages[0].content }}",
                                               .jinja_tool_use = "tools:{{ tools[0].function.name }}<tool_call>"});
  CHECK(variant.render(conversations[0], nullptr, true) == "plain:Hello!");
  CHECK(variant.render(conversations[0], weather_tools, true) == "tools:get_weather<tool_call>");
  // A template that does not parse falls back to its family (ChatML here).
  const chat_prompt broken(chat_prompt::parts{.jinja = "<|im_start|>{% for %}"});
  CHECK_FALSE(broken.jinja());
  CHECK(broken.render(conversations[0], nullptr, true) == "<|im_start|>user\nHello!<|im_end|>\n<|im_start|>assistant\n");
}

TEST_CASE("A BOS the template writes is not doubled", "[llm][chat_prompt]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return test::skip_unless_ci("test model stories260K.gguf is missing");
  const gguf_file f = read_gguf(*path);
  const vocab v(f);
  REQUIRE(v.add_bos());
  const chat_prompt p(chat_prompt::parts{.jinja = "{{ bos_token }}{{ messages[0].content }}", .bos_token = "<s>"});
  const std::vector<token_id> ids = chat_tokens(v, p.render(conversations[0], nullptr, false));
  REQUIRE(ids.size() >= 2);
  CHECK(ids[0] == v.bos());
  CHECK(ids[1] != v.bos());
  CHECK(ids == v.tokenize("Hello!", true));
}

TEST_CASE("A lazy grammar waits for its trigger, then constrains the rest", "[llm][chat_prompt][grammar]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return test::skip_unless_ci("test model stories260K.gguf is missing");
  auto m = model::load(*path);
  vocab v(m->meta());
  llm_context ctx(*m, {.n_ctx = 256, .n_threads = 1});
  generator gen(ctx, v);
  const auto prompt = v.tokenize("Once upon a time", true);
  const generate_result free = gen.generate(prompt, generate_params::greedy(40));
  // A word of the free answer as the trigger: the answer is the same up to it, then the grammar's.
  const size_t at = free.text.find(' ', 8);
  REQUIRE(at != std::string::npos);
  const size_t end = free.text.find_first_of(" ,.", at + 1);
  REQUIRE(end != std::string::npos);
  const std::string trigger = free.text.substr(at, end - at);
  INFO("free answer: '" << free.text << "', trigger '" << trigger << "'");
  generate_params p = generate_params::greedy(40);
  p.grammar = "root ::= \"" + trigger + "\" \" was a cat.\"";
  p.grammar_triggers = {trigger};
  gen.reset();
  const generate_result lazy = gen.generate(prompt, p);
  CHECK(lazy.text == free.text.substr(0, at) + trigger + " was a cat.");
  CHECK(lazy.finish == "stop");
  // A trigger that never appears leaves the answer as it was.
  p.grammar_triggers = {"<tool_call>"};
  gen.reset();
  CHECK(gen.generate(prompt, p).text == free.text);
}

TEST_CASE("A reasoning budget forces the end marker after its tokens", "[llm][chat_prompt]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return test::skip_unless_ci("test model stories260K.gguf is missing");
  auto m = model::load(*path);
  vocab v(m->meta());
  llm_context ctx(*m, {.n_ctx = 256, .n_threads = 1});
  generator gen(ctx, v);
  const auto prompt = v.tokenize("Once upon a time", true);
  const generate_result free = gen.generate(prompt, generate_params::greedy(12));
  generate_params p = generate_params::greedy(30);
  p.reasoning_budget = 4;
  p.reasoning_end = " The end.";
  p.reasoning_open = true;  // the prompt opened the block: its first 4 tokens are reasoning
  gen.reset();
  const generate_result r = gen.generate(prompt, p);
  std::string first4;
  for (size_t i = 0; i < 4; ++i) first4 += v.token_to_piece(free.tokens[i]);
  INFO("answer: '" << r.text << "'");
  REQUIRE(r.tokens.size() > 4);
  CHECK(std::equal(free.tokens.begin(), free.tokens.begin() + 4, r.tokens.begin()));
  const std::vector<token_id> marker = v.tokenize(" The end.", false, true);
  REQUIRE(r.tokens.size() >= 4 + marker.size());
  CHECK(std::equal(marker.begin(), marker.end(), r.tokens.begin() + 4));
  // Without a budget nothing is forced.
  p.reasoning_budget = -1;
  gen.reset();
  CHECK(gen.generate(prompt, p).text.substr(0, first4.size()) == first4);
  // A grammar applies after the block only: the reasoning is free, then the grammar's answer.
  p.reasoning_budget = 4;
  p.grammar = R"(root ::= " Lily was a cat.")";
  gen.reset();
  const generate_result g = gen.generate(prompt, p);
  std::string marker_text;  // an SPM vocabulary writes the marker with its space prefix
  for (const token_id t : marker) marker_text += v.token_to_piece(t);
  CHECK(g.text == first4 + marker_text + " Lily was a cat.");
  CHECK(g.finish == "stop");
  // So does a lazy one: a trigger inside the block does not switch it on.
  p.grammar = "root ::= \"" + first4.substr(first4.size() - 2) + "\" \"!\"";
  p.grammar_triggers = {first4.substr(first4.size() - 2)};
  gen.reset();
  const generate_result lazy = gen.generate(prompt, p);
  CHECK(lazy.text.substr(0, first4.size() + marker_text.size()) == first4 + marker_text);
}

TEST_CASE("Serving renders what the strict sandbox refuses: list.append (Kimi K2) and generation blocks (LFM 2.5)", "[llm][chat_prompt][jinja]") {
  jinja::options serving;
  serving.mutable_values = true;
  serving.generation_tag = true;
  const std::string appends = "{% set ns = namespace(l=[]) %}{% set _ = ns.l.append(1) %}{% set _ = ns.l.append(ns.l) %}"
                              "{% set _ = ns.l.insert(0, 'a') %}{{ ns.l }} {{ ns.l.pop() }} {{ ns.l.pop(0) }} {{ ns.l }}"
                              "{% set d = {'x': 1} %}{% set _ = d.update({'y': 2}) %} {{ d.setdefault('z', 3) }} {{ d.pop('x') }} {{ d }}";
  // A list appended to itself goes in as a copy: no container can hold itself.
  CHECK(jinja::template_::parse(appends, serving).render(ojson::object()) == "['a', 1, [1]] [1] a [1] 3 1 {'y': 2, 'z': 3}");
  CHECK_THROWS_WITH(jinja::template_::parse(appends).render(ojson::object()),
                    Catch::Contains("access to attribute 'append' of 'list' object is unsafe"));
  CHECK(jinja::template_::parse("a{% generation %}b{{ 1 }}{% endgeneration %}c", serving).render(ojson::object()) == "ab1c");
  CHECK_THROWS_WITH(jinja::template_::parse("a{% generation %}b{% endgeneration %}c"), Catch::Contains("unknown tag 'generation'"));
  CHECK_THROWS_WITH(jinja::template_::parse("{% generation %}b", serving), Catch::Contains("missing 'endgeneration'"));

  const auto kimi = shared_template("Kimi-K2-Instruct.jinja");
  const auto lfm = shared_template("LFM2.5-8B-A1B.jinja");
  if (!kimi || !lfm) return test::skip_unless_ci("../shared/chat-templates is not here");
  const ojson chat = ojson::parse(R"([{"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "c1", "type": "function",
      "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
    {"role": "tool", "tool_call_id": "c1", "content": "21 C"}])");
  const chat_prompt k(chat_prompt::parts{.jinja = *kimi});
  REQUIRE(k.jinja());
  const std::string prompt = k.render(chat, weather_tools, true);
  CHECK_THAT(prompt, Catch::Contains("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|>") &&
                         Catch::Contains("## Return of functions.get_weather:0\n21 C"));
  const chat_prompt l(chat_prompt::parts{.jinja = *lfm});
  REQUIRE(l.jinja());
  CHECK_THAT(l.render(conversations[2], nullptr, true), Catch::Contains("Blue.") && Catch::Contains("Another one"));
}

TEST_CASE("Preserved control tokens print as their text, the others as nothing", "[llm][chat_prompt]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return test::skip_unless_ci("test model stories260K.gguf is missing");
  auto m = model::load(*path);
  vocab v(m->meta());
  llm_context ctx(*m, {.n_ctx = 64, .n_threads = 1});
  generator gen(ctx, v);
  // <s> is a control token (not an end of generation): a bias makes greedy decoding take it.
  generate_params p = generate_params::greedy(2);
  p.logit_bias = {{v.bos(), 100.0f}};
  const auto prompt = v.tokenize("Once upon a time", true);
  const generate_result plain = gen.generate(prompt, p);
  REQUIRE(plain.tokens == std::vector<token_id>{v.bos(), v.bos()});
  CHECK(plain.text.empty());
  p.preserved_tokens = {"<s>", "[TOOL_CALLS]", "Once"};  // only single control tokens count
  gen.reset();
  CHECK(gen.generate(prompt, p).text == "<s><s>");
}
