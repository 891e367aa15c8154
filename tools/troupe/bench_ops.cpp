// troupe bench ops: CPU kernel throughput without a model, side by side in one run (the workloads of
// tools/bench/bench_cpu_ops; scripts/bench-cpu-ops gives the full tables).
//
//   troupe bench ops [-t 1,2] [--types q4_0,q8_0,q4_K] [--shape 4096x4096] [--batch 512] [--min-time 0.5]
//
// Prints memcpy / read GB/s, matrix-vector weight-read GB/s per type (and its ratio to memcpy), the
// matrix-matrix GFLOP/s at one batch against OpenBLAS sgemm, and the thread pool's dispatch cost.
#include <chrono>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "backends/cpu/cpu_features.h"
#include "runtime/error.h"
#include "tools/bench/cpu_ops.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {
namespace {

struct ops_options {
  std::vector<int> threads = {1, 2};
  std::vector<std::string> types = {"q4_0", "q8_0", "q4_K"};
  std::string shape = "4096x4096";
  int64_t batch = 512;
  double min_time = 0.5;
};

// Seconds per run(): one warm-up, then runs until min_time has passed (at least 3).
double time_per_run(bench::workload& w, double min_time) {
  w.run();
  int n = 0;
  const auto t0 = std::chrono::steady_clock::now();
  double elapsed = 0;
  do {
    w.run();
    ++n;
    elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  } while (elapsed < min_time || n < 3);
  return elapsed / n;
}

double rate(bench::workload& w, double amount, double min_time) { return amount / time_per_run(w, min_time); }

int run_ops(const ops_options& o) {
  int64_t m = 0, k = 0;
  {
    char x = 0;
    std::istringstream in(o.shape);
    if (!(in >> m >> x >> k) || x != 'x' || m <= 0 || k <= 0) {
      std::fprintf(stderr, "troupe bench ops: --shape '%s' is not of the form MxK\n", o.shape.c_str());
      return 1;
    }
  }
  std::vector<type> types;
  for (const std::string& name : o.types) {
    const std::optional<type> t = type_from_name(name);
    if (!t || !traits(*t).supported || traits(*t).vec_dot == nullptr || k % traits(*t).block_size != 0) {
      std::fprintf(stderr, "troupe bench ops: cannot benchmark weights of type '%s' with k = %lld\n", name.c_str(),
                   static_cast<long long>(k));
      return 1;
    }
    types.push_back(*t);
  }
  for (int t : o.threads) {
    if (t < 1) {
      std::fprintf(stderr, "troupe bench ops: thread counts must be >= 1\n");
      return 1;
    }
  }
  std::printf("CPU: %s; kernels: %s; BLAS: %s\n\n", cpu::host_cpu_features().describe().c_str(),
              std::string(cpu::isa_name(cpu::active_isa())).c_str(), bench::blas_description().c_str());

  std::vector<double> memcpy_gbs;
  std::printf("| threads | memcpy GB/s | read GB/s | dispatch us/op |\n|---:|---:|---:|---:|\n");
  for (int t : o.threads) {
    auto mc = bench::make_memcpy(t);
    auto rd = bench::make_read(t);
    auto dp = bench::make_dispatch(t);
    memcpy_gbs.push_back(rate(*mc, mc->bytes, o.min_time) / 1e9);
    const double read_gbs = rate(*rd, rd->bytes, o.min_time) / 1e9;
    const double us = time_per_run(*dp, o.min_time) * 1e6;
    std::printf("| %d | %.1f | %.1f | %.2f |\n", t, memcpy_gbs.back(), read_gbs, us);
  }

  std::printf("\n| weights | %s matvec | threads | GB/s | / memcpy |\n|---|---|---:|---:|---:|\n", o.shape.c_str());
  for (type ty : types) {
    for (size_t i = 0; i < o.threads.size(); ++i) {
      auto w = bench::make_matvec(ty, m, k, o.threads[i]);
      const double gbs = rate(*w, w->bytes, o.min_time) / 1e9;
      std::printf("| %s | | %d | %.1f | %.2f |\n", std::string(type_name(ty)).c_str(), o.threads[i], gbs,
                  gbs / memcpy_gbs[i]);
    }
  }

  std::printf("\n| weights | batch %lld | threads | GFLOP/s | sgemm GFLOP/s | / sgemm |\n|---|---|---:|---:|---:|---:|\n",
              static_cast<long long>(o.batch));
  for (int t : o.threads) {
    auto sg = bench::make_sgemm(m, k, o.batch, t);
    const double sgemm = sg ? rate(*sg, sg->flops, o.min_time) / 1e9 : 0.0;
    std::vector<type> mm_types = {type::f32};
    for (type ty : types) {
      if (ty != type::f32) mm_types.push_back(ty);
    }
    for (type ty : mm_types) {
      auto w = bench::make_matmul(ty, bench::mm_path::automatic, m, k, o.batch, t);
      const double gf = rate(*w, w->flops, o.min_time) / 1e9;
      std::printf("| %s | | %d | %.1f | %.1f | %.2f |\n", std::string(type_name(ty)).c_str(), t, gf, sgemm,
                  sgemm > 0 ? gf / sgemm : 0.0);
    }
  }
  return 0;
}

}  // namespace

command_fn add_bench_ops(CLI::App& app) {
  auto o = std::make_shared<ops_options>();
  app.add_option("-t,--threads", o->threads, "thread counts to compare")->delimiter(',');
  app.add_option("--types", o->types, "weight types of the matrix products")->delimiter(',');
  app.add_option("--shape", o->shape, "weight matrix rows x columns (MxK)");
  app.add_option("--batch", o->batch, "activation rows of the matrix-matrix product")->check(CLI::PositiveNumber);
  app.add_option("--min-time", o->min_time, "seconds per measurement")->check(CLI::PositiveNumber);
  return [o] { return run_ops(*o); };
}

}  // namespace troupe::cli
