// A decode batch: tokens with their positions and sequences, and which of them need logits.
//
//   batch b;
//   for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], i, 0, i + 1 == prompt.size());
//   ctx.decode(b);   // split into micro-batches of at most n_ubatch tokens
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::llm {

struct batch {
  std::vector<int32_t> tokens;
  std::vector<int32_t> pos;
  std::vector<int32_t> seq;
  std::vector<uint8_t> logits;  // 1: return this token's logits

  void add(int32_t token, int32_t position, int32_t seq_id, bool want_logits) {
    tokens.push_back(token);
    pos.push_back(position);
    seq.push_back(seq_id);
    logits.push_back(want_logits ? 1 : 0);
  }
  size_t size() const { return tokens.size(); }
  // Tokens of [begin, end) that want logits.
  size_t n_outputs(size_t begin, size_t end) const {
    size_t n = 0;
    for (size_t i = begin; i < end; ++i) n += logits[i] != 0;
    return n;
  }
  size_t n_outputs() const { return n_outputs(0, size()); }
  void clear() {
    tokens.clear();
    pos.clear();
    seq.clear();
    logits.clear();
  }
};

}  // namespace troupe::llm
