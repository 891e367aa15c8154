// Logits of a whole token sequence, and how far two sets of them are apart: for comparing a converted or
// quantized model with the model it came from, position by position (teacher forcing: both see the same
// tokens, so one early difference does not change every later position).
//
//   const auto want = test::logits_of(f32_ctx, tokens), got = test::logits_of(f16_ctx, tokens);
//   CHECK(test::max_abs_diff(got, want) <= 0.05);
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "llm/llm_context.h"

namespace troupe::test {

// Decodes `tokens` in sequence 0 of an empty context, in one batch, and returns every position's logits.
inline std::vector<std::vector<float>> logits_of(llm::llm_context& ctx, const std::vector<int32_t>& tokens) {
  llm::batch b;
  for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], static_cast<int32_t>(i), 0, true);
  ctx.decode(b);
  std::vector<std::vector<float>> out;
  for (size_t i = 0; i < ctx.n_outputs(); ++i) {
    const auto l = ctx.logits(i);
    out.emplace_back(l.begin(), l.end());
  }
  return out;
}

// The largest |a - b| over every position and token (infinity when the shapes differ or a value is NaN).
inline double max_abs_diff(const std::vector<std::vector<float>>& a, const std::vector<std::vector<float>>& b) {
  if (a.size() != b.size()) return INFINITY;
  double m = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].size() != b[i].size()) return INFINITY;
    for (size_t j = 0; j < a[i].size(); ++j) {
      const double d = std::fabs(static_cast<double>(a[i][j]) - static_cast<double>(b[i][j]));
      if (!(d <= m)) m = std::isnan(d) ? INFINITY : d;
    }
  }
  return m;
}

// sqrt(sum (a - b)^2 / sum want^2) over every position and token: the error relative to the logits' size
// (infinity when the shapes differ or a value is NaN).
inline double relative_rms(const std::vector<std::vector<float>>& got, const std::vector<std::vector<float>>& want) {
  if (got.size() != want.size()) return INFINITY;
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (got[i].size() != want[i].size()) return INFINITY;
    for (size_t j = 0; j < got[i].size(); ++j) {
      const double d = static_cast<double>(got[i][j]) - static_cast<double>(want[i][j]);
      err += d * d;
      norm += static_cast<double>(want[i][j]) * static_cast<double>(want[i][j]);
    }
  }
  const double r = std::sqrt(err / norm);
  return std::isnan(r) ? INFINITY : r;
}

}  // namespace troupe::test
