// vocab's state, shared by vocab.cpp (loading, special tokens, pieces) and the two tokenizers
// (tokenizer_spm.cpp, tokenizer_bpe.cpp). Not part of the public API.
#pragma once

#include <array>
#include <functional>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "llm/vocab.h"

namespace troupe::llm {

// Hash for unordered_map<std::string, ...> lookups by string_view without building a std::string.
struct string_hash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
template <class V>
using string_map = std::unordered_map<std::string, V, string_hash, std::equal_to<>>;

struct vocab::impl {
  std::string model;     // tokenizer.ggml.model
  std::string pre_name;  // tokenizer.ggml.pre
  vocab_type type = vocab_type::spm;
  pre_tokenizer_type pre = pre_tokenizer_type::gpt2;
  bool ignore_merges = false;  // BPE: a word that is a token as a whole is not merged (Llama 3)

  std::vector<token_data> tokens;      // [n_tokens]
  string_map<token_id> by_text;        // token text -> id
  string_map<int32_t> merge_ranks;     // "left right" -> rank (BPE)
  std::array<token_id, 256> byte_tokens{};  // byte -> token, token_null when none

  token_id bos = token_null, eos = token_null, eot = token_null, eom = token_null;
  token_id unk = token_null, pad = token_null, nl = token_null;
  bool add_bos = false, add_eos = false, add_space_prefix = false;
  std::vector<token_id> eog;  // sorted

  // Control, user-defined and unknown tokens, longest text first: matched in the text before tokenizing.
  std::vector<token_id> special_tokens;
  // token_to_piece(id, special = true) for every token.
  std::vector<std::string> pieces;
  // vocab::sorted_pieces(), built on first use.
  std::once_flag sorted_once;
  vocab::piece_index sorted;

  token_id find(std::string_view text) const {
    const auto it = by_text.find(text);
    return it == by_text.end() ? token_null : it->second;
  }
  // Rank of the merge (left, right), or -1; `scratch` holds the lookup key.
  int32_t merge_rank_of(std::string_view left, std::string_view right, std::string& scratch) const {
    scratch.assign(left);
    scratch += ' ';
    scratch += right;
    const auto it = merge_ranks.find(scratch);
    return it == merge_ranks.end() ? -1 : it->second;
  }
};

namespace detail {

// Appends the tokens of `text` (no special tokens in it; SPM: spaces already escaped as '▁').
void tokenize_spm(const vocab::impl& v, std::string_view text, std::vector<token_id>& out);
void tokenize_bpe(const vocab::impl& v, std::string_view text, std::vector<token_id>& out);

}  // namespace detail
}  // namespace troupe::llm
