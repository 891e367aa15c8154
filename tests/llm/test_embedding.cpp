// Embeddings: the pooled final hidden states against the logits of a generation context (logits = W h, so
// W e is the logits divided by |h|), unit length, pooling declared by GGUF, independent of earlier calls.
#include <catch2/catch.hpp>

#include <cmath>
#include <vector>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "llm/embedding.h"
#include "runtime/types.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

TEST_CASE("embeddings: the hidden state times the output matrix gives the logits (stories260K)", "[llm][embeddings]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  const vocab v(m->meta());
  const uint32_t n_embd = m->hp().n_embd, n_vocab = m->hp().n_vocab;
  llm_context gen(*m, {.n_ctx = 64, .n_threads = 2});
  llm_context emb(*m, {.n_ctx = 64, .n_threads = 2, .embeddings = true});
  CHECK(emb.row_width() == n_embd);
  CHECK(pooling_of(m->hp()) == pooling::mean);  // stories260K declares none

  // The output matrix as floats: [n_vocab rows of n_embd].
  const tensor& w = *m->output();
  std::vector<std::byte> raw(nbytes(w));
  tensor_get(w, raw.data(), 0, raw.size());
  std::vector<float> wf(static_cast<size_t>(n_embd) * n_vocab);
  REQUIRE(traits(w.type).to_float != nullptr);
  traits(w.type).to_float(raw.data(), wf.data(), static_cast<int64_t>(wf.size()));

  // One token: the mean is that token's hidden state, so W e = logits / |h| for every vocabulary entry.
  const std::vector<token_id> one = {1};
  const std::vector<float> e = embed(emb, one);
  REQUIRE(e.size() == n_embd);
  double norm = 0;
  for (float x : e) norm += static_cast<double>(x) * x;
  CHECK(std::abs(norm - 1.0) < 1e-5);
  batch b;
  b.add(1, 0, 0, true);
  gen.decode(b);
  const std::span<const float> logits = gen.logits(0);
  std::vector<double> we(n_vocab);
  for (uint32_t r = 0; r < n_vocab; ++r) {
    double s = 0;
    for (uint32_t d = 0; d < n_embd; ++d) s += static_cast<double>(wf[static_cast<size_t>(r) * n_embd + d]) * e[d];
    we[r] = s;
  }
  // |h| = logits[r] / (W e)[r]: one positive constant over the vocabulary (the embedding is the hidden state
  // divided by its norm: not negated, not scaled entry by entry), taken at the largest (W e)[r].
  uint32_t pivot = 0;
  for (uint32_t r = 1; r < n_vocab; ++r) {
    if (std::abs(we[r]) > std::abs(we[pivot])) pivot = r;
  }
  const double h_norm = logits[pivot] / we[pivot];
  CHECK(h_norm > 0);
  size_t bad = 0;
  double max_err = 0;
  for (uint32_t r = 0; r < n_vocab; ++r) {
    const double err = std::abs(we[r] * h_norm - logits[r]);
    max_err = std::max(max_err, err);
    if (err > 1e-3 * (1.0 + std::abs(logits[r]))) ++bad;
  }
  INFO("max error " << max_err);
  CHECK(bad == 0);

  // Several tokens: mean pooled; the same text gives the same vector after other calls; others differ.
  const auto a = v.tokenize("Once upon a time", true);
  const auto c = v.tokenize("The cat sat on the mat", true);
  const std::vector<float> ea = embed(emb, a);
  const std::vector<float> ec = embed(emb, c);
  const std::vector<float> ea2 = embed(emb, a);
  CHECK(ea == ea2);
  double dot = 0;
  for (size_t d = 0; d < n_embd; ++d) dot += static_cast<double>(ea[d]) * ec[d];
  CHECK(dot < 0.999);
  CHECK_THROWS_AS(embed(emb, std::vector<token_id>(65, 1)), capacity_error);
  CHECK_THROWS_AS(embed(emb, std::vector<token_id>{}), error);
  CHECK_THROWS_AS(embed(gen, a), error);  // not an embeddings context
}
