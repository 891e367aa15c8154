// Byte-level BPE tokenization (tokenizer.ggml.model "gpt2"): split the text into words with the
// pre-tokenizer, show each byte of a word as its GPT-2 code point, then within each word repeatedly merge
// the adjacent pair with the lowest merge rank (ties: the leftmost pair) and emit each symbol's token.
#include <algorithm>
#include <cstdint>
#include <queue>
#include <string>
#include <vector>

#include "llm/detail/symbol_merge.h"
#include "llm/detail/vocab_impl.h"
#include "llm/pretokenizer.h"
#include "llm/unicode.h"
#include "runtime/log.h"

namespace troupe::llm::detail {
namespace {

using symbol = merge_symbol;  // bytes of the byte-level word

struct bigram {
  int left, right;
  int32_t rank;
  size_t size;
};

// Lowest rank first; among equal ranks the leftmost pair.
struct bigram_order {
  bool operator()(const bigram& a, const bigram& b) const {
    return a.rank > b.rank || (a.rank == b.rank && a.left > b.left);
  }
};

class bpe_session {
 public:
  explicit bpe_session(const vocab::impl& v) : v_(v) {}

  void tokenize_word(std::string_view raw, std::vector<token_id>& out) {
    word_.clear();
    for (const char c : raw) word_ += gpt2_byte_to_utf8(static_cast<uint8_t>(c));

    if (v_.ignore_merges) {
      if (const token_id id = v_.find(word_); id != token_null) {
        out.push_back(id);
        return;
      }
    }

    symbols_.clear();
    queue_ = {};
    merge_symbols(
        symbols_, queue_, word_.size(),
        [this](size_t off) { return std::min(utf8_sequence_length(static_cast<uint8_t>(word_[off])), word_.size() - off); },
        [this](int left, int right) { try_add_bigram(left, right); });

    if (symbols_.empty()) return;
    for (int i = 0; i != -1; i = symbols_[i].next) emit(symbols_[i], out);
  }

 private:
  std::string_view sym(int i) const { return std::string_view(word_).substr(symbols_[i].offset, symbols_[i].n); }

  void try_add_bigram(int left, int right) {
    if (left < 0 || right < 0) return;
    const int32_t rank = v_.merge_rank_of(sym(left), sym(right), key_);
    if (rank < 0) return;
    queue_.push({left, right, rank, symbols_[left].n + symbols_[right].n});
  }

  void emit(const symbol& s, std::vector<token_id>& out) const {
    const std::string_view piece = std::string_view(word_).substr(s.offset, s.n);
    if (const token_id id = v_.find(piece); id != token_null) {
      out.push_back(id);
      return;
    }
    // Not a token: one token per character, i.e. per byte. A byte the vocabulary has no token for is
    // dropped, as llama.cpp does (SmolLM2, for one, has none for bytes that never occur in UTF-8 text, such
    // as 0xC0 or 0xFF, nor for a few control characters).
    for (size_t off = 0; off < piece.size();) {
      const size_t n = std::min(utf8_sequence_length(static_cast<uint8_t>(piece[off])), piece.size() - off);
      const token_id id = v_.find(piece.substr(off, n));
      if (id != token_null) {
        out.push_back(id);
      } else {
        TROUPE_LOG(debug, "vocab: a byte has no token in this vocabulary; dropped");
      }
      off += n;
    }
  }

  const vocab::impl& v_;
  std::string word_;  // the current word, byte-level encoded
  std::string key_;   // scratch for merge lookups
  std::vector<symbol> symbols_;
  std::priority_queue<bigram, std::vector<bigram>, bigram_order> queue_;
};

}  // namespace

void tokenize_bpe(const vocab::impl& v, std::string_view text, std::vector<token_id>& out) {
  bpe_session session(v);
  for (const std::string_view word : pre_tokenize(v.pre, text)) session.tokenize_word(word, out);
}

}  // namespace troupe::llm::detail
