// The host-RAM prompt cache's round trip on a model's KV cache, on whatever devices the model's layers are:
// a sequence's positions saved to host bytes (kv_cache::save), the sequence forgotten, other cells taken, the
// bytes written back into another sequence (kv_cache::restore, whole or a prefix) and the next tokens
// decoded: the same logits as continuing the original, within `tol` (0: the same bits).
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "llm/llm_context.h"

namespace troupe::test {

inline float max_rel_difference(std::span<const float> a, std::span<const float> b) {
  REQUIRE(a.size() == b.size());
  float worst = 0;
  for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::fabs(a[i] - b[i]) / std::max(1.0f, std::fabs(a[i])));
  return worst;
}

inline void check_kv_round_trip(const llm::model& m, float tol) {
  const int32_t n = 40;
  const auto token = [&](int32_t i) { return static_cast<int32_t>((i * 7919 + 13) % m.hp().n_vocab); };
  const auto next_logits = [&](llm::llm_context& ctx, int32_t seq, int32_t from) {
    llm::batch b;
    for (int32_t i = from; i <= n; ++i) b.add(token(i), i, seq, i == n);
    ctx.decode(b);
    const auto l = ctx.logits(0);
    return std::vector<float>(l.begin(), l.end());
  };
  llm::llm_context ctx(m, {.n_ctx = 256, .n_seq_max = 4, .n_threads = 2});
  llm::batch b;
  for (int32_t i = 0; i < n; ++i) b.add(token(i), i, 0, i + 1 == n);
  ctx.decode(b);
  const std::vector<uint8_t> saved = ctx.kv().save(0, n);
  CHECK(saved.size() == static_cast<size_t>(n) * ctx.kv().bytes_per_token());
  CHECK_THROWS_AS(ctx.kv().save(0, n + 1), error);  // a position the sequence lacks
  // The original goes on: the reference.
  llm::llm_context ref(m, {.n_ctx = 256, .n_seq_max = 4, .n_threads = 2});
  ref.decode(b);
  const std::vector<float> want = next_logits(ref, 0, n);
  // Forgotten; another sequence takes the first cells; the bytes come back into sequence 2, in other cells.
  ctx.kv().seq_rm(0, -1, -1);
  llm::batch other;
  for (int32_t i = 0; i < 13; ++i) other.add(token(1000 + i), i, 1, i == 12);
  ctx.decode(other);
  ctx.kv().restore(2, saved, n, n);
  CHECK(ctx.kv().seq_pos_max(2) == n - 1);
  const std::vector<float> got = next_logits(ctx, 2, n);
  INFO("whole restore: largest relative difference " << max_rel_difference(want, got));
  if (tol == 0) {
    CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
  } else {
    CHECK(max_rel_difference(want, got) <= tol);
  }
  // A prefix of it (30 of the 40 positions) into sequence 3, the rest decoded.
  ctx.kv().restore(3, saved, n, 30);
  CHECK(ctx.kv().seq_pos_max(3) == 29);
  const std::vector<float> part = next_logits(ctx, 3, 30);
  INFO("prefix restore: largest relative difference " << max_rel_difference(want, part));
  CHECK(max_rel_difference(want, part) <= std::max(tol, 1e-4f));
  CHECK_THROWS_AS(ctx.kv().restore(3, saved, n, n + 1), error);
}

}  // namespace troupe::test
