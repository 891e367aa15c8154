// SentencePiece-style tokenization (tokenizer.ggml.model "llama"), as llama.cpp does it for SPM vocabs:
// start from one symbol per UTF-8 character; repeatedly merge the adjacent pair whose concatenation is a
// token with the highest score (ties: the leftmost pair); then emit each symbol's token, or its bytes as
// byte tokens <0xXX> when the symbol is not a token.
#include <algorithm>
#include <cstdint>
#include <queue>
#include <vector>

#include "llm/detail/symbol_merge.h"
#include "llm/detail/vocab_impl.h"
#include "llm/unicode.h"
#include "runtime/log.h"

namespace troupe::llm::detail {
namespace {

// A symbol's length: a whole UTF-8 character, or one byte of invalid UTF-8. (llama.cpp takes the length
// its first byte claims even when the bytes after it do not follow; for valid UTF-8 the two agree, for
// invalid bytes this keeps a following '▁' whole so that the text round-trips.)
size_t char_length(std::string_view text, size_t offset) { return utf8_decode(text, offset).len; }

using symbol = merge_symbol;

struct bigram {
  int left, right;
  float score;
  size_t size;  // bytes of the merged text; a bigram is stale once its symbols changed size
};

// Highest score first; among equal scores the leftmost pair.
struct bigram_order {
  bool operator()(const bigram& a, const bigram& b) const {
    return a.score < b.score || (a.score == b.score && a.left > b.left);
  }
};

class spm_session {
 public:
  spm_session(const vocab::impl& v, std::string_view text) : v_(v), text_(text) {}

  void tokenize(std::vector<token_id>& out) {
    if (text_.empty()) return;
    merge_symbols(
        symbols_, queue_, text_.size(), [this](size_t off) { return char_length(text_, off); },
        [this](int left, int right) { try_add_bigram(left, right); });
    for (int i = 0; i != -1; i = symbols_[i].next) emit(symbols_[i], out);
  }

 private:
  void try_add_bigram(int left, int right) {
    if (left < 0 || right < 0) return;
    const std::string_view merged = text_.substr(symbols_[left].offset, symbols_[left].n + symbols_[right].n);
    const token_id id = v_.find(merged);
    if (id == token_null) return;
    queue_.push({left, right, v_.tokens[id].score, merged.size()});
  }

  void emit(const symbol& s, std::vector<token_id>& out) const {
    const std::string_view piece = text_.substr(s.offset, s.n);
    if (const token_id id = v_.find(piece); id != token_null) {
      out.push_back(id);
      return;
    }
    // Byte fallback: a character with no token becomes one byte token per byte.
    for (const char c : piece) {
      const token_id id = v_.byte_tokens[static_cast<uint8_t>(c)];
      if (id != token_null) {
        out.push_back(id);
      } else if (v_.unk != token_null) {
        out.push_back(v_.unk);
      } else {
        TROUPE_LOG(debug, "vocab: byte 0x" << std::hex << int(static_cast<uint8_t>(c))
                                           << " has no token and there is no <unk>; dropped");
      }
    }
  }

  const vocab::impl& v_;
  std::string_view text_;
  std::vector<symbol> symbols_;
  std::priority_queue<bigram, std::vector<bigram>, bigram_order> queue_;
};

}  // namespace

void tokenize_spm(const vocab::impl& v, std::string_view text, std::vector<token_id>& out) {
  spm_session(v, text).tokenize(out);
}

}  // namespace troupe::llm::detail
