// Generation for one sequence: prompt processing with prefix reuse, sampling, stop conditions, streaming.
//
//   generator gen(ctx, vocab, /*seq*/ 0);
//   auto r = gen.generate(vocab.tokenize(prompt, true), {.max_tokens = 64}, [](std::string_view piece, token_id) {
//     std::cout << piece << std::flush;
//     return true;                       // false stops the answer (Ctrl-C, a client that went away)
//   });
//   r.finish;                            // "stop" (end of generation / stop string), "length", "cancelled"
//
// The generator remembers the tokens its sequence holds in the KV cache; a new prompt that starts with
// them (the next turn of a chat) only decodes the new part.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/llm/detokenizer.h"
#include "runtime/llm/llm_context.h"
#include "runtime/llm/sampler.h"
#include "runtime/llm/vocab.h"

namespace troupe::llm {

struct generate_params {
  int32_t max_tokens = 256;              // generated tokens at most (the context may end it earlier)
  sampling_params sampling;
  std::vector<std::string> stop;         // stop strings: generation ends before them
};

struct generate_result {
  std::vector<token_id> tokens;  // generated
  std::string text;              // generated text (without a matched stop string)
  std::string finish;            // "stop", "length" or "cancelled"
  int32_t n_prompt = 0;          // prompt tokens in the request
  int32_t n_prompt_decoded = 0;  // prompt tokens actually decoded (the rest reused from the cache)
  double prompt_seconds = 0;
  double gen_seconds = 0;
};

// Called with each new piece of text and its token; returning false cancels.
using piece_fn = std::function<bool(std::string_view piece, token_id id)>;

class generator {
 public:
  generator(llm_context& ctx, const vocab& v, int32_t seq = 0);

  // Decodes what of `prompt` the cache does not hold yet, then samples up to max_tokens. Throws
  // capacity_error when the prompt does not fit the context.
  generate_result generate(std::span<const token_id> prompt, const generate_params& p, const piece_fn& on_piece = {});
  // Forgets the sequence (clears its cells).
  void reset();
  // Tokens the sequence holds.
  const std::vector<token_id>& cached() const { return cached_; }

 private:
  void decode_tokens(std::span<const token_id> tokens, bool last_logits);

  llm_context& ctx_;
  const vocab& vocab_;
  int32_t seq_;
  std::vector<token_id> cached_;
};

}  // namespace troupe::llm
