// BPE pre-tokenizers: how byte-level BPE vocabularies split text into words before merging, chosen by the
// GGUF key tokenizer.ggml.pre.
//
//   auto pre = pre_tokenizer_from_name("smollm").value();
//   for (std::string_view word : pre_tokenize(pre, "I'm 42 today"))   // "I", "'m", " ", "4", "2", " today"
//     ...
//
// Each type is the Hugging Face split regex (or sequence of regexes) of that tokenizer family, implemented
// by hand over Unicode categories (std::regex has no \p{L}); docs/tokenizer.md has the details:
//   gpt2     's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//   llama3   (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|
//            \s*[\r\n]+|\s+(?!\S)|\s+
//   qwen2    llama3 with \p{N} (one digit per word)
//   smollm   \p{N} (every digit a word of its own), then gpt2
//   default  [\p{P}$+<=>^~|]+, then gpt2, then \p{N}+, then [0-9][0-9][0-9] (llama.cpp's fallback)
// Later regexes split the words of earlier ones; text between matches stays a word of its own.
// (?i:...) folds ASCII case only, as llama.cpp does.
//
// Invalid UTF-8 bytes count as "other" characters (neither letter, number nor space) and are kept as they
// are, so that detokenize(tokenize(s)) == s holds for any bytes.
#pragma once

#include <optional>
#include <string_view>
#include <vector>

namespace troupe::llm {

enum class pre_tokenizer_type { gpt2, llama3, qwen2, smollm, default_bpe };

// "gpt2"/"gpt-2", "llama3"/"llama-v3"/"llama-bpe", "qwen2", "smollm", "default"; nullopt for others.
std::optional<pre_tokenizer_type> pre_tokenizer_from_name(std::string_view name);

// Splits UTF-8 text into words: non-empty byte ranges of `text` that cover it exactly, in order.
std::vector<std::string_view> pre_tokenize(pre_tokenizer_type type, std::string_view text);

}  // namespace troupe::llm
