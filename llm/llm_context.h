// The decode API: runs batches of tokens through a model with a KV cache, returns logits.
//
//   llm_context ctx(*m, {.n_ctx = 2048, .n_threads = 2});
//   batch b; ... ; ctx.decode(b);
//   std::span<const float> l = ctx.logits(0);   // [n_vocab] for the first token that asked for logits
//
// A batch is split into micro-batches of at most n_ubatch tokens; the graph's compute memory is reserved
// once for the worst case (n_ubatch tokens over the whole cache, n_outputs_reserved rows of logits) and
// reused; a micro-batch that needs more grows it. Errors (a full cache, a token
// id outside the vocabulary, a bad sequence id, a device failure) throw troupe::error; the cache keeps only
// the micro-batches that completed.
//
// Pipelining: when the model's layers span several backends (CPU and CPU1, a GPU and the CPU...) and a
// batch has several micro-batches, up to n_pipeline of them are in flight at once, each with its own graph
// and compute memory (a scheduler per pipeline slot, reserved at the first such batch): a thread per
// backend runs the splits, micro-batch k + 1's first split while micro-batch k runs its second, each split
// after the same split of the micro-batch before (so every layer's cache writes happen in micro-batch
// order) and after the split before it. Logits are bit-identical to running them one after another
// (n_pipeline = 1). With a split runner (set_split_runner on sched(): the actor layer hands each split to
// its device actor's thread) the threads hand their splits to it, several at once.
//
// The pipeline is the context's own: a coordinator thread places micro-batches (builds, allocates and sets
// up their graphs, commits their cells) and takes their results, a thread per backend runs their splits.
// submit() hands it a job and returns at once; jobs start in the order they were submitted, and the
// micro-batches of a job overlap those of the jobs before it (the decoder actor's sequence groups). The
// synchronous decode() of several micro-batches and decode_ring() run on it too.
#pragma once

#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "llm/batch.h"
#include "llm/kv_cache.h"
#include "llm/model.h"
#include "runtime/memory.h"
#include "runtime/sched.h"

namespace troupe::llm {

struct context_params {
  uint32_t n_ctx = 0;        // cache cells; 0: the model's training context, at most 4096
  uint32_t n_batch = 2048;   // most tokens one decode() takes
  uint32_t n_ubatch = 512;   // tokens per graph
  uint32_t n_seq_max = 1;
  type type_k = type::f16;
  type type_v = type::f16;
  bool flash_attn = true;    // attention as one fused op where a layer's cache allows it (graph_shape)
  int n_threads = 0;         // CPU threads; 0: all hardware threads
  uint32_t n_pipeline = 4;   // micro-batches in flight at once over several backends; 1: one at a time
  // Rows of logits the compute memory is reserved for; 0: n_seq_max (a decode outputs one row per
  // sequence; a batch that asks for more, as perplexity's every token, grows the compute memory once).
  uint32_t n_outputs_reserved = 0;
  // Output the final hidden states (after the output norm, [n_embd] per row) instead of logits: a context
  // for embeddings. logits(i) then holds token i's hidden state.
  bool embeddings = false;
};

struct decode_stats {
  uint64_t n_tokens = 0;     // tokens decoded
  uint64_t n_graphs = 0;     // micro-batches computed
  double seconds = 0.0;      // wall time inside decode()
  uint64_t n_pipelined = 0;  // decodes whose micro-batches ran as a pipeline
};

class llm_context {
 public:
  llm_context(const model& m, const context_params& p = {});
  ~llm_context();
  llm_context(const llm_context&) = delete;
  llm_context& operator=(const llm_context&) = delete;

  void decode(const batch& b);
  // Generation of several groups of sequences at once, as a ring over the model's backends: each group's
  // step (a batch of its sequences' tokens, at most n_ubatch) goes through the backends while the other
  // groups' steps do, so that with the layers over two devices both work on every step. next(group, logits,
  // next_batch) gets a group's logits (a row per token that asked, in batch order) and fills its next step;
  // false or an empty batch ends that group. The groups' sequences must be disjoint. One backend (or
  // n_pipeline 1): the groups' steps one after another. Each group's logits are bit-identical either way.
  using ring_step = std::function<bool(size_t group, std::span<const float> logits, batch& next)>;
  void decode_ring(std::vector<batch> first, const ring_step& next);
  // Asynchronous decoding. A job: start (may be empty) runs on the pipeline's coordinator thread once every
  // job submitted before has all its micro-batches placed (its cache edits: seq_rm...; a throw fails the
  // job), then b is checked as decode() checks a batch (its size aside: any number of micro-batches) and
  // goes through the pipeline. done gets its logits (a row per token that asked, in batch order) or the
  // error, on the coordinator thread; it may submit more. An empty b: done right after start. group tags
  // the job's spans in the trace. A failure fails every job with a micro-batch in flight at or after the
  // one that failed (the ones before complete and stay in the cache); later jobs run as usual. Do not call
  // decode() or decode_ring() while submitted jobs are not done; the destructor fails jobs that have not
  // started and waits for the others.
  using job_done = std::function<void(std::vector<float> logits, std::exception_ptr error)>;
  void submit(std::function<void()> start, batch b, job_done done, int64_t group = -1);
  // Logits of the i-th token (in batch order) that asked for them in the last decode: [n_vocab].
  std::span<const float> logits(size_t i) const;
  // Floats per output row: n_vocab, or n_embd for an embeddings context.
  size_t row_width() const { return params_.embeddings ? m_.hp().n_embd : m_.hp().n_vocab; }
  size_t n_outputs() const { return n_outputs_; }

  const model& mdl() const { return m_; }
  // Context shift of seq (llama.cpp's): positions [p0, p0 + n) dropped, the later ones moved down by n with
  // their K turned back by n positions (kv_cache::shifted, rope_turn_rows), written into free cells;
  // `make_room(cells)` (may be empty) runs first to free as many (the batch decoder's evictor). Throws
  // error for a bad range, capacity_error when there is no room. Not while a decode of seq is in flight.
  void shift(int32_t seq, int32_t p0, int32_t n, const std::function<void(size_t)>& make_room = {});
  kv_cache& kv() { return *kv_; }
  const kv_cache& kv() const { return *kv_; }
  const context_params& params() const { return params_; }
  scheduler& sched() { return *sched_; }
  // Compute memory reserved, over every backend and pipeline slot; and per buffer type.
  size_t compute_bytes() const;
  std::map<buffer_type_i*, size_t> compute_bytes_by_buft() const;
  // Pipeline slots with compute memory of their own besides sched()'s (0 until a batch was pipelined).
  size_t n_pipeline_slots() const;
  // Whether a batch of several micro-batches would run as a pipeline.
  bool pipelines() const;
  // Adds (sign > 0) or removes this context's KV cache ("context") and compute buffers ("compute").
  void account(memory_ledger& ledger, int sign = 1) const;
  const decode_stats& stats() const { return stats_; }
  void set_n_threads(int n);

 private:
  struct ubatch;    // one micro-batch's graph, inputs and outputs (llm/detail/llm_pipeline.h)
  struct pipeline;  // the coordinator and backend threads (llm/detail/llm_pipeline.h, llm_pipeline.cpp)
  // Checks a batch before anything of it runs (any size when !limit: the pipeline's jobs).
  void validate(const batch& b, bool limit = true) const;
  void prepare(ubatch& u, scheduler& s, const batch& b, size_t begin, size_t end, int64_t group = -1);
  void finish(ubatch& u, scheduler& s, float* dst = nullptr);
  void decode_pipelined(const batch& b);
  pipeline& pipe();  // started at the first use
  scheduler& slot(size_t i);
  void reserve(scheduler& s);

  const model& m_;
  context_params params_;
  std::unique_ptr<kv_cache> kv_;
  backend_ptr host_;  // the host CPU's backend, last in the scheduler's order
  std::vector<backend_ptr> device_backends_;  // devices holding weights, other than the host
  std::unique_ptr<scheduler> sched_;
  std::vector<sched_backend> backend_list_;              // sched_'s backends, for the pipeline slots' schedulers
  std::vector<std::unique_ptr<scheduler>> slots_;        // pipeline slots after the first (sched_)
  std::vector<float> logits_;
  size_t n_outputs_ = 0;
  uint64_t next_ubatch_id_ = 0;  // the trace's micro-batch ids
  decode_stats stats_;
  mutable std::mutex mem_mu_;       // slots_ and the compute memory sizes (read from other threads)
  std::unique_ptr<pipeline> pipe_;  // last: stopped before anything it uses goes
};

}  // namespace troupe::llm
