// CPU op benchmarks, side by side in one run so that ratios mean something on a shared machine:
//
//   memcpy/threads:N               copy of a 256 MiB buffer (bytes/s = bytes copied)
//   read/threads:N                 sum over a 256 MiB buffer (bytes/s = bytes read)
//   matvec/<w>/<m>x<k>/threads:N   mul_mat of m x k weights of type w by one f32 vector through the CPU
//                                  backend (activation quantized once per op); bytes/s = weight bytes read.
//                                  The weights rotate through >= 256 MiB of copies, so they stream from
//                                  memory as in token generation, never from the last-level cache.
//   matvec_batch/<w>/<m>x<k>/b<n>/threads:N  the same by n f32 vectors (n sequences decoding at once);
//                                  bytes/s = weight bytes read per second (the effective weight bandwidth:
//                                  n times the tokens per byte of weights). b1 is the matvec above.
//   matmul/<w>/<path>/b<n>/threads:N  mul_mat of 4096 x 4096 weights by n f32 vectors; GFLOPS = 2 m k n per
//                                  second. path: auto (the backend's choice), quant (SIMD dot products,
//                                  BLAS off), blas (dequantize + sgemm forced).
//   matmul_shape/<w>/<path>/<m>x<k>/b512/threads:N  the same at SmolLM2-135M's shapes by 512 rows (a prompt).
//   sgemm/b<n>/threads:N           OpenBLAS cblas_sgemm alone at the same size, OpenBLAS on N threads,
//                                  registered just before the matmuls of the same batch and thread count.
//   dispatch/threads:N             thread_pool::run of an empty job: the cost of waking N threads and
//                                  waiting for them (one graph, one dispatch).
//   graph_nodes/threads:N          a graph of 64 trivial nodes: time per node (kernel + barrier).
//
// scripts/bench-cpu-ops runs this with a filter and prints the tables with ratios. TROUPE_CPU_ISA=avx2 (or
// scalar) lowers the kernels' instruction-set level for comparison.
#include <benchmark/benchmark.h>

#include <functional>
#include <memory>
#include <string>

#include "backends/cpu/cpu_features.h"
#include "tools/bench/cpu_ops.h"

using namespace troupe;

namespace {

// One benchmark: make the workload (not timed), run it per iteration, report its rates.
void bm_workload(benchmark::State& state, const std::function<std::unique_ptr<bench::workload>()>& make) {
  const std::unique_ptr<bench::workload> w = make();
  if (!w) {
    state.SkipWithError("not available in this build");
    return;
  }
  for (auto _ : state) {
    w->run();
    benchmark::ClobberMemory();
  }
  const double it = static_cast<double>(state.iterations());
  if (w->bytes > 0) state.SetBytesProcessed(static_cast<int64_t>(w->bytes * it));
  if (w->items > 0) state.SetItemsProcessed(static_cast<int64_t>(w->items * it));
  if (w->flops > 0) state.counters["GFLOPS"] = benchmark::Counter(w->flops * it * 1e-9, benchmark::Counter::kIsRate);
}

const type all_weight_types[] = {type::f32,  type::f16,  type::bf16, type::q4_0, type::q4_1, type::q5_0, type::q5_1,
                                 type::q8_0, type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K};

// ---- registration --------------------------------------------------------------------------------------

void register_all() {
  const int threads[] = {1, 2};
  // Order matters on a small machine: memory and dispatch first, before OpenBLAS's own threaded sgemm has
  // run (its worker threads keep polling for a while after each call unless OPENBLAS_THREAD_TIMEOUT is
  // small, as scripts/bench-cpu-ops sets it).
  for (int nth : threads) {
    const std::string th = "/threads:" + std::to_string(nth);
    benchmark::RegisterBenchmark(("memcpy" + th).c_str(), bm_workload, [nth] { return bench::make_memcpy(nth); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
    benchmark::RegisterBenchmark(("read" + th).c_str(), bm_workload, [nth] { return bench::make_read(nth); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  }
  for (int nth : threads) {
    const std::string th = "/threads:" + std::to_string(nth);
    benchmark::RegisterBenchmark(("dispatch" + th).c_str(), bm_workload, [nth] { return bench::make_dispatch(nth); })
        ->UseRealTime();
    benchmark::RegisterBenchmark(("graph_nodes" + th).c_str(), bm_workload,
                                 [nth] { return bench::make_graph_nodes(nth); })
        ->UseRealTime();
  }
  // flash_attn of a Llama-3.2-1B layer: a decode step and a 64-row prompt micro-batch after 4096 and 16384
  // cells, f16 and quantized caches.
  for (type t : {type::f16, type::q8_0, type::q4_0}) {
    for (int64_t depth : {4096, 16384}) {
      for (int64_t n_tok : {1, 64}) {
        for (int nth : threads) {
          const std::string name = "attention/" + std::string(type_name(t)) + "/d" + std::to_string(depth) + "/n" +
                                   std::to_string(n_tok) + "/threads:" + std::to_string(nth);
          benchmark::RegisterBenchmark(name.c_str(), bm_workload,
                                       [t, depth, n_tok, nth] { return bench::make_attention(t, depth, n_tok, nth); })
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  const std::pair<int64_t, int64_t> shapes[] = {{576, 576}, {1536, 576}, {4096, 4096}, {11008, 4096}};
  for (type t : all_weight_types) {
    for (auto [m, k] : shapes) {
      if (k % traits(t).block_size != 0) continue;  // K-quants need rows of whole 256-value blocks
      for (int nth : threads) {
        const std::string name = "matvec/" + std::string(type_name(t)) + "/" + std::to_string(m) + "x" +
                                 std::to_string(k) + "/threads:" + std::to_string(nth);
        benchmark::RegisterBenchmark(name.c_str(), bm_workload,
                                     [t, m, k, nth] { return bench::make_matvec(t, m, k, nth); })
            ->UseRealTime()
            ->Unit(benchmark::kMicrosecond);
      }
    }
  }
  // Batched matrix-vector products for the types of common models, at SmolLM2-135M's widest shape and a 7B
  // one; batch 1 registered next to the others so that the ratios compare numbers of the same run.
  const type batch_types[] = {type::q4_0, type::q4_1, type::q8_0, type::q4_K, type::q6_K, type::f16};
  for (type t : batch_types) {
    for (auto [m, k] : {std::pair<int64_t, int64_t>{1536, 576}, std::pair<int64_t, int64_t>{4096, 4096}}) {
      if (k % traits(t).block_size != 0) continue;
      for (int nth : threads) {
        for (int64_t n : {1, 2, 4, 8}) {
          const std::string name = "matvec_batch/" + std::string(type_name(t)) + "/" + std::to_string(m) + "x" +
                                   std::to_string(k) + "/b" + std::to_string(n) + "/threads:" + std::to_string(nth);
          benchmark::RegisterBenchmark(name.c_str(), bm_workload,
                                       [t, m, k, nth, n] { return bench::make_matvec(t, m, k, nth, n); })
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  auto add_matmul = [&](type t, bench::mm_path path, const char* pname, int64_t n, int nth) {
    const std::string name = "matmul/" + std::string(type_name(t)) + "/" + pname + "/b" + std::to_string(n) +
                             "/threads:" + std::to_string(nth);
    benchmark::RegisterBenchmark(name.c_str(), bm_workload,
                                 [t, path, n, nth] { return bench::make_matmul(t, path, 4096, 4096, n, nth); })
        ->UseRealTime()
        ->Unit(benchmark::kMillisecond);
  };
  // A prompt's products at SmolLM2-135M's shapes (576 x 576 attention, 1536 x 576 up / gate, 576 x 1536 down)
  // by 512 rows, the paths side by side: where the 4096 x 4096 sweep below streams its rows through L2, these
  // keep a tile's rows in L1 as a small model's prompt does.
  for (type t : {type::f32, type::f16, type::q4_0, type::q4_1, type::q5_0, type::q5_1, type::q8_0, type::q4_K, type::q6_K}) {
    for (auto [m, k] : {std::pair<int64_t, int64_t>{576, 576}, {1536, 576}, {576, 1536}}) {
      if (k % traits(t).block_size != 0) continue;
      for (int nth : threads) {
        for (auto [path, pname] : {std::pair{bench::mm_path::quant, "quant"}, std::pair{bench::mm_path::blas, "blas"}}) {
          const std::string name = "matmul_shape/" + std::string(type_name(t)) + "/" + pname + "/" +
                                   std::to_string(m) + "x" + std::to_string(k) + "/b512/threads:" + std::to_string(nth);
          benchmark::RegisterBenchmark(name.c_str(), bm_workload,
                                       [t, path, m, k, nth] { return bench::make_matmul(t, path, m, k, 512, nth); })
              ->UseRealTime()
              ->Unit(benchmark::kMicrosecond);
        }
      }
    }
  }
  // Per batch and thread count: the OpenBLAS sgemm baseline next to ours, so that a ratio compares numbers
  // taken seconds apart; auto at the batches the targets name, quant and blas at every batch (the BLAS
  // crossover sweep).
  const int64_t batches[] = {16, 32, 64, 128, 256, 512};
  const bool have_blas = bench::blas_description() != "none";
  for (int64_t n : batches) {
    for (int nth : threads) {
      if (have_blas) {
        const std::string name = "sgemm/b" + std::to_string(n) + "/threads:" + std::to_string(nth);
        benchmark::RegisterBenchmark(name.c_str(), bm_workload,
                                     [n, nth] { return bench::make_sgemm(4096, 4096, n, nth); })
            ->UseRealTime()
            ->Unit(benchmark::kMillisecond);
      }
      for (type t : all_weight_types) {
        if (n == 32 || n == 128 || n == 512) add_matmul(t, bench::mm_path::automatic, "auto", n, nth);
        add_matmul(t, bench::mm_path::quant, "quant", n, nth);
        add_matmul(t, bench::mm_path::blas, "blas", n, nth);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  register_all();
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("troupe_cpu_features", cpu::host_cpu_features().describe());
  benchmark::AddCustomContext("troupe_cpu_isa", std::string(cpu::isa_name(cpu::active_isa())));
  benchmark::AddCustomContext("troupe_blas", bench::blas_description());
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
