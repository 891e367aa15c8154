// The KV cache: per-layer K and V tensors over n_ctx cells, and which position of which sequences each
// cell holds.
//
//   kv_cache kv(model, {.n_ctx = 4096, .type_k = type::f16, .type_v = type::f16, .n_seq_max = 4});
//   std::vector<uint32_t> cells = kv.find_slots(n_tokens);   // where the next tokens' K/V go
//   kv.commit(cells, pos, seq);                              // after the ubatch's graph ran
//   kv.seq_rm(1, 10, -1);                                    // drop sequence 1 from position 10 on
//   kv.seq_cp(0, 2, 0, -1);                                  // sequence 2 shares 0's prefix (no copy)
//
// Layout: K of layer l is [n_embd_k_gqa, n_ctx] (a row per cell). V is stored transposed, [n_ctx,
// n_embd_v_gqa] (a row per dimension), so attention reads it as a matrix without copying; a quantized V
// type (q8_0) cannot be written column-wise, so it is stored like K and transposed when read. The memory
// is zeroed at creation: cells outside the mask must never hold NaNs that a zero weight would spread.
// Sliding-window layers use the same cells; the mask hides what is outside their window.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string_view>
#include <span>
#include <vector>

#include "runtime/backend.h"
#include "runtime/context.h"
#include "llm/model.h"

namespace troupe::llm {

// The KV cache element types (llama.cpp's -ctk / -ctv names): f32, f16, bf16, q8_0, q4_0, q4_1, q5_0, q5_1,
// iq4_nl; null for any other name.
std::optional<type> kv_cache_type_named(std::string_view name);
// "f32, f16, ..." for messages.
const char* kv_cache_type_names();

struct kv_cache_params {
  uint32_t n_ctx = 4096;     // cells (tokens over all sequences)
  type type_k = type::f16;   // kv_cache_type_named()
  type type_v = type::f16;
  uint32_t n_seq_max = 1;    // sequences, at most 64
};

class kv_cache {
 public:
  static constexpr uint32_t max_seq = 64;
  static constexpr uint32_t pad = 32;  // n_kv is a multiple of this (keeps attention shapes stable)

  kv_cache(const model& m, const kv_cache_params& p);
  ~kv_cache();
  kv_cache(const kv_cache&) = delete;
  kv_cache& operator=(const kv_cache&) = delete;

  uint32_t size() const { return n_ctx_; }
  // Whether layer il keeps V transposed ([n_ctx, n_embd_v_gqa]: a row per dimension, for the devices' dense
  // matrix products) or a row per cell ([n_embd_v_gqa, n_ctx]: quantized V, and every layer a CPU device
  // computes (host memory, CPU instances), whose product reads V's rows in cell order and so gives a
  // sequence the same sums wherever its cells are and whatever else is cached).
  bool v_trans(uint32_t il) const { return v_trans_[il]; }
  bool cpu_layer(uint32_t il) const { return cpu_layer_[il]; }
  bool any_v_trans() const;
  tensor* k(uint32_t il) const { return k_[il]; }  // [n_embd_k_gqa, n_ctx]
  tensor* v(uint32_t il) const { return v_[il]; }  // v_trans(il): [n_ctx, n_embd_v_gqa]; else [n_embd_v_gqa, n_ctx]

  // Free cells for n tokens (not necessarily contiguous), in increasing order. When there are enough above
  // every cell that the sequences `seqs` hold, those: each sequence's cells then stay in position order, and
  // attention on the CPU sums them in the order a fresh cache would (the same bits, wherever a shared prefix
  // lies). Else the lowest free ones. Throws capacity_error when the cache is full.
  std::vector<uint32_t> find_slots(uint32_t n, std::span<const int32_t> seqs = {}) const;
  // Records that cells[i] holds position pos[i] of sequence seq[i].
  void commit(const std::vector<uint32_t>& cells, const std::vector<int32_t>& pos, const std::vector<int32_t>& seq);
  // Cells that attention must cover: one past the highest used cell (after adding `extra` cells), padded.
  uint32_t n_kv(const std::vector<uint32_t>& extra = {}) const;

  // Frees cells that commit() filled (a micro-batch whose compute failed gives its cells back).
  void release(const std::vector<uint32_t>& cells);
  // Removes positions [p0, p1) of seq (p1 < 0: to the end; seq < 0: every sequence).
  void seq_rm(int32_t seq, int32_t p0, int32_t p1);
  // Makes positions [p0, p1) of src visible to dst as well (shared cells, no copy).
  void seq_cp(int32_t src, int32_t dst, int32_t p0, int32_t p1);
  void clear();

  // A sequence's positions as host bytes, and back (the host-RAM prompt cache, llm/prefix_index.h). The
  // layout, per layer: K of positions 0..n-1 (a row each), then V of the same (a row each, whatever the
  // cache's own V layout); bytes_per_token() per position over all layers.
  size_t bytes_per_token() const;
  // Positions [0, n) of seq; throws error when seq lacks one of them.
  std::vector<uint8_t> save(int32_t seq, int32_t n) const;
  // Writes positions [0, n) of a saved sequence of n_saved positions (n <= n_saved) into free cells and gives
  // them to seq (which should hold nothing). Throws capacity_error when fewer than n cells are free.
  void restore(int32_t seq, std::span<const uint8_t> saved, int32_t n_saved, int32_t n);

  // Context shift: seq's positions with [p0, p0 + n) dropped and the later ones moved down by n, as host bytes
  // in save()'s layout (held - n positions, held = seq_pos_max(seq) + 1), each moved K row passed through
  // `turn(il, rows, n_rows)` as f32 ([n_embd_k_gqa] per row: the layer's rope by -n positions) and stored back
  // in the cache's type. The caller forgets seq and restores these. Throws error when seq holds fewer
  // than p0 + n positions.
  using turn_fn = std::function<void(uint32_t il, float* rows, int64_t n_rows)>;
  std::vector<uint8_t> shifted(int32_t seq, int32_t p0, int32_t n, const turn_fn& turn) const;

  // Highest position of seq, or -1 when it holds none.
  int32_t seq_pos_max(int32_t seq) const;
  uint32_t used_cells() const;
  // Cells in use and cells that more than one sequence holds (prefix sharing), as of the last edit; safe to
  // read from any thread while another edits (the /metrics gauges).
  struct occupancy_counts {
    uint32_t used = 0;
    uint32_t shared = 0;
  };
  occupancy_counts occupancy() const { return {used_now_.load(), shared_now_.load()}; }

  // The attention mask for a ubatch: [n_kv, n_rows] f32 rows (n_rows >= tokens; extra rows -inf), 0 where
  // token t (position pos[t], sequence seq[t]) may attend to cell c, -inf elsewhere. window > 0: only
  // positions within the last `window` tokens (sliding-window layers).
  void fill_mask(float* dst, uint32_t n_kv, uint32_t n_rows, const std::vector<int32_t>& pos,
                 const std::vector<int32_t>& seq, const std::vector<uint32_t>& cells, uint32_t window) const;

  // Bytes of K/V memory per buffer type (the breakdown's "context").
  std::map<buffer_type_i*, size_t> bytes_by_buft() const;
  size_t bytes() const;

 private:
  struct cell {
    int32_t pos = -1;
    uint64_t seqs = 0;  // bit s: sequence s holds this cell
  };
  void check_seq(int32_t seq, const char* what) const;
  void recount();  // used_now_, shared_now_ after an edit
  // Moves the rows of the positions in `cells` (cells[i] holds position i) between host bytes in save()'s
  // layout (n_host positions a layer) and the cache: to the host (save) or from it (restore).
  void move_rows(const std::vector<uint32_t>& cells, uint8_t* host, size_t n_host, bool to_host) const;

  uint32_t n_ctx_;
  uint32_t n_seq_max_;
  type type_k_, type_v_;
  std::vector<bool> v_trans_;  // per layer
  std::vector<bool> cpu_layer_;  // per layer: troupe's CPU kernels compute it (a row per cell for K and V)
  std::vector<tensor*> k_, v_;
  std::unique_ptr<context> ctx_;
  std::vector<buffer_ptr> buffers_;
  std::vector<cell> cells_;
  std::atomic<uint32_t> used_now_{0}, shared_now_{0};
};

}  // namespace troupe::llm
