// flash_attn: attention of a block of query rows at a time, without the score matrix in memory.
//
// A work item is one head and a tile of up to tile_rows query rows (dynamically claimed, so a busy core
// takes fewer). For the tile it computes the scores over every cache cell into the thread's work rows
// (cells whose mask is -inf for all the tile's rows, 16 at a time, are not computed: the masked half of a
// prompt's causal attention and other sequences' cells), the softmax of each row, and the rows' sums of
// V's rows weighted by the softmax (mad_tile, which skips weights of 0), straight into dst. Each step is the
// computation the unfused graph does (mul_mat_masked, soft_max, the column-major mul_mat, cont) with the same
// functions and order, so the two give bit-identical results; only the memory traffic differs (a tile's
// scores stay in L1 / L2 instead of an [n_kv, n_tokens, n_head] matrix).
#include <atomic>
#include <cmath>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd/simd.h"
#include "runtime/ops.h"

namespace troupe::cpu::detail {
namespace {

constexpr int64_t tile_rows = 6;    // query rows per item: mad_tile's register tile width
constexpr int64_t cell_block = 16;  // cells whose mask is checked (and skipped) together

size_t score_bytes(int64_t n_kv) { return align_up(static_cast<size_t>(tile_rows * n_kv) * sizeof(float)); }

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

}  // namespace

bool supports_flash_attn(const tensor& node) {
  const tensor* q = node.src[0];
  const tensor* k = node.src[1];
  const tensor* v = node.src[2];
  const tensor* mask = node.src[3];
  if (q == nullptr || k == nullptr || v == nullptr || node.type != type::f32) return false;
  if (q->type != type::f32 || q->nb[0] != sizeof(float)) return false;
  for (const tensor* kv : {k, v}) {
    if ((kv->type != type::f32 && kv->type != type::f16) || kv->nb[0] != type_size(kv->type)) return false;
  }
  if (mask != nullptr && mask->type != type::f32 && mask->type != type::f16) return false;
  return dense_rows(node, sizeof(float));
}

size_t flash_attn_work_size(const tensor& node, int nth) {
  return cache_line + static_cast<size_t>(nth) * score_bytes(node.src[1]->ne[1]);
}

void compute_flash_attn(const compute_params& params, tensor& node) {
  if (!supports_flash_attn(node)) unsupported(node, "needs f32 q, f32 / f16 k and v rows, f32 / f16 mask");
  const tensor& q = *node.src[0];
  const tensor& k = *node.src[1];
  const tensor& v = *node.src[2];
  const tensor* mask = node.src[3];
  const int64_t n_kv = k.ne[1];
  require_work(params, node, flash_attn_work_size(node, params.nth));
  const float scale = node.param<float>(0);
  const int64_t hd_k = q.ne[0], hd_v = v.ne[0], n_tok = q.ne[1], n_head = q.ne[2];
  const int64_t group = n_head / k.ne[2];

  const simd::kernel_table& tb = params.reference ? simd::table(isa::scalar) : simd::active_table();
  const simd::vec_dot_tile_fn dot_tile = tb.dot_tile(k.type);
  const vec_dot_fn dot = tb.dot(k.type);
  const simd::mad_tile_fn mad = tb.mad(v.type);
  float* scores =
      reinterpret_cast<float*>(params.wdata + cache_line + static_cast<size_t>(params.ith) * score_bytes(n_kv));
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
    const char* q_rows = addr(q, 0, j0, h, 0);
    int64_t live_end = 0;  // past the last computed block: the weights after it are 0
    for (int64_t c0 = 0; c0 < n_kv; c0 += cell_block) {
      const int64_t c1 = std::min(n_kv, c0 + cell_block);
      if (masked_block(j0, nj, c0, c1)) {
        for (int64_t r = 0; r < nj; ++r) std::fill(scores + r * n_kv + c0, scores + r * n_kv + c1, 0.0f);
        continue;
      }
      live_end = c1;
      const char* k_rows = k_plane + c0 * static_cast<int64_t>(k.nb[1]);
      if (dot_tile != nullptr) {
        dot_tile(hd_k, c1 - c0, nj, scores + c0, static_cast<size_t>(n_kv), k_rows, k.nb[1], q_rows, q.nb[1]);
      } else {
        for (int64_t r = 0; r < nj; ++r) {
          for (int64_t c = c0; c < c1; ++c) {
            dot(hd_k, scores + r * n_kv + c, k_rows + (c - c0) * static_cast<int64_t>(k.nb[1]),
                q_rows + r * static_cast<int64_t>(q.nb[1]));
          }
        }
      }
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
    mad(live_end, hd_v, nj, addr(v, 0, 0, h / group, 0), v.nb[1], scores, static_cast<size_t>(n_kv) * sizeof(float),
        out, out_stride);
  };

  for_each_claimed(params, n_head * tiles, run_item);
}

}  // namespace troupe::cpu::detail
