// Copies and conversions: cpy, cont, get_rows, set_rows.
//
// cpy / cont copy the source's elements in row-major order of the source's dimensions into the
// destination's elements in row-major order of its own dimensions (same count, any shapes and strides):
//   same type         any known type; blocks of quantized types are copied as units
//   float -> float    f32 / f16 / bf16 in any combination
//   float -> quant    into any type with from_float_ref whose destination rows have dense blocks
//   quant -> float    from any type with to_float whose source rows have dense blocks
#include <cstring>
#include <string>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd/simd.h"

namespace troupe::cpu::detail {

namespace {

// The reference functions in reference mode, else the active SIMD table's (bit-identical conversions).
const simd::kernel_table& kernels_for(const compute_params& params) {
  return params.reference ? simd::table(isa::scalar) : simd::active_table();
}

// Walks a tensor's units (elements, or blocks of a block type) in row-major order of its dimensions.
struct flat_cursor {
  char* base;
  int64_t ne0;  // units per row
  int64_t ne1, ne2;
  int64_t nb0, nb1, nb2, nb3;
  int64_t i0 = 0, i1 = 0, i2 = 0, i3 = 0;

  explicit flat_cursor(const tensor& t)
      : base(static_cast<char*>(t.data)),
        ne0(t.ne[0] / block_size(t.type)),
        ne1(t.ne[1]),
        ne2(t.ne[2]),
        nb0(static_cast<int64_t>(t.nb[0])),
        nb1(static_cast<int64_t>(t.nb[1])),
        nb2(static_cast<int64_t>(t.nb[2])),
        nb3(static_cast<int64_t>(t.nb[3])) {}

  void seek(int64_t flat) {
    i0 = flat % ne0;
    flat /= ne0;
    i1 = flat % ne1;
    flat /= ne1;
    i2 = flat % ne2;
    i3 = flat / ne2;
  }
  char* ptr() const { return base + i0 * nb0 + i1 * nb1 + i2 * nb2 + i3 * nb3; }
  int64_t left() const { return ne0 - i0; }  // units to the end of the current row
  void advance(int64_t n) {                  // n <= left()
    i0 += n;
    if (i0 < ne0) return;
    i0 = 0;
    if (++i1 < ne1) return;
    i1 = 0;
    if (++i2 < ne2) return;
    i2 = 0;
    ++i3;
  }
};

// Calls f(src_ptr, dst_ptr, n) for the runs, in order, that are contiguous along dim 0 in both tensors when
// n units starting at flat unit s_begin of the source pair up with those starting at d_begin of dst.
template <class F>
void for_each_run(flat_cursor& s, int64_t s_begin, flat_cursor& d, int64_t d_begin, int64_t n, F&& f) {
  s.seek(s_begin);
  d.seek(d_begin);
  while (n > 0) {
    const int64_t run = std::min(n, std::min(s.left(), d.left()));
    f(s.ptr(), d.ptr(), run);
    s.advance(run);
    d.advance(run);
    n -= run;
  }
}

// A dense float buffer seen as a one-row f32 tensor, for gathering into / scattering from.
tensor buffer_tensor(float* buf, int64_t n) {
  tensor t;
  t.type = type::f32;
  t.ne = {n, 1, 1, 1};
  t.nb = {4, 4 * static_cast<size_t>(n), 4 * static_cast<size_t>(n), 4 * static_cast<size_t>(n)};
  t.data = buf;
  return t;
}

enum class cpy_kind { same, floats, quantize, dequantize, none };

cpy_kind classify(const tensor& src, const tensor& dst) {
  const type_traits& ts = traits(src.type);
  const type_traits& td = traits(dst.type);
  if (src.type == dst.type) return ts.known && ts.type_size > 0 ? cpy_kind::same : cpy_kind::none;
  if (is_float_type(src.type) && is_float_type(dst.type)) return cpy_kind::floats;
  if (is_float_type(src.type) && td.is_quantized && td.supported && td.from_float_ref != nullptr &&
      dst.nb[0] == td.type_size) {
    return cpy_kind::quantize;
  }
  if (ts.is_quantized && ts.supported && ts.to_float != nullptr && is_float_type(dst.type) &&
      src.nb[0] == ts.type_size) {
    return cpy_kind::dequantize;
  }
  return cpy_kind::none;
}

bool aligned_f32(const void* p) { return reinterpret_cast<uintptr_t>(p) % alignof(float) == 0; }

int64_t load_index(const tensor& idx, int64_t i0, int64_t i1, int64_t i2) {
  const char* p = addr(idx, i0, i1, i2, 0);
  if (idx.type == type::i32) {
    int32_t v;
    std::memcpy(&v, p, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

[[noreturn]] void bad_index(const tensor& node, int64_t row, int64_t n_rows) {
  unsupported(node, "row index " + std::to_string(row) + " out of range [0, " + std::to_string(n_rows) + ")");
}

}  // namespace

bool supports_cpy(const tensor& node) {
  if (node.src[0] == nullptr) return false;
  return classify(*node.src[0], node) != cpy_kind::none;
}

size_t cpy_work_size(const tensor& node, int nth) {
  const tensor& src = *node.src[0];
  switch (classify(src, node)) {
    case cpy_kind::quantize: return static_cast<size_t>(nth) * align_up(static_cast<size_t>(node.ne[0]) * 4);
    case cpy_kind::dequantize: return static_cast<size_t>(nth) * align_up(static_cast<size_t>(src.ne[0]) * 4);
    default: return 0;
  }
}

void compute_cpy(const compute_params& params, tensor& node) {
  if (node.src[0] == nullptr) unsupported(node, "no source");
  const tensor& src = *node.src[0];
  const cpy_kind kind = classify(src, node);
  if (kind == cpy_kind::none) {
    unsupported(node, "no conversion from " + std::string(type_name(src.type)) + " to " +
                          std::string(type_name(node.type)) + " with these layouts");
  }
  flat_cursor s(src);
  flat_cursor d(node);

  switch (kind) {
    case cpy_kind::same: {
      const size_t unit = type_size(node.type);
      const int64_t n_units = nelements(node) / block_size(node.type);
      const item_range share = split_range(n_units, params.ith, params.nth);
      if (share.begin >= share.end) return;
      if (is_contiguous(src) && is_contiguous(node)) {
        std::memcpy(static_cast<char*>(node.data) + static_cast<size_t>(share.begin) * unit,
                    static_cast<const char*>(src.data) + static_cast<size_t>(share.begin) * unit,
                    static_cast<size_t>(share.end - share.begin) * unit);
        return;
      }
      for_each_run(
          s, share.begin, d, share.begin, share.end - share.begin,
          [&](const char* ps, char* pd, int64_t n) { copy_units(ps, src.nb[0], pd, node.nb[0], unit, n); });
      return;
    }
    case cpy_kind::floats: {
      const item_range share = split_range(nelements(node), params.ith, params.nth);
      if (share.begin >= share.end) return;
      for_each_run(s, share.begin, d, share.begin, share.end - share.begin,
                   [&](const char* ps, char* pd, int64_t n) {
                     convert_floats(ps, src.nb[0], src.type, pd, node.nb[0], node.type, n);
                   });
      return;
    }
    case cpy_kind::quantize: {
      // Per destination row: gather its ne0 source values (they may span source rows) as f32, quantize.
      const int64_t ne0 = node.ne[0];
      const size_t per_thread = align_up(static_cast<size_t>(ne0) * 4);
      require_work(params, node, per_thread * static_cast<size_t>(params.nth));
      float* buf = reinterpret_cast<float*>(params.wdata + per_thread * static_cast<size_t>(params.ith));
      tensor bt = buffer_tensor(buf, ne0);
      const from_float_fn quantize = kernels_for(params).quantize(node.type);
      const item_range rows = split_range(nrows(node), params.ith, params.nth);
      for (int64_t r = rows.begin; r < rows.end; ++r) {
        char* pd = row_addr(node, unravel_row(node, r));
        s.seek(r * ne0);
        if (src.type == type::f32 && src.nb[0] == 4 && s.left() >= ne0 && aligned_f32(s.ptr())) {
          quantize(reinterpret_cast<const float*>(s.ptr()), pd, ne0);  // the values are one dense run
          continue;
        }
        flat_cursor b(bt);
        for_each_run(s, r * ne0, b, 0, ne0, [&](const char* ps, char* pb, int64_t n) {
          convert_floats(ps, src.nb[0], src.type, pb, 4, type::f32, n);
        });
        quantize(buf, pd, ne0);
      }
      return;
    }
    case cpy_kind::dequantize: {
      // Per source row: dequantize its ne0 values to f32, scatter them over the destination's elements.
      const int64_t ne0 = src.ne[0];
      const size_t per_thread = align_up(static_cast<size_t>(ne0) * 4);
      require_work(params, node, per_thread * static_cast<size_t>(params.nth));
      float* buf = reinterpret_cast<float*>(params.wdata + per_thread * static_cast<size_t>(params.ith));
      tensor bt = buffer_tensor(buf, ne0);
      const to_float_fn dequantize = kernels_for(params).dequantize(src.type);
      const item_range rows = split_range(nrows(src), params.ith, params.nth);
      for (int64_t r = rows.begin; r < rows.end; ++r) {
        const char* ps = row_addr(src, unravel_row(src, r));
        d.seek(r * ne0);
        if (node.type == type::f32 && node.nb[0] == 4 && d.left() >= ne0 && aligned_f32(d.ptr())) {
          dequantize(ps, reinterpret_cast<float*>(d.ptr()), ne0);
          continue;
        }
        dequantize(ps, buf, ne0);
        flat_cursor b(bt);
        for_each_run(b, 0, d, r * ne0, ne0, [&](const char* pb, char* pd, int64_t n) {
          convert_floats(pb, 4, type::f32, pd, node.nb[0], node.type, n);
        });
      }
      return;
    }
    case cpy_kind::none: break;
  }
}

// ---- get_rows: dst[:, j, k, l] = a[:, idx[j, k, l], k, l] as f32 ----

bool supports_get_rows(const tensor& node) {
  const tensor* a = node.src[0];
  const tensor* idx = node.src[1];
  if (a == nullptr || idx == nullptr || node.type != type::f32) return false;
  if (idx->type != type::i32 && idx->type != type::i64) return false;
  if (is_float_type(a->type)) return true;
  const type_traits& t = traits(a->type);
  // Block types are dequantized straight into the destination row.
  return t.supported && t.to_float != nullptr && a->nb[0] == t.type_size && dense_rows(node, 4);
}

void compute_get_rows(const compute_params& params, tensor& node) {
  if (!supports_get_rows(node)) unsupported(node, "needs i32/i64 indices, f32 dst, a type convertible to f32");
  const tensor& a = *node.src[0];
  const tensor& idx = *node.src[1];
  const int64_t ne0 = a.ne[0];
  const bool plain = is_float_type(a.type);
  const to_float_fn dequantize = kernels_for(params).dequantize(a.type);
  // dst is [ne0, idx.ne0, idx.ne1, idx.ne2]: dst row (i1, i2, i3) takes index idx[i1, i2, i3].
  const item_range rows = split_range(nrows(node), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(node, r);
    const int64_t row = load_index(idx, ri.i1, ri.i2, ri.i3);
    if (row < 0 || row >= a.ne[1]) bad_index(node, row, a.ne[1]);
    const char* ps = addr(a, 0, row, ri.i2, ri.i3);
    char* pd = row_addr(node, ri);
    if (plain) {
      convert_floats(ps, a.nb[0], a.type, pd, node.nb[0], type::f32, ne0);
    } else {
      dequantize(ps, reinterpret_cast<float*>(pd), ne0);
    }
  }
}

// ---- set_rows: dst[:, idx[i, j % ne1i, k % ne2i], j, k] = src[:, i, j, k] ----

namespace {

bool set_rows_quantized(const tensor& node) { return !is_float_type(node.type); }

}  // namespace

bool supports_set_rows(const tensor& node) {
  const tensor* src = node.src[1];
  const tensor* idx = node.src[2];
  if (node.src[0] == nullptr || src == nullptr || idx == nullptr) return false;
  if (!is_float_type(src->type)) return false;
  if (idx->type != type::i32 && idx->type != type::i64) return false;
  if (is_float_type(node.type)) return true;
  const type_traits& t = traits(node.type);
  return t.supported && t.is_quantized && t.from_float_ref != nullptr && node.nb[0] == t.type_size;
}

size_t set_rows_work_size(const tensor& node, int nth) {
  if (!set_rows_quantized(node)) return 0;
  return static_cast<size_t>(nth) * align_up(static_cast<size_t>(node.ne[0]) * 4);
}

void compute_set_rows(const compute_params& params, tensor& node) {
  if (!supports_set_rows(node)) {
    unsupported(node, "needs f32/f16/bf16 source rows, i32/i64 indices, a destination type from f32");
  }
  const tensor& src = *node.src[1];
  const tensor& idx = *node.src[2];
  const int64_t ne0 = src.ne[0];
  const bool quantized = set_rows_quantized(node);
  float* buf = nullptr;
  if (quantized) {
    const size_t per_thread = align_up(static_cast<size_t>(ne0) * 4);
    require_work(params, node, per_thread * static_cast<size_t>(params.nth));
    buf = reinterpret_cast<float*>(params.wdata + per_thread * static_cast<size_t>(params.ith));
  }
  const from_float_fn quantize = kernels_for(params).quantize(node.type);
  const bool direct = src.type == type::f32 && dense_rows(src, 4);
  // Rows of src: (i, j, k) = (i1, i2, i3); the index tensor is [n, ne1i, ne2i], broadcast over j and k.
  const item_range rows = split_range(nrows(src), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    const row_index ri = unravel_row(src, r);
    const int64_t row = load_index(idx, ri.i1, ri.i2 % idx.ne[1], ri.i3 % idx.ne[2]);
    if (row < 0 || row >= node.ne[1]) bad_index(node, row, node.ne[1]);
    const char* ps = row_addr(src, ri);
    char* pd = addr(node, 0, row, ri.i2, ri.i3);
    if (!quantized) {
      convert_floats(ps, src.nb[0], src.type, pd, node.nb[0], node.type, ne0);
    } else if (direct) {
      quantize(reinterpret_cast<const float*>(ps), pd, ne0);
    } else {
      convert_floats(ps, src.nb[0], src.type, reinterpret_cast<char*>(buf), 4, type::f32, ne0);
      quantize(buf, pd, ne0);
    }
  }
}

}  // namespace troupe::cpu::detail
