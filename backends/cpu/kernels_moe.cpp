// Mixture-of-experts kernels: mul_mat_id (each token's rows times the experts its router chose) and top_k
// (the router's choice).
//
// mul_mat_id groups the (choice, token) pairs by expert, so that each expert's weights are read once per
// batch however many tokens chose it, and an expert no token chose is not read at all:
//   1. every thread converts its share of b's rows to the experts' vec_dot_type (as mul_mat does), and
//      thread 0 meanwhile builds the routing table in the work buffer: per expert, the pairs that chose it
//      (in token order) and the chunks its work is cut into; pairs whose id is out of range get zero rows;
//   2. threads take chunks (an expert, a range of its rows, a range of its pairs) from a shared counter
//      (every chunk in a static split in reference mode) and compute each element with one dot product of
//      a row of the expert and the pair's converted row of b: the same dot products as mul_mat's, so an
//      element does not depend on the thread count or on which other tokens shared the batch.
// Chunks of a few rows of an expert against up to 32 of its pairs keep those rows in cache while they are
// reused; the SIMD table's row kernels compute the rows of a chunk for one pair per call.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd/simd.h"

namespace troupe::cpu::detail {

namespace {

constexpr int64_t moe_cols_per = 32;            // pairs per chunk
constexpr int64_t moe_min_rows = 16;            // expert rows per chunk, at least
constexpr int64_t moe_chunks_per_thread = 8;    // enough chunks to even out uneven threads

struct moe_plan {
  int64_t n_expert = 0, n_used = 0, n_tokens = 0, n_b = 0;
  bool convert_b = false;
  size_t b_row_bytes = 0;  // one converted row of b
  // Work buffer layout, byte offsets: [counter][converted b][scratch per thread][counts][offsets][chunk
  // starts][rows per chunk][pairs]
  size_t b_off = 0, scratch_off = 0, scratch = 0, counts_off = 0, offsets_off = 0, chunks_off = 0, rows_off = 0,
         pairs_off = 0, total = 0;
};

moe_plan plan_moe(const tensor& node, int nth) {
  const tensor& as = *node.src[0];
  const tensor& b = *node.src[1];
  const tensor& ids = *node.src[2];
  moe_plan p;
  p.n_expert = as.ne[2];
  p.n_used = ids.ne[0];
  p.n_tokens = ids.ne[1];
  p.n_b = b.ne[1];
  const type vdt = traits(as.type).vec_dot_type;
  p.convert_b = !(vdt == type::f32 && dense_rows(b, 4));
  size_t off = cache_line;  // for_each_claimed's counter
  p.b_off = off;
  if (p.convert_b) {
    p.b_row_bytes = row_size(vdt, as.ne[0]);
    off += align_up(p.b_row_bytes * static_cast<size_t>(nrows(b)));
    if (!is_float_type(vdt) && !dense_rows(b, 4)) p.scratch = align_up(static_cast<size_t>(as.ne[0]) * sizeof(float));
  }
  p.scratch_off = off;
  off += p.scratch * static_cast<size_t>(nth);
  const size_t experts = static_cast<size_t>(p.n_expert);
  p.counts_off = off;
  off += align_up(experts * sizeof(int64_t));
  p.offsets_off = off;
  off += align_up((experts + 1) * sizeof(int64_t));
  p.chunks_off = off;
  off += align_up((experts + 1) * sizeof(int64_t));
  p.rows_off = off;
  off += align_up(sizeof(int64_t));
  p.pairs_off = off;
  off += align_up(static_cast<size_t>(p.n_used * p.n_tokens) * sizeof(int32_t));
  p.total = off;
  return p;
}

template <class T>
T* at(const compute_params& params, size_t off) {
  return reinterpret_cast<T*>(params.wdata + off);
}

// Thread 0: the pairs per expert (pair = s + t * n_used, in token order), each expert's first chunk, and
// the rows per chunk; zero rows of dst for ids out of range.
void build_routing(const compute_params& params, tensor& node, const moe_plan& p) {
  const tensor& ids = *node.src[2];
  const int64_t m = node.ne[0];
  int64_t* counts = at<int64_t>(params, p.counts_off);
  int64_t* offsets = at<int64_t>(params, p.offsets_off);
  int64_t* chunks = at<int64_t>(params, p.chunks_off);
  int32_t* pairs = at<int32_t>(params, p.pairs_off);
  std::fill(counts, counts + p.n_expert, int64_t{0});
  auto id_of = [&](int64_t s, int64_t t) {
    int32_t e;
    std::memcpy(&e, addr(ids, s, t, 0, 0), sizeof e);
    return e;
  };
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    for (int64_t s = 0; s < p.n_used; ++s) {
      const int32_t e = id_of(s, t);
      if (e >= 0 && e < p.n_expert) {
        ++counts[e];
      } else {
        std::memset(addr(node, 0, s, t, 0), 0, static_cast<size_t>(m) * sizeof(float));
      }
    }
  }
  offsets[0] = 0;
  int64_t active = 0;
  for (int64_t e = 0; e < p.n_expert; ++e) {
    offsets[e + 1] = offsets[e] + counts[e];
    active += counts[e] > 0 ? 1 : 0;
  }
  std::fill(counts, counts + p.n_expert, int64_t{0});  // reused as fill positions
  for (int64_t t = 0; t < p.n_tokens; ++t) {
    for (int64_t s = 0; s < p.n_used; ++s) {
      const int32_t e = id_of(s, t);
      if (e < 0 || e >= p.n_expert) continue;
      pairs[offsets[e] + counts[e]++] = static_cast<int32_t>(s + t * p.n_used);
    }
  }
  // Rows per chunk: every thread gets several chunks even when only a few experts are active (decoding one
  // token: n_used experts, one pair each).
  const int64_t want = std::max<int64_t>(1, params.nth * moe_chunks_per_thread / std::max<int64_t>(1, active));
  const int64_t rows_per = std::max(moe_min_rows, (m + want - 1) / want);
  *at<int64_t>(params, p.rows_off) = rows_per;
  const int64_t row_chunks = (m + rows_per - 1) / rows_per;
  chunks[0] = 0;
  for (int64_t e = 0; e < p.n_expert; ++e) {
    const int64_t col_chunks = (counts[e] + moe_cols_per - 1) / moe_cols_per;
    chunks[e + 1] = chunks[e] + row_chunks * col_chunks;
  }
}

}  // namespace

bool supports_mul_mat_id(const tensor& node) {
  const tensor* as = node.src[0];
  const tensor* b = node.src[1];
  const tensor* ids = node.src[2];
  if (as == nullptr || b == nullptr || ids == nullptr) return false;
  if (b->type != type::f32 || ids->type != type::i32 || node.type != type::f32 || !dense_rows(node, 4)) return false;
  const type_traits& ta = traits(as->type);
  if (!ta.supported || ta.vec_dot == nullptr || as->nb[0] != ta.type_size) return false;
  const type_traits& tv = traits(ta.vec_dot_type);
  if (!is_float_type(ta.vec_dot_type) && tv.from_float_ref == nullptr) return false;
  if (as->ne[0] % tv.block_size != 0 || as->ne[0] != b->ne[0]) return false;
  return as->ne[3] == 1 && b->ne[3] == 1 && ids->ne[2] == 1 && ids->ne[3] == 1 && ids->ne[1] == b->ne[2] &&
         (b->ne[1] == 1 || b->ne[1] == ids->ne[0]) && node.ne[0] == as->ne[1] && node.ne[1] == ids->ne[0] &&
         node.ne[2] == ids->ne[1];
}

size_t mul_mat_id_work_size(const tensor& node, int nth) { return plan_moe(node, nth).total; }

void compute_mul_mat_id(const compute_params& params, tensor& node) {
  if (!supports_mul_mat_id(node)) {
    unsupported(node, "needs experts [k, m, n_expert, 1] of a multipliable type with dense rows, f32 b "
                      "[k, 1 or n_used, n_tokens, 1], i32 ids [n_used, n_tokens] and f32 dst with dense rows");
  }
  const tensor& as = *node.src[0];
  const tensor& b = *node.src[1];
  const moe_plan p = plan_moe(node, params.nth);
  require_work(params, node, p.total);
  const type_traits& ta = traits(as.type);
  const type vdt = ta.vec_dot_type;
  const simd::kernel_table& kt = params.reference ? simd::table(isa::scalar) : simd::active_table();
  const from_float_fn quantize = params.reference ? traits(vdt).from_float_ref : kt.quantize(vdt);
  const vec_dot_fn dot = params.reference ? ta.vec_dot : kt.dot(as.type);
  const simd::vec_dot_rows_fn dot_rows = params.reference ? nullptr : kt.dot_rows(as.type);
  const int64_t k = as.ne[0];

  // 1. b's rows converted (threads split them); the routing table (thread 0).
  uint8_t* b_conv = p.convert_b ? params.wdata + p.b_off : nullptr;
  if (p.convert_b) {
    const bool dense = dense_rows(b, 4);
    float* scratch = p.scratch > 0 ? at<float>(params, p.scratch_off + p.scratch * static_cast<size_t>(params.ith)) : nullptr;
    const item_range rows = split_range(nrows(b), params.ith, params.nth);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      const char* src = row_addr(b, unravel_row(b, r));
      char* dst = reinterpret_cast<char*>(b_conv + static_cast<size_t>(r) * p.b_row_bytes);
      if (dense && vdt != type::f32) {
        quantize(reinterpret_cast<const float*>(src), dst, k);
      } else if (is_float_type(vdt)) {
        convert_floats(src, b.nb[0], type::f32, dst, type_size(vdt), vdt, k);
      } else {
        gather_f32(src, b.nb[0], scratch, k);
        quantize(scratch, dst, k);
      }
    }
  }
  if (params.ith == 0) build_routing(params, node, p);
  params.sync();

  const int64_t* offsets = at<int64_t>(params, p.offsets_off);
  const int64_t* chunks = at<int64_t>(params, p.chunks_off);
  const int32_t* pairs = at<int32_t>(params, p.pairs_off);
  const int64_t rows_per = *at<int64_t>(params, p.rows_off);
  const int64_t m = node.ne[0];
  const int64_t row_chunks = (m + rows_per - 1) / rows_per;
  auto b_row = [&](int64_t s, int64_t t) -> const void* {
    const int64_t r = t * p.n_b + (p.n_b == 1 ? 0 : s);
    if (b_conv != nullptr) return b_conv + static_cast<size_t>(r) * p.b_row_bytes;
    return addr(b, 0, r % p.n_b, r / p.n_b, 0);
  };
  auto run_chunk = [&](int64_t c) {
    const int64_t e = std::upper_bound(chunks, chunks + p.n_expert + 1, c) - chunks - 1;
    const int64_t local = c - chunks[e];
    const int64_t i0 = (local % row_chunks) * rows_per, i1 = std::min(m, i0 + rows_per);
    const int64_t j0 = offsets[e] + (local / row_chunks) * moe_cols_per;
    const int64_t j1 = std::min(offsets[e + 1], j0 + moe_cols_per);
    const char* a_rows = addr(as, 0, i0, e, 0);
    for (int64_t j = j0; j < j1; ++j) {
      const int64_t s = pairs[j] % p.n_used, t = pairs[j] / p.n_used;
      const void* y = b_row(s, t);
      float* out = reinterpret_cast<float*>(addr(node, i0, s, t, 0));
      if (dot_rows != nullptr) {
        dot_rows(k, i1 - i0, out, a_rows, as.nb[1], y);
        continue;
      }
      for (int64_t i = i0; i < i1; ++i) dot(k, out + (i - i0), a_rows + (i - i0) * static_cast<int64_t>(as.nb[1]), y);
    }
  };
  const int64_t n_chunks = chunks[p.n_expert];
  if (params.reference) {
    const item_range items = split_range(n_chunks, params.ith, params.nth);
    for (int64_t c = items.begin; c < items.end; ++c) run_chunk(c);
    return;
  }
  for_each_claimed(params, n_chunks, run_chunk);
}

// ---- top_k: the indices of each row's k largest values, largest first; ties: the lower index first ----

bool supports_top_k(const tensor& node) {
  const tensor* a = node.src[0];
  return a != nullptr && a->type == type::f32 && node.type == type::i32 && node.ne[0] >= 1 && node.ne[0] <= a->ne[0] &&
         node.ne[1] == a->ne[1] && node.ne[2] == a->ne[2] && node.ne[3] == a->ne[3];
}

size_t top_k_work_size(const tensor& node, int nth) {
  if (node.src[0] == nullptr) return 0;
  return align_up(static_cast<size_t>(node.src[0]->ne[0]) * sizeof(int32_t)) * static_cast<size_t>(nth);
}

void compute_top_k(const compute_params& params, tensor& node) {
  if (!supports_top_k(node)) unsupported(node, "needs f32 a and an i32 dst [k, a.ne[1..3]] with k <= a.ne[0]");
  const tensor& a = *node.src[0];
  const int64_t n = a.ne[0], k = node.ne[0];
  const size_t per_thread = align_up(static_cast<size_t>(n) * sizeof(int32_t));
  require_work(params, node, per_thread * static_cast<size_t>(params.nth));
  int32_t* order = at<int32_t>(params, per_thread * static_cast<size_t>(params.ith));
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  const int64_t sd = static_cast<int64_t>(node.nb[0]);
  const item_range rows = split_range(nrows(a), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(a, r);
    const char* x = row_addr(a, ri);
    auto value = [&](int32_t i) {
      const float v = load_float(x + i * sa, type::f32);
      return std::isnan(v) ? -INFINITY : v;  // NaN never wins over a number
    };
    for (int32_t i = 0; i < static_cast<int32_t>(n); ++i) order[i] = i;
    std::partial_sort(order, order + k, order + n, [&](int32_t l, int32_t rr) {
      const float vl = value(l), vr = value(rr);
      return vl > vr || (vl == vr && l < rr);
    });
    char* y = row_addr(node, ri);
    for (int64_t i = 0; i < k; ++i) std::memcpy(y + i * sd, &order[i], sizeof(int32_t));
  }
}

}  // namespace troupe::cpu::detail
