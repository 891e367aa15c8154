// flash_attn: attention of a block of query rows at a time, without the score matrix in memory.
//
// A work item is one head and a tile of up to tile_rows query rows (dynamically claimed, so a busy core
// takes fewer). Outside the reference path, the tiles group consecutive rows that see nearly the same cells
// (a prompt's rows; not the next tokens of different sequences, which see disjoint cells of the one KV pool),
// and a tile's work covers only the blocks of cells some row of it sees: the scores, the softmax (its
// exponentials and sum over those blocks alone, the same values and order as over the whole row: the masked
// entries are exact zeros either way) and the weighted V rows. So a step costs what its own sequence's cells
// cost, not the pool's. For the tile it computes the scores over every cache cell into the thread's work rows
// (cells whose mask is -inf for all the tile's rows, 16 at a time, are not computed: the masked half of a
// prompt's causal attention and other sequences' cells), the softmax of each row, and the rows' sums of
// V's rows weighted by the softmax (mad_tile, which skips weights of 0), straight into dst. Each step is the
// computation the unfused graph does (mul_mat_masked, soft_max, the column-major mul_mat, cont) with the same
// functions and order, so the two give bit-identical results; only the memory traffic differs (a tile's
// scores stay in L1 / L2 instead of an [n_kv, n_tokens, n_head] matrix).
#include <algorithm>
#include <atomic>
#include <cmath>
#include <utility>
#include <vector>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd/simd.h"
#include "runtime/ops.h"

namespace troupe::cpu::detail {
namespace {

constexpr int64_t tile_rows = 6;    // query rows per item: mad_tile's register tile width
constexpr int64_t cell_block = 16;  // cells whose mask is checked (and skipped) together

size_t score_bytes(int64_t n_kv) { return align_up(static_cast<size_t>(tile_rows * n_kv) * sizeof(float)); }

// Cells of a V of another type than f32 / f16 converted to f32 at a time (weighted_values).
constexpr int64_t v_block = 32;

// What a thread needs beside its scores for K and V of types other than f32 / f16 (bf16, the quantized KV
// caches): the tile's query rows in K's vec_dot_type (as the unfused graph's product converts them), and for V
// a block of v_block rows as f32. Zero for f32 / f16 K and V.
struct quant_work {
  type q_type = type::f32;  // what the tile's query rows are converted to for K's dot (f32: used as they are)
  size_t q_row = 0;         // bytes of one converted query row
  bool v_direct = true;     // V is f32 / f16: mad_tile reads it as it is
  size_t q_bytes = 0, v_bytes = 0;
  size_t total() const { return q_bytes + v_bytes; }
};

quant_work quant_work_of(const tensor& node) {
  const tensor& k = *node.src[1];
  const tensor& v = *node.src[2];
  quant_work w;
  w.q_type = traits(k.type).vec_dot_type;
  if (w.q_type != type::f32) {
    w.q_row = row_size(w.q_type, k.ne[0]);
    w.q_bytes = align_up(static_cast<size_t>(tile_rows) * w.q_row);
  }
  w.v_direct = v.type == type::f32 || v.type == type::f16;
  if (!w.v_direct) w.v_bytes = align_up(static_cast<size_t>(v_block * v.ne[0]) * sizeof(float));
  return w;
}

size_t thread_bytes(const tensor& node) { return score_bytes(node.src[1]->ne[1]) + quant_work_of(node).total(); }

// A decode step (one query row, masked) can be split between the threads by cells and by V's values
// (compute_flash_attn_sparse); its scores for every head then sit in a matrix shared by the threads, after
// their own buffers.
constexpr int64_t split_cells = 512;  // cells per unit of the split scores
constexpr int64_t split_values = 16;  // V's values per unit of the split weighted sums

// The items of a decode step (one query row): a KV head's query heads in chunks of tile_rows, or each head
// where there is one per KV head.
int64_t decode_items(const tensor& node) {
  const int64_t n_head = node.src[0]->ne[2], n_kv_head = node.src[1]->ne[2];
  const int64_t group = n_head / n_kv_head;
  return group > 1 ? n_kv_head * ((group + tile_rows - 1) / tile_rows) : n_head;
}

// Bytes of the shared scores where a decode step with nth threads would be split: fewer items than twice
// the threads.
size_t split_bytes(const tensor& node, int nth) {
  const tensor& q = *node.src[0];
  if (nth < 2 || q.ne[1] != 1 || node.src[3] == nullptr || decode_items(node) >= 2 * nth) return 0;
  return align_up(static_cast<size_t>(q.ne[2] * node.src[1]->ne[1]) * sizeof(float));
}

// A thread's buffers in the op's work memory.
struct thread_work {
  float* scores = nullptr;
  char* q = nullptr;   // converted query rows
  float* v = nullptr;  // a block of V's rows as f32
};

thread_work thread_work_of(const compute_params& params, const tensor& node) {
  const quant_work w = quant_work_of(node);
  char* base = reinterpret_cast<char*>(params.wdata) + cache_line + static_cast<size_t>(params.ith) * thread_bytes(node);
  thread_work t;
  t.scores = reinterpret_cast<float*>(base);
  base += score_bytes(node.src[1]->ne[1]);
  t.q = base;
  base += w.q_bytes;
  t.v = reinterpret_cast<float*>(base);
  return t;
}

// The softmax of one row of scores in place, as compute_soft_max does it (scale, the mask added, max, then
// its softmax_normalize).
void softmax_row(float* y, const char* m, size_t sm, type mt, int64_t n, float scale, bool reference) {
  float mx = -INFINITY;
  for (int64_t i = 0; i < n; ++i) {
    float v = y[i] * scale;
    if (m != nullptr) v += load_float(m + static_cast<size_t>(i) * sm, mt);
    y[i] = v;
    if (v > mx) mx = v;
  }
  softmax_normalize(y, n, mx, reference);
}

// Prefetches rows [c0, c1) of a plane (rows `stride` bytes apart, `bytes` used of each) into L1. A KV head's
// rows are a slice of each cell's row of the cache (128 of 1024 bytes for 8 heads of 64 f16), so a walk over
// the cells reads a few lines per 4 KiB page, which the hardware's stream prefetchers (within a page) do not
// run ahead of.
void prefetch_rows(const char* plane, size_t stride, size_t bytes, int64_t c0, int64_t c1) {
  for (int64_t c = c0; c < c1; ++c) {
    const char* row = plane + static_cast<size_t>(c) * stride;
    for (size_t b = 0; b < bytes; b += cache_line) __builtin_prefetch(row + b, 0, 3);
    __builtin_prefetch(row + bytes - 1, 0, 3);
  }
}

// Cells per call of the tile product in block_scores: a multiple of the register tiles' rows (3 and 4), the
// unit of its prefetches.
constexpr int64_t score_step = 48;

// The scores of nj query rows (q_rows, q_stride bytes apart: one head's tokens, or one token's heads) against
// cells [c0, c1) of a K plane, into the tile's score rows (n_kv floats apart): the table's tile product, or its
// dot per cell. Each score is the same dot product whichever rows share the tile, and however the cells are
// split between calls. K's rows of the next step are fetched into L1 on the way (the V rows of the weighted
// sum, fetched here, would have left L2 by then: the mad kernels fetch their own ahead).
void block_scores(const simd::kernel_table& tb, const tensor& k, size_t q_stride, int64_t hd_k, int64_t c0, int64_t c1,
                  int64_t nj, int64_t n_kv, const char* k_plane, const char* q_rows, float* scores) {
  if (const simd::vec_dot_tile_fn dot_tile = tb.dot_tile(k.type)) {
    const size_t k_bytes = row_size(k.type, hd_k);
    for (int64_t b0 = c0; b0 < c1; b0 += score_step) {
      const int64_t b1 = std::min(c1, b0 + score_step);
      prefetch_rows(k_plane, k.nb[1], k_bytes, b1, std::min(c1, b1 + score_step));
      dot_tile(hd_k, b1 - b0, nj, scores + b0, static_cast<size_t>(n_kv), k_plane + b0 * static_cast<int64_t>(k.nb[1]),
               k.nb[1], q_rows, q_stride);
    }
    return;
  }
  const char* k_rows = k_plane + c0 * static_cast<int64_t>(k.nb[1]);
  const vec_dot_fn dot = tb.dot(k.type);
  for (int64_t r = 0; r < nj; ++r) {
    for (int64_t c = c0; c < c1; ++c) {
      dot(hd_k, scores + r * n_kv + c, k_rows + (c - c0) * static_cast<int64_t>(k.nb[1]), q_rows + r * static_cast<int64_t>(q_stride));
    }
  }
}

// The query rows a tile's scores read: as they are for f32 / f16 K, else converted to K's vec_dot_type into
// the thread's buffer (q_stride updated to the converted rows'), as the unfused product converts them.
const char* tile_queries(const simd::kernel_table& tb, const quant_work& w, const thread_work& tw, const char* q_rows,
                         size_t& q_stride, int64_t nj, int64_t hd_k) {
  if (w.q_type == type::f32) return q_rows;
  const from_float_fn convert = tb.quantize(w.q_type) != nullptr ? tb.quantize(w.q_type) : traits(w.q_type).from_float_ref;
  for (int64_t r = 0; r < nj; ++r) {
    convert(reinterpret_cast<const float*>(q_rows + r * static_cast<int64_t>(q_stride)), tw.q + static_cast<size_t>(r) * w.q_row, hd_k);
  }
  q_stride = w.q_row;
  return tw.q;
}

// out rows (o_stride floats apart) = the tile's softmax rows (scores, n_kv floats apart) times V's rows
// [0, live_end) of a plane: mad_tile over f32 / f16 V. V of another type (bf16, the quantized caches): the rows
// of each block of v_block cells some row weighs converted to f32, and the table's mad_acc_f32 continuing each
// output value's FMA chain over them. Either way each value is one chain over the cells in order from +0,
// skipping weights of 0, so a row's values do not depend on the tile's other rows, on which cells the
// sequence got, or on the blocks.
void weighted_values(const simd::kernel_table& tb, const quant_work& w, const thread_work& tw, const tensor& v, const char* v_plane,
                     int64_t live_end, int64_t nj, const float* scores, int64_t n_kv, float* out, size_t o_stride) {
  const int64_t hd_v = v.ne[0];
  if (w.v_direct) {
    tb.mad(v.type)(live_end, hd_v, nj, v_plane, v.nb[1], scores, static_cast<size_t>(n_kv) * sizeof(float), out, o_stride);
    return;
  }
  const to_float_fn to_f32 = tb.dequantize(v.type) != nullptr ? tb.dequantize(v.type) : traits(v.type).to_float;
  const size_t v_bytes = row_size(v.type, hd_v);
  for (int64_t r = 0; r < nj; ++r) std::fill(out + r * static_cast<int64_t>(o_stride), out + r * static_cast<int64_t>(o_stride) + hd_v, 0.0f);
  for (int64_t c0 = 0; c0 < live_end; c0 += v_block) {
    const int64_t c1 = std::min(live_end, c0 + v_block);
    bool any = false;
    for (int64_t r = 0; r < nj && !any; ++r) {
      const float* wr = scores + r * n_kv;
      for (int64_t c = c0; c < c1 && !any; ++c) any = wr[c] != 0.0f;
    }
    if (!any) continue;
    prefetch_rows(v_plane, v.nb[1], v_bytes, c1, std::min(live_end, c1 + v_block));  // (see prefetch_rows)
    for (int64_t c = c0; c < c1; ++c) to_f32(v_plane + c * static_cast<int64_t>(v.nb[1]), tw.v + (c - c0) * hd_v, hd_v);
    tb.mad_acc_f32(c1 - c0, hd_v, nj, tw.v, static_cast<size_t>(hd_v) * sizeof(float), scores + c0,
                   static_cast<size_t>(n_kv) * sizeof(float), out, o_stride);
  }
}

}  // namespace

static void compute_flash_attn_sparse(const compute_params& params, tensor& node);

bool supports_flash_attn(const tensor& node) {
  const tensor* q = node.src[0];
  const tensor* k = node.src[1];
  const tensor* v = node.src[2];
  const tensor* mask = node.src[3];
  if (q == nullptr || k == nullptr || v == nullptr || node.type != type::f32) return false;
  if (q->type != type::f32 || q->nb[0] != sizeof(float)) return false;
  for (const tensor* kv : {k, v}) {
    if (kv->nb[0] != type_size(kv->type) || kv->ne[0] % block_size(kv->type) != 0) return false;
  }
  // K: f32 / f16, or a type with a dot against rows of a type the query rows convert to; V: f32 / f16, or a
  // type that converts to f32.
  const simd::kernel_table& tb = simd::active_table();
  const type qt = traits(k->type).vec_dot_type;
  if (k->type != type::f32 && k->type != type::f16) {
    if (tb.dot(k->type) == nullptr || (tb.quantize(qt) == nullptr && traits(qt).from_float_ref == nullptr)) return false;
    if (simd::table(isa::scalar).dot(k->type) == nullptr) return false;  // (the reference path's)
  }
  if (v->type != type::f32 && v->type != type::f16) {
    if (tb.dequantize(v->type) == nullptr && traits(v->type).to_float == nullptr) return false;
  }
  if (mask != nullptr && mask->type != type::f32 && mask->type != type::f16) return false;
  return dense_rows(node, sizeof(float));
}

size_t flash_attn_work_size(const tensor& node, int nth) {
  return cache_line + static_cast<size_t>(nth) * thread_bytes(node) + split_bytes(node, nth);
}

// Whether this computation of the node has the split's shared scores, and where they are.
static bool split_decode(const compute_params& params, const tensor& node) {
  return split_bytes(node, params.nth) > 0 && params.wsize >= flash_attn_work_size(node, params.nth);
}
static float* split_scores(const compute_params& params, const tensor& node) {
  return reinterpret_cast<float*>(params.wdata + cache_line + static_cast<size_t>(params.nth) * thread_bytes(node));
}

void compute_flash_attn(const compute_params& params, tensor& node) {
  if (!supports_flash_attn(node)) unsupported(node, "needs f32 q, k and v rows of whole blocks of a type it computes with, f32 / f16 mask");
  const tensor& q = *node.src[0];
  const tensor& k = *node.src[1];
  const tensor& v = *node.src[2];
  const tensor* mask = node.src[3];
  const int64_t n_kv = k.ne[1];
  require_work(params, node, flash_attn_work_size(node, params.nth));
  if (!params.reference && mask != nullptr) {
    compute_flash_attn_sparse(params, node);
    return;
  }
  const float scale = node.param<float>(0);
  const int64_t hd_k = q.ne[0], hd_v = v.ne[0], n_tok = q.ne[1], n_head = q.ne[2];
  const int64_t group = n_head / k.ne[2];

  const simd::kernel_table& tb = params.reference ? simd::table(isa::scalar) : simd::active_table();
  const quant_work qw = quant_work_of(node);
  const thread_work tw = thread_work_of(params, node);
  float* scores = tw.scores;
  const size_t sm = mask != nullptr ? mask->nb[0] : 0;
  const size_t out_stride = node.nb[2] / sizeof(float);  // floats from one query row's output to the next

  auto masked_block = [&](int64_t j0, int64_t nj, int64_t c0, int64_t c1) {
    if (mask == nullptr) return false;
    for (int64_t j = j0; j < j0 + nj; ++j) {
      const char* row = addr(*mask, 0, j, 0, 0);
      for (int64_t c = c0; c < c1; ++c) {
        if (load_float(row + static_cast<size_t>(c) * sm, mask->type) != -INFINITY) return false;
      }
    }
    return true;
  };

  const int64_t tiles = (n_tok + tile_rows - 1) / tile_rows;
  auto run_item = [&](int64_t t) {
    const int64_t h = t / tiles;
    const int64_t j0 = (t % tiles) * tile_rows;
    const int64_t nj = std::min(tile_rows, n_tok - j0);
    const char* k_plane = addr(k, 0, 0, h / group, 0);
    size_t q_stride = q.nb[1];
    const char* q_rows = tile_queries(tb, qw, tw, addr(q, 0, j0, h, 0), q_stride, nj, hd_k);
    int64_t live_end = 0;  // past the last computed block: the weights after it are 0
    for (int64_t c0 = 0; c0 < n_kv; c0 += cell_block) {
      const int64_t c1 = std::min(n_kv, c0 + cell_block);
      if (masked_block(j0, nj, c0, c1)) {
        for (int64_t r = 0; r < nj; ++r) std::fill(scores + r * n_kv + c0, scores + r * n_kv + c1, 0.0f);
        continue;
      }
      live_end = c1;
      block_scores(tb, k, q_stride, hd_k, c0, c1, nj, n_kv, k_plane, q_rows, scores);
    }
    for (int64_t r = 0; r < nj; ++r) {
      const char* m = mask != nullptr ? addr(*mask, 0, j0 + r, 0, 0) : nullptr;
      softmax_row(scores + r * n_kv, m, sm, mask != nullptr ? mask->type : type::f32, n_kv, scale, params.reference);
    }
    float* out = reinterpret_cast<float*>(addr(node, 0, h, j0, 0));
    if (live_end == 0) {  // every cell masked for every row: softmax gave zeros, so does the product
      for (int64_t r = 0; r < nj; ++r) std::fill(out + r * out_stride, out + r * out_stride + hd_v, 0.0f);
      return;
    }
    weighted_values(tb, qw, tw, v, addr(v, 0, 0, h / group, 0), live_end, nj, scores, n_kv, out, out_stride);
  };

  for_each_claimed(params, n_head * tiles, run_item);
}

// Whether cell block b (cells [16 b, 16 b + 16) below n_kv) is masked (-inf) for mask row j.
static bool block_masked(const tensor& mask, int64_t j, int64_t b, int64_t n_kv) {
  const char* row = addr(mask, 0, j, 0, 0);
  const int64_t c1 = std::min(n_kv, (b + 1) * cell_block);
  for (int64_t c = b * cell_block; c < c1; ++c) {
    if (load_float(row + static_cast<size_t>(c) * mask.nb[0], mask.type) != -INFINITY) return false;
  }
  return true;
}

// y[i] = y[i] * scale + mask[i] for i in [c0, c1), returning the largest (the same maximum as a scalar
// loop's `if (x > mx)`). A dense f32 mask (the graphs') through the table's vector kernel.
static float scale_mask_max(const simd::kernel_table& tb, float* y, const char* m, size_t sm, type mt, float scale,
                            int64_t c0, int64_t c1) {
  if (mt == type::f32 && sm == sizeof(float)) {
    return tb.scale_mask_max(c1 - c0, y + c0, reinterpret_cast<const float*>(m) + c0, scale);
  }
  float mx = -INFINITY;
  for (int64_t i = c0; i < c1; ++i) {
    const float x = y[i] * scale + load_float(m + static_cast<size_t>(i) * sm, mt);
    y[i] = x;
    if (x > mx) mx = x;
  }
  return mx;
}

// The sparse path (see the top of the file): tiles of rows that see nearly the same blocks, each with the
// blocks any of its rows sees.
static void compute_flash_attn_sparse(const compute_params& params, tensor& node) {
  const tensor& q = *node.src[0];
  const tensor& k = *node.src[1];
  const tensor& v = *node.src[2];
  const tensor& mask = *node.src[3];
  const int64_t n_kv = k.ne[1];
  const float scale = node.param<float>(0);
  const int64_t hd_k = q.ne[0], hd_v = v.ne[0], n_tok = q.ne[1], n_head = q.ne[2];
  const int64_t group = n_head / k.ne[2];
  const int64_t n_blocks = (n_kv + cell_block - 1) / cell_block;
  const int64_t n_words = (n_blocks + 63) / 64;

  // Each row's live blocks as a bitmap; every thread computes the same plan.
  std::vector<uint64_t> live(static_cast<size_t>(n_tok * n_words), 0);
  for (int64_t j = 0; j < n_tok; ++j) {
    uint64_t* w = live.data() + j * n_words;
    for (int64_t b = 0; b < n_blocks; ++b) {
      if (!block_masked(mask, j, b, n_kv)) w[b / 64] |= uint64_t{1} << (b % 64);
    }
  }
  // Tiles: consecutive rows whose blocks differ from the tile's first row's in at most two (a prompt's rows
  // gain one at a time).
  struct tile {
    int64_t j0, nj;
    std::vector<std::pair<int64_t, int64_t>> runs;  // [begin, end) cells, in order
  };
  std::vector<tile> tiles;
  for (int64_t j = 0; j < n_tok;) {
    const uint64_t* first = live.data() + j * n_words;
    int64_t nj = 1;
    while (nj < tile_rows && j + nj < n_tok) {
      const uint64_t* w = live.data() + (j + nj) * n_words;
      int64_t differ = 0;
      for (int64_t i = 0; i < n_words; ++i) differ += __builtin_popcountll(first[i] ^ w[i]);
      if (differ > 2) break;
      ++nj;
    }
    tile t{j, nj, {}};
    for (int64_t b = 0; b < n_blocks; ++b) {
      bool any = false;
      for (int64_t r = 0; r < nj && !any; ++r) any = (live[static_cast<size_t>((j + r) * n_words + b / 64)] >> (b % 64)) & 1;
      if (!any) continue;
      const int64_t c0 = b * cell_block, c1 = std::min(n_kv, c0 + cell_block);
      if (!t.runs.empty() && t.runs.back().second == c0) {
        t.runs.back().second = c1;
      } else {
        t.runs.push_back({c0, c1});
      }
    }
    tiles.push_back(std::move(t));
    j += nj;
  }

  const simd::kernel_table& tb = simd::active_table();
  const quant_work qw = quant_work_of(node);
  const thread_work tw = thread_work_of(params, node);
  const size_t sm = mask.nb[0];
  const size_t out_stride = node.nb[2] / sizeof(float);
  const auto n_tiles = static_cast<int64_t>(tiles.size());

  // Where every tile is one query row (decode: each sequence's next token sees its own cells), an item is
  // instead up to tile_rows query heads of one KV head (grouped-query attention) for that row: the heads read
  // the KV head's K and V once between them instead of once each, and each row's values are the same.
  const bool by_group = group > 1 && std::all_of(tiles.begin(), tiles.end(), [](const tile& t) { return t.nj == 1; });
  const int64_t chunks = (group + tile_rows - 1) / tile_rows;  // items per KV head and tile
  const size_t head_stride = node.nb[1] / sizeof(float);       // floats from one head's output to the next

  // An item's query rows: the first head h, nj rows (heads of one token, or tokens of one head), their
  // strides in q and dst, and its tile.
  struct item_rows {
    int64_t h = 0, nj = 0;
    const tile* t = nullptr;
    size_t q_stride = 0, o_stride = 0;
    bool one_row = false;  // the rows are heads of one token: its mask row for each
  };
  auto rows_of = [&](int64_t item) {
    item_rows ir;
    ir.q_stride = q.nb[1];
    ir.o_stride = out_stride;
    if (by_group) {
      const int64_t per_head = n_tiles * chunks;
      const int64_t g = item / per_head, c = (item % per_head) % chunks;
      ir.t = &tiles[static_cast<size_t>((item % per_head) / chunks)];
      ir.h = g * group + c * tile_rows;
      ir.nj = std::min(tile_rows, group - c * tile_rows);
      ir.q_stride = q.nb[2];
      ir.o_stride = head_stride;
      ir.one_row = true;
    } else {
      ir.h = item / n_tiles;
      ir.t = &tiles[static_cast<size_t>(item % n_tiles)];
      ir.nj = ir.t->nj;
    }
    return ir;
  };
  const int64_t n_items = by_group ? (n_head / group) * n_tiles * chunks : n_head * n_tiles;

  // The softmax of one row of scores y (mask row m) over the runs, as softmax_row and softmax_normalize
  // compute it over the whole row: scale and mask, the max, the exponentials (elementwise), the nonzero ones
  // summed in order into 16 lanes, the scaling.
  auto softmax_runs = [&](float* y, const char* m, const std::vector<std::pair<int64_t, int64_t>>& runs) {
    float mx = -INFINITY;
    for (const auto& [c0, c1] : runs) mx = std::max(mx, scale_mask_max(tb, y, m, sm, mask.type, scale, c0, c1));
    if (mx == -INFINITY) {
      for (const auto& [c0, c1] : runs) std::fill(y + c0, y + c1, 0.0f);
      return;
    }
    nonzero_lane_sum lanes;
    for (const auto& [c0, c1] : runs) tb.exp_lane_sum(c1 - c0, y + c0, mx, lanes.lanes, &lanes.lane);
    const float inv = static_cast<float>(1.0 / static_cast<double>(lanes.total()));
    for (const auto& [c0, c1] : runs) tb.scale_row(c1 - c0, y + c0, inv);
  };

  // A decode step with fewer items than twice the threads (a model with few KV heads) is split three ways
  // instead, so that every thread works: the scores by ranges of cells, the softmax by row, the weighted sums
  // by ranges of V's values, with a barrier between, the scores in a shared matrix (see flash_attn_work_size).
  // Every element is computed by the same operations as an item computes it (each score one dot product,
  // each output value one FMA chain over the cells in order), so the values are the same bits.
  // (split_decode: one query row, so one tile, and fewer items than twice the threads.)
  if (split_decode(params, node) && qw.v_direct && !tiles[0].runs.empty()) {
    const tile& t = tiles[0];
    float* shared = split_scores(params, node);
    const int64_t live_end = t.runs.back().second;
    const int64_t cell_units = (live_end + split_cells - 1) / split_cells;
    // 1. Scores: item x range of cells; the cells no run covers are 0 (the weighted sums read [0, live_end)).
    for_each_claimed(params, n_items * cell_units, [&](int64_t u) {
      const item_rows ir = rows_of(u / cell_units);
      const int64_t a = (u % cell_units) * split_cells, b = std::min(live_end, a + split_cells);
      float* rows = shared + ir.h * n_kv;
      size_t q_stride = ir.q_stride;
      const char* q_rows = tile_queries(tb, qw, tw, addr(q, 0, t.j0, ir.h, 0), q_stride, ir.nj, hd_k);
      const char* k_plane = addr(k, 0, 0, ir.h / group, 0);
      int64_t at = a;
      for (const auto& [c0, c1] : t.runs) {
        const int64_t r0 = std::max(a, c0), r1 = std::min(b, c1);
        if (r0 >= r1) continue;
        for (int64_t r = 0; r < ir.nj; ++r) std::fill(rows + r * n_kv + at, rows + r * n_kv + r0, 0.0f);
        block_scores(tb, k, q_stride, hd_k, r0, r1, ir.nj, n_kv, k_plane, q_rows, rows);
        at = r1;
      }
      for (int64_t r = 0; r < ir.nj; ++r) std::fill(rows + r * n_kv + at, rows + r * n_kv + b, 0.0f);
    });
    params.sync();
    // 2. The softmax of each head's row.
    for_each_claimed(params, n_head, [&](int64_t h) {
      softmax_runs(shared + h * n_kv, addr(mask, 0, t.j0, 0, 0), t.runs);
    });
    params.sync();
    // 3. Weighted sums: item x range of V's values.
    const int64_t v_units = (hd_v + split_values - 1) / split_values;
    for_each_claimed(params, n_items * v_units, [&](int64_t u) {
      const item_rows ir = rows_of(u / v_units);
      const int64_t d0 = (u % v_units) * split_values, w = std::min(split_values, hd_v - d0);
      float* out = reinterpret_cast<float*>(addr(node, d0, ir.h, t.j0, 0));
      const char* v_plane = addr(v, d0, 0, ir.h / group, 0);
      tb.mad(v.type)(live_end, w, ir.nj, v_plane, v.nb[1], shared + ir.h * n_kv, static_cast<size_t>(n_kv) * sizeof(float), out,
                     ir.o_stride);
    });
    return;
  }

  // The thread's scores: zero outside the blocks an item writes, which it clears again when done (the
  // weights of the cells no row sees are exact zeros for mad, without writing them per item).
  float* scores = tw.scores;
  std::fill(scores, scores + tile_rows * n_kv, 0.0f);

  auto run_item = [&](int64_t item) {
    const item_rows ir = rows_of(item);
    const int64_t h = ir.h, nj = ir.nj;
    size_t q_stride = ir.q_stride;
    const size_t o_stride = ir.o_stride;
    const tile& t = *ir.t;
    const int64_t j0 = t.j0;
    float* out = reinterpret_cast<float*>(addr(node, 0, h, j0, 0));
    if (t.runs.empty()) {  // every cell masked for every row: softmax gives zeros, so does the product
      for (int64_t r = 0; r < nj; ++r) std::fill(out + r * o_stride, out + r * o_stride + hd_v, 0.0f);
      return;
    }
    const char* k_plane = addr(k, 0, 0, h / group, 0);
    const char* q_rows = tile_queries(tb, qw, tw, addr(q, 0, j0, h, 0), q_stride, nj, hd_k);
    const char* v_plane = addr(v, 0, 0, h / group, 0);
    for (const auto& [c0, c1] : t.runs) {
      block_scores(tb, k, q_stride, hd_k, c0, c1, nj, n_kv, k_plane, q_rows, scores);
    }
    for (int64_t r = 0; r < nj; ++r) softmax_runs(scores + r * n_kv, addr(mask, 0, j0 + (ir.one_row ? 0 : r), 0, 0), t.runs);
    const int64_t live_end = t.runs.back().second;
    weighted_values(tb, qw, tw, v, v_plane, live_end, nj, scores, n_kv, out, o_stride);
    for (int64_t r = 0; r < nj; ++r) {
      for (const auto& [c0, c1] : t.runs) std::fill(scores + r * n_kv + c0, scores + r * n_kv + c1, 0.0f);
    }
  };

  for_each_claimed(params, n_items, run_item);
}

}  // namespace troupe::cpu::detail
