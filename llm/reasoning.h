// Reasoning ("thinking") in a model's answer: the markers a chat template's model writes its reasoning
// between, whether a rendered prompt leaves the model inside the reasoning block, and the answer split into
// reasoning and content, whole (split_reasoning) or as it streams (reasoning_stream), as llama-server and vLLM
// return them in message.reasoning_content / delta.reasoning_content.
//
//   const llm::reasoning_markers m = llm::detect_reasoning(template_source);  // {"<think>", "</think>"} for Qwen3
//   const bool open = llm::prompt_opens_reasoning(m, prompt);               // DeepSeek R1: "...<think>\n" -> true
//   llm::reasoning_split s = llm::split_reasoning(m, answer, open);         // s.reasoning, s.content
//
//   llm::reasoning_stream rs(m, open);
//   for (piece : pieces) { auto d = rs.feed(piece); send(d.reasoning, d.content); }
//   auto d = rs.finish();                                                    // what was held back
//
// What the answer is split into (split_reasoning and the stream agree byte for byte):
//   - The reasoning block is entered when `open` (the prompt opened it) or when the answer, after leading
//     whitespace, starts with m.start; with `open`, a start marker the model writes again at its very
//     beginning (after whitespace) is dropped too. A start marker anywhere later is plain text.
//   - The reasoning runs up to the first m.end; without one (an unfinished block) the whole rest is reasoning
//     and the content is empty. Markers never appear in either part.
//   - The reasoning is trimmed of whitespace at both ends; the content of leading whitespace only (its
//     trailing whitespace is kept). Whitespace is ' ', '\t', '\n', '\r', '\f', '\v'.
//   - Every occurrence of a string of m.strip (content wrappers: Granite 3.x's <response> / </response>,
//     Apriel's [END FINAL RESPONSE], Kimi K3's response tags...) is removed from the content, scanning left to
//     right and taking the longest at each position, before its leading whitespace is trimmed (so whitespace
//     on both sides of a leading wrapper goes).
//   - With empty markers (a model that does not think) the answer is all content, verbatim (no trimming, no
//     stripping).
// The stream holds back what it cannot decide yet: leading whitespace and a prefix of m.start at the
// beginning, a suffix that may begin m.end (reasoning) or a string of m.strip (content), and the reasoning's
// trailing whitespace (sent once more reasoning follows it, dropped at m.end or at finish()). Every marker
// detect_reasoning gives is ASCII, so pieces of whole UTF-8 characters come out as whole characters.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace troupe::llm {

struct reasoning_markers {
  std::string start, end;          // e.g. "<think>", "</think>"; both empty: the model does not think
  std::vector<std::string> strip;  // removed from the content wherever they appear (content wrappers)
  bool empty() const { return start.empty() && end.empty(); }
  friend bool operator==(const reasoning_markers&, const reasoning_markers&) = default;
};

// The markers of the model a chat template (its Jinja source text) is for:
//   <think> </think>            Qwen3, QwQ, DeepSeek R1 / V3.2 / V4, GLM, Nemotron, Bielik, Reka, LFM2.5, Laguna,
//                               RWKV, and by name MiniMax M1 and MiMo (whose templates do not write the tags)
//   <think> </think> + strip <response> </response>                          Granite 3.x
//   [THINK] [/THINK]                                                           Ministral / Magistral
//   <|channel|>analysis<|message|> <|end|> + strip the final channel header   gpt-oss (harmony)
//   <|channel>thought <channel|>                                               Gemma 4
//   <|START_THINKING|> <|END_THINKING|> + strip <|START_TEXT|> ...              Command A (Cohere2)
//   <|open|>think<|sep|> <|close|>think<|sep|> + strip the response tags       Kimi K3
//   <mm:think> </mm:think>                                                     MiniMax M3
//   <seed:think> </seed:think>                                                 Seed-OSS
//   <|think|> <|end|> + strip <|begin|>assistant<|content|> ...                Solar Open
//   to=self<|message|> <|eom|> + strip the to=user header, <|eot|>              Muse Glimmer (ATEM)
//   "Here are my reasoning steps:\n" "[BEGIN FINAL RESPONSE]"
//                                + strip [END FINAL RESPONSE], <|end|>          Apriel 1.5 / 1.6
// Empty markers for a template that shows no reasoning.
reasoning_markers detect_reasoning(std::string_view template_source);

// Whether a rendered prompt leaves the model inside an open reasoning block: the prompt, less trailing
// whitespace, ends with m.start (less its trailing whitespace), e.g. DeepSeek R1's "<｜Assistant｜><think>\n".
// A prompt ending with a closed empty block ("<think>\n\n</think>\n\n") does not.
bool prompt_opens_reasoning(const reasoning_markers& m, std::string_view prompt);

struct reasoning_split {
  std::string reasoning, content;
  friend bool operator==(const reasoning_split&, const reasoning_split&) = default;
};

// A whole answer split into reasoning and content (see above).
reasoning_split split_reasoning(const reasoning_markers& m, std::string_view answer, bool open);

// The same split as the answer arrives piece by piece: each feed() says which new bytes are reasoning and
// which content; finish() flushes what was held back. The concatenation of every result's reasoning (and
// content) equals split_reasoning's of the whole answer, however the answer was cut.
class reasoning_stream {
 public:
  reasoning_stream(reasoning_markers m, bool open);
  reasoning_split feed(std::string_view piece);
  reasoning_split finish();
  // Inside the reasoning block now (for a reasoning budget): from the start marker (or from the beginning,
  // when the prompt opened the block) until the end marker.
  bool in_reasoning() const;

 private:
  enum class phase { begin, reasoning, content, verbatim };
  void run(bool final, reasoning_split& out);
  void emit_reasoning(std::string_view bytes, reasoning_split& out);
  void emit_content(std::string_view bytes, reasoning_split& out);

  reasoning_markers m_;
  bool open_;
  phase phase_;
  std::string held_;        // bytes not decided yet
  std::string pending_ws_;  // the reasoning's trailing whitespace so far
  bool reasoning_started_ = false, content_started_ = false;
};

// The message field a chat template reads a past assistant turn's reasoning from: "reasoning_content" (Qwen3,
// GLM, DeepSeek V3.2, ...), "reasoning" (Solar Open; vLLM's name), "thinking" (gpt-oss, LFM2.5), or "" where
// the template reads none (the caller then leaves past reasoning out). A template that reads several gives
// the first of that order.
std::string_view reasoning_field(std::string_view template_source);

}  // namespace troupe::llm
