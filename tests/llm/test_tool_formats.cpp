// Function-calling formats (llm/tool_calls.h): which format each real chat template of ../shared/chat-templates
// writes calls in, calls rendered by those templates (troupe's Jinja engine) parsed back, and for every syntax
// the cases around a call (text, malformed calls, unknown functions, streaming), its grammar against its own
// rendering, and every prefix of a rendering parsed without a crash.
#include <catch2/catch.hpp>

#include <nlohmann/json.hpp>

#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "llm/grammar.h"
#include "llm/jinja/jinja.h"
#include "llm/tool_calls.h"
#include "tests/support/skip.h"

using namespace troupe::llm;
using ojson = nlohmann::ordered_json;

namespace {

const std::vector<tool_function> tools = {
    {"get_weather", "Weather of a city", R"({"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})"},
    {"get_time", "Time in a zone", R"({"type": "object", "properties": {"zone": {"type": "string"}, "n": {"type": "integer"}}, "required": ["zone"]})"}};

const std::vector<tool_call> two_calls = {{"", "get_weather", R"({"city":"Paris"})"}, {"", "get_time", R"({"zone":"CET","n":2})"}};

constexpr tool_syntax all_syntaxes[] = {
    tool_syntax::hermes,      tool_syntax::llama3,      tool_syntax::mistral,      tool_syntax::deepseek_r1,
    tool_syntax::deepseek_v31, tool_syntax::dsml,       tool_syntax::functionary_v31, tool_syntax::functionary_v32,
    tool_syntax::granite,     tool_syntax::command_r7b, tool_syntax::gpt_oss,      tool_syntax::qwen3_coder,
    tool_syntax::glm4,        tool_syntax::kimi_k2,     tool_syntax::apriel,       tool_syntax::generic};

// Formats whose calls are the whole answer (no text around them).
bool whole_answer(tool_syntax s) { return s == tool_syntax::llama3 || s == tool_syntax::generic; }

std::filesystem::path templates_dir() { return std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared" / "chat-templates"; }

std::string read_file(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The same calls: names in order, arguments equal as JSON (and ids where `ids` gives them).
void check_calls(const std::vector<tool_call>& got, const std::vector<tool_call>& want, const std::vector<std::string>& ids = {}) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    INFO("call " << i << ": " << got[i].name << " " << got[i].arguments);
    CHECK(got[i].name == want[i].name);
    CHECK(nlohmann::json::parse(got[i].arguments) == nlohmann::json::parse(want[i].arguments));
    if (!ids.empty()) CHECK(got[i].id == ids[i]);
  }
}

bool matches(const std::shared_ptr<const grammar>& g, const std::string& text) {
  grammar_matcher m(g);
  return m.accept(text) && m.can_end();
}

bool starts_with_trigger(tool_syntax s, const std::string& text) {
  for (const std::string& t : tool_call_triggers(s)) {
    if (text.rfind(t, 0) == 0) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("tool formats: detect_tool_syntax names the format of each real chat template", "[tools]") {
  const std::filesystem::path dir = templates_dir();
  if (!std::filesystem::exists(dir)) return troupe::test::skip_unless_ci("../shared/chat-templates is not here");
  // Every template of the folder, with the format its tool calls are written in (generic: none of the
  // known ones, or no tool calls at all).
  const std::map<std::string, std::string> expected = {
      {"Apriel-1.6-15b-Thinker-fixed", "apriel"},
      {"Bielik-11B-v3.0-Instruct", "hermes"},
      {"Cohere2MoE", "command-r7b"},
      {"CohereForAI-c4ai-command-r-plus-tool_use", "generic"},  // "Action: ```json [...]```", a format of its own
      {"GLM-4.7-Flash", "glm4"},
      {"GigaChat3-10B-A1.8B", "generic"},  // "function call" turns
      {"GigaChat3.1-10B-A1.8B", "generic"},
      {"Kimi-K2-Instruct", "kimi-k2"},
      {"Kimi-K3", "generic"},  // <|open|>call tool="..."
      {"LFM2.5-8B-A1B", "generic"},  // <|tool_call_start|>[f(a=1)] (Python calls)
      {"LFM2.5-Instruct", "generic"},
      {"MiMo-VL", "hermes"},
      {"MiniMax-M1", "apriel"},  // <tool_calls> with an object a line, which apriel's parser takes
      {"MiniMax-M3", "generic"},  // <tool_call> around <invoke name=...>, not hermes
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "qwen3-coder"},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "hermes"},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "hermes"},
      {"Qwen-QwQ-32B", "hermes"},
      {"Qwen-Qwen2.5-7B-Instruct", "hermes"},
      {"Qwen-Qwen3-0.6B", "hermes"},
      {"Reka-Edge", "hermes"},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "deepseek-r1"},
      {"deepseek-ai-DeepSeek-V3.2", "dsml"},
      {"deepseek-ai-DeepSeek-V4-Flash-0731", "dsml"},
      {"deepseek-ai-DeepSeek-V4", "dsml"},
      {"fireworks-ai-llama-3-firefunction-v2", "generic"},  // functools[...]
      {"google-gemma-2-2b-it", "generic"},
      {"google-gemma-4-31B-it-interleaved", "generic"},  // <|tool_call>call:f{...}<tool_call|>
      {"ibm-granite-granite-3.3-2B-Instruct", "granite"},
      {"ibm-granite-granite-4.1", "hermes"},
      {"llama-cpp-deepseek-r1", "deepseek-r1"},
      {"llama-cpp-rwkv-world", "generic"},
      {"meetkai-functionary-medium-v3.1", "functionary-v3.1"},
      {"meta-llama-Llama-3.1-8B-Instruct", "llama3"},
      {"meta-llama-Llama-3.2-3B-Instruct", "llama3"},
      {"microsoft-Phi-3.5-mini-instruct", "generic"},
      {"mistralai-Ministral-3-14B-Reasoning-2512", "mistral"},
      {"mistralai-Mistral-Nemo-Instruct-2407", "mistral"},
      {"muse-glimmer", "generic"},  // <atem:function_calls>
      {"poolside-Laguna-S-2.1", "glm4"},
      {"poolside-Laguna-XS-2.1", "glm4"},
      {"poolside-Laguna-XS.2", "glm4"},
      {"unsloth-Apriel-1.5", "apriel"},
      {"upstage-Solar-Open-100B", "generic"},  // <|tool_call:begin|>id<|tool_call:name|>f<|tool_call:args|>
  };
  size_t n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    if (entry.path().extension() != ".jinja") continue;
    const std::string stem = entry.path().stem().string();
    INFO(stem);
    const auto it = expected.find(stem);
    REQUIRE(it != expected.end());
    CHECK(tool_syntax_name(detect_tool_syntax(read_file(entry.path()))) == it->second);
    ++n;
  }
  CHECK(n == expected.size());
}

TEST_CASE("tool formats: calls rendered by the model's own template parse back", "[tools]") {
  const std::filesystem::path dir = templates_dir();
  if (!std::filesystem::exists(dir)) return troupe::test::skip_unless_ci("../shared/chat-templates is not here");
  ojson tool_list = ojson::array();
  for (const tool_function& t : tools) {
    tool_list.push_back({{"type", "function"},
                         {"function", {{"name", t.name}, {"description", t.description}, {"parameters", ojson::parse(t.parameters)}}}});
  }
  const std::string question = "What is the weather in Paris and the time in CET?";
  struct case_ {
    std::string file;
    size_t n_calls;         // Llama 3.1 / 3.2 refuse more than one call
    bool content_null;      // R1 Distill renders calls only when the content is None
    bool string_arguments;  // ... and concatenates the arguments as text
    bool ids;               // the parsed calls carry the conversation's ids (Mistral Nemo)
  };
  // Kimi-K2-Instruct.jinja appends to a list, which the strict sandbox refuses, and the Laguna templates use
  // a {% generation %} tag: they render with the daemon's options (jinja::options::mutable_values and
  // generation_tag), as llm::chat_prompt renders every template.
  const std::vector<case_> cases = {
      {"Kimi-K2-Instruct", 2, false, false, false},
      {"poolside-Laguna-XS.2", 2, false, false, false},
      {"poolside-Laguna-S-2.1", 2, false, false, false},
      {"Qwen-Qwen3-0.6B", 2, false, false, false},
      {"Qwen-Qwen2.5-7B-Instruct", 2, false, false, false},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", 2, false, false, false},
      {"Bielik-11B-v3.0-Instruct", 2, false, false, false},
      {"MiMo-VL", 2, false, false, false},
      {"Reka-Edge", 2, false, false, false},
      {"ibm-granite-granite-4.1", 2, false, false, false},
      {"meta-llama-Llama-3.2-3B-Instruct", 1, false, false, false},
      {"meta-llama-Llama-3.1-8B-Instruct", 1, false, false, false},
      {"mistralai-Mistral-Nemo-Instruct-2407", 2, false, false, true},
      {"mistralai-Ministral-3-14B-Reasoning-2512", 2, false, false, false},
      {"deepseek-ai-DeepSeek-V3.2", 2, false, false, false},
      {"deepseek-ai-DeepSeek-V4", 2, false, false, false},
      {"deepseek-ai-DeepSeek-V4-Flash-0731", 2, false, false, false},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", 2, true, true, false},
      {"meetkai-functionary-medium-v3.1", 2, false, false, false},
      {"Cohere2MoE", 2, false, false, false},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", 2, false, false, false},
      {"GLM-4.7-Flash", 2, false, false, false},
      {"Apriel-1.6-15b-Thinker-fixed", 2, false, false, false},
      {"unsloth-Apriel-1.5", 2, false, false, false},
      {"MiniMax-M1", 2, false, false, false},
  };
  const std::vector<std::string> ids = {"abcdef123", "bcdefg234"};
  for (const case_& c : cases) {
    INFO(c.file);
    const std::string src = read_file(dir / (c.file + ".jinja"));
    REQUIRE(!src.empty());
    const tool_syntax syn = detect_tool_syntax(src);
    CHECK(syn != tool_syntax::generic);
    ojson calls = ojson::array();
    for (size_t i = 0; i < c.n_calls; ++i) {
      ojson args = ojson::parse(two_calls[i].arguments);
      calls.push_back({{"id", ids[i]},
                       {"type", "function"},
                       {"function", {{"name", two_calls[i].name}, {"arguments", c.string_arguments ? ojson(args.dump()) : args}}}});
    }
    ojson assistant = {{"role", "assistant"}, {"content", c.content_null ? ojson(nullptr) : ojson("")}, {"tool_calls", calls}};
    const ojson ctx = {{"messages", ojson::array({{{"role", "user"}, {"content", question}}, assistant})},
                       {"tools", tool_list},
                       {"add_generation_prompt", false},
                       {"bos_token", ""},
                       {"eos_token", ""}};
    std::string rendered;
    troupe::llm::jinja::options serving;
    serving.mutable_values = serving.generation_tag = true;
    REQUIRE_NOTHROW(rendered = troupe::llm::jinja::template_::parse(src, serving).render(ctx));
    const size_t q = rendered.rfind(question);
    REQUIRE(q != std::string::npos);
    std::string answer = rendered.substr(q + question.size());
    if (syn == tool_syntax::llama3) {
      // The whole answer is the call: without the assistant header (the prompt's) and the end of the turn
      // (a stop token, not text of the answer).
      const size_t header = answer.rfind("<|end_header_id|>");
      REQUIRE(header != std::string::npos);
      answer = answer.substr(header + std::string_view("<|end_header_id|>").size());
      for (const std::string_view stop : {"<|eot_id|>", "<|eom_id|>"}) {
        if (answer.size() >= stop.size() && answer.compare(answer.size() - stop.size(), stop.size(), stop) == 0) answer.resize(answer.size() - stop.size());
      }
    }
    INFO(tool_syntax_name(syn) << ": " << answer);
    const tool_output out = parse_tool_calls(syn, answer, tools);
    const std::vector<tool_call> want(two_calls.begin(), two_calls.begin() + static_cast<std::ptrdiff_t>(c.n_calls));
    check_calls(out.calls, want, c.ids ? std::vector<std::string>(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(c.n_calls)) : std::vector<std::string>{});
  }
}

TEST_CASE("tool formats: each syntax parses its own rendering back with the ids its format carries", "[tools]") {
  // Covers the formats no template here renders calls in (DeepSeek R1 / V3.1, Functionary v3.2, Granite 3,
  // gpt-oss, Kimi K2).
  for (const tool_syntax syn : all_syntaxes) {
    INFO(tool_syntax_name(syn));
    CHECK(tool_syntax_named(tool_syntax_name(syn)) == syn);
    const std::string text = render_tool_calls(syn, two_calls);
    INFO(text);
    CHECK(starts_with_trigger(syn, text));
    const tool_output out = parse_tool_calls(syn, text, tools);
    check_calls(out.calls, two_calls, syn == tool_syntax::kimi_k2 ? std::vector<std::string>{"functions.get_weather:0", "functions.get_time:1"}
                                                                  : std::vector<std::string>{"", ""});
    CHECK(out.content.empty());
  }
  CHECK_FALSE(tool_syntax_named("chatml").has_value());
}

TEST_CASE("tool formats: text around calls and malformed or unknown calls stay content", "[tools]") {
  const std::vector<tool_call> one = {two_calls[0]};
  for (const tool_syntax syn : all_syntaxes) {
    INFO(tool_syntax_name(syn));
    // Free text is content.
    const tool_output plain = parse_tool_calls(syn, "  The weather is fine.\n", tools);
    CHECK(plain.calls.empty());
    CHECK(plain.content == "The weather is fine.");
    // Text, then a call.
    const std::string call = render_tool_calls(syn, one);
    if (!whole_answer(syn)) {
      const tool_output mixed = parse_tool_calls(syn, "Let me check.\n" + call, tools);
      check_calls(mixed.calls, one);
      CHECK(mixed.content == "Let me check.");
    } else {
      const tool_output mixed = parse_tool_calls(syn, "Let me check.\n" + call, tools);
      CHECK(mixed.calls.empty());
    }
    // A malformed call (bad JSON, or an unclosed XML parameter) stays content.
    std::string bad = call;
    for (const auto& [from, to] : std::vector<std::pair<std::string, std::string>>{{"\"Paris\"}", "\"Paris\",}"},
                                                                                    {"</parameter>", "</param>"},
                                                                                    {"</arg_value>", "</arg_val>"},
                                                                                    {"</｜DSML｜parameter>", "</｜DSML｜param>"}}) {
      if (const size_t p = bad.find(from); p != std::string::npos) {
        bad.replace(p, from.size(), to);
        break;
      }
    }
    REQUIRE(bad != call);
    INFO(bad);
    const tool_output malformed = parse_tool_calls(syn, bad, tools);
    CHECK(malformed.calls.empty());
    CHECK(malformed.content == bad);
    // A call of a function not in the tools stays content.
    const std::string unknown = render_tool_calls(syn, std::vector<tool_call>{{"", "get_stock", R"({"city":"Paris"})"}});
    const tool_output other = parse_tool_calls(syn, unknown, tools);
    CHECK(other.calls.empty());
    CHECK(other.content == unknown);
    // Streaming: text before a call goes out, a partial trigger is held back, so is a call.
    if (whole_answer(syn)) {
      CHECK(streamable_content(syn, "Hello") == 5);
      CHECK(streamable_content(syn, " {\"na") == 0);
      CHECK(streamable_content(syn, call) == 0);
    } else {
      CHECK(streamable_content(syn, "Hello") == 5);
      CHECK(streamable_content(syn, "Hello " + call) == 6);
      for (const std::string& t : tool_call_triggers(syn)) {
        INFO(t);
        CHECK(streamable_content(syn, "Hello " + t.substr(0, t.size() - 1)) == 6);
        CHECK(streamable_content(syn, "Hello " + t) == 6);
      }
    }
  }
  // Formats' own details.
  const auto parse = [&](tool_syntax s, const std::string& text) { return parse_tool_calls(s, text, tools); };
  // Mistral Nemo's list with ids, and Ministral's [TOOL_CALLS]f[ARGS] with a call id.
  tool_output m = parse(tool_syntax::mistral, R"([TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}, "id": "abcdef123"}])");
  check_calls(m.calls, one, {"abcdef123"});
  m = parse(tool_syntax::mistral, R"(Sure.[TOOL_CALLS]get_weather[CALL_ID]xyz[ARGS]{"city": "Paris"})");
  check_calls(m.calls, one, {"xyz"});
  CHECK(m.content == "Sure.");
  // DeepSeek: R1's form parses under V3.1 and the other way round.
  check_calls(parse(tool_syntax::deepseek_v31, render_tool_calls(tool_syntax::deepseek_r1, two_calls)).calls, two_calls);
  check_calls(parse(tool_syntax::deepseek_r1, render_tool_calls(tool_syntax::deepseek_v31, two_calls)).calls, two_calls);
  // DSML: string="false" values are JSON, string="true" ones text even where they look like JSON.
  const tool_output d = parse(tool_syntax::dsml,
                              "<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_time\">\n<｜DSML｜parameter name=\"zone\" string=\"true\">12</｜DSML｜parameter>\n"
                              "<｜DSML｜parameter name=\"n\" string=\"false\">[1, 2]</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>");
  REQUIRE(d.calls.size() == 1);
  CHECK(d.calls[0].arguments == R"({"zone":"12","n":[1,2]})");
  // Qwen3-Coder: a string parameter stays text (one newline trimmed at each end), others are JSON.
  const tool_output q = parse(tool_syntax::qwen3_coder, "<tool_call>\n<function=get_time>\n<parameter=zone>\n\n42\n</parameter>\n<parameter=n>\n7\n</parameter>\n</function>\n</tool_call>");
  REQUIRE(q.calls.size() == 1);
  CHECK(q.calls[0].arguments == "{\"zone\":\"\\n42\",\"n\":7}");
  // GLM 4.5: newlines after the name and between pairs; a value that is not JSON is text.
  const tool_output g = parse(tool_syntax::glm4, "<tool_call>get_time\n<arg_key>zone</arg_key>\n<arg_value>CET</arg_value>\n<arg_key>n</arg_key>\n<arg_value>x1</arg_value>\n</tool_call>");
  REQUIRE(g.calls.size() == 1);
  CHECK(g.calls[0].arguments == R"({"zone":"CET","n":"x1"})");
  // Functionary v3.1: <|python_tag|> code calls "python" where it is a tool.
  std::vector<tool_function> with_python = tools;
  with_python.push_back({"python", "Runs code", R"({"type": "object", "properties": {"code": {"type": "string"}}})"});
  const tool_output py = parse_tool_calls(tool_syntax::functionary_v31, "<|python_tag|>print(1)<|eom_id|>", with_python);
  REQUIRE(py.calls.size() == 1);
  CHECK(py.calls[0].arguments == R"x({"code":"print(1)"})x");
  CHECK(parse(tool_syntax::functionary_v31, "<|python_tag|>print(1)").calls.empty());
  // Functionary v3.2: >>>all text is content; the first segment may come without its >>>.
  const tool_output v32 = parse(tool_syntax::functionary_v32, "all\nLet me look.>>>get_weather\n{\"city\": \"Paris\"}");
  check_calls(v32.calls, one);
  CHECK(v32.content == "Let me look.");
  check_calls(parse(tool_syntax::functionary_v32, "get_weather\n{\"city\": \"Paris\"}").calls, one);
  // Command R7B: the response's markers are not content.
  CHECK(parse(tool_syntax::command_r7b, "<|START_RESPONSE|>Hi there.<|END_RESPONSE|>").content == "Hi there.");
  // gpt-oss: the analysis and final channels stay content; calls in either header order parse.
  const tool_output oss = parse(tool_syntax::gpt_oss,
                                "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
                                "<|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>");
  check_calls(oss.calls, one);
  CHECK(oss.content == "<|channel|>analysis<|message|>Need weather.<|end|>");
  check_calls(parse(tool_syntax::gpt_oss, "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>{\"city\": \"Paris\"}<|call|>").calls, one);
  // Kimi K2: the id names the function.
  const tool_output k = parse(tool_syntax::kimi_k2, "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:3<|tool_call_argument_begin|>{\"city\": \"Paris\"}<|tool_call_end|><|tool_calls_section_end|>");
  check_calls(k.calls, one, {"functions.get_weather:3"});
  // Generic: {"response": ...} is the answer's content.
  const tool_output gr = parse(tool_syntax::generic, R"({"response": "It is sunny."})");
  CHECK(gr.calls.empty());
  CHECK(gr.content == "It is sunny.");
  // Generic's prompt teaches its protocol and lists the tools.
  CHECK_THAT(tools_prompt(tool_syntax::generic, tools), Catch::Contains("\"tool_calls\"") && Catch::Contains("get_time"));
}

TEST_CASE("tool formats: each syntax's grammar parses and takes exactly its own well-formed calls", "[tools][grammar]") {
  const std::vector<tool_call> one = {two_calls[0]};
  for (const tool_syntax syn : all_syntaxes) {
    INFO(tool_syntax_name(syn));
    std::shared_ptr<const grammar> single, parallel;
    REQUIRE_NOTHROW(single = grammar::parse(tool_call_gbnf(syn, tools, false)));
    REQUIRE_NOTHROW(parallel = grammar::parse(tool_call_gbnf(syn, tools, true)));
    const std::string first = render_tool_calls(syn, one), both = render_tool_calls(syn, two_calls);
    INFO(both);
    CHECK(matches(single, first));
    CHECK(matches(parallel, first));
    CHECK(matches(parallel, both));
    CHECK_FALSE(matches(single, both));
    // The grammar's language starts at a trigger (a lazy grammar takes over from there).
    CHECK(starts_with_trigger(syn, first));
    for (const std::string& t : tool_call_triggers(syn)) {
      INFO(t);
      CHECK(grammar_matcher(single).accepts(t));
      CHECK(grammar_matcher(parallel).accepts(t));
    }
    // An unknown function, or an argument of the wrong type, is refused.
    CHECK_FALSE(matches(single, render_tool_calls(syn, std::vector<tool_call>{{"", "get_stock", R"({"city":"Paris"})"}})));
    CHECK_FALSE(matches(single, render_tool_calls(syn, std::vector<tool_call>{{"", "get_time", R"({"zone":"CET","n":"two"})"}})));
  }
}

TEST_CASE("tool formats: every prefix of a rendering parses and streams safely", "[tools]") {
  std::vector<std::string> texts;
  for (const tool_syntax syn : all_syntaxes) texts.push_back("Let me check. " + render_tool_calls(syn, two_calls));
  texts.push_back(std::string("\0\xff{[<|\"\\", 9));
  for (const tool_syntax syn : all_syntaxes) {
    INFO(tool_syntax_name(syn));
    // Its own rendering, prefix by prefix: never a call streamed as content.
    const std::string own = "Let me check. " + render_tool_calls(syn, two_calls);
    for (size_t n = 0; n <= own.size(); ++n) {
      const std::string_view prefix(own.data(), n);
      const tool_output out = parse_tool_calls(syn, prefix, tools);
      CHECK(out.calls.size() <= 2);
      const size_t s = streamable_content(syn, prefix);
      CHECK(s <= (whole_answer(syn) ? n : std::min<size_t>(n, 14)));
    }
    // Everyone's renderings, and their prefixes and suffixes.
    for (const std::string& t : texts) {
      for (size_t n = 0; n <= t.size(); n += 3) {
        (void)parse_tool_calls(syn, std::string_view(t).substr(0, n), tools);
        (void)parse_tool_calls(syn, std::string_view(t).substr(n), tools);
        CHECK(streamable_content(syn, std::string_view(t).substr(n)) <= t.size() - n);
      }
    }
  }
}
