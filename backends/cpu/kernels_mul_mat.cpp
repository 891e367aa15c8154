// Matrix product: dst[i, j, i2, i3] = dot(row i of a plane (i2 / r2, i3 / r3), row j of b plane (i2, i3)).
//
// a: [k, m, ne2a, ne3a] of any supported type with dense rows (nb[0] == block bytes), any row/plane
// strides; b: [k, n, ne2b, ne3b] f32, any strides; dst: [m, n, ne2b, ne3b] f32 with dense rows.
// r2 = ne2b / ne2a, r3 = ne3b / ne3a: consecutive b planes share one a plane (grouped-query attention).
//
// a column-major (a transposed view of f32 / f16 rows, V of the attention): mul_mat_columns below.
//
// Otherwise three paths; every one computes each element of dst with one dot product of a row of a and a row of b
// converted to a's vec_dot_type, so the result does not depend on the thread count.
//
// Reference path (params.reference): every row of b is converted once to a's vec_dot_type into the work
// buffer (threads split the rows, then sync), then threads split tiles of dst statically and compute each
// element with traits(a.type).vec_dot. Scalar code only.
//
// Fast path: the same conversion, with the active SIMD table's quantizer (bit-identical to the reference),
// then the threads take chunks of dst from a shared counter (so a thread slowed down by the OS does not hold
// the others up) and use the table's SIMD vec_dot. Matrix-vector products (token generation, also of a few
// sequences at once) are chunks of rows of a against all rows of b; matrix-matrix products are tiles of
// tile_m rows of a against tile_n rows of b, so a's rows stay in L1 and the b tile in L2 while they are
// reused. Where the table has a tile kernel for a's type, a chunk runs as register tiles of one row of a x
// up to 4 rows of b, each block of a loaded and decoded once for them; for the 32-value block types the
// activation side of b's blocks (scales, sums) is prepared once per matmul where it stays in L1
// (tile_prepared_budget). Tile elements are bit-identical to vec_dot's, so a sequence's logits do not depend
// on which other sequences were decoded in the same batch. Where the table has a GEMM for a's type (q8_0,
// q4_K, q6_K) and b has gemm_min_rows rows or more (a prompt), chunks of gemm_chunk_m rows of a x gemm_chunk_n
// rows of b run through it instead: a tile of a's rows converted once into a row-interleaved 8-bit form, b's
// rows prepared once per matmul, several of a's rows x several of b's per register pass; its elements are
// vec_dot's again, bit for bit (simd/q8_0_x86.inc and the others), so the prompt cache's and a batch's results
// stay the same.
//
// BLAS path (TROUPE_HAVE_BLAS, TROUPE_CPU_BLAS=on, not reference, n >= blas_min_batch(a.type)): each thread takes a range of
// a's rows, dequantizes it into the work buffer (unless a is f32 that sgemm can read in place) and calls a
// single-threaded cblas_sgemm for those columns of dst. OpenBLAS runs on troupe's threads rather than its
// own pool, so the two never compete for cores; its thread count is set to 1 around the op and restored.
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string_view>

#include "backends/cpu/kernels_internal.h"
#include "backends/cpu/simd/simd.h"

#ifdef TROUPE_HAVE_BLAS
// OpenBLAS's header uses C99 _Complex, which -Wpedantic flags when its directory is not a system one.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cblas.h>
#pragma GCC diagnostic pop
#endif

namespace troupe::cpu {

namespace {

// BLAS crossover per weight type, in rows of b (tokens) per plane: the smallest batch of the sweep (16, 32,
// 64, ... 512) from which dequantizing a and running sgemm clearly beat the SIMD dot products (where runs
// disagreed on a near tie, the larger batch), measured with bench_cpu_ops on 4096 x 4096 weights
// (scripts/bench-cpu-ops; the tables are in docs/performance.md).
//
// The other side of the crossover is OpenBLAS's speed, which depends on the kernels it picked for the CPU:
// its AVX-512 ones (SkylakeX, Cooperlake, SapphireRapids) run sgemm about twice as fast as its AVX2 ones
// (Haswell, Zen; also what OPENBLAS_CORETYPE=Haswell forces), so there is one table for each. Types whose
// dot kernels are fast for their size (q2_K, q4_K, bf16 with AVX512_BF16) cross over late; f32 needs no
// dequantization and crosses over early.
constexpr int64_t never = INT64_MAX;

struct crossover {
  type t;
  int64_t avx2_blas;    // OpenBLAS with AVX2 kernels
  int64_t avx512_blas;  // OpenBLAS with AVX-512 kernels
};

constexpr crossover crossovers[] = {
    {type::f32, 32, 16},   {type::f16, 64, 32},   {type::bf16, 16, 16},  {type::q4_0, 64, 32},
    {type::q4_1, 64, 32},  {type::q5_0, 64, 32},  {type::q5_1, 64, 32},  {type::q8_0, 64, 64},
    {type::q2_K, 256, 128}, {type::q3_K, 128, 128}, {type::q4_K, 256, 64}, {type::q5_K, 64, 32},
    {type::q6_K, 64, 32},
};

// bf16 with vdpbf16ps: never BLAS over AVX2 sgemm, from 256 over AVX-512 sgemm (a tie at 128).
constexpr int64_t bf16_native_avx2_blas = never;
constexpr int64_t bf16_native_avx512_blas = 256;

}  // namespace

// The kernels OpenBLAS picked for this CPU (DYNAMIC_ARCH: from cpuid, or OPENBLAS_CORETYPE): AVX-512 ones
// (SkylakeX, Cooperlake, SapphireRapids), AVX2 ones (Haswell, Zen; also Skylake client, which DYNAMIC_ARCH
// maps to Haswell), or older ones. A CPU that OpenBLAS 0.3.21 does not recognise gets its SSE3 kernels
// (Prescott): measured on such a machine (a Xeon with AVX-512 VNNI and BF16 that reports no model name),
// sgemm ran at ~30 GFLOP/s per core against 42-78 GFLOP/s for troupe's own q4_0..q8_0 and K-quant tiles
// at 512 rows (bench_cpu_ops matmul/<type>/(quant|blas)/b512/threads:1), so with such kernels only f32 and
// f16 still cross over.
blas_kernels blas_kernel_family() {
#ifdef TROUPE_HAVE_BLAS
  static const blas_kernels v = [] {
    const std::string_view core = openblas_get_corename();
    auto is = [&](std::string_view k) {
      return core.size() == k.size() &&
             std::equal(core.begin(), core.end(), k.begin(), [](char a, char b) { return (a | 0x20) == b; });
    };
    for (std::string_view k : {"skylakex", "cooperlake", "sapphirerapids"}) {
      if (is(k)) return blas_kernels::avx512;
    }
    for (std::string_view k : {"haswell", "zen", "skylake"}) {
      if (is(k)) return blas_kernels::avx2;
    }
    return blas_kernels::older;
  }();
  return v;
#else
  return blas_kernels::older;
#endif
}

int64_t blas_min_batch_for(type t, blas_kernels family, bool simd, bool bf16_native) {
  if (family == blas_kernels::older && simd) {
    // troupe's own SIMD tiles beat pre-AVX2 sgemm for every quantized type and bf16. f32 ties; f16's tile
    // is about twice as fast as this sgemm on SmolLM2 f16 prompts, but it rounds the activations to f16 (its
    // vec_dot type, as llama.cpp's) where sgemm keeps them f32, which shifts the perplexity test's ratios by
    // ~1.3%: so f16, like f32, goes to sgemm from a batch of 128 on, for sgemm's f32 accuracy.
    return t == type::f32 || t == type::f16 ? 128 : never;
  }
  const bool avx512 = family == blas_kernels::avx512;
  if (t == type::bf16 && bf16_native) return avx512 ? bf16_native_avx512_blas : bf16_native_avx2_blas;
  for (const crossover& c : crossovers) {
    if (c.t == t) return avx512 ? c.avx512_blas : c.avx2_blas;
  }
  return 64;
}

bool blas_crossovers_enabled() {
#ifdef TROUPE_HAVE_BLAS
  static const bool on = [] {
    const char* env = std::getenv("TROUPE_CPU_BLAS");
    return env != nullptr && (std::string_view(env) == "1" || std::string_view(env) == "on");
  }();
  return on;
#else
  return false;
#endif
}

namespace {

int64_t default_blas_min_batch(type t) {
  // Batch invariance first: without TROUPE_CPU_BLAS every product runs troupe's own kernels, whose
  // elements do not depend on the batch (a sequence's logits are the same alone or next to others).
  if (!blas_crossovers_enabled()) return never;
  const simd::kernel_table& kt = simd::active_table();
  return blas_min_batch_for(t, blas_kernel_family(), kt.level != isa::scalar, kt.bf16_native);
}

std::atomic<int64_t> blas_min_batch_override{0};

}  // namespace

int64_t blas_min_batch(type weights) {
  const int64_t o = blas_min_batch_override.load(std::memory_order_relaxed);
  if (o != 0) return o < 0 ? INT64_MAX : o;
  return default_blas_min_batch(weights);
}

void set_blas_min_batch(int64_t n) { blas_min_batch_override.store(n, std::memory_order_relaxed); }

}  // namespace troupe::cpu

namespace troupe::cpu::detail {

namespace {

// sgemm is not worth its packing for products thinner than this in m or k.
[[maybe_unused]] constexpr int64_t blas_min_m = 64;
[[maybe_unused]] constexpr int64_t blas_min_k = 64;

// Reference path tiles.
constexpr int64_t tile_m = 16;
constexpr int64_t tile_n = 16;

// Fast path: tiles of dst for matrix-matrix products, row chunks for matrix-vector ones.
constexpr int64_t fast_tile_m = 16;
constexpr int64_t fast_tile_n = 32;
constexpr int64_t chunks_per_thread = 8;  // matrix-vector: enough chunks to even out uneven threads
constexpr int64_t min_chunk_rows = 16;

struct mm_plan {
  bool blas = false;
  bool fast = false;  // SIMD table, dynamic chunks
  // BLAS path
  bool a_direct = false;  // a is f32 with strides sgemm can take: no dequantization
  size_t a_f32_bytes = 0;
  // reference and fast paths
  bool convert_b = false;  // b's rows are converted to vec_dot_type in the work buffer
  size_t counter = 0;      // fast path, nth > 1: one cache line for the shared chunk counter
  size_t b_row_bytes = 0;  // one converted row
  size_t b_bytes = 0;      // all converted rows, cache-line aligned
  size_t scratch = 0;      // per thread: one strided b row gathered to dense f32 before quantizing
  // fast path, where a's tile kernel reads prepared rows: every converted row of b prepared (after the
  // scratch)
  size_t tile_row_bytes = 0;
  size_t tile_bytes = 0;
  // fast path, where the weight type has a GEMM and b has gemm_min_rows rows or more: every converted row of b
  // prepared for it (after the scratch, instead of the tile's)
  size_t gemm_row_bytes = 0;
  size_t gemm_bytes = 0;
  size_t total = 0;
};

// The GEMM's batches: from this many rows of b on (below, the tiles of one weight row are as fast), in chunks of
// gemm_chunk_m rows of a x gemm_chunk_n rows of b (a chunk's prepared rows of b, 64 x 40 bytes per block of
// 32 values, stay in L2 while the chunk's weight tiles pass over them).
constexpr int64_t gemm_min_rows = 16;
constexpr int64_t gemm_chunk_m = 32;
constexpr int64_t gemm_chunk_n = 64;

// Whether the fast path runs a's type against n rows of b through the table's GEMM.
bool uses_gemm(const simd::kernel_table& kt, type a_type, int64_t n) {
  return kt.gemm_of(a_type) != nullptr && n >= gemm_min_rows;
}

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
  p.blas = !reference && n >= blas_min_batch(a.type) && m >= blas_min_m && k >= blas_min_k && f32_strides_ok(b) &&
           f32_strides_ok(node) && b.nb[1] / 4 >= static_cast<size_t>(k) && node.nb[1] / 4 >= static_cast<size_t>(m);
#else
  (void)n;
  (void)m;
#endif
  if (p.blas) {
    p.a_direct = a.type == type::f32 && f32_strides_ok(a) && a.nb[1] / 4 >= static_cast<size_t>(k);
    if (!p.a_direct) p.a_f32_bytes = align_up(static_cast<size_t>(k * m * a.ne[2] * a.ne[3]) * sizeof(float));
    p.total = p.a_f32_bytes;
    return p;
  }
  p.fast = !reference;
  if (p.fast && nth > 1) p.counter = cache_line;
  const type vdt = traits(a.type).vec_dot_type;
  p.convert_b = !(vdt == type::f32 && f32_strides_ok(b));
  if (p.convert_b) {
    p.b_row_bytes = row_size(vdt, k);
    p.b_bytes = align_up(p.b_row_bytes * static_cast<size_t>(nrows(b)));
    if (!is_float_type(vdt) && !dense_rows(b, 4)) p.scratch = align_up(static_cast<size_t>(k) * sizeof(float));
  }
  if (p.fast && p.convert_b) {
    const simd::kernel_table& kt = simd::active_table();
    if (uses_gemm(kt, a.type, n)) {
      p.gemm_row_bytes = kt.gemm_size(a.type)(k);
      p.gemm_bytes = align_up(p.gemm_row_bytes * static_cast<size_t>(nrows(b)));
    } else if (kt.dot_tile_prepared(a.type) != nullptr) {
      // Prepared rows pay where a tile's (up to 4 of them) stay in L1.
      const size_t row_bytes = kt.prepared_size(a.type)(k);
      const size_t budget = n >= fast_tile_n ? simd::tile_prepared_budget_mm : simd::tile_prepared_budget;
      if (row_bytes * static_cast<size_t>(std::min<int64_t>(n, 4)) <= budget) {
        p.tile_row_bytes = row_bytes;
        p.tile_bytes = align_up(p.tile_row_bytes * static_cast<size_t>(nrows(b)));
      }
    }
  }
  p.total = p.counter + p.b_bytes + p.scratch * static_cast<size_t>(nth) + p.tile_bytes + p.gemm_bytes;
  return p;
}

// Converts rows [begin, end) of b (f32, any strides) to `vdt` with `quantize`, densely packed at `out`.
void convert_b_rows(const tensor& b, type vdt, from_float_fn quantize, int64_t begin, int64_t end, uint8_t* out,
                    size_t row_bytes, float* scratch) {
  const int64_t k = b.ne[0];
  const bool dense = dense_rows(b, 4);
  for (int64_t r = begin; r < end; ++r) {
    const char* src = row_addr(b, unravel_row(b, r));
    char* dst = reinterpret_cast<char*>(out + static_cast<size_t>(r) * row_bytes);
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

// Everything a thread needs to compute elements of dst with vec_dot.
struct mm_ctx {
  const tensor& a;
  const tensor& b;
  tensor& dst;
  const mm_plan& p;
  const uint8_t* b_conv;  // converted rows of b, or null when b is used as is
  const uint8_t* b_tile;  // fast path: converted rows of b prepared for dot_tile, or null
  const uint8_t* b_gemm;  // fast path: converted rows of b prepared for gemm, or null
  vec_dot_fn dot;
  simd::vec_dot_rows_fn dot_rows;  // fast path: several rows of a per call; null on the reference path
  simd::vec_dot_tile_fn dot_tile;  // fast path: rows of a x rows of b per call; null where the type has none
  simd::vec_dot_tile_fn dot_tile_prepared;  // the same on b_tile's rows (when b_tile is set)
  simd::vec_dot_tile_fn gemm;               // the same elements again, on b_gemm's rows (when b_gemm is set)
  int64_t k, m, n, ne2b, r2, r3;

  const void* b_row(int64_t plane, int64_t j, int64_t i2, int64_t i3) const {
    if (b_conv != nullptr) return b_conv + static_cast<size_t>(plane * n + j) * p.b_row_bytes;
    return addr(b, 0, j, i2, i3);
  }

  // dst[i_begin..i_end, j_begin..j_end] of one plane.
  void tile(int64_t plane, int64_t i_begin, int64_t i_end, int64_t j_begin, int64_t j_end) const {
    const int64_t i2 = plane % ne2b;
    const int64_t i3 = plane / ne2b;
    const char* a_plane = addr(a, 0, 0, i2 / r2, i3 / r3);
    if (b_gemm != nullptr) {
      gemm(k, i_end - i_begin, j_end - j_begin, reinterpret_cast<float*>(addr(dst, i_begin, j_begin, i2, i3)),
           dst.nb[1] / sizeof(float), a_plane + i_begin * static_cast<int64_t>(a.nb[1]), a.nb[1],
           b_gemm + static_cast<size_t>(plane * n + j_begin) * p.gemm_row_bytes, p.gemm_row_bytes);
      return;
    }
    if (dot_tile != nullptr) {
      // Register tiles of one row of a x up to 4 rows of b (one sequence's token, a few sequences decoding
      // at once, or a tile of a prompt): each block of a is decoded once for the rows of b. Rows of b
      // (converted, or prepared) are b_row_bytes (tile_row_bytes) apart, dst's columns nb[1].
      const uint8_t* y = b_tile != nullptr ? b_tile + static_cast<size_t>(plane * n + j_begin) * p.tile_row_bytes
                                           : static_cast<const uint8_t*>(b_row(plane, j_begin, i2, i3));
      // b used as is (f32 with dense rows): its rows are nb[1] apart.
      const size_t y_stride = b_tile != nullptr ? p.tile_row_bytes : b_conv != nullptr ? p.b_row_bytes : b.nb[1];
      (b_tile != nullptr ? dot_tile_prepared : dot_tile)(
          k, i_end - i_begin, j_end - j_begin, reinterpret_cast<float*>(addr(dst, i_begin, j_begin, i2, i3)),
          dst.nb[1] / sizeof(float), a_plane + i_begin * static_cast<int64_t>(a.nb[1]), a.nb[1], y, y_stride);
      return;
    }
    if (dot_rows != nullptr) {
      // Column by column: the tile's rows of a (a few KiB each) stay in cache across the columns, and dst's
      // rows are dense, so each call writes i_end - i_begin consecutive floats.
      for (int64_t j = j_begin; j < j_end; ++j) {
        dot_rows(k, i_end - i_begin, reinterpret_cast<float*>(addr(dst, i_begin, j, i2, i3)),
                 a_plane + i_begin * static_cast<int64_t>(a.nb[1]), a.nb[1], b_row(plane, j, i2, i3));
      }
      return;
    }
    for (int64_t i = i_begin; i < i_end; ++i) {
      const char* a_row = a_plane + i * static_cast<int64_t>(a.nb[1]);
      for (int64_t j = j_begin; j < j_end; ++j) {
        float s;
        dot(k, &s, a_row, b_row(plane, j, i2, i3));
        std::memcpy(addr(dst, i, j, i2, i3), &s, sizeof s);
      }
    }
  }
};

// Converts b (threads split its rows) into the work buffer after the counter; returns the converted rows.
const uint8_t* convert_b(const compute_params& params, const tensor& b, type vdt, from_float_fn quantize,
                         const mm_plan& p) {
  if (!p.convert_b) return nullptr;
  uint8_t* out = params.wdata + p.counter;
  float* scratch =
      p.scratch > 0
          ? reinterpret_cast<float*>(out + p.b_bytes + p.scratch * static_cast<size_t>(params.ith))
          : nullptr;
  const item_range rows = split_range(nrows(b), params.ith, params.nth);
  convert_b_rows(b, vdt, quantize, rows.begin, rows.end, out, p.b_row_bytes, scratch);
  return out;
}

// The fast path's prepared rows of b for the GEMM or for the tile kernel (threads split the rows, as for the
// conversion; the caller syncs before any thread reads them); null when neither reads prepared rows.
const uint8_t* prepare_b(const compute_params& params, const tensor& b, type a_type, const uint8_t* b_conv,
                         const mm_plan& p) {
  const bool gemm = p.gemm_bytes != 0;
  if (!gemm && p.tile_bytes == 0) return nullptr;
  const simd::kernel_table& kt = simd::active_table();
  const simd::tile_prepare_fn prepare = gemm ? kt.prepare_gemm(a_type) : kt.prepare_tile(a_type);
  const size_t row_bytes = gemm ? p.gemm_row_bytes : p.tile_row_bytes;
  uint8_t* out = params.wdata + p.counter + p.b_bytes + p.scratch * static_cast<size_t>(params.nth);
  const item_range rows = split_range(nrows(b), params.ith, params.nth);
  for (int64_t r = rows.begin; r < rows.end; ++r) {
    prepare(b.ne[0], b_conv + static_cast<size_t>(r) * p.b_row_bytes, out + static_cast<size_t>(r) * row_bytes);
  }
  return out;
}

void mul_mat_reference(const compute_params& params, tensor& node, const mm_plan& p) {
  const tensor& a = *node.src[0];
  const tensor& b = *node.src[1];
  const type_traits& ta = traits(a.type);
  const uint8_t* b_conv = convert_b(params, b, ta.vec_dot_type, traits(ta.vec_dot_type).from_float_ref, p);
  if (p.convert_b) params.sync();  // every thread reads every converted row
  const mm_ctx c{a,       b,       node,    p,       b_conv,  nullptr, nullptr, ta.vec_dot, nullptr, nullptr,
                 nullptr, nullptr, a.ne[0], a.ne[1], b.ne[1], b.ne[2], b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]};

  // Tiles in order (plane, tile of b rows, tile of a rows); each thread takes a contiguous range of them.
  const int64_t n_planes = b.ne[2] * b.ne[3];
  const int64_t tiles_m = (c.m + tile_m - 1) / tile_m;
  const int64_t tiles_n = (c.n + tile_n - 1) / tile_n;
  const item_range tiles = split_range(n_planes * tiles_n * tiles_m, params.ith, params.nth);
  for (int64_t t = tiles.begin; t < tiles.end; ++t) {
    const int64_t tm = t % tiles_m;
    const int64_t tn = (t / tiles_m) % tiles_n;
    const int64_t plane = t / (tiles_m * tiles_n);
    c.tile(plane, tm * tile_m, std::min(c.m, (tm + 1) * tile_m), tn * tile_n, std::min(c.n, (tn + 1) * tile_n));
  }
}

void mul_mat_fast(const compute_params& params, tensor& node, const mm_plan& p) {
  const tensor& a = *node.src[0];
  const tensor& b = *node.src[1];
  const simd::kernel_table& kt = simd::active_table();
  const type vdt = traits(a.type).vec_dot_type;
  const uint8_t* b_conv = convert_b(params, b, vdt, kt.quantize(vdt), p);
  // Each thread prepares the rows it converted: no sync between the two.
  const uint8_t* b_prepared = prepare_b(params, b, a.type, b_conv, p);
  const uint8_t* b_tile = p.tile_bytes != 0 ? b_prepared : nullptr;
  const uint8_t* b_gemm = p.gemm_bytes != 0 ? b_prepared : nullptr;
  // Float weights cost little to load, so in matrix-vector products (a few rows of b, weights streamed from
  // memory) their tiles only pay while the tile's rows of b stay in L1 (f16 at k = 4096 and 4 rows of b was
  // slower as a tile than row by row); quantized ones pay at any size, and so do matrix-matrix tiles.
  simd::vec_dot_tile_fn dot_tile = kt.dot_tile(a.type);
  if (is_float_type(a.type) && b.ne[1] < fast_tile_n) {
    const size_t b_row = p.convert_b ? p.b_row_bytes : static_cast<size_t>(b.ne[0]) * sizeof(float);
    if (b_row * static_cast<size_t>(std::min<int64_t>(b.ne[1], 4)) > simd::tile_prepared_budget) dot_tile = nullptr;
  }
  const mm_ctx c{a,        b,       node,    p,       b_conv,  b_tile,           b_gemm, kt.dot(a.type), kt.dot_rows(a.type),
                 dot_tile, kt.dot_tile_prepared(a.type), kt.gemm_of(a.type), a.ne[0], a.ne[1], b.ne[1], b.ne[2],
                 b.ne[2] / a.ne[2], b.ne[3] / a.ne[3]};

  // Chunk geometry: rows of a per chunk (rows_per) against b rows per chunk (cols_per).
  const int64_t n_planes = b.ne[2] * b.ne[3];
  int64_t rows_per = fast_tile_m;
  int64_t cols_per = fast_tile_n;
  if (b_gemm != nullptr) {
    rows_per = gemm_chunk_m;
    cols_per = gemm_chunk_n;
  } else if (c.n < fast_tile_n) {
    // Matrix-vector (or a few vectors): all of b's rows in each chunk, rows of a split finely enough that
    // every thread gets several chunks.
    cols_per = c.n;
    const int64_t want = std::max<int64_t>(1, params.nth * chunks_per_thread / std::max<int64_t>(1, n_planes));
    rows_per = std::max(min_chunk_rows, (c.m + want - 1) / want);
  }
  const int64_t chunks_m = (c.m + rows_per - 1) / rows_per;
  const int64_t chunks_n = (c.n + cols_per - 1) / cols_per;
  const int64_t n_chunks = n_planes * chunks_n * chunks_m;

  // mul_mat_masked: a chunk whose mask entries are all -inf (the masked half of a prompt's attention, other
  // sequences' cells) is written as zeros instead of computed; every other element is computed as ever.
  const tensor* mask = node.src[2];
  auto masked_whole = [&](int64_t plane, int64_t i0, int64_t i1, int64_t j0, int64_t j1) {
    if (mask == nullptr) return false;
    const int64_t i2 = (plane % c.ne2b) % mask->ne[2];
    for (int64_t j = j0; j < j1; ++j) {
      const char* row = addr(*mask, 0, j, i2, 0);
      for (int64_t i = i0; i < i1; ++i) {
        if (load_float(row + static_cast<size_t>(i) * mask->nb[0], mask->type) != -INFINITY) return false;
      }
    }
    return true;
  };
  auto run_chunk = [&](int64_t t) {
    const int64_t tm = t % chunks_m;
    const int64_t tn = (t / chunks_m) % chunks_n;
    const int64_t plane = t / (chunks_m * chunks_n);
    const int64_t i0 = tm * rows_per, i1 = std::min(c.m, (tm + 1) * rows_per);
    const int64_t j0 = tn * cols_per, j1 = std::min(c.n, (tn + 1) * cols_per);
    if (masked_whole(plane, i0, i1, j0, j1)) {
      const int64_t i2 = plane % c.ne2b, i3 = plane / c.ne2b;
      for (int64_t j = j0; j < j1; ++j) {
        std::memset(addr(node, i0, j, i2, i3), 0, static_cast<size_t>(i1 - i0) * sizeof(float));
      }
      return;
    }
    c.tile(plane, i0, i1, j0, j1);
  };

  // The counter's sync also publishes the converted b.
  for_each_claimed(params, n_chunks, run_chunk);
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

  // Each thread owns rows [m0, m1) of a, i.e. columns [m0, m1) of dst, in every plane; boundaries on
  // multiples of 16 floats so that no two threads write the same cache line of dst.
  const int64_t per = (m / params.nth + 15) / 16 * 16;
  const int64_t m0 = std::min(m, per * params.ith);
  const int64_t m1 = params.ith == params.nth - 1 ? m : std::min(m, m0 + per);

  int blas_threads = 1;
  if (params.ith == 0) {
    blas_threads = openblas_get_num_threads();
    openblas_set_num_threads(1);  // each of our threads runs its own single-threaded sgemm
  }
  params.sync();

  if (!p.a_direct && m1 > m0) {
    const to_float_fn to_f32 = simd::active_table().dequantize(a.type);
    for (int64_t i3 = 0; i3 < a.ne[3]; ++i3) {
      for (int64_t i2 = 0; i2 < a.ne[2]; ++i2) {
        for (int64_t i = m0; i < m1; ++i) {
          const char* src = addr(a, 0, i, i2, i3);
          float* dst = a_f32 + ((i3 * a.ne[2] + i2) * m + i) * k;
          if (a.type == type::f32) {
            std::memcpy(dst, src, static_cast<size_t>(k) * sizeof(float));
          } else {
            to_f32(src, dst, k);
          }
        }
      }
    }
  }

  if (m1 > m0) {
    // Row-major: C[n x (m1 - m0)] = B[n x k] * A[m0..m1 x k]^T, i.e. dst[i, j] = sum_l a[l, i] * b[l, j].
    const int64_t ldb = static_cast<int64_t>(b.nb[1] / 4);
    const int64_t ldc = static_cast<int64_t>(node.nb[1] / 4);
    const int64_t lda = p.a_direct ? static_cast<int64_t>(a.nb[1] / 4) : k;
    for (int64_t i3 = 0; i3 < b.ne[3]; ++i3) {
      for (int64_t i2 = 0; i2 < b.ne[2]; ++i2) {
        const int64_t i2a = i2 / r2;
        const int64_t i3a = i3 / r3;
        const float* pa = p.a_direct ? reinterpret_cast<const float*>(addr(a, 0, m0, i2a, i3a))
                                     : a_f32 + ((i3a * a.ne[2] + i2a) * m + m0) * k;
        const float* pb = reinterpret_cast<const float*>(addr(b, 0, 0, i2, i3));
        float* pc = reinterpret_cast<float*>(addr(node, m0, 0, i2, i3));
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m1 - m0),
                    static_cast<int>(k), 1.0f, pb, static_cast<int>(ldb), pa, static_cast<int>(lda), 0.0f, pc,
                    static_cast<int>(ldc));
      }
    }
  }
  params.sync();  // every sgemm has started single-threaded before the setting is restored
  if (params.ith == 0) openblas_set_num_threads(blas_threads);
}
#endif

// a column-major (f32 / f16 with nb[1] == the element size: a row of a per value of the summed dimension,
// e.g. V in a row per cache cell, read transposed) and b with dense f32 rows: dst's columns are sums of a's
// rows scaled by b's values (mad_tile, simd.h), each element summed in order of a's rows whatever the
// tile or thread. Threads split (plane, tile of b columns).
bool column_major(const tensor& a) {
  return (a.type == type::f32 || a.type == type::f16) && a.nb[1] == type_size(a.type) && a.nb[0] != a.nb[1];
}

void mul_mat_columns(const compute_params& params, tensor& node) {
  const tensor& a = *node.src[0];
  const tensor& b = *node.src[1];
  const int64_t k = a.ne[0], m = a.ne[1], n = b.ne[1];
  const int64_t r2 = b.ne[2] / a.ne[2], r3 = b.ne[3] / a.ne[3];
  const simd::mad_tile_fn mad = (params.reference ? simd::table(isa::scalar) : simd::active_table()).mad(a.type);
  constexpr int64_t cols_per = 6;
  const int64_t tiles_n = (n + cols_per - 1) / cols_per;
  const int64_t n_planes = b.ne[2] * b.ne[3];
  const item_range items = split_range(n_planes * tiles_n, params.ith, params.nth);
  for (int64_t t = items.begin; t < items.end; ++t) {
    const int64_t plane = t / tiles_n;
    const int64_t j0 = (t % tiles_n) * cols_per;
    const int64_t i2 = plane % b.ne[2], i3 = plane / b.ne[2];
    mad(k, m, std::min(cols_per, n - j0), addr(a, 0, 0, i2 / r2, i3 / r3), a.nb[0], addr(b, 0, j0, i2, i3), b.nb[1],
        reinterpret_cast<float*>(addr(node, 0, j0, i2, i3)), node.nb[1] / sizeof(float));
  }
}

}  // namespace

const char* mul_mat_kernel_family_of(type t, int64_t n) {
#ifdef TROUPE_HAVE_BLAS
  if (n >= blas_min_batch(t)) return "blas";
#endif
  const simd::kernel_table& kt = simd::active_table();
  if (uses_gemm(kt, t, n)) return "gemm";
  if (kt.dot_tile(t) != nullptr) return "tile";
  if (kt.dot_rows(t) != nullptr) return "rows";
  return "dot";
}

bool supports_mul_mat(const tensor& node) {
  const tensor* a = node.src[0];
  const tensor* b = node.src[1];
  if (a == nullptr || b == nullptr || b->type != type::f32 || node.type != type::f32) return false;
  if (!dense_rows(node, 4)) return false;
  if (column_major(*a)) return dense_rows(*b, 4);
  const type_traits& ta = traits(a->type);
  if (!ta.supported || ta.vec_dot == nullptr || ta.to_float == nullptr) return false;
  if (a->nb[0] != ta.type_size) return false;  // vec_dot and to_float read dense rows of blocks
  const type_traits& tv = traits(ta.vec_dot_type);
  if (!is_float_type(ta.vec_dot_type) && tv.from_float_ref == nullptr) return false;
  return a->ne[0] % tv.block_size == 0;  // b's rows must be whole blocks of vec_dot_type
}

size_t mul_mat_work_size(const tensor& node, int nth, bool reference) {
  if (node.src[0] != nullptr && column_major(*node.src[0])) return 0;
  return plan_mul_mat(node, nth, reference).total;
}

void compute_mul_mat(const compute_params& params, tensor& node) {
  if (!supports_mul_mat(node)) {
    unsupported(node, "needs a of a supported type with dense rows, f32 b and f32 dst with dense rows");
  }
  if (column_major(*node.src[0])) return mul_mat_columns(params, node);
  const mm_plan p = plan_mul_mat(node, params.nth, params.reference);
  require_work(params, node, p.total);
#ifdef TROUPE_HAVE_BLAS
  if (p.blas) return mul_mat_blas(params, node, p);
#endif
  if (p.fast) return mul_mat_fast(params, node, p);
  mul_mat_reference(params, node, p);
}

}  // namespace troupe::cpu::detail

namespace troupe::cpu {
const char* mul_mat_kernel_family(type t, int64_t n) { return detail::mul_mat_kernel_family_of(t, n); }
}  // namespace troupe::cpu
