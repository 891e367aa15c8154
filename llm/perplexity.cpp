#include "llm/perplexity.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "runtime/error.h"

namespace troupe::llm {

perplexity_result perplexity(llm_context& ctx, const vocab& v, std::span<const token_id> tokens, uint32_t chunk) {
  const auto t0 = std::chrono::steady_clock::now();
  if (chunk == 0) chunk = ctx.params().n_ctx;
  chunk = std::min(chunk, ctx.params().n_ctx);
  if (chunk < 4) throw error("perplexity: chunks of " + std::to_string(chunk) + " tokens are too small");
  const size_t n_chunks = tokens.size() / chunk;
  if (n_chunks == 0) {
    throw error("perplexity: the text has " + std::to_string(tokens.size()) + " tokens, fewer than one chunk of " +
                std::to_string(chunk));
  }
  perplexity_result r;
  r.chunk_size = chunk;
  r.n_chunks = static_cast<uint32_t>(n_chunks);
  const uint32_t first = chunk / 2;
  double nll = 0.0;
  for (size_t c = 0; c < n_chunks; ++c) {
    ctx.kv().clear();
    std::vector<token_id> toks(tokens.begin() + static_cast<std::ptrdiff_t>(c * chunk),
                               tokens.begin() + static_cast<std::ptrdiff_t>((c + 1) * chunk));
    if (v.add_bos() && v.bos() != token_null) toks[0] = v.bos();
    // Decode in pieces of n_batch tokens, keeping the logits of the scored positions.
    const size_t step = ctx.params().n_batch;
    for (size_t begin = 0; begin < toks.size(); begin += step) {
      const size_t end = std::min(toks.size(), begin + step);
      batch b;
      for (size_t i = begin; i < end; ++i) b.add(toks[i], static_cast<int32_t>(i), 0, i >= first && i + 1 < toks.size());
      ctx.decode(b);
      size_t out = 0;
      for (size_t i = begin; i < end; ++i) {
        if (!(i >= first && i + 1 < toks.size())) continue;
        const auto l = ctx.logits(out++);
        // log softmax at the next token.
        const float mx = *std::max_element(l.begin(), l.end());
        double sum = 0.0;
        for (float x : l) sum += std::exp(static_cast<double>(x - mx));
        nll += -(static_cast<double>(l[static_cast<size_t>(toks[i + 1])] - mx) - std::log(sum));
        r.n_scored += 1;
      }
    }
  }
  r.nll = nll / static_cast<double>(r.n_scored);
  r.ppl = std::exp(r.nll);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

}  // namespace troupe::llm
