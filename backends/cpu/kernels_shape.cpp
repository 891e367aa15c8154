// Shape ops and reductions over dimension 0: concat, pad, sum_rows, mean, argmax.
//
// concat and pad move elements of any plain (non-block) type, f32 in practice; the reductions read
// f32 / f16 / bf16 with any strides. Threads split the rows of the destination (of the source for argmax).
#include <cmath>
#include <cstring>

#include "backends/cpu/kernels_internal.h"

namespace troupe::cpu::detail {

namespace {

bool plain_type(type t) {
  const type_traits& tr = traits(t);
  return tr.known && tr.block_size == 1 && tr.type_size > 0;
}

}  // namespace

// ---- concat: dst = a joined with b along dim ----

bool supports_concat(const tensor& node) {
  const tensor* a = node.src[0];
  const tensor* b = node.src[1];
  if (a == nullptr || b == nullptr) return false;
  const int32_t dim = node.param<int32_t>(0);
  return a->type == node.type && b->type == node.type && plain_type(node.type) && dim >= 0 && dim < max_dims;
}

void compute_concat(const compute_params& params, tensor& node) {
  if (!supports_concat(node)) unsupported(node, "needs a, b and dst of one plain type and dim in [0, 4)");
  const tensor& a = *node.src[0];
  const tensor& b = *node.src[1];
  const int dim = node.param<int32_t>(0);
  const size_t es = type_size(node.type);
  const int64_t ne0 = node.ne[0];
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    char* pd = row_addr(node, ri);
    if (dim == 0) {  // [a row | b row]
      const int64_t na = a.ne[0];
      copy_units(row_addr(a, ri), a.nb[0], pd, node.nb[0], es, na);
      copy_units(row_addr(b, ri), b.nb[0], pd + na * static_cast<int64_t>(node.nb[0]), node.nb[0], es, ne0 - na);
      continue;
    }
    // The whole row comes from a when its index along dim is inside a, else from b (index shifted).
    int64_t i[4] = {0, ri.i1, ri.i2, ri.i3};
    const tensor* s = &a;
    if (i[dim] >= a.ne[static_cast<size_t>(dim)]) {
      i[dim] -= a.ne[static_cast<size_t>(dim)];
      s = &b;
    }
    copy_units(addr(*s, 0, i[1], i[2], i[3]), s->nb[0], pd, node.nb[0], es, ne0);
  }
}

// ---- pad: a's elements, then zeros up to dst's extent in every dimension ----

bool supports_pad(const tensor& node) {
  const tensor* a = node.src[0];
  return a != nullptr && a->type == node.type && plain_type(node.type);
}

void compute_pad(const compute_params& params, tensor& node) {
  if (!supports_pad(node)) unsupported(node, "needs a and dst of one plain type");
  const tensor& a = *node.src[0];
  const size_t es = type_size(node.type);
  const int64_t ne0 = node.ne[0];
  const int64_t na = a.ne[0];
  const int64_t sd = static_cast<int64_t>(node.nb[0]);
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    char* pd = row_addr(node, ri);
    int64_t i0 = 0;
    if (ri.i1 < a.ne[1] && ri.i2 < a.ne[2] && ri.i3 < a.ne[3]) {
      copy_units(row_addr(a, ri), a.nb[0], pd, node.nb[0], es, na);
      i0 = na;
    }
    // All-zero bytes are zero in every plain type.
    if (sd == static_cast<int64_t>(es)) {
      std::memset(pd + i0 * sd, 0, static_cast<size_t>(ne0 - i0) * es);
    } else {
      for (; i0 < ne0; ++i0) std::memset(pd + i0 * sd, 0, es);
    }
  }
}

// ---- sum_rows / mean: dst[0, i1, i2, i3] = sum (or mean) of row (i1, i2, i3), accumulated in double ----

bool supports_reduce(const tensor& node) {
  const tensor* a = node.src[0];
  return a != nullptr && is_float_type(a->type) && node.type == type::f32;
}

void compute_reduce(const compute_params& params, tensor& node) {
  if (!supports_reduce(node)) unsupported(node, "needs f32/f16/bf16 a and f32 dst");
  const tensor& a = *node.src[0];
  const int64_t ne0 = a.ne[0];
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  const bool mean = node.op == op::mean;
  const item_range rows = split_range(nrows(a), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(a, r);
    const char* x = row_addr(a, ri);
    double sum = 0.0;
    for (int64_t i = 0; i < ne0; ++i) sum += load_float(x + i * sa, a.type);
    if (mean) sum /= static_cast<double>(ne0);
    store_float(row_addr(node, ri), type::f32, static_cast<float>(sum));
  }
}

// ---- argmax: dst[r] = first index of the maximum of row r of a (NaN never wins) ----

bool supports_argmax(const tensor& node) {
  const tensor* a = node.src[0];
  return a != nullptr && is_float_type(a->type) && node.type == type::i32 && nelements(node) == nrows(*a);
}

void compute_argmax(const compute_params& params, tensor& node) {
  if (!supports_argmax(node)) unsupported(node, "needs f32/f16/bf16 a and one i32 per row of a");
  const tensor& a = *node.src[0];
  const int64_t ne0 = a.ne[0];
  const int64_t sa = static_cast<int64_t>(a.nb[0]);
  // dst holds one value per row of a, row r at dst's flat element r (walked through dst's own strides).
  const item_range rows = split_range(nrows(a), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const char* x = row_addr(a, unravel_row(a, r));
    int32_t best = 0;
    float mx = -INFINITY;
    for (int64_t i = 0; i < ne0; ++i) {
      const float v = load_float(x + i * sa, a.type);
      if (v > mx) {  // strict: ties keep the first index
        mx = v;
        best = static_cast<int32_t>(i);
      }
    }
    int64_t f = r;
    const int64_t d0 = f % node.ne[0];
    f /= node.ne[0];
    const int64_t d1 = f % node.ne[1];
    f /= node.ne[1];
    const int64_t d2 = f % node.ne[2];
    const int64_t d3 = f / node.ne[2];
    std::memcpy(addr(node, d0, d1, d2, d3), &best, sizeof best);
  }
}

}  // namespace troupe::cpu::detail
