#include "tools/bench/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <random>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "runtime/context.h"
#include "runtime/graph.h"
#include "runtime/ops.h"

#ifdef TROUPE_HAVE_BLAS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cblas.h>
#pragma GCC diagnostic pop
#endif

namespace troupe::bench {

namespace {

struct aligned_buffer {
  uint8_t* p = nullptr;
  size_t size = 0;
  explicit aligned_buffer(size_t n) : p(static_cast<uint8_t*>(std::aligned_alloc(64, (n + 63) / 64 * 64))), size(n) {
    if (p == nullptr) throw std::bad_alloc();
    std::memset(p, 1, size);  // touch every page now, not inside the timed loop
  }
  ~aligned_buffer() { std::free(p); }
  aligned_buffer(const aligned_buffer&) = delete;
  aligned_buffer& operator=(const aligned_buffer&) = delete;
};

// One backend and one bare pool per thread count, shared by every workload (as a program would).
cpu::cpu_backend& backend(int nth) {
  static std::map<int, std::unique_ptr<cpu::cpu_backend>> backends;
  auto& b = backends[nth];
  if (!b) b = cpu::make_cpu_backend({.n_threads = nth});
  return *b;
}

cpu::thread_pool& pool(int nth) {
  static std::map<int, std::unique_ptr<cpu::thread_pool>> pools;
  auto& p = pools[nth];
  if (!p) p = std::make_unique<cpu::thread_pool>(nth);
  return *p;
}

std::vector<float> random_floats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

aligned_buffer& stream_source() {
  static aligned_buffer b(stream_bytes);
  return b;
}

// ---- memory ----

struct memcpy_workload final : workload {
  int nth;
  aligned_buffer dst{stream_bytes};
  explicit memcpy_workload(int n) : nth(n) { bytes = static_cast<double>(stream_bytes); }
  void run() override {
    const size_t per = stream_bytes / static_cast<size_t>(nth);
    const uint8_t* src = stream_source().p;
    pool(nth).run(nth, [&](int ith, cpu::barrier&) {
      std::memcpy(dst.p + per * static_cast<size_t>(ith), src + per * static_cast<size_t>(ith), per);
    });
  }
};

struct read_workload final : workload {
  int nth;
  std::vector<uint64_t> sums;
  explicit read_workload(int n) : nth(n), sums(static_cast<size_t>(n) * 8) { bytes = static_cast<double>(stream_bytes); }
  void run() override {
    const size_t words = stream_bytes / sizeof(uint64_t) / static_cast<size_t>(nth);
    const uint64_t* base = reinterpret_cast<const uint64_t*>(stream_source().p);
    pool(nth).run(nth, [&](int ith, cpu::barrier&) {
      const uint64_t* p = base + words * static_cast<size_t>(ith);
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (size_t i = 0; i < words; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
      }
      sums[static_cast<size_t>(ith) * 8] = a0 + a1 + a2 + a3;  // one cache line per thread
    });
  }
};

// ---- mul_mat through the backend ----

// m x k weights of type t in `copies` consecutive matrices: 64 distinct rows quantized from random values,
// repeated (the values do not change the speed). The last one made is cached for the next workload; a
// workload keeps its own reference.
struct weight_pool {
  std::unique_ptr<aligned_buffer> buf;
  size_t matrix_bytes = 0;
  int64_t copies = 1;
};

std::shared_ptr<const weight_pool> weights(type t, int64_t m, int64_t k, size_t min_total) {
  static std::string cached_key;
  static std::shared_ptr<const weight_pool> cached;
  const std::string key =
      std::string(type_name(t)) + "/" + std::to_string(m) + "x" + std::to_string(k) + "/" + std::to_string(min_total);
  if (key == cached_key && cached) return cached;
  cached.reset();  // 256 MiB each: let the old one go first unless a workload still holds it
  cached_key.clear();
  const size_t row = row_size(t, k);
  auto w = std::make_shared<weight_pool>();
  w->matrix_bytes = row * static_cast<size_t>(m);
  w->copies = std::max<int64_t>(1, static_cast<int64_t>((min_total + w->matrix_bytes - 1) / w->matrix_bytes));
  w->buf = std::make_unique<aligned_buffer>(w->matrix_bytes * static_cast<size_t>(w->copies));
  constexpr int64_t distinct = 64;
  const std::vector<float> v = random_floats(static_cast<size_t>(k * distinct), 7);
  std::vector<uint8_t> rows(row * distinct);
  for (int64_t r = 0; r < distinct; ++r) {
    traits(t).from_float_ref(v.data() + r * k, rows.data() + row * static_cast<size_t>(r), k);
  }
  for (int64_t r = 0; r < m * w->copies; ++r) {
    std::memcpy(w->buf->p + row * static_cast<size_t>(r), rows.data() + row * static_cast<size_t>(r % distinct), row);
  }
  cached = std::move(w);
  cached_key = key;
  return cached;
}

// One mul_mat node, dst = a * b, with data placed by hand so that a can point at any weight copy.
struct mm_graph {
  context ctx{{.max_tensors = 8, .no_alloc = true}};
  tensor* a = nullptr;
  tensor* b = nullptr;
  tensor* out = nullptr;
  std::vector<float> b_data, out_data;
  graph g;

  mm_graph(type t, int64_t m, int64_t k, int64_t n) {
    a = ctx.new_tensor_2d(t, k, m);
    b = ctx.new_tensor_2d(type::f32, k, n);
    out = mul_mat(ctx, a, b);
    b_data = random_floats(static_cast<size_t>(k * n), 9);
    out_data.resize(static_cast<size_t>(m * n));
    b->data = b_data.data();
    out->data = out_data.data();
    g.build_forward_expand(out);
  }
};

struct matvec_workload final : workload {
  std::shared_ptr<const weight_pool> w;
  mm_graph mg;
  cpu::cpu_backend& be;
  int64_t copy = 0;
  matvec_workload(type t, int64_t m, int64_t k, int nth, int64_t n)
      : w(weights(t, m, k, stream_bytes)), mg(t, m, k, n), be(backend(nth)) {
    bytes = static_cast<double>(w->matrix_bytes);
    flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  }
  void run() override {
    mg.a->data = w->buf->p + w->matrix_bytes * static_cast<size_t>(copy);
    copy = copy + 1 == w->copies ? 0 : copy + 1;
    be.graph_compute(mg.g);
  }
};

struct matmul_workload final : workload {
  std::shared_ptr<const weight_pool> w;
  mm_graph mg;
  cpu::cpu_backend& be;
  int64_t min_batch;
  matmul_workload(type t, mm_path path, int64_t m, int64_t k, int64_t n, int nth)
      : w(weights(t, m, k, 0)), mg(t, m, k, n), be(backend(nth)),
        min_batch(path == mm_path::quant ? -1 : path == mm_path::blas ? 1 : 0) {
    mg.a->data = w->buf->p;
    flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  }
  void run() override {
    cpu::set_blas_min_batch(min_batch);
    be.graph_compute(mg.g);
    cpu::set_blas_min_batch(0);
  }
};

#ifdef TROUPE_HAVE_BLAS
struct sgemm_workload final : workload {
  int64_t m, k, n;
  int nth;
  std::vector<float> a, b, c;
  sgemm_workload(int64_t m_, int64_t k_, int64_t n_, int nth_)
      : m(m_), k(k_), n(n_), nth(nth_), a(random_floats(static_cast<size_t>(m * k), 1)),
        b(random_floats(static_cast<size_t>(k * n), 2)), c(static_cast<size_t>(m * n)) {
    flops = 2.0 * static_cast<double>(m) * static_cast<double>(k) * static_cast<double>(n);
  }
  void run() override {
    const int before = openblas_get_num_threads();
    openblas_set_num_threads(nth);
    // The product mul_mat computes: C[n x m] = B[n x k] * A[m x k]^T, row-major.
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                1.0f, b.data(), static_cast<int>(k), a.data(), static_cast<int>(k), 0.0f, c.data(), static_cast<int>(m));
    openblas_set_num_threads(before);
  }
};
#endif

// ---- attention ----

struct attention_workload final : workload {
  static constexpr int64_t hd = 64, n_head = 32, n_head_kv = 8;
  context ctx{{.max_tensors = 16, .no_alloc = true}};
  int64_t n_kv, n_tok, copies;
  size_t kv_bytes;
  std::vector<uint8_t> kv_data;  // copies x (K, V)
  std::vector<float> q_data, mask_data, out_data;
  tensor *k = nullptr, *v = nullptr, *out = nullptr;
  graph g;
  cpu::cpu_backend& be;
  int64_t copy = 0;

  attention_workload(type t, int64_t depth, int64_t tok, int nth) : n_kv(depth + tok), n_tok(tok), be(backend(nth)) {
    const int64_t n_embd = hd * n_head_kv;
    const size_t row = row_size(t, n_embd);
    kv_bytes = row * static_cast<size_t>(n_kv);
    copies = std::max<int64_t>(1, static_cast<int64_t>(stream_bytes / (2 * kv_bytes)));
    kv_data.resize(2 * kv_bytes * static_cast<size_t>(copies));
    const std::vector<float> r = random_floats(static_cast<size_t>(n_embd * n_kv), 11);
    for (int64_t c = 0; c < 2 * copies; ++c) {
      uint8_t* dst = kv_data.data() + static_cast<size_t>(c) * kv_bytes;
      for (int64_t cell = 0; cell < n_kv; ++cell) traits(t).from_float_ref(r.data() + cell * n_embd, dst + cell * row, n_embd);
    }
    tensor* kc = ctx.new_tensor_2d(t, n_embd, n_kv);
    tensor* vc = ctx.new_tensor_2d(t, n_embd, n_kv);
    tensor* q = ctx.new_tensor_3d(type::f32, hd, n_head, n_tok);
    tensor* mask = ctx.new_tensor_2d(type::f32, n_kv, n_tok);
    q_data = random_floats(static_cast<size_t>(hd * n_head * n_tok), 12);
    mask_data.assign(static_cast<size_t>(n_kv * n_tok), 0.0f);
    for (int64_t j = 0; j < n_tok; ++j) {  // token j sees the depth cells and the tokens up to itself
      for (int64_t c = depth + j + 1; c < n_kv; ++c) mask_data[static_cast<size_t>(j * n_kv + c)] = -INFINITY;
    }
    out_data.resize(static_cast<size_t>(hd * n_head * n_tok));
    // Data first: a view takes its source's address when it is made.
    q->data = q_data.data();
    mask->data = mask_data.data();
    kc->data = kv_data.data();
    vc->data = kv_data.data() + kv_bytes;
    k = view_3d(ctx, kc, hd, n_kv, n_head_kv, row, row_size(t, hd), 0);
    v = view_3d(ctx, vc, hd, n_kv, n_head_kv, row, row_size(t, hd), 0);
    out = flash_attn(ctx, permute(ctx, q, 0, 2, 1, 3), k, v, mask, 0.125f);
    out->data = out_data.data();
    g.build_forward_expand(out);
    bytes = 2.0 * static_cast<double>(kv_bytes);
    flops = 4.0 * hd * n_head * static_cast<double>(n_tok) * static_cast<double>(n_kv);
  }
  void run() override {
    uint8_t* base = kv_data.data() + static_cast<size_t>(copy) * 2 * kv_bytes;
    k->view_src->data = base;
    v->view_src->data = base + kv_bytes;
    k->data = base;
    v->data = base + kv_bytes;
    copy = (copy + 1) % copies;
    be.graph_compute(g);
  }
};

// ---- dispatch ----

struct dispatch_workload final : workload {
  int nth;
  explicit dispatch_workload(int n) : nth(n) { items = 1; }
  void run() override {
    pool(nth).run(nth, [](int, cpu::barrier&) {});
  }
};

struct graph_nodes_workload final : workload {
  static constexpr int n_nodes = 64;
  context ctx{{.max_tensors = 2 * n_nodes, .mem_size = 1 << 20}};
  graph g;
  cpu::cpu_backend& be;
  explicit graph_nodes_workload(int nth) : be(backend(nth)) {
    tensor* x = ctx.new_tensor_1d(type::f32, 16);
    std::memset(x->data, 0, 64);
    tensor* cur = x;
    for (int i = 0; i < n_nodes; ++i) cur = scale(ctx, cur, 1.0f);
    g.build_forward_expand(cur);
    items = n_nodes;
  }
  void run() override { be.graph_compute(g); }
};

}  // namespace

std::unique_ptr<workload> make_memcpy(int nth) { return std::make_unique<memcpy_workload>(nth); }
std::unique_ptr<workload> make_read(int nth) { return std::make_unique<read_workload>(nth); }

std::unique_ptr<workload> make_matvec(type t, int64_t m, int64_t k, int nth, int64_t n) {
  return std::make_unique<matvec_workload>(t, m, k, nth, n);
}

std::unique_ptr<workload> make_matmul(type t, mm_path path, int64_t m, int64_t k, int64_t n, int nth) {
  return std::make_unique<matmul_workload>(t, path, m, k, n, nth);
}

std::unique_ptr<workload> make_attention(type kv, int64_t depth, int64_t n_tok, int nth) {
  return std::make_unique<attention_workload>(kv, depth, n_tok, nth);
}

std::unique_ptr<workload> make_sgemm(int64_t m, int64_t k, int64_t n, int nth) {
#ifdef TROUPE_HAVE_BLAS
  return std::make_unique<sgemm_workload>(m, k, n, nth);
#else
  (void)m, (void)k, (void)n, (void)nth;
  return nullptr;
#endif
}

std::unique_ptr<workload> make_dispatch(int nth) { return std::make_unique<dispatch_workload>(nth); }
std::unique_ptr<workload> make_graph_nodes(int nth) { return std::make_unique<graph_nodes_workload>(nth); }

std::string blas_description() {
#ifdef TROUPE_HAVE_BLAS
  return std::string("OpenBLAS ") + openblas_get_corename();
#else
  return "none";
#endif
}

}  // namespace troupe::bench
