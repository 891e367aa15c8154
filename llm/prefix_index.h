// Which cells of a model's KV cache a prompt can start from, and the conversations the cache keeps after
// their sessions moved on: the bookkeeping of prefix reuse across sequences (no KV memory of its own).
//
// The cache is one pool of cells; a cell may belong to several sequences (kv_cache::seq_cp shares it, no copy).
// Sequences [0, n_live) belong to sessions. Sequences [n_live, n_total) are *kept conversations*: when a
// session's sequence is about to drop positions (a new conversation on that session, or the session
// closes), those positions are first shared into a kept sequence, so they stay in the pool until its cells
// are needed. A step whose prompt starts with tokens that another sequence (live or kept) holds takes that
// sequence's cells for them and decodes only the rest. New tokens always go into free cells, so a shared
// cell is never written: one sequence never sees another's later tokens.
//
//   prefix_index ix(4, 64);
//   auto plan = ix.plan_step(seq, keep, tokens);  // on the scheduler's thread, when a step arrives
//   // submit, in this order: share(seq -> plan.keep_into, plan.kept), share(plan.donor -> seq, plan.n),
//   // then the step (seq, plan.keep, plan.tokens); unpin(donor) once that share ran
//   ix.step_done(seq, ok);                         // when its decode completed (or failed)
//   int32_t r = ix.evict_one();                    // on the pipeline's thread, when cells run short
//
// A kept conversation evicted for room is saved to host memory first (kv_cache::save; `host_limit` bytes
// at most, least recently used dropped): a later prompt that starts with it has those positions written back
// (kv_cache::restore) instead of decoded, as llama-server's --cache-ram does.
//
// What it records for a sequence is what the cache will hold once every edit submitted so far has run;
// `stable` is how many leading positions of that are decoded already and that no submitted edit removes: only
// those are shared into another sequence. Thread-safe (the scheduler plans, the pipeline evicts).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <span>
#include <utility>
#include <vector>

#include "llm/vocab.h"

namespace troupe::llm {

struct prefix_index_stats {
  uint64_t reused_tokens = 0;       // prompt positions taken from another sequence's cells instead of decoded
  uint64_t reused_steps = 0;        // steps that took them
  uint64_t kept_conversations = 0;  // times a sequence's positions were kept in the pool before being dropped
  uint64_t evictions = 0;           // kept conversations dropped to make room
  uint64_t idle_evictions = 0;      // idle sessions' sequences dropped to make room (no kept one left)
  uint32_t kept_now = 0;            // kept conversations in the pool now
  uint64_t kept_tokens_now = 0;     // their positions
  uint64_t restored_tokens = 0;     // prompt positions written back from host memory instead of decoded
  uint64_t saved_conversations = 0; // evicted kept conversations saved to host memory
  uint32_t host_entries = 0;        // saved conversations in host memory now
  uint64_t host_bytes = 0;          // their bytes
};

class prefix_index {
 public:
  // n_live: the sessions' sequences; n_total: all sequences of the cache (kept ones are n_live..n_total-1);
  // min_kept: fewer positions than this are not worth keeping.
  // host_limit: bytes of host memory for evicted conversations (0: none are saved).
  prefix_index(uint32_t n_live, uint32_t n_total, uint32_t min_kept = 16, uint64_t host_limit = 0);

  struct step_plan {
    int32_t keep_into = -1;  // first: this kept sequence takes seq's positions [0, kept) (forgetting its own)
    int32_t kept = 0;
    int32_t donor = -1;      // then: seq forgets its positions and takes positions [0, n) of donor
    int32_t n = 0;
    // or (restore set, donor -1): seq forgets its positions and takes positions [0, n) of these saved bytes
    // (kv_cache::save of restore_saved positions)
    std::shared_ptr<const std::vector<uint8_t>> restore;
    int32_t restore_saved = 0;
    int32_t keep = 0;        // then the step: keep this many positions of seq, decode `tokens` after them
    std::vector<token_id> tokens;
    int32_t reused = 0;      // prompt positions the donor or the restore saved (n minus the step's own keep;
                             // negative when seq's own positions were evicted while idle)
  };
  // A step of live sequence seq arrives: keep its first `keep` positions, decode `tokens`.
  step_plan plan_step(int32_t seq, int32_t keep, std::span<const token_id> tokens);
  // A live sequence whose step in progress is decoding at least min_gain more of this step's prompt than
  // any sequence holds decoded now (several clients behind one new long prefix): the step is better
  // planned once that one is done, sharing its positions instead of decoding them beside it. -1: none.
  int32_t leader_for(int32_t seq, int32_t keep, std::span<const token_id> tokens, size_t min_gain) const;
  // The step's decode completed (ok) or failed (then only its stable positions are known).
  void step_done(int32_t seq, bool ok);
  // The step's share or restore found no room: seq holds nothing, and the step decodes `tokens_of(seq)`
  // whole (a step from position 0, nothing shared).
  void retry_plain(int32_t seq);
  // Live sequence seq forgets everything (its session leaves, or a new one attaches): the kept sequence
  // that should take its positions [0, n) first, or {-1, 0}.
  std::pair<int32_t, int32_t> forget(int32_t seq);
  // A step of live sequence seq shifts its context first (sequence_step::shift_at/shift_n): its positions
  // [at, at + n) go and the later ones move down.
  void shifted(int32_t seq, int32_t at, int32_t n);
  // dst forgot its positions and took positions [0, n) of src (an explicit share).
  void shared(int32_t src, int32_t dst, int32_t n);
  // A share from seq that plan_step asked for has run: seq may be evicted again.
  void unpin(int32_t seq);
  // The least recently used kept conversation that no submitted share still needs, forgotten here; its
  // cells are the caller's to free (kv_cache::seq_rm). With none left, the least recently used idle live
  // sequence (set_idle: its session between answers), whose tokens the index remembers: its next step
  // starts from position 0 (plan_step), sharing or restoring what it can. *tokens: the victim's decoded
  // positions (for the host-RAM prompt cache). -1: none.
  int32_t evict_one(std::vector<token_id>* tokens = nullptr);
  // evict_one and store as one step, `save(victim, n)` giving the victim's first n positions as bytes (empty:
  // not saved) while the index is locked: no plan in between sees the conversation in neither the pool nor
  // host memory. The pipeline's evictor.
  int32_t evict_saving(const std::function<std::vector<uint8_t>(int32_t seq, int32_t n)>& save);
  // Live sequence seq is between answers (its session ended one: its cells may go when the pool needs
  // them), or not (a step arrived).
  void set_idle(int32_t seq, bool idle);
  // Whether evicted conversations are saved to host memory (host_limit > 0).
  bool saves() const { return host_limit_ > 0; }
  // An evicted conversation's positions as saved bytes (kv_cache::save), kept in host memory within the
  // limit (least recently used dropped first; one that an entry continues replaces it).
  void store(std::vector<token_id> tokens, std::vector<uint8_t> bytes);
  // Forgets everything (the cache was cleared).
  void clear();

  prefix_index_stats stats() const;
  // What the index records for seq (tests).
  std::vector<token_id> tokens_of(int32_t seq) const;

 private:
  struct entry {
    std::vector<token_id> tokens;
    size_t stable = 0;
    uint64_t used = 0;  // LRU stamp
    int pins = 0;
    bool idle = false;     // live: between answers
    bool evicted = false;  // live: its cells went (evict_one); tokens are what it held
  };
  struct saved {
    std::vector<token_id> tokens;
    std::shared_ptr<const std::vector<uint8_t>> bytes;
    uint64_t used = 0;
  };
  bool live(int32_t seq) const { return seq >= 0 && static_cast<uint32_t>(seq) < n_live_; }
  int32_t evict_locked(std::vector<token_id>* tokens);  // evict_one, under mu_
  void store_locked(std::vector<token_id> tokens, std::vector<uint8_t> bytes);  // store, under mu_
  // The kept sequence that should take `tokens` (already covered: -1), stamping it.
  int32_t keep_slot(std::span<const token_id> tokens, int32_t except);
  // Live seq's decoded positions recorded in a kept sequence (keep_slot's, pinned until the share ran); -1
  // when they are already in the pool or no kept sequence is free. Under mu_.
  int32_t keep_decoded(int32_t seq);
  void check(int32_t seq, const char* what) const;

  uint32_t n_live_, n_total_, min_kept_;
  uint64_t host_limit_;
  std::vector<saved> host_;
  uint64_t host_bytes_ = 0;
  mutable std::mutex mu_;
  std::vector<entry> e_;
  uint64_t tick_ = 0;
  prefix_index_stats st_;
};

}  // namespace troupe::llm
