// Perplexity of a model over a token sequence, the way the reference implementation measures it: the text
// is cut into chunks of n_ctx tokens, each chunk is decoded from an empty cache (with BOS first when the
// model adds one), and only the second half of each chunk is scored, so every scored token has at least
// n_ctx / 2 tokens of context.
//
//   perplexity_result r = perplexity(ctx, vocab, tokens);   // r.ppl, r.n_scored
#pragma once

#include <cstdint>
#include <span>

#include "llm/llm_context.h"
#include "llm/vocab.h"

namespace troupe::llm {

struct perplexity_result {
  double ppl = 0.0;           // exp(mean negative log-likelihood)
  double nll = 0.0;           // mean negative log-likelihood per scored token (nats)
  uint64_t n_scored = 0;      // tokens scored
  uint32_t n_chunks = 0;
  uint32_t chunk_size = 0;
  double seconds = 0.0;
};

// Throws error when the text has fewer than 2 * chunk tokens (no complete chunk to score with context).
perplexity_result perplexity(llm_context& ctx, const vocab& v, std::span<const token_id> tokens, uint32_t chunk = 0);

}  // namespace troupe::llm
