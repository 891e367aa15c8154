// Generation for one sequence, synchronously: prompt processing with prefix reuse, sampling, stop
// conditions, streaming. It drives an llm::sequence (sequence.h, the one state machine of an answer) and
// decodes each of its steps alone on the context.
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
#include <string_view>
#include <vector>

#include "llm/generate_params.h"
#include "llm/llm_context.h"
#include "llm/vocab.h"

namespace troupe::llm {

// Called with each new piece of text and its token (token_null for text flushed at the end); returning
// false cancels.
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
  void decode_tokens(std::span<const token_id> tokens);

  llm_context& ctx_;
  const vocab& vocab_;
  int32_t seq_;
  std::vector<token_id> cached_;
};

}  // namespace troupe::llm
