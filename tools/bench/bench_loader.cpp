// Loader benchmarks.
//
//   ./build/tools/bench/bench_loader [--benchmark_filter=...]
//
// - open_map/stories260K: parse + placement + mmap-in-place load of the real model, then one read of
//   every page (so the figure includes the page faults a first forward pass would take).
// - open_map/1GiB/{warm,cold} and open_copy/1GiB/{warm,cold}: the same for a synthetic 1 GiB GGUF
//   (written once to the temp folder), in place (mmap) and copied (pread into buffers). "cold" evicts the
//   file from the page cache first (posix_fadvise DONTNEED), so the disk is read.
// - parse/per_1000_tensors: parsing a header of 10,000 tensor infos from memory; the time per iteration is
//   reported per 1,000 tensors by the "per_1000" counter.
#include <benchmark/benchmark.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "loader/gguf_writer.h"
#include "loader/model_loader.h"

using namespace troupe;

namespace {

void evict(const std::filesystem::path& p) {
  const int fd = ::open(p.c_str(), O_RDONLY);
  if (fd < 0) return;
  ::fdatasync(fd);
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  ::close(fd);
}

// Reads one byte per page of every weight, so lazily mapped pages are really loaded.
uint64_t touch(const model_weights& w, const model_loader& l) {
  uint64_t sum = 0;
  for (const auto& t : l.tensors()) {
    const auto* p = static_cast<const unsigned char*>(w.get(t.name)->data);
    for (uint64_t i = 0; i < t.n_bytes; i += 4096) sum += p[i];
  }
  return sum;
}

const std::filesystem::path& big_model() {
  static const std::filesystem::path path = [] {
    auto p = std::filesystem::temp_directory_path() / "troupe_bench_1GiB.gguf";
    if (std::filesystem::exists(p) && std::filesystem::file_size(p) > (size_t{1} << 30)) return p;
    // 64 tensors of 16 MiB (f32 [4096, 1024]), written by reference from one zeroed block.
    static std::vector<float> block(size_t{4096} * 1024, 0.5f);
    gguf_writer w;
    w.add("general.architecture", std::string("bench"));
    for (int i = 0; i < 64; ++i) {
      w.add_tensor_ref("blk." + std::to_string(i) + ".w", type::f32, {4096, 1024}, std::as_bytes(std::span(block)));
    }
    w.write_file(p);
    return p;
  }();
  return path;
}

void load_once(benchmark::State& state, const std::filesystem::path& path, bool use_mmap, bool cold) {
  placement_params pp;
  pp.host = &cpu::cpu_device().buffer_type();
  uint64_t bytes = 0;
  for (auto _ : state) {
    if (cold) {
      state.PauseTiming();
      evict(path);
      state.ResumeTiming();
    }
    model_loader loader(path);
    model_weights w = loader.load(loader.plan(pp), {.use_mmap = use_mmap});
    benchmark::DoNotOptimize(touch(w, loader));
    bytes = w.mapped_bytes() + w.copied_bytes();
  }
  state.SetBytesProcessed(static_cast<int64_t>(bytes) * state.iterations());
}

void bm_open_map_stories(benchmark::State& state) {
  const std::filesystem::path p = std::filesystem::path(TROUPE_TEST_MODEL_DIR) / "stories260K.gguf";
  if (!std::filesystem::exists(p)) {
    state.SkipWithError("stories260K.gguf not found next to the project");
    return;
  }
  load_once(state, p, true, false);
}
BENCHMARK(bm_open_map_stories)->Name("open_map/stories260K")->Unit(benchmark::kMicrosecond);

void bm_big(benchmark::State& state) { load_once(state, big_model(), state.range(0) != 0, state.range(1) != 0); }
BENCHMARK(bm_big)->Name("open_map/1GiB/warm")->Args({1, 0})->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(bm_big)->Name("open_map/1GiB/cold")->Args({1, 1})->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(bm_big)->Name("open_copy/1GiB/warm")->Args({0, 0})->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();
BENCHMARK(bm_big)->Name("open_copy/1GiB/cold")->Args({0, 1})->Unit(benchmark::kMillisecond)->Iterations(3)->UseRealTime();

void bm_parse(benchmark::State& state) {
  constexpr int n = 10000;
  gguf_writer w;
  w.add("general.architecture", std::string("bench"));
  std::vector<float> tiny(32, 1.0f);
  for (int i = 0; i < n; ++i) {
    w.add_tensor_ref("blk." + std::to_string(i / 10) + ".tensor_" + std::to_string(i % 10) + ".weight", type::f32, {32},
                     std::as_bytes(std::span(tiny)));
  }
  const std::vector<std::byte> bytes = w.write();
  for (auto _ : state) {
    gguf_file f = parse_gguf(bytes);
    benchmark::DoNotOptimize(f.tensors().size());
  }
  state.counters["per_1000"] = benchmark::Counter(static_cast<double>(state.iterations()) * n / 1000.0,
                                                  benchmark::Counter::kIsRate | benchmark::Counter::kInvert);
}
BENCHMARK(bm_parse)->Name("parse/per_1000_tensors")->Unit(benchmark::kMillisecond);

}  // namespace

BENCHMARK_MAIN();
