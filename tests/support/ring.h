// Generation of four sequences three ways, for the ring tests (llm_context::decode_ring against one batch
// per step and against the groups one after another): tests/llm/test_pipeline.cpp (CPU / CPU1) and
// tests/backends/rpc/test_rpc_model.cpp (CPU / a real troupe peer, and behind a slow link).
//
//   test::check_ring(*m, 12);                              // the three ways, checked against each other
//   const auto r = test::generate_four(ring_ctx, 12, 2);   // 2 groups of 2 through decode_ring
//   const auto a = test::generate_four(other_ctx, 12, 1);  // one batch of 4 per step
#pragma once

#include <catch2/catch.hpp>

#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <vector>

#include "llm/llm_context.h"
#include "llm/model.h"
#include "tests/support/greedy.h"

namespace troupe::test {

inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// Greedy generation of n tokens for 4 sequences (prompts of different lengths already decoded): in one
// batch per step (groups = 1), or as `groups` groups of sequences through decode_ring. Returns each
// sequence's tokens, and the logits of every step in order of (sequence, step) for the bit comparison.
struct four_answers {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logits;
};

// before_steps runs after the prompts, before the first step.
inline four_answers generate_four(llm::llm_context& ctx, int n, size_t groups, const std::function<void()>& before_steps = {}) {
  four_answers out;
  out.tokens.resize(4);
  out.logits.resize(4);
  std::vector<int32_t> pos(4), last(4);
  for (int32_t s = 0; s < 4; ++s) {
    llm::batch b;
    for (int32_t i = 0; i < 5 + 3 * s; ++i) b.add(stories_prompt[static_cast<size_t>(i % 5)], i, s, i == 4 + 3 * s);
    ctx.decode(b);
    last[static_cast<size_t>(s)] = argmax_of(ctx.logits(0));
    pos[static_cast<size_t>(s)] = 5 + 3 * s;
  }
  if (before_steps) before_steps();
  const size_t per = 4 / groups;
  const auto step_of = [&](size_t g) {
    llm::batch b;
    for (size_t s = g * per; s < (g + 1) * per; ++s) b.add(last[s], pos[s]++, static_cast<int32_t>(s), true);
    return b;
  };
  std::vector<int> steps(groups, 0);
  const auto take = [&](size_t g, std::span<const float> l, llm::batch& next) {
    const size_t n_vocab = l.size() / per;
    for (size_t i = 0; i < per; ++i) {
      const size_t s = g * per + i;
      const std::span<const float> row = l.subspan(i * n_vocab, n_vocab);
      last[s] = argmax_of(row);
      out.tokens[s].push_back(last[s]);
      out.logits[s].insert(out.logits[s].end(), row.begin(), row.end());
    }
    if (++steps[g] == n) return false;
    next = step_of(g);
    return true;
  };
  if (groups == 1) {
    llm::batch b = step_of(0);
    for (bool more = true; more;) {
      ctx.decode(b);
      std::vector<float> l;
      for (size_t r = 0; r < 4; ++r) l.insert(l.end(), ctx.logits(r).begin(), ctx.logits(r).end());
      more = take(0, l, b);
    }
    return out;
  }
  std::vector<llm::batch> first;
  for (size_t g = 0; g < groups; ++g) first.push_back(step_of(g));
  ctx.decode_ring(std::move(first), take);
  return out;
}

// The three ways on m (its layers over two or more devices), checked: the ring (two groups through
// decode_ring) gives the tokens of one batch per step and the logits, bit for bit, of the two groups one
// after another (n_pipeline = 1). before_ring(ring) runs after the ring's prompts, before its first step.
inline void check_ring(const llm::model& m, int n, const std::function<void(llm::llm_context&)>& before_ring = {}) {
  const llm::context_params cp{.n_ctx = 512, .n_ubatch = 64, .n_seq_max = 4, .n_threads = 1, .n_pipeline = 4};
  llm::context_params serial_cp = cp;
  serial_cp.n_pipeline = 1;
  llm::llm_context ring(m, cp), one_batch(m, cp), serial(m, serial_cp);
  const auto r = generate_four(ring, n, 2, [&] {
    if (before_ring) before_ring(ring);
  });
  const auto a = generate_four(one_batch, n, 1);
  const auto s = generate_four(serial, n, 2);
  CHECK(ring.stats().n_pipelined == 1);
  CHECK(serial.stats().n_pipelined == 0);
  for (size_t q = 0; q < 4; ++q) {
    INFO("sequence " << q);
    CHECK(r.tokens[q].size() == static_cast<size_t>(n));
    CHECK(r.tokens[q] == a.tokens[q]);  // grouped or not: the same tokens
    CHECK(r.tokens[q] == s.tokens[q]);
    CHECK(same_bits(r.logits[q], s.logits[q]));  // ring or one group after the other: the same bits
  }
}

}  // namespace troupe::test
