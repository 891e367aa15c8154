// Greedy decoding through the synchronous LLM layer, and the reference facts of stories260K it is checked
// against (../shared/models/README.md: the reference implementation's greedy tokens, F32).
//
//   CHECK(test::greedy(ctx, test::stories_prompt, 32) == test::stories_ref);
#pragma once

#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "llm/llm_context.h"

namespace troupe::test {

inline int32_t argmax_of(std::span<const float> l) {
  return static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
}

// Decodes the prompt in sequence seq, then n greedy tokens one at a time.
inline std::vector<int32_t> greedy(llm::llm_context& ctx, const std::vector<int32_t>& prompt, int n, int32_t seq = 0) {
  llm::batch b;
  for (size_t i = 0; i < prompt.size(); ++i) b.add(prompt[i], static_cast<int32_t>(i), seq, i + 1 == prompt.size());
  ctx.decode(b);
  std::vector<int32_t> out;
  auto pos = static_cast<int32_t>(prompt.size());
  for (int i = 0; i < n; ++i) {
    const int32_t t = argmax_of(ctx.logits(0));
    out.push_back(t);
    b.clear();
    b.add(t, pos++, seq, true);
    ctx.decode(b);
  }
  return out;
}

// "Once upon a time" with BOS, and the next 32 greedy tokens of stories260K.
inline const std::vector<int32_t> stories_prompt = {1, 403, 407, 261, 378};
inline const std::vector<int32_t> stories_ref = {432, 383, 286, 261, 376, 298, 315, 421, 395, 317, 426,
                                                 338, 401, 396, 267, 337, 410, 408, 419, 292, 411, 322,
                                                 265, 282, 295, 433, 426, 385, 328, 432, 358, 394};

}  // namespace troupe::test
