// Context shift (llm_context::shift, kv_cache::shifted, rope_turn_rows, sequence's context_shift): on a real
// model (stories260K), the moved K rows of layer 0 against the rows a fresh decode of the shifted tokens
// writes (layer 0's K and V depend only on the token and its position), the kept rows untouched, and whole
// answers that run past their context, alone and batched.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "llm/batch_decoder.h"
#include "llm/generator.h"
#include "llm/graph.h"
#include "llm/llm_context.h"
#include "llm/model.h"
#include "llm/vocab.h"
#include "runtime/types.h"
#include "tests/test_models.h"

using namespace troupe;

namespace {

// Layer 0's K (k true) or V rows of n positions as f32, out of kv_cache::save's bytes (its first layer).
std::vector<float> layer0_rows(const llm::kv_cache& kv, const std::vector<uint8_t>& saved, int32_t n, bool k) {
  const tensor& t = k ? *kv.k(0) : *kv.v(0);
  REQUIRE_FALSE(kv.v_trans(0));  // the CPU's layout: V a row per cell, as K
  const int64_t n_embd = t.ne[0];
  const size_t row = row_size(t.type, n_embd);
  const size_t k_row = row_size(kv.k(0)->type, kv.k(0)->ne[0]);
  const uint8_t* at = saved.data() + (k ? 0 : static_cast<size_t>(n) * k_row);
  std::vector<float> out(static_cast<size_t>(n * n_embd));
  for (int32_t p = 0; p < n; ++p) traits(t.type).to_float(at + static_cast<size_t>(p) * row, out.data() + p * n_embd, n_embd);
  return out;
}

// The largest difference relative to the largest magnitude of its block of 32 values in b (at least 1):
// the scale a quantized type rounds to.
float max_rel_difference(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i0 = 0; i0 < a.size(); i0 += 32) {
    const size_t i1 = std::min(a.size(), i0 + 32);
    float m = 1.0f;
    for (size_t i = i0; i < i1; ++i) m = std::max(m, std::fabs(b[i]));
    for (size_t i = i0; i < i1; ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / m);
  }
  return worst;
}

void decode_all(llm::llm_context& ctx, const std::vector<int32_t>& tokens) {
  llm::batch b;
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], static_cast<int32_t>(i), 0, i + 1 == tokens.size());
  ctx.decode(b);
}

// Shifts positions [4, 24) of 60 and compares layer 0 with a fresh decode of the 40 tokens left.
void check_shift_rows(const llm::model& m, type kv_type, float tol) {
  INFO("KV type " << type_name(kv_type));
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 60; ++i) tokens.push_back((i * 7919 + 13) % static_cast<int32_t>(m.hp().n_vocab));
  const int32_t p0 = 4, n = 20, kept_n = 60 - n;
  std::vector<int32_t> shifted(tokens.begin(), tokens.begin() + p0);
  shifted.insert(shifted.end(), tokens.begin() + p0 + n, tokens.end());
  llm::llm_context ctx(m, {.n_ctx = 128, .n_seq_max = 1, .type_k = kv_type, .type_v = kv_type, .n_threads = 2});
  decode_all(ctx, tokens);
  const std::vector<uint8_t> before = ctx.kv().save(0, 60);
  ctx.shift(0, p0, n);
  CHECK(ctx.kv().seq_pos_max(0) == kept_n - 1);
  CHECK(ctx.kv().used_cells() == static_cast<uint32_t>(kept_n));
  const std::vector<uint8_t> after = ctx.kv().save(0, kept_n);

  llm::llm_context fresh(m, {.n_ctx = 128, .n_seq_max = 1, .type_k = kv_type, .type_v = kv_type, .n_threads = 2});
  decode_all(fresh, shifted);
  const std::vector<uint8_t> want = fresh.kv().save(0, kept_n);

  const std::vector<float> k_got = layer0_rows(ctx.kv(), after, kept_n, true);
  const std::vector<float> k_want = layer0_rows(fresh.kv(), want, kept_n, true);
  const std::vector<float> k_before = layer0_rows(ctx.kv(), before, 60, true);
  const int64_t row = ctx.kv().k(0)->ne[0];
  // The kept rows: the very values they had.
  CHECK(std::equal(k_got.begin(), k_got.begin() + p0 * row, k_before.begin()));
  INFO("largest K difference from a fresh decode at the new positions: " << max_rel_difference(k_got, k_want));
  CHECK(max_rel_difference(k_got, k_want) <= tol);
  // And far from what they were before the turn (the test would pass with no rotation otherwise).
  const std::vector<float> k_unturned(k_before.begin() + (p0 + n) * row, k_before.end());
  const std::vector<float> k_moved(k_got.begin() + p0 * row, k_got.end());
  CHECK(max_rel_difference(k_moved, k_unturned) > 4 * tol);
  // V has no rope: layer 0's is the fresh decode's exactly, for every position.
  CHECK(layer0_rows(ctx.kv(), after, kept_n, false) == layer0_rows(fresh.kv(), want, kept_n, false));
}

}  // namespace

TEST_CASE("context shift: moved K rows are the rope of their new positions, V and the kept rows unchanged, for each KV type", "[shift]") {
  // The tolerance: rounding of the rotation, plus the type's own rounding when the row is stored again.
  if (const auto path = test::model_path("stories260K.gguf")) {
    auto m = llm::model::load(*path);
    check_shift_rows(*m, type::f32, 1e-5f);
    check_shift_rows(*m, type::f16, 2e-3f);
    check_shift_rows(*m, type::bf16, 1.6e-2f);
  }
  // Quantized K needs heads of 32 values: SmolLM2's are 64.
  if (const auto path = test::smollm2_path()) {
    auto m = llm::model::load(*path);
    // Both rows rounded to the block's scale (max / 127, max / 8): three roundings apart at most.
    check_shift_rows(*m, type::q8_0, 0.025f);
    check_shift_rows(*m, type::q4_0, 0.25f);
  }
}

TEST_CASE("context shift: a greedy answer goes past its context, equal to the answer without until the first shift, alone and batched", "[shift]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  const llm::vocab v(m->meta());
  const std::vector<int32_t> prompt = v.tokenize("Once upon a time", true);
  llm::generate_params p = llm::generate_params::greedy(120);
  p.logit_bias = {{v.eos(), -100.0f}};  // no end of text: the answer runs into the context's limit
  const uint32_t n_ctx = 48;

  llm::llm_context plain_ctx(*m, {.n_ctx = n_ctx, .n_seq_max = 1, .n_threads = 2});
  llm::generator plain(plain_ctx, v);
  const llm::generate_result without = plain.generate(prompt, p);
  CHECK(without.finish == "length");
  // The prompt and the answer fill the cells (the context's, n_ctx padded).
  const size_t cells = plain_ctx.kv().size();
  REQUIRE(without.tokens.size() == cells - prompt.size());

  p.context_shift = true;
  p.n_keep = 2;
  llm::llm_context ctx(*m, {.n_ctx = n_ctx, .n_seq_max = 1, .n_threads = 2});
  llm::generator gen(ctx, v);
  const llm::generate_result with = gen.generate(prompt, p);
  CHECK(with.finish == "length");
  REQUIRE(with.tokens.size() == 120);  // max_tokens, 2.5 times the context
  CHECK(std::equal(without.tokens.begin(), without.tokens.end(), with.tokens.begin()));
  CHECK(ctx.kv().seq_pos_max(0) < static_cast<int32_t>(cells));
  for (const int32_t t : with.tokens) CHECK(t != v.eos());

  // The next turn starts from what the cache holds after the shifts: the kept tokens (BOS and n_keep) and
  // the latest ones; its answer is still right there (a prompt the generator's cache does not start with
  // is decoded whole).
  const llm::generate_result next = gen.generate(prompt, llm::generate_params::greedy(8));
  CHECK(next.tokens == std::vector<int32_t>(without.tokens.begin(), without.tokens.begin() + static_cast<std::ptrdiff_t>(next.tokens.size())));

  // An answer cancelled right after a shift (its piece refused): the cache holds what the generator records,
  // so the next turn is right.
  {
    llm::llm_context c2(*m, {.n_ctx = n_ctx, .n_seq_max = 1, .n_threads = 2});
    llm::generator g2(c2, v);
    size_t pieces = 0;
    const llm::generate_result cut = g2.generate(prompt, p, [&](std::string_view, llm::token_id) {
      return ++pieces < cells - prompt.size() + 1;  // the first piece after the first shift refuses
    });
    CHECK(cut.finish == "cancelled");
    CHECK(c2.kv().seq_pos_max(0) + 1 <= static_cast<int32_t>(cells));
    const llm::generate_result again = g2.generate(prompt, llm::generate_params::greedy(8));
    CHECK(again.tokens == std::vector<int32_t>(without.tokens.begin(), without.tokens.begin() + 8));
  }

  // Two answers batched on one context (the batch decoder's shifts): both run to max_tokens, each the
  // unshifted answer until its first shift.
  llm::llm_context both_ctx(*m, {.n_ctx = static_cast<uint32_t>(2 * cells), .n_seq_max = 2, .n_threads = 2});
  p.n_ctx = static_cast<int32_t>(cells);  // each answer's own limit in the shared cells
  const std::vector<llm::generate_result> both = llm::generate_together(both_ctx, v, {prompt, prompt}, p);
  for (const llm::generate_result& r : both) {
    REQUIRE(r.tokens.size() == 120);
    CHECK(std::equal(without.tokens.begin(), without.tokens.end(), r.tokens.begin()));
  }
  CHECK(both[0].tokens == both[1].tokens);
}

TEST_CASE("context shift: a shift outside what the sequence holds is refused before the cache changes", "[shift]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path);
  llm::llm_context ctx(*m, {.n_ctx = 64, .n_seq_max = 2, .n_threads = 2});
  decode_all(ctx, {1, 20, 30, 40, 50, 60});
  CHECK_THROWS_AS(ctx.shift(0, 4, 3), error);
  CHECK_THROWS_AS(ctx.shift(0, -1, 2), error);
  CHECK_THROWS_AS(ctx.shift(1, 0, 1), error);  // holds nothing
  CHECK(ctx.kv().seq_pos_max(0) == 5);
  CHECK(ctx.kv().used_cells() == 6);
}
