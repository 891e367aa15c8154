// One answer on one sequence, step by step: the sequence says what to decode next, the caller decodes it
// and hands back the logits of its last token; the sequence samples, handles stop conditions and returns
// the text to stream. It is the one state machine of an answer: the synchronous generator (generator.h)
// decodes its steps alone, generate_together (batch_decoder.h) and the decoder actor batch them with
// other sequences' steps, and the session actor drives one per conversation turn.
//
//   llm::sequence s(vocab, cached, prompt, {.max_tokens = 64}, ctx.params().n_ctx);
//   while (!s.done()) {
//     const llm::sequence_step& st = s.pending();       // drop cache positions >= st.keep, decode st.tokens
//     auto logits = decoder.decode({{seq, st.keep, st.tokens}})[0];
//     llm::sequence_output out = s.advance(logits);      // out.piece: text to stream now
//   }
//   s.result().finish;                                   // "stop", "length" or "cancelled"
//
// Its decisions (prefix reuse, sampling, stop strings, the context limit) depend only on the logits it is
// given, so the same sequence decoded alone or in a batch produces the same tokens.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "llm/detokenizer.h"
#include "llm/generate_params.h"
#include "llm/grammar.h"
#include "llm/sampler.h"

namespace troupe::llm {

// What to decode next: keep the first `keep` positions of the sequence in the cache, then decode `tokens`
// at positions keep, keep + 1, ... with the logits of the last one.
struct sequence_step {
  int32_t keep = 0;
  std::vector<token_id> tokens;
  // A context shift before the step (generate_params::context_shift): positions [shift_at, shift_at +
  // shift_n) are dropped and the later ones move down by shift_n (their K turned back by as many positions);
  // keep counts after the shift. shift_n 0: none. cached() already leaves the dropped positions out: the
  // caller makes the shift as soon as the step is handed on, whether or not the answer is cancelled after.
  int32_t shift_at = 0;
  int32_t shift_n = 0;
};

struct sequence_output {
  std::string piece;            // text to stream now (may be empty: a held-back character or stop prefix)
  token_id token = token_null;  // the sampled token (token_null when none was sampled)
  bool done = false;
};

class sequence {
 public:
  // cached: the tokens the sequence holds in the cache now (the previous turn); prompt: the whole prompt.
  // Throws error for an empty prompt, capacity_error when the prompt does not fit n_ctx, sampling_error
  // for bad sampling parameters (grammar_error for a grammar that does not compile).
  sequence(const vocab& v, std::span<const token_id> cached, std::span<const token_id> prompt,
           const generate_params& p, uint32_t n_ctx);

  bool done() const { return done_; }
  // The next step to decode; its tokens are empty once done().
  const sequence_step& pending() const { return pending_; }
  // After pending() was decoded: samples from its last token's logits ([n_vocab]).
  sequence_output advance(std::span<const float> logits);
  // Ends the answer now with finish "cancelled" (nothing more is streamed).
  void cancel();
  // The decoder took n of pending()'s prompt positions from another sequence's cells (prefix reuse across
  // sequences) instead of decoding them: result().n_prompt_decoded says so. Negative: it decoded -n
  // positions before pending().keep again (the pool evicted them while the session was idle).
  void reused(int32_t n);

  const generate_result& result() const { return result_; }
  // Context shifts the answer took (generate_params::context_shift).
  int32_t n_shifts() const { return n_shifts_; }
  // Tokens the sequence holds in the cache after the last decoded step.
  const std::vector<token_id>& cached() const { return cached_; }

 private:
  sequence_output finish(std::string finish, bool flush);
  token_logprob logprob_of(token_id t) const;
  // After a token's text was added: switches a lazy grammar on at a trigger, follows the reasoning block.
  void watch_text(size_t before);


  const vocab& vocab_;
  generate_params params_;
  uint32_t n_ctx_;
  sampler_chain chain_;
  std::unique_ptr<grammar_matcher> grammar_;  // when params_.grammar is set
  bool grammar_on_ = true;                    // false while a lazy grammar waits for its trigger
  // The reasoning budget: inside the block, tokens taken in it, the end marker's tokens still to force.
  bool in_reasoning_ = false, reasoning_done_ = false, budget_spent_ = false;
  int32_t n_reasoning_ = 0;
  size_t free_from_ = 0;  // bytes of text after the reasoning block: where a lazy grammar's trigger may begin
  std::vector<token_id> forced_;
  std::vector<uint8_t> allowed_;              // the grammar's mask at this step
  std::vector<float> masked_;                 // the logits with disallowed tokens at -inf
  detokenizer detok_;
  std::vector<token_id> cached_;
  sequence_step pending_;
  generate_result result_;
  size_t held_ = 0;  // bytes of result_.text not yet streamed
  int32_t n_sampled_ = 0;
  int32_t n_keep_ = 0;  // prompt positions a context shift keeps
  int32_t n_shifts_ = 0;
  bool done_ = false;
  bool in_prompt_ = true;
  std::chrono::steady_clock::time_point t0_, t1_;
};

}  // namespace troupe::llm
