// Matrix product: dst[i, j, i2, i3] = dot(row i of a plane (i2 / r2, i3 / r3), row j of b plane (i2, i3)).
//
// a: [k, m, ne2a, ne3a] of any supported type with dense rows (nb[0] == block bytes), any row/plane
// strides; b: [k, n, ne2b, ne3b] f32, any strides; dst: [m, n, ne2b, ne3b] f32 with dense rows.
// r2 = ne2b / ne2a, r3 = ne3b / ne3a: consecutive b planes share one a plane (grouped-query attention).
//
// Reference path (always available): every row of b is converted once to a's vec_dot_type into the work
// buffer (threads split the rows, then sync), then threads split tiles of dst and compute each element with
// one traits(a.type).vec_dot call, so the result does not depend on the thread count.
// BLAS path (TROUPE_HAVE_BLAS, !params.reference, large products): a is dequantized to f32 in the work
// buffer unless it is usable as is (threads split rows, then sync); thread 0 calls cblas_sgemm per dst
// plane while the others wait at the final sync.
#include <algorithm>
#include <cstring>

#include "backends/cpu/kernels_internal.h"

#ifdef TROUPE_HAVE_BLAS
// OpenBLAS's header uses C99 _Complex, which -Wpedantic flags when its directory is not a system one.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cblas.h>
#pragma GCC diagnostic pop
#endif

namespace troupe::cpu::detail {

namespace {

// Products at least this large go to BLAS: n columns of b (tokens), m rows and k columns of a. Below it the
// conversion of a to f32 and the single-threaded sgemm call cost more than the quantized dot products.
[[maybe_unused]] constexpr int64_t blas_min_n = 32;
[[maybe_unused]] constexpr int64_t blas_min_m = 64;
[[maybe_unused]] constexpr int64_t blas_min_k = 64;

// Tiles of dst computed by one thread at a time: tile_m rows of a against tile_n rows of b, so a tile's
// rows of a and b stay in cache while they are reused.
constexpr int64_t tile_m = 16;
constexpr int64_t tile_n = 16;

struct mm_plan {
  bool blas = false;
  // BLAS path
  bool a_direct = false;  // a is f32 with strides sgemm can take: no dequantization
  size_t a_f32_bytes = 0;
  // reference path
  bool convert_b = false;  // b's rows are converted to vec_dot_type in the work buffer
  size_t b_row_bytes = 0;  // one converted row
  size_t b_bytes = 0;      // all converted rows, cache-line aligned
  size_t scratch = 0;      // per thread: one strided b row gathered to dense f32 before quantizing
  size_t total = 0;
};

bool f32_strides_ok(const tensor& t) { return dense_rows(t, 4); }

mm_plan plan_mul_mat(const tensor& node, int nth, bool reference) {
  const tensor& a = *node.src[0];
  const tensor& b = *node.src[1];
  const int64_t k = a.ne[0];
  const int64_t m = a.ne[1];
  const int64_t n = b.ne[1];
  mm_plan p;
#ifdef TROUPE_HAVE_BLAS
  // sgemm needs b and dst as row-major f32 matrices with leading dimensions >= their row lengths.
  p.blas = !reference && n >= blas_min_n && m >= blas_min_m && k >= blas_min_k && f32_strides_ok(b) &&
           f32_strides_ok(node) && b.nb[1] / 4 >= static_cast<size_t>(k) &&
           node.nb[1] / 4 >= static_cast<size_t>(m);
#else
  (void)reference;
  (void)n;
  (void)m;
#endif
  if (p.blas) {
    p.a_direct = a.type == type::f32 && f32_strides_ok(a) && a.nb[1] / 4 >= static_cast<size_t>(k);
    if (!p.a_direct) {
      p.a_f32_bytes = align_up(static_cast<size_t>(k * m * a.ne[2] * a.ne[3]) * sizeof(float));
    }
    p.total = p.a_f32_bytes;
    return p;
  }
  const type vdt = traits(a.type).vec_dot_type;
  p.convert_b = !(vdt == type::f32 && f32_strides_ok(b));
  if (p.convert_b) {
    p.b_row_bytes = row_size(vdt, k);
    p.b_bytes = align_up(p.b_row_bytes * static_cast<size_t>(nrows(b)));
    if (!is_float_type(vdt) && !dense_rows(b, 4)) p.scratch = align_up(static_cast<size_t>(k) * sizeof(float));
  }
  p.total = p.b_bytes + p.scratch * static_cast<size_t>(nth);
  return p;
}

// Converts rows [begin, end) of b (f32, any strides) to `vdt`, densely packed at `out`.
void convert_b_rows(const tensor& b, type vdt, int64_t begin, int64_t end, uint8_t* out, size_t row_bytes,
                    float* scratch) {
  const int64_t k = b.ne[0];
  const from_float_fn quantize = traits(vdt).from_float_ref;
  const bool dense = dense_rows(b, 4);
  for (int64_t r = begin; r < end; ++r) {
    const char* src = row_addr(b, unravel_row(b, r));
    char* dst = reinterpret_cast<char*>(out + static_cast<size_t>(r) * row_bytes);
    if (is_float_type(vdt)) {
      convert_floats(src, b.nb[0], type::f32, dst, type_size(vdt), vdt, k);
    } else if (dense) {
      quantize(reinterpret_cast<const float*>(src), dst, k);
    } else {
      gather_f32(src, b.nb[0], scratch, k);
      quantize(scratch, dst, k);
    }
  }
}

void mul_mat_reference(const compute_params& params, tensor& node, const mm_plan& p) {
  const tensor& a = *node.src[0];
  const tensor& b = *node.src[1];
  const type_traits& ta = traits(a.type);
  const int64_t k = a.ne[0];
  const int64_t m = a.ne[1];
  const int64_t n = b.ne[1];
  const int64_t ne2b = b.ne[2];
  const int64_t r2 = b.ne[2] / a.ne[2];
  const int64_t r3 = b.ne[3] / a.ne[3];

  if (p.convert_b) {
    float* scratch =
        p.scratch > 0
            ? reinterpret_cast<float*>(params.wdata + p.b_bytes + p.scratch * static_cast<size_t>(params.ith))
            : nullptr;
    const item_range rows = split_range(nrows(b), params.ith, params.nth);
    convert_b_rows(b, ta.vec_dot_type, rows.begin, rows.end, params.wdata, p.b_row_bytes, scratch);
    params.sync();  // every thread reads every converted row
  }

  // Tiles in order (plane, tile of b rows, tile of a rows); each thread takes a contiguous range of them.
  const int64_t n_planes = b.ne[2] * b.ne[3];
  const int64_t tiles_m = (m + tile_m - 1) / tile_m;
  const int64_t tiles_n = (n + tile_n - 1) / tile_n;
  const item_range tiles = split_range(n_planes * tiles_n * tiles_m, params.ith, params.nth);
  const vec_dot_fn dot = ta.vec_dot;
  for (int64_t t = tiles.begin; t < tiles.end; ++t) {
    const int64_t tm = t % tiles_m;
    const int64_t tn = (t / tiles_m) % tiles_n;
    const int64_t plane = t / (tiles_m * tiles_n);
    const int64_t i2 = plane % ne2b;
    const int64_t i3 = plane / ne2b;
    const char* a_plane = addr(a, 0, 0, i2 / r2, i3 / r3);
    const int64_t j_end = std::min(n, (tn + 1) * tile_n);
    const int64_t i_end = std::min(m, (tm + 1) * tile_m);
    for (int64_t i = tm * tile_m; i < i_end; ++i) {
      const char* a_row = a_plane + i * static_cast<int64_t>(a.nb[1]);
      for (int64_t j = tn * tile_n; j < j_end; ++j) {
        const void* b_row =
            p.convert_b
                ? static_cast<const void*>(params.wdata + static_cast<size_t>((plane * n + j)) * p.b_row_bytes)
                : static_cast<const void*>(addr(b, 0, j, i2, i3));
        float s;
        dot(k, &s, a_row, b_row);
        std::memcpy(addr(node, i, j, i2, i3), &s, sizeof s);
      }
    }
  }
}

#ifdef TROUPE_HAVE_BLAS
void mul_mat_blas(const compute_params& params, tensor& node, const mm_plan& p) {
  const tensor& a = *node.src[0];
  const tensor& b = *node.src[1];
  const int64_t k = a.ne[0];
  const int64_t m = a.ne[1];
  const int64_t n = b.ne[1];
  const int64_t r2 = b.ne[2] / a.ne[2];
  const int64_t r3 = b.ne[3] / a.ne[3];
  float* a_f32 = reinterpret_cast<float*>(params.wdata);

  if (!p.a_direct) {
    // Dequantize a into [k, m, ne2a, ne3a] dense f32; rows split across threads.
    const to_float_fn to_f32 = traits(a.type).to_float;
    const item_range rows = split_range(nrows(a), params.ith, params.nth);
    for (int64_t r = rows.begin; r < rows.end; ++r) {
      const char* src = row_addr(a, unravel_row(a, r));
      float* dst = a_f32 + r * k;
      if (a.type == type::f32) {
        std::memcpy(dst, src, static_cast<size_t>(k) * sizeof(float));
      } else {
        to_f32(src, dst, k);
      }
    }
    params.sync();
  }

  if (params.ith == 0) {
    // Row-major: C[n x m] = B[n x k] * A[m x k]^T, i.e. dst[i, j] = sum_l a[l, i] * b[l, j].
    const int64_t ldb = static_cast<int64_t>(b.nb[1] / 4);
    const int64_t ldc = static_cast<int64_t>(node.nb[1] / 4);
    const int64_t lda = p.a_direct ? static_cast<int64_t>(a.nb[1] / 4) : k;
    for (int64_t i3 = 0; i3 < b.ne[3]; ++i3) {
      for (int64_t i2 = 0; i2 < b.ne[2]; ++i2) {
        const int64_t i2a = i2 / r2;
        const int64_t i3a = i3 / r3;
        const float* pa = p.a_direct ? reinterpret_cast<const float*>(addr(a, 0, 0, i2a, i3a))
                                     : a_f32 + (i3a * a.ne[2] + i2a) * m * k;
        const float* pb = reinterpret_cast<const float*>(addr(b, 0, 0, i2, i3));
        float* pc = reinterpret_cast<float*>(addr(node, 0, 0, i2, i3));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m),
                    static_cast<int>(k), 1.0f, pb, static_cast<int>(ldb), pa, static_cast<int>(lda), 0.0f, pc,
                    static_cast<int>(ldc));
      }
    }
  }
  params.sync();  // the node is done when thread 0 is
}
#endif

}  // namespace

bool supports_mul_mat(const tensor& node) {
  const tensor* a = node.src[0];
  const tensor* b = node.src[1];
  if (a == nullptr || b == nullptr || b->type != type::f32 || node.type != type::f32) return false;
  if (!dense_rows(node, 4)) return false;
  const type_traits& ta = traits(a->type);
  if (!ta.supported || ta.vec_dot == nullptr || ta.to_float == nullptr) return false;
  if (a->nb[0] != ta.type_size) return false;  // vec_dot and to_float read dense rows of blocks
  const type_traits& tv = traits(ta.vec_dot_type);
  if (!is_float_type(ta.vec_dot_type) && tv.from_float_ref == nullptr) return false;
  return a->ne[0] % tv.block_size == 0;  // b's rows must be whole blocks of vec_dot_type
}

size_t mul_mat_work_size(const tensor& node, int nth, bool reference) {
  return plan_mul_mat(node, nth, reference).total;
}

void compute_mul_mat(const compute_params& params, tensor& node) {
  if (!supports_mul_mat(node)) {
    unsupported(node, "needs a of a supported type with dense rows, f32 b and f32 dst with dense rows");
  }
  const mm_plan p = plan_mul_mat(node, params.nth, params.reference);
  require_work(params, node, p.total);
#ifdef TROUPE_HAVE_BLAS
  if (p.blas) return mul_mat_blas(params, node, p);
#endif
  mul_mat_reference(params, node, p);
}

}  // namespace troupe::cpu::detail
