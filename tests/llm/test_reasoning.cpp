// Reasoning in answers: the markers detected in the 44 real chat templates of ../shared/chat-templates, the
// message field each reads past reasoning from, whether prompts rendered by troupe's Jinja engine leave the
// model in an open block, the whole-answer split, and the stream against the split for every way of cutting
// the answer.
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "llm/jinja/jinja.h"
#include "llm/reasoning.h"
#include "tests/support/skip.h"

using namespace troupe::llm;

namespace {

const std::filesystem::path templates_dir =
    std::filesystem::path(TROUPE_SOURCE_DIR) / ".." / "shared" / "chat-templates";

// The source of ../shared/chat-templates/NAME.jinja; nullopt (after a skip, or a failure under CI=true) when
// the folder is not here.
std::optional<std::string> template_source(const std::string& name) {
  if (!std::filesystem::exists(templates_dir)) {
    troupe::test::skip_unless_ci("../shared/chat-templates is not here");
    return std::nullopt;
  }
  std::ifstream f(templates_dir / (name + ".jinja"), std::ios::binary);
  if (!f) FAIL("no template " << name << ".jinja in " << templates_dir.string());
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// The prompt the template renders for one user turn "Hi" with the generation prompt, plus `extra` variables.
std::string render_prompt(const std::string& source, const nlohmann::ordered_json& extra) {
  nlohmann::ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", "Hi"}}}},
                                {"add_generation_prompt", true},
                                {"bos_token", ""},
                                {"eos_token", ""}};
  for (auto it = extra.begin(); it != extra.end(); ++it) ctx[it.key()] = it.value();
  return jinja::template_::parse(source).render(ctx);
}

std::string visible(std::string_view s) {
  std::string out;
  for (char c : s) out += c == '\n' ? std::string("\\n") : std::string(1, c);
  return out;
}

const reasoning_markers think{"<think>", "</think>", {}};

// The concatenated deltas of a stream fed `answer` cut at `cuts` (increasing offsets), then finished.
reasoning_split streamed(const reasoning_markers& m, std::string_view answer, bool open, const std::vector<size_t>& cuts) {
  reasoning_stream s(m, open);
  reasoning_split all;
  size_t from = 0;
  auto add = [&](const reasoning_split& d) {
    all.reasoning += d.reasoning;
    all.content += d.content;
  };
  for (size_t cut : cuts) {
    add(s.feed(answer.substr(from, cut - from)));
    from = cut;
  }
  add(s.feed(answer.substr(from)));
  add(s.finish());
  return all;
}

// Every way of cutting `answer` that the stream test tries: pieces of 1, 2, 3 and 7 bytes from every offset
// (the first piece shorter, possibly empty), and every one or two cut points.
std::vector<std::vector<size_t>> cuttings(size_t n) {
  std::vector<std::vector<size_t>> out;
  for (size_t piece : {1, 2, 3, 7}) {
    for (size_t first = 0; first < piece; ++first) {
      std::vector<size_t> cuts;
      for (size_t at = first; at < n; at += piece) cuts.push_back(at);
      out.push_back(cuts);
    }
  }
  for (size_t a = 0; a <= n; ++a) {
    out.push_back({a});
    for (size_t b = a; b <= n; ++b) out.push_back({a, b});
  }
  return out;
}

// The number of cuttings tried; fails at the first whose deltas differ from split_reasoning.
size_t check_stream(const reasoning_markers& m, std::string_view answer, bool open) {
  const reasoning_split whole = split_reasoning(m, answer, open);
  size_t tried = 0;
  for (const std::vector<size_t>& cuts : cuttings(answer.size())) {
    ++tried;
    const reasoning_split got = streamed(m, answer, open, cuts);
    if (got != whole) {
      std::string at;
      for (size_t c : cuts) at += std::to_string(c) + " ";
      FAIL("answer '" << visible(answer) << "' (open " << open << ") cut at " << at << ": stream reasoning '"
                      << visible(got.reasoning) << "' content '" << visible(got.content) << "', split reasoning '"
                      << visible(whole.reasoning) << "' content '" << visible(whole.content) << "'");
    }
  }
  return tried;
}

}  // namespace

TEST_CASE("detect_reasoning finds the markers of each real chat template", "[reasoning]") {
  struct expect {
    const char* name;
    const char* start;
    const char* end;
  };
  const std::string apriel = "Here are my reasoning steps:\n";
  // All 44 templates of ../shared/chat-templates.
  const std::vector<expect> expected = {
      {"Apriel-1.6-15b-Thinker-fixed", apriel.c_str(), "[BEGIN FINAL RESPONSE]"},
      {"unsloth-Apriel-1.5", apriel.c_str(), "[BEGIN FINAL RESPONSE]"},
      {"Bielik-11B-v3.0-Instruct", "<think>", "</think>"},
      {"Cohere2MoE", "<|START_THINKING|>", "<|END_THINKING|>"},
      {"CohereForAI-c4ai-command-r-plus-tool_use", "", ""},
      {"GLM-4.7-Flash", "<think>", "</think>"},
      {"GigaChat3-10B-A1.8B", "", ""},
      {"GigaChat3.1-10B-A1.8B", "", ""},
      {"Kimi-K2-Instruct", "", ""},
      {"Kimi-K3", "<|open|>think<|sep|>", "<|close|>think<|sep|>"},
      {"LFM2.5-8B-A1B", "<think>", "</think>"},
      {"LFM2.5-Instruct", "<think>", "</think>"},
      {"MiMo-VL", "<think>", "</think>"},
      {"MiniMax-M1", "<think>", "</think>"},
      {"MiniMax-M3", "<mm:think>", "</mm:think>"},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "<think>", "</think>"},
      {"NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use", "", ""},
      {"NousResearch-Hermes-3-Llama-3.1-8B-tool_use", "", ""},
      {"Qwen-QwQ-32B", "<think>", "</think>"},
      {"Qwen-Qwen2.5-7B-Instruct", "", ""},
      {"Qwen-Qwen3-0.6B", "<think>", "</think>"},
      {"Reka-Edge", "<think>", "</think>"},
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", "<think>", "</think>"},
      {"deepseek-ai-DeepSeek-V3.2", "<think>", "</think>"},
      {"deepseek-ai-DeepSeek-V4-Flash-0731", "<think>", "</think>"},
      {"deepseek-ai-DeepSeek-V4", "<think>", "</think>"},
      {"fireworks-ai-llama-3-firefunction-v2", "", ""},
      {"google-gemma-2-2b-it", "", ""},
      {"google-gemma-4-31B-it-interleaved", "<|channel>thought", "<channel|>"},
      {"ibm-granite-granite-3.3-2B-Instruct", "<think>", "</think>"},
      {"ibm-granite-granite-4.1", "", ""},
      {"llama-cpp-deepseek-r1", "<think>", "</think>"},
      {"llama-cpp-rwkv-world", "<think>", "</think>"},
      {"meetkai-functionary-medium-v3.1", "", ""},
      {"meta-llama-Llama-3.1-8B-Instruct", "", ""},
      {"meta-llama-Llama-3.2-3B-Instruct", "", ""},
      {"microsoft-Phi-3.5-mini-instruct", "", ""},
      {"mistralai-Ministral-3-14B-Reasoning-2512", "[THINK]", "[/THINK]"},
      {"mistralai-Mistral-Nemo-Instruct-2407", "", ""},
      {"muse-glimmer", "to=self<|message|>", "<|eom|>"},
      {"poolside-Laguna-S-2.1", "<think>", "</think>"},
      {"poolside-Laguna-XS-2.1", "<think>", "</think>"},
      {"poolside-Laguna-XS.2", "<think>", "</think>"},
      {"upstage-Solar-Open-100B", "<|think|>", "<|end|>"},
  };
  REQUIRE(expected.size() == 44);
  for (const expect& e : expected) {
    const std::optional<std::string> src = template_source(e.name);
    if (!src) return;
    const reasoning_markers m = detect_reasoning(*src);
    INFO(e.name);
    CHECK(m.start == e.start);
    CHECK(m.end == e.end);
    CHECK(m.empty() == (std::string_view(e.start).empty()));
  }
  // The content wrappers of those that have them.
  using strings = std::vector<std::string>;
  CHECK(detect_reasoning(*template_source("ibm-granite-granite-3.3-2B-Instruct")).strip ==
        strings{"<response>", "</response>"});
  CHECK(detect_reasoning(*template_source("unsloth-Apriel-1.5")).strip == strings{"[END FINAL RESPONSE]", "<|end|>"});
  CHECK(detect_reasoning(*template_source("Qwen-Qwen3-0.6B")).strip.empty());
  CHECK(detect_reasoning(*template_source("MiniMax-M3")).strip.empty());  // its <response> tags are tool results'
}

TEST_CASE("detect_reasoning on templates not in the collection", "[reasoning]") {
  CHECK(detect_reasoning("").empty());
  CHECK(detect_reasoning("{{ '<|start|>assistant<|channel|>analysis<|message|>' + message.thinking + '<|end|>' }}").start ==
        "<|channel|>analysis<|message|>");
  const reasoning_markers seed = detect_reasoning("{{ '<seed:think>' + message.reasoning_content + '</seed:think>' }}");
  CHECK(seed.start == "<seed:think>");
  CHECK(seed.end == "</seed:think>");
}

TEST_CASE("reasoning_field names the field each real template reads past reasoning from", "[reasoning]") {
  const std::vector<std::pair<const char*, const char*>> expected = {
      {"Qwen-Qwen3-0.6B", "reasoning_content"},
      {"GLM-4.7-Flash", "reasoning_content"},  // m.reasoning_content
      {"deepseek-ai-DeepSeek-V3.2", "reasoning_content"},
      {"Kimi-K3", "reasoning_content"},  // message.get('reasoning_content') or message.get('reasoning')
      {"Cohere2MoE", "reasoning_content"},  // reads reasoning, reasoning_content and thinking
      {"google-gemma-4-31B-it-interleaved", "reasoning_content"},
      {"Apriel-1.6-15b-Thinker-fixed", "reasoning_content"},
      {"muse-glimmer", "reasoning_content"},
      {"upstage-Solar-Open-100B", "reasoning"},
      {"LFM2.5-8B-A1B", "thinking"},
      {"Qwen-QwQ-32B", ""},                               // strips past reasoning from the content instead
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", ""},
      {"mistralai-Ministral-3-14B-Reasoning-2512", ""},  // a "thinking" chunk of the content, not a field
      {"unsloth-Apriel-1.5", ""},
      {"meta-llama-Llama-3.2-3B-Instruct", ""},
  };
  CHECK(reasoning_field("{{ message.thinking }}") == "thinking");
  CHECK(reasoning_field("{{ block['thinking'] }}") == "");
  CHECK(reasoning_field("{% set reasoning = true %}{{ message.reasoning_effort }}") == "");
  CHECK(reasoning_field("{{ msg[\"reasoning\"] }}") == "reasoning");
  for (const auto& [name, field] : expected) {
    const std::optional<std::string> src = template_source(name);
    if (!src) return;
    INFO(name);
    CHECK(reasoning_field(*src) == field);
  }
}

TEST_CASE("prompt_opens_reasoning on prompts rendered from the real templates", "[reasoning]") {
  using ojson = nlohmann::ordered_json;
  struct expect {
    const char* name;
    ojson extra;
    bool open;
    const char* ends_with;  // the rendered prompt's end
  };
  const std::vector<expect> expected = {
      {"deepseek-ai-DeepSeek-R1-Distill-Llama-8B", ojson::object(), true, "<\xEF\xBD\x9C" "Assistant\xEF\xBD\x9C><think>\n"},
      {"llama-cpp-deepseek-r1", ojson::object(), true, "<think>\n"},
      {"Qwen-Qwen3-0.6B", ojson::object(), false, "<|im_start|>assistant\n"},
      {"Qwen-Qwen3-0.6B", {{"enable_thinking", false}}, false, "<think>\n\n</think>\n\n"},
      {"Qwen-QwQ-32B", {{"enable_thinking", true}}, true, "<think>\n"},
      {"Qwen-QwQ-32B", ojson::object(), false, "<think>\n</think>"},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", ojson::object(), true, "<think>\n"},
      {"NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", {{"enable_thinking", false}}, false, "<think></think>"},
      {"GLM-4.7-Flash", ojson::object(), true, "<|assistant|><think>"},
      {"GLM-4.7-Flash", {{"enable_thinking", false}}, false, "<|assistant|></think>"},
      {"deepseek-ai-DeepSeek-V3.2", ojson::object(), false, "<think></think>"},
      {"deepseek-ai-DeepSeek-V3.2", {{"enable_thinking", true}}, true, "<think>"},
      {"deepseek-ai-DeepSeek-V4", ojson::object(), false, "</think>"},
      {"deepseek-ai-DeepSeek-V4", {{"enable_thinking", true}}, true, "<think>"},
      {"Bielik-11B-v3.0-Instruct", {{"enable_thinking", true}}, true, "<think>\n"},
      {"Bielik-11B-v3.0-Instruct", ojson::object(), false, "<|im_start|>assistant\n"},
      {"Reka-Edge", {{"enable_thinking", true}}, true, "assistant: <think>\n"},
      {"llama-cpp-rwkv-world", {{"enable_thinking", true}}, true, "Assistant: <think>"},
      {"llama-cpp-rwkv-world", {{"enable_thinking", false}}, false, "<think>\n</think>"},
      {"Kimi-K3", ojson::object(), true, "<|open|>think<|sep|>"},
      {"Kimi-K3", {{"thinking", false}}, false, "<|open|>response<|sep|>"},
      {"Cohere2MoE", ojson::object(), true, "<|START_THINKING|>"},
      {"Cohere2MoE", {{"reasoning", false}}, false, "<|START_THINKING|><|END_THINKING|>"},
      {"MiniMax-M3", {{"thinking_mode", "enabled"}}, true, "ai\n<mm:think>"},
      {"MiniMax-M3", {{"thinking_mode", "disabled"}}, false, "ai\n</mm:think>"},
      {"MiniMax-M3", ojson::object(), false, "ai\n"},
      {"Apriel-1.6-15b-Thinker-fixed", ojson::object(), true, "<|begin_assistant|>\nHere are my reasoning steps:\n"},
      {"unsloth-Apriel-1.5", ojson::object(), false, "<|assistant|>\n"},
      {"google-gemma-4-31B-it-interleaved", ojson::object(), false, "<|channel>thought\n<channel|>"},
      {"google-gemma-4-31B-it-interleaved", {{"enable_thinking", true}}, false, "<|turn>model\n"},
      {"upstage-Solar-Open-100B", {{"reasoning_effort", "low"}}, false, "<|think|><|end|><|begin|>assistant"},
      {"mistralai-Ministral-3-14B-Reasoning-2512", ojson::object(), false, "[INST]Hi[/INST]"},
      {"muse-glimmer", ojson::object(), false, "<|start|>assistant"},
      {"meta-llama-Llama-3.2-3B-Instruct", ojson::object(), false, "<|start_header_id|>assistant<|end_header_id|>\n\n"},
  };
  REQUIRE(expected.size() == 34);
  for (const expect& e : expected) {
    const std::optional<std::string> src = template_source(e.name);
    if (!src) return;
    INFO(e.name << " with " << e.extra.dump());
    std::string prompt;
    try {
      prompt = render_prompt(*src, e.extra);
    } catch (const jinja::error& err) {
      FAIL("troupe's Jinja engine refuses it: " << err.what());
    }
    INFO("prompt ends '" << visible(prompt.substr(prompt.size() > 60 ? prompt.size() - 60 : 0)) << "'");
    CHECK(std::string_view(prompt).ends_with(e.ends_with));
    CHECK(prompt_opens_reasoning(detect_reasoning(*src), prompt) == e.open);
  }
}

TEST_CASE("prompt_opens_reasoning on made-up prompts", "[reasoning]") {
  CHECK(prompt_opens_reasoning(think, "<|im_start|>assistant\n<think>"));
  CHECK(prompt_opens_reasoning(think, "<|im_start|>assistant\n<think>\n \n"));
  CHECK_FALSE(prompt_opens_reasoning(think, "<|im_start|>assistant\n<think>\n</think>\n"));
  CHECK_FALSE(prompt_opens_reasoning(think, "<think>x</think>\n<|im_start|>assistant\n"));
  CHECK_FALSE(prompt_opens_reasoning(think, ""));
  CHECK_FALSE(prompt_opens_reasoning(reasoning_markers{}, "<think>"));
  const reasoning_markers apriel{"Here are my reasoning steps:\n", "[BEGIN FINAL RESPONSE]", {}};
  CHECK(prompt_opens_reasoning(apriel, "<|begin_assistant|>\nHere are my reasoning steps:\n"));
  CHECK(prompt_opens_reasoning(apriel, "<|begin_assistant|>\nHere are my reasoning steps:"));
}

TEST_CASE("split_reasoning", "[reasoning]") {
  using split = reasoning_split;
  // Markers at the start.
  CHECK(split_reasoning(think, "<think>\nLet me see.\n</think>\n\nHello!\n", false) == split{"Let me see.", "Hello!\n"});
  CHECK(split_reasoning(think, "\n <think>a\n\nb </think>c", false) == split{"a\n\nb", "c"});
  // The prompt opened the block: no start marker in the answer, or one written again.
  CHECK(split_reasoning(think, "Let me see.\n</think>\n\nHello!", true) == split{"Let me see.", "Hello!"});
  CHECK(split_reasoning(think, "\n<think>\nLet me see.</think>Hello!", true) == split{"Let me see.", "Hello!"});
  CHECK(split_reasoning(think, "</think>Hello!", true) == split{"", "Hello!"});
  // An end marker that never comes: all reasoning.
  CHECK(split_reasoning(think, "<think>\nStill thinking...\n", false) == split{"Still thinking...", ""});
  CHECK(split_reasoning(think, "Still thinking </thi", true) == split{"Still thinking </thi", ""});
  // No markers: all content (leading whitespace trimmed).
  CHECK(split_reasoning(think, "\n\nHello, world.\n", false) == split{"", "Hello, world.\n"});
  CHECK(split_reasoning(think, "", false) == split{"", ""});
  CHECK(split_reasoning(think, "", true) == split{"", ""});
  // Markers after the content began are content.
  CHECK(split_reasoning(think, "Hello <think>x</think> world", false) == split{"", "Hello <think>x</think> world"});
  CHECK(split_reasoning(think, "Hi</think> there", false) == split{"", "Hi</think> there"});
  // Only the first end marker ends the block; later markers are content.
  CHECK(split_reasoning(think, "<think>a</think>b<think>c</think>d", false) == split{"a", "b<think>c</think>d"});
  // A model that does not think: verbatim.
  CHECK(split_reasoning(reasoning_markers{}, " <think>x</think> y\n", false) == split{"", " <think>x</think> y\n"});
  // Content wrappers.
  const reasoning_markers granite{"<think>", "</think>", {"<response>", "</response>"}};
  CHECK(split_reasoning(granite, "<think>Hmm.</think>\n<response>\nHello.</response>", false) == split{"Hmm.", "Hello."});
  CHECK(split_reasoning(granite, "<response>Plain.</response>", false) == split{"", "Plain."});
  const reasoning_markers apriel{"Here are my reasoning steps:\n", "[BEGIN FINAL RESPONSE]",
                                 {"[END FINAL RESPONSE]", "<|end|>"}};
  CHECK(split_reasoning(apriel, "1. Add.\n[BEGIN FINAL RESPONSE]\n4[END FINAL RESPONSE]<|end|>", true) ==
        split{"1. Add.", "4"});
  CHECK(split_reasoning(apriel, "Here are my reasoning steps:\n1. Add.\n[BEGIN FINAL RESPONSE]\n4", false) ==
        split{"1. Add.", "4"});
  const reasoning_markers harmony = detect_reasoning("<|channel|>analysis");
  const std::string gpt_oss =
      "<|channel|>analysis<|message|>Think.<|end|><|start|>assistant<|channel|>final<|message|>Hi!<|return|>";
  CHECK(split_reasoning(harmony, gpt_oss, false) == split{"Think.", "Hi!"});
  check_stream(harmony, gpt_oss, false);
  const reasoning_markers solar = detect_reasoning("<|begin|>assistant<|think|>");
  const std::string solar_answer = "<|think|>Hmm.<|end|><|begin|>assistant<|content|>Hi<|end|>";
  CHECK(split_reasoning(solar, solar_answer, false) == split{"Hmm.", "Hi"});
  check_stream(solar, solar_answer, false);
  const reasoning_markers glimmer = detect_reasoning("<|start|>assistant to=self<|message|>");
  const std::string glimmer_answer = " to=self<|message|>Hmm.<|eom|><|start|>assistant to=user<|message|>Hi<|eot|>";
  CHECK(split_reasoning(glimmer, glimmer_answer, false) == split{"Hmm.", "Hi"});
  CHECK(split_reasoning(glimmer, " to=user<|message|>Hi<|eot|>", false) == split{"", "Hi"});
  check_stream(glimmer, glimmer_answer, false);
}

TEST_CASE("reasoning_stream gives what split_reasoning gives however the answer is cut", "[reasoning]") {
  const reasoning_markers granite{"<think>", "</think>", {"<response>", "</response>"}};
  const reasoning_markers apriel{"Here are my reasoning steps:\n", "[BEGIN FINAL RESPONSE]",
                                 {"[END FINAL RESPONSE]", "<|end|>"}};
  const reasoning_markers kimi{"<|open|>think<|sep|>", "<|close|>think<|sep|>",
                               {"<|open|>response<|sep|>", "<|close|>response<|sep|>"}};
  const reasoning_markers overlap{"<think>", "</think>", {"<r>", "<rr>", "<r>x"}};
  const std::vector<std::pair<reasoning_markers, std::vector<std::string>>> cases = {
      {think,
       {"<think>\nLet me see.\n\nOK. </think>\n\nHello there!\n", "  <think>abc</think>x", "Hello <think>not</think> world",
        "<think>\nunfinished  \n", "<thi", "<think", "   ", "", "</think>Answer", "<think>a</think", "<think>a</th</think>b",
        "<think> </think>  \n", "\n\n<think><think>x</think>y", "a  </</think> b \n", "<<think>>x</think>",
        "r\xC3\xA9sum\xC3\xA9 </think> caf\xC3\xA9"}},
      {granite, {"<think>t</think>\n<response>\nHello</response>", "<response>plain</response> ", "<resp", "a<response",
                 "<think>x</think><</response><response>"}},
      {apriel, {"Here are my reasoning steps:\nstep 1\n[BEGIN FINAL RESPONSE]\nThe answer is 4.\n[END FINAL RESPONSE]\n<|end|>",
                "step\n[BEGIN FINAL [BEGIN FINAL RESPONSE] x [END FINAL RESPONSE"}},
      {kimi, {"thinking<|close|>think<|sep|><|open|>response<|sep|>Hi<|close|>response<|sep|>",
              "<|open|>response<|sep|>Hi<|close|>response<|sep|>"}},
      {overlap, {"<r>x<rr><r><rr", "</think><rr><r>xy<r", "a<r>b<rrr>"}},
      {reasoning_markers{}, {" <think>x</think> y\n", ""}},
  };
  size_t tried = 0;
  for (const auto& [m, answers] : cases) {
    for (const std::string& a : answers) tried += check_stream(m, a, false) + check_stream(m, a, true);
  }
  CHECK(tried > 10000);
}

TEST_CASE("reasoning_stream holds back marker bytes and says when it is in the block", "[reasoning]") {
  reasoning_stream s(think, false);
  CHECK_FALSE(s.in_reasoning());
  CHECK(s.feed("<th") == reasoning_split{"", ""});
  CHECK(s.feed("ink>\nA") == reasoning_split{"A", ""});
  CHECK(s.in_reasoning());
  CHECK(s.feed(" b\n") == reasoning_split{" b", ""});  // the trailing newline waits
  CHECK(s.feed("</thi") == reasoning_split{"", ""});
  CHECK(s.in_reasoning());
  CHECK(s.feed("nk>\n\nHi") == reasoning_split{"", "Hi"});
  CHECK_FALSE(s.in_reasoning());
  CHECK(s.feed(" <think>") == reasoning_split{"", " <think>"});
  CHECK(s.finish() == reasoning_split{"", ""});

  reasoning_stream open(think, true);
  CHECK(open.in_reasoning());
  CHECK(open.feed("x") == reasoning_split{"x", ""});
  CHECK(open.feed("</think>y") == reasoning_split{"", "y"});
  CHECK_FALSE(open.in_reasoning());

  reasoning_stream plain(reasoning_markers{}, true);
  CHECK_FALSE(plain.in_reasoning());
  CHECK(plain.feed("  <th") == reasoning_split{"", "  <th"});
}
