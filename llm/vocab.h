// The model's vocabulary and tokenizer, loaded from GGUF metadata (tokenizer.ggml.*).
//
//   const gguf_file f = read_gguf("stories260K.gguf");
//   const llm::vocab v(f);                                  // throws vocab_error / gguf_error naming the key
//   std::vector<llm::token_id> ids = v.tokenize("Once upon a time", /*add_special=*/true);  // [1, 403, ...]
//   std::string text = v.detokenize(ids, {.strip_leading_space = true});                 // "Once upon a time"
//   std::string piece = v.token_to_piece(ids[1]);           // " Once"
//
// Two tokenizer families, by tokenizer.ggml.model (others are refused by name):
//   "llama"  SentencePiece-style (SPM): spaces become U+2581 '▁', a '▁' is prefixed to the text
//            (add_space_prefix), pieces merge pairwise by score, and characters with no token fall back to
//            byte tokens <0xXX>. Behaves as llama.cpp's SPM tokenizer does.
//   "gpt2"   byte-level BPE: text is split into words by the pre-tokenizer of tokenizer.ggml.pre
//            (llm/pretokenizer.h), bytes are shown as printable code points, and merges apply in
//            the order tokenizer.ggml.merges lists them.
// Special tokens (control and user-defined token types) are matched in the text before tokenization:
// user-defined ones always, control (and unknown) ones only when parse_special is true.
//
// A vocab is immutable after construction; all methods are const and safe to call from several threads.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "llm/pretokenizer.h"

namespace troupe {
class gguf_file;
}

namespace troupe::llm {

// A vocabulary that cannot be used: an unsupported tokenizer model or pre-tokenizer, inconsistent
// arrays, a token id out of range.
class vocab_error : public error {
 public:
  using error::error;
};

using token_id = int32_t;
constexpr token_id token_null = -1;  // "no such token" (a special token the vocabulary does not have)

enum class vocab_type { spm, bpe };

// tokenizer.ggml.token_type values.
enum class token_type : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

struct token_data {
  std::string text;  // as stored: '▁' for spaces (SPM), byte-level code points (BPE), "<0x0A>" for bytes
  float score = 0.0f;  // SPM merge priority (higher merges first); 0 when the file has no scores
  token_type type = token_type::normal;
};

struct detokenize_options {
  bool special = false;  // render control and unknown tokens (e.g. "<s>", "<|im_end|>") instead of nothing
  // SPM with add_space_prefix: drop the space that tokenization prefixed, i.e. a leading space of the
  // first non-empty piece when that is text (so after a BOS that renders as nothing). For whole sequences
  // from their start; llama.cpp's detokenize strips it only when the first token is not BOS.
  bool strip_leading_space = false;
};

class vocab {
 public:
  // Reads tokenizer.ggml.* from the file. Throws vocab_error (unsupported model or pre-tokenizer, arrays
  // of different lengths, duplicate tokens) or gguf_error (a missing or mistyped key).
  explicit vocab(const gguf_file& file);
  ~vocab();
  vocab(vocab&&) noexcept;
  vocab& operator=(vocab&&) noexcept;
  vocab(const vocab&) = delete;
  vocab& operator=(const vocab&) = delete;

  vocab_type type() const;
  const std::string& model_name() const;  // tokenizer.ggml.model: "llama" or "gpt2"
  const std::string& pre_name() const;    // tokenizer.ggml.pre as stored ("" when absent)
  pre_tokenizer_type pre() const;         // BPE only; gpt2 for SPM vocabularies
  int32_t n_tokens() const;

  // The token's stored data; throws vocab_error for an id out of range.
  const token_data& data(token_id id) const;
  const std::string& text(token_id id) const { return data(id).text; }
  token_type type_of(token_id id) const { return data(id).type; }
  bool is_control(token_id id) const { return type_of(id) == token_type::control; }
  bool is_byte(token_id id) const { return type_of(id) == token_type::byte; }
  // End of generation: EOS, EOT, EOM and tokens known to end a turn ("<|im_end|>", "<|eot_id|>",
  // "<end_of_turn>", "<|endoftext|>", ...). False for ids out of range.
  bool is_eog(token_id id) const;
  const std::vector<token_id>& eog_tokens() const;

  // The tokens that stand for text (not control or unknown tokens, not empty), ordered by their pieces'
  // bytes, with each piece's common prefix length with the one before: a flattened trie of the vocabulary
  // for walks that share work between pieces with a common prefix (the grammar matcher). Built on first
  // use (thread-safe).
  struct piece_index {
    std::vector<token_id> order;
    std::vector<std::string_view> text;  // [i]: the piece of order[i], views into `bytes`
    std::string bytes;                   // the pieces back to back in order (a walk reads memory in order)
    std::vector<uint32_t> lcp;           // [i]: common prefix length of text[i - 1] and text[i]; [0] = 0
  };
  const piece_index& sorted_pieces() const;

  // Special tokens; token_null when the vocabulary has none.
  token_id bos() const;
  token_id eos() const;
  token_id eot() const;  // end of turn: tokenizer.ggml.eot_token_id, else found by text
  token_id unk() const;
  token_id pad() const;
  token_id nl() const;  // the token of "\n"
  bool add_bos() const;  // tokenize(..., add_special = true) prepends BOS
  bool add_eos() const;  // ... and appends EOS
  bool add_space_prefix() const;

  // The token whose stored text is exactly `text`.
  std::optional<token_id> find(std::string_view text) const;
  // The token for one byte: SPM <0xXX> (else the one-character token), BPE the byte's code point.
  std::optional<token_id> byte_to_token(uint8_t byte) const;
  // BPE merge rank of (left, right) as stored (byte-level text), or -1.
  int32_t merge_rank(std::string_view left, std::string_view right) const;

  // Text to token ids. add_special: BOS/EOS as add_bos()/add_eos() say. parse_special: control tokens
  // written in the text ("<|im_start|>", "<s>") become those tokens; otherwise they are tokenized as text.
  // Never throws on any input bytes (invalid UTF-8 included).
  std::vector<token_id> tokenize(std::string_view text, bool add_special, bool parse_special = false) const;

  // The bytes a token stands for: SPM '▁' -> ' ' and <0xXX> -> the byte, BPE code points -> bytes.
  // Control and unknown tokens give "" unless special; user-defined tokens give their text. A piece may
  // be part of a UTF-8 character (byte tokens): use detokenizer to stream text. Throws for bad ids.
  std::string token_to_piece(token_id id, bool special = false) const;
  // The concatenated pieces of `tokens`.
  std::string detokenize(std::span<const token_id> tokens, const detokenize_options& options = {}) const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe::llm
