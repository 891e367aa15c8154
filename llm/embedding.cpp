#include "llm/embedding.h"

#include <cmath>
#include <string>

#include "runtime/error.h"

namespace troupe::llm {

pooling pooling_of(const hparams& hp) {
  switch (hp.pooling) {
    case 2: return pooling::cls;
    case 3: return pooling::last;
    case 4: throw error("embeddings: " + hp.name + ".pooling_type is 4 (rank): a reranker, not an embedding model");
    default: return pooling::mean;
  }
}

std::vector<float> embed(llm_context& ctx, std::span<const token_id> tokens) {
  if (!ctx.params().embeddings) throw error("embeddings: the context was not made with embeddings = true");
  if (tokens.empty()) throw error("embeddings: empty input");
  if (tokens.size() > ctx.params().n_ctx) {
    throw capacity_error("embeddings: the input has " + std::to_string(tokens.size()) + " tokens, the context holds " +
                         std::to_string(ctx.params().n_ctx));
  }
  const pooling pool = pooling_of(ctx.mdl().hp());
  ctx.kv().seq_rm(0, -1, -1);
  batch b;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const bool out = pool == pooling::mean || (pool == pooling::cls && i == 0) || (pool == pooling::last && i + 1 == tokens.size());
    b.add(tokens[i], static_cast<int32_t>(i), 0, out);
  }
  ctx.decode(b);
  const size_t n = ctx.row_width();
  std::vector<double> sum(n, 0.0);
  const size_t rows = b.n_outputs();
  for (size_t r = 0; r < rows; ++r) {
    const std::span<const float> h = ctx.logits(r);
    for (size_t d = 0; d < n; ++d) sum[d] += h[d];
  }
  ctx.kv().seq_rm(0, -1, -1);
  double norm = 0.0;
  for (double& v : sum) {
    v /= static_cast<double>(rows);
    norm += v * v;
  }
  norm = std::sqrt(norm);
  std::vector<float> out(n);
  for (size_t d = 0; d < n; ++d) out[d] = norm > 0 ? static_cast<float>(sum[d] / norm) : 0.0f;
  return out;
}

}  // namespace troupe::llm
