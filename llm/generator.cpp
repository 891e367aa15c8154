#include "llm/generator.h"

#include <algorithm>

#include "llm/sequence.h"

namespace troupe::llm {

generator::generator(llm_context& ctx, const vocab& v, int32_t seq) : ctx_(ctx), vocab_(v), seq_(seq) {}

void generator::reset() {
  ctx_.kv().seq_rm(seq_, -1, -1);
  cached_.clear();
}

// Decodes tokens after cached_ in batches of n_batch, with the logits of the last one.
void generator::decode_tokens(std::span<const token_id> tokens) {
  const size_t step = ctx_.params().n_batch;
  batch b;
  for (size_t begin = 0; begin < tokens.size(); begin += step) {
    const size_t end = std::min(tokens.size(), begin + step);
    b.clear();
    for (size_t i = begin; i < end; ++i) {
      b.add(tokens[i], static_cast<int32_t>(cached_.size() + (i - begin)), seq_, i + 1 == tokens.size());
    }
    ctx_.decode(b);
    cached_.insert(cached_.end(), tokens.begin() + static_cast<std::ptrdiff_t>(begin),
                   tokens.begin() + static_cast<std::ptrdiff_t>(end));
  }
}

generate_result generator::generate(std::span<const token_id> prompt, const generate_params& p, const piece_fn& on_piece) {
  sequence s(vocab_, cached_, prompt, p, ctx_.params().n_ctx);
  while (!s.done()) {
    const sequence_step& step = s.pending();
    if (static_cast<size_t>(step.keep) < cached_.size()) {
      ctx_.kv().seq_rm(seq_, step.keep, -1);
      cached_.resize(static_cast<size_t>(step.keep));
    }
    decode_tokens(step.tokens);
    const sequence_output out = s.advance(ctx_.logits(0));
    // A shift the next step asks for is made now, before the piece goes out (which may cancel the answer), as
    // the decoder actor makes it when the step arrives: the cache is then what the sequence records.
    if (const sequence_step& next = s.pending(); next.shift_n > 0) {
      ctx_.shift(seq_, next.shift_at, next.shift_n);
      cached_.erase(cached_.begin() + next.shift_at, cached_.begin() + next.shift_at + next.shift_n);
    }
    // The answer's last piece ends it whatever the callback says; an earlier one may cancel it.
    if (on_piece && !out.piece.empty() && !on_piece(out.piece, out.token) && !out.done) s.cancel();
  }
  return s.result();
}

}  // namespace troupe::llm
