// Several sequences' next tokens in one decode: each step names its sequence (its own seq id in the KV
// cache), how much of the sequence's cache to keep, and the tokens to decode after it.
//
//   llm_context ctx(m, {.n_ctx = 4096, .n_seq_max = 4});
//   batch_decoder dec(ctx);
//   std::vector<seq_step> steps = {{0, s0.pending().keep, s0.pending().tokens},
//                                  {1, s1.pending().keep, s1.pending().tokens}};
//   std::vector<std::vector<float>> logits = dec.decode(steps);   // [n_vocab] per step, in step order
//
// Tokens of all steps go into batches of at most n_batch tokens (a long prompt spans several decode()
// calls; short steps share a batch), so two sequences generating at the same time cost about one
// matrix-vector pass each step instead of two. generate_together() runs whole answers this way.
#pragma once

#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "llm/generator.h"
#include "llm/llm_context.h"
#include "llm/sequence.h"
#include "runtime/error.h"

namespace troupe::llm {

struct seq_step {
  int32_t seq = 0;                // sequence id, below the context's n_seq_max
  int32_t keep = 0;               // cache positions of seq to keep; later ones are removed first
  std::vector<token_id> tokens;   // decoded at positions keep, keep + 1, ...; not empty
  // A context shift first (sequence_step): positions [shift_at, shift_at + shift_n) dropped, the later ones
  // moved down (llm_context::shift); keep counts after it. shift_n 0: none.
  int32_t shift_at = 0;
  int32_t shift_n = 0;
};

// A step keeps positions its sequence does not hold (a share or restore before it found no room): thrown
// before anything is decoded, so the caller may decode the step's whole prompt instead.
class missing_positions_error : public error {
 public:
  using error::error;
};

struct batch_decoder_stats {
  uint64_t n_decodes = 0;   // decode() calls on the context
  uint64_t n_steps = 0;     // steps decoded
  uint64_t n_tokens = 0;    // tokens decoded
  uint32_t max_steps = 0;   // most steps in one call of decode()
};

class batch_decoder {
 public:
  explicit batch_decoder(llm_context& ctx);

  // Decodes every step and returns the logits of each step's last token, in step order. At most one step
  // per sequence. Throws error for a bad step (an unknown sequence, empty tokens, keep beyond what the
  // sequence holds, two steps of one sequence) before decoding anything, and capacity_error when the
  // cache is full (steps decoded before that stay in the cache; their sequences' keep values say so).
  std::vector<std::vector<float>> decode(std::span<const seq_step> steps);
  // Removes a sequence's every cache cell.
  void forget(int32_t seq);

  // The same through the context's pipeline (llm_context::submit), returning at once: the steps are checked
  // and their cache edits made once the decodes submitted before are placed, all of them go into one job,
  // and done gets the logits per step (in step order), or the error, on the pipeline's thread. Decodes
  // submitted one after another overlap in the pipeline when the model spans several backends: the actor
  // layer's sequence groups. submit_forget: forget(seq) in the same order. Do not mix with decode().
  using decode_done = std::function<void(std::vector<std::vector<float>> logits, std::exception_ptr error)>;
  void submit(std::vector<seq_step> steps, decode_done done, int64_t group = -1);
  void submit_forget(int32_t seq);
  // llm_context::shift(seq, p0, n) in the same order, making room through the evictor; when it fails (no
  // room) seq is left empty, and its next step fails for keeping positions it does not hold.
  void submit_shift(int32_t seq, int32_t p0, int32_t n);
  // forget(dst), then dst shares positions [0, n) of src (kv_cache::seq_cp), in the same order; `after`
  // (may be empty) runs on the pipeline's thread once it has.
  void submit_share(int32_t src, int32_t dst, int32_t n, std::function<void()> after = {});
  // Frees room in the cache before a decode or a restore: while fewer cells are free than needed, `evict`
  // names a sequence whose cells may go (-1: none left; it may save them first), which is then forgotten.
  // The kept conversations of prefix reuse (prefix_index::evict_one). Runs on the pipeline's thread, in the
  // decode's cache edits.
  void set_evictor(std::function<int32_t(kv_cache&)> evict);
  // forget(seq), then seq takes positions [0, n) of saved bytes (kv_cache::save of n_saved positions) in
  // free cells, in the pipeline's order; `after` (may be empty) runs once it has. A restore that finds no
  // room leaves seq empty (its step then fails, as decoding those positions would have).
  // `failed` (may be empty) runs instead of nothing when there was no room.
  void submit_restore(int32_t seq, std::shared_ptr<const std::vector<uint8_t>> saved, int32_t n_saved, int32_t n,
                      std::function<void()> failed = {});

  batch_decoder_stats stats() const;

 private:
  void check(std::span<const seq_step> steps) const;  // throws for a bad step
  void begin(std::span<const seq_step> steps);        // check, then drop what each step does not keep
  void count(std::span<const seq_step> steps, uint64_t n_decodes);

  llm_context& ctx_;
  void make_room(size_t needed);
  std::function<int32_t(kv_cache&)> evict_;
  mutable std::mutex mu_;  // stats_ (submit's are counted on the pipeline's thread)
  batch_decoder_stats stats_;
};

// Generates one answer per prompt, every sequence i on seq id i of ctx (ctx.params().n_seq_max >= the
// number of prompts), decoding their steps together until all are done. on_piece(i, piece, token) streams
// (may be empty). The synchronous counterpart of several sessions decoding at once.
std::vector<generate_result> generate_together(
    llm_context& ctx, const vocab& v, const std::vector<std::vector<token_id>>& prompts, const generate_params& p,
    const std::function<void(size_t, std::string_view, token_id)>& on_piece = {});

}  // namespace troupe::llm
