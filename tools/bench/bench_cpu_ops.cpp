// CPU op benchmarks, side by side in one run so that ratios mean something on a shared machine:
//
//   memcpy/threads:N               copy of a 256 MiB buffer (bytes/s = bytes copied)
//   read/threads:N                 sum over a 256 MiB buffer (bytes/s = bytes read)
//   matvec/<w>/<m>x<k>/threads:N   mul_mat of m x k weights of type w by one f32 vector through the CPU
//                                  backend (activation quantized once per op); bytes/s = weight bytes read.
//                                  The weights rotate through >= 256 MiB of copies, so they stream from
//                                  memory as in token generation, never from the last-level cache.
//   matmul/<w>/<path>/b<n>/threads:N  mul_mat of 4096 x 4096 weights by n f32 vectors; GFLOPS = 2 m k n per
//                                  second. path: auto (the backend's choice), quant (SIMD dot products,
//                                  BLAS off), blas (dequantize + sgemm forced).
//   sgemm/b<n>/threads:N           OpenBLAS cblas_sgemm alone at the same size, OpenBLAS on N threads.
//   dispatch/threads:N             thread_pool::run of an empty job: the cost of waking N threads and
//                                  waiting for them (one graph, one dispatch).
//   graph_nodes/threads:N          a graph of 64 trivial nodes: time per node (kernel + barrier).
//
// scripts/bench-cpu-ops runs this with a filter and prints the tables with ratios. TROUPE_CPU_ISA=avx2 (or
// scalar) lowers the kernels' instruction-set level for comparison.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/cpu/cpu_features.h"
#include "backends/cpu/kernels.h"
#include "backends/cpu/thread_pool.h"
#include "runtime/context.h"
#include "runtime/graph.h"
#include "runtime/ops.h"
#include "runtime/types.h"

#ifdef TROUPE_HAVE_BLAS
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#include <cblas.h>
#pragma GCC diagnostic pop
#endif

using namespace troupe;

namespace {

constexpr size_t stream_bytes = size_t{256} << 20;

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

// ---- memory bandwidth ----------------------------------------------------------------------------------

void bm_memcpy(benchmark::State& state, int nth) {
  static aligned_buffer src(stream_bytes), dst(stream_bytes);
  const size_t per = stream_bytes / static_cast<size_t>(nth);
  for (auto _ : state) {
    pool(nth).run(nth, [&](int ith, cpu::barrier&) {
      std::memcpy(dst.p + per * static_cast<size_t>(ith), src.p + per * static_cast<size_t>(ith), per);
    });
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(stream_bytes));
}

void bm_read(benchmark::State& state, int nth) {
  static aligned_buffer src(stream_bytes);
  const size_t words = stream_bytes / sizeof(uint64_t) / static_cast<size_t>(nth);
  std::vector<uint64_t> sums(static_cast<size_t>(nth) * 8);
  for (auto _ : state) {
    pool(nth).run(nth, [&](int ith, cpu::barrier&) {
      const uint64_t* p = reinterpret_cast<const uint64_t*>(src.p) + words * static_cast<size_t>(ith);
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (size_t i = 0; i < words; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
      }
      sums[static_cast<size_t>(ith) * 8] = a0 + a1 + a2 + a3;
    });
    benchmark::DoNotOptimize(sums.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(stream_bytes));
}

// ---- mul_mat through the backend ---------------------------------------------------------------------

// Weights of type t, m x k, in `copies` consecutive matrices (rows quantized once from random values and
// repeated: the values do not change the speed).
struct weight_pool {
  std::unique_ptr<aligned_buffer> buf;
  size_t matrix_bytes = 0;
  int64_t copies = 1;
};

weight_pool make_weights(type t, int64_t m, int64_t k, size_t min_total) {
  weight_pool w;
  const size_t row = row_size(t, k);
  w.matrix_bytes = row * static_cast<size_t>(m);
  w.copies = std::max<int64_t>(1, static_cast<int64_t>((min_total + w.matrix_bytes - 1) / w.matrix_bytes));
  w.buf = std::make_unique<aligned_buffer>(w.matrix_bytes * static_cast<size_t>(w.copies));
  constexpr int64_t distinct = 64;
  const std::vector<float> v = random_floats(static_cast<size_t>(k * distinct), 7);
  std::vector<uint8_t> rows(row * distinct);
  for (int64_t r = 0; r < distinct; ++r) traits(t).from_float_ref(v.data() + r * k, rows.data() + row * static_cast<size_t>(r), k);
  for (int64_t r = 0; r < m * w.copies; ++r) {
    std::memcpy(w.buf->p + row * static_cast<size_t>(r), rows.data() + row * static_cast<size_t>(r % distinct), row);
  }
  return w;
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

void bm_matvec(benchmark::State& state, type t, int64_t m, int64_t k, int nth) {
  static std::map<std::string, weight_pool> pools;  // shared by the thread counts of one shape
  const std::string key = std::string(type_name(t)) + "/" + std::to_string(m) + "x" + std::to_string(k);
  auto it = pools.find(key);
  if (it == pools.end()) {
    pools.clear();  // one pool at a time: 256 MiB each
    it = pools.emplace(key, make_weights(t, m, k, stream_bytes)).first;
  }
  const weight_pool& w = it->second;
  mm_graph mg(t, m, k, 1);
  cpu::cpu_backend& be = backend(nth);
  int64_t copy = 0;
  for (auto _ : state) {
    mg.a->data = w.buf->p + w.matrix_bytes * static_cast<size_t>(copy);
    copy = copy + 1 == w.copies ? 0 : copy + 1;
    be.graph_compute(mg.g);
    benchmark::DoNotOptimize(mg.out_data.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(w.matrix_bytes));
  state.counters["weight_MiB"] = static_cast<double>(w.matrix_bytes) / (1 << 20);
}

enum class mm_path { automatic, quant, blas };

void bm_matmul(benchmark::State& state, type t, mm_path path, int64_t m, int64_t k, int64_t n, int nth) {
  static std::map<std::string, weight_pool> pools;
  const std::string key = std::string(type_name(t)) + "/" + std::to_string(m) + "x" + std::to_string(k);
  auto it = pools.find(key);
  if (it == pools.end()) {
    pools.clear();
    it = pools.emplace(key, make_weights(t, m, k, 0)).first;
  }
  mm_graph mg(t, m, k, n);
  mg.a->data = it->second.buf->p;
  cpu::set_blas_min_batch(path == mm_path::quant ? -1 : path == mm_path::blas ? 1 : 0);
  cpu::cpu_backend& be = backend(nth);
  for (auto _ : state) {
    be.graph_compute(mg.g);
    benchmark::DoNotOptimize(mg.out_data.data());
  }
  cpu::set_blas_min_batch(0);
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * static_cast<double>(m * k * n) * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
}

#ifdef TROUPE_HAVE_BLAS
void bm_sgemm(benchmark::State& state, int64_t m, int64_t k, int64_t n, int nth) {
  const std::vector<float> a = random_floats(static_cast<size_t>(m * k), 1);
  const std::vector<float> b = random_floats(static_cast<size_t>(k * n), 2);
  std::vector<float> c(static_cast<size_t>(m * n));
  const int before = openblas_get_num_threads();
  openblas_set_num_threads(nth);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n), static_cast<int>(m), static_cast<int>(k),
                1.0f, b.data(), static_cast<int>(k), a.data(), static_cast<int>(k), 0.0f, c.data(), static_cast<int>(m));
    benchmark::DoNotOptimize(c.data());
  }
  openblas_set_num_threads(before);
  state.counters["GFLOPS"] =
      benchmark::Counter(2.0 * static_cast<double>(m * k * n) * static_cast<double>(state.iterations()) * 1e-9,
                         benchmark::Counter::kIsRate);
}
#endif

// ---- dispatch ------------------------------------------------------------------------------------------

void bm_dispatch(benchmark::State& state, int nth) {
  cpu::thread_pool& p = pool(nth);
  for (auto _ : state) p.run(nth, [](int, cpu::barrier&) {});
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()));  // ops per second
}

void bm_graph_nodes(benchmark::State& state, int nth) {
  constexpr int n_nodes = 64;
  context ctx({.max_tensors = 2 * n_nodes, .mem_size = 1 << 20});
  tensor* x = ctx.new_tensor_1d(type::f32, 16);
  std::memset(x->data, 0, 64);
  tensor* cur = x;
  for (int i = 0; i < n_nodes; ++i) cur = scale(ctx, cur, 1.0f);
  graph g;
  g.build_forward_expand(cur);
  cpu::cpu_backend& be = backend(nth);
  for (auto _ : state) be.graph_compute(g);
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations()) * n_nodes);  // nodes per second
}

// ---- registration --------------------------------------------------------------------------------------

const type all_weight_types[] = {type::f32,  type::f16,  type::bf16, type::q4_0, type::q4_1, type::q5_0, type::q5_1,
                                 type::q8_0, type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K};

void register_all() {
  const int threads[] = {1, 2};
  for (int nth : threads) {
    const std::string th = "/threads:" + std::to_string(nth);
    benchmark::RegisterBenchmark(("memcpy" + th).c_str(), bm_memcpy, nth)->UseRealTime()->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("read" + th).c_str(), bm_read, nth)->UseRealTime()->Unit(benchmark::kMillisecond);
  }
  const std::pair<int64_t, int64_t> shapes[] = {{576, 576}, {1536, 576}, {4096, 4096}, {11008, 4096}};
  for (type t : all_weight_types) {
    for (auto [m, k] : shapes) {
      if (k % traits(t).block_size != 0) continue;  // K-quants need rows of whole 256-value blocks
      for (int nth : threads) {
        const std::string name = "matvec/" + std::string(type_name(t)) + "/" + std::to_string(m) + "x" +
                                 std::to_string(k) + "/threads:" + std::to_string(nth);
        benchmark::RegisterBenchmark(name.c_str(), bm_matvec, t, m, k, nth)->UseRealTime()->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // Matrix-matrix: the batches the issue asks for plus the ones around the BLAS crossover.
  const int64_t batches[] = {8, 16, 32, 64, 128, 256, 512};
  const std::pair<mm_path, const char*> paths[] = {
      {mm_path::automatic, "auto"}, {mm_path::quant, "quant"}, {mm_path::blas, "blas"}};
  for (type t : all_weight_types) {
    for (auto [path, pname] : paths) {
      for (int64_t n : batches) {
        for (int nth : threads) {
          const std::string name = "matmul/" + std::string(type_name(t)) + "/" + pname + "/b" + std::to_string(n) +
                                   "/threads:" + std::to_string(nth);
          benchmark::RegisterBenchmark(name.c_str(), bm_matmul, t, path, int64_t{4096}, int64_t{4096}, n, nth)
              ->UseRealTime()
              ->Unit(benchmark::kMillisecond);
        }
      }
    }
  }
#ifdef TROUPE_HAVE_BLAS
  for (int64_t n : batches) {
    for (int nth : threads) {
      const std::string name = "sgemm/b" + std::to_string(n) + "/threads:" + std::to_string(nth);
      benchmark::RegisterBenchmark(name.c_str(), bm_sgemm, int64_t{4096}, int64_t{4096}, n, nth)
          ->UseRealTime()
          ->Unit(benchmark::kMillisecond);
    }
  }
#endif
  for (int nth : threads) {
    const std::string th = "/threads:" + std::to_string(nth);
    benchmark::RegisterBenchmark(("dispatch" + th).c_str(), bm_dispatch, nth)->UseRealTime();
    benchmark::RegisterBenchmark(("graph_nodes" + th).c_str(), bm_graph_nodes, nth)->UseRealTime();
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("troupe_cpu_features", cpu::host_cpu_features().describe());
  benchmark::AddCustomContext("troupe_cpu_isa", std::string(cpu::isa_name(cpu::active_isa())));
#ifdef TROUPE_HAVE_BLAS
  benchmark::AddCustomContext("troupe_blas", "OpenBLAS");
#else
  benchmark::AddCustomContext("troupe_blas", "none");
#endif
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
