// The CUDA backend on a GPU: devices, buffers, every op of the conformance table against the CPU reference,
// and real models (stories260K's reference tokens, SmolLM2's perplexity against the CPU's). Without a GPU
// (CI) every case skips with cudart's reason (ctest: Skipped); TROUPE_REQUIRE_GPU=1 (the GPU machine's script)
// makes that a failure.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/cuda_device.h"
#include "backends/registry.h"
#include "llm/llm_context.h"
#include "runtime/ops.h"
#include "tests/backends/conformance_cases.h"
#include "tests/backends/conformance_runner.h"
#include "tests/support/buffer_bytes.h"
#include "tests/support/greedy.h"
#include "tests/support/skip.h"
#include "tests/support/story.h"
#include "tests/test_models.h"

using namespace troupe;

namespace {

cuda::device* first_device() {
  const auto devs = cuda::devices();
  if (!devs.empty()) return devs[0];
  test::skip_gpu("no CUDA device (" + cuda::status() + ")");
  return nullptr;
}



}  // namespace

TEST_CASE("CUDA devices are registered as CUDA0.. with what cudart reports", "[cuda][gpu]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  register_builtin_backends();
  CHECK(registry::instance().find("CUDA0") == d);
  CHECK(d->type() == device_type::gpu);
  const device_memory m = d->memory();
  CHECK(m.total > 0);
  CHECK(m.free <= m.total);
  CHECK(d->buffer_type().max_size() == d->info().total);
  CHECK(d->host_buffer_type() != nullptr);
  CHECK(d->host_buffer_type()->is_host());
  CHECK_THAT(format_devices(), Catch::Contains("CUDA0"));
}

TEST_CASE("a CUDA buffer holds the bytes written at any offset and length, through both staging buffers", "[cuda][gpu]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  test::check_buffer_bytes(d->buffer_type(), 3 * cuda::device::staging_bytes + 13);  // several staging pieces, odd length
}

TEST_CASE("an allocation the CUDA device cannot hold is an out-of-memory error naming it, and it keeps serving", "[cuda][gpu]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  buffer_type_i& bt = d->buffer_type();
  try {
    bt.alloc_buffer(bt.max_size() - 4096);  // the whole device: more than is free
    FAIL("the whole device memory was allocated");
  } catch (const out_of_memory_error& e) {
    CHECK_THAT(e.what(), Catch::Contains("CUDA0") && Catch::Contains("cudaMalloc"));
  }
  buffer_ptr ok = bt.alloc_buffer(4096);
  CHECK(ok->size() == 4096);
}

TEST_CASE("every conformance case the CUDA device claims matches the CPU reference on it", "[cuda][gpu][conformance]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  backend_ptr be = d->init_backend();
  auto compared = testing::compare_supported_cases(*be);
  testing::check_gpu_coverage(compared);
}

TEST_CASE("CUDA0 takes the dp4a kernel for one activation column and cuBLAS for 64, both matching the CPU", "[cuda][gpu]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  backend_ptr be = d->init_backend();
  for (int64_t n : {int64_t{1}, int64_t{64}}) {
    INFO("columns " << n);
    context ctx({.max_tensors = 8, .no_alloc = true});
    tensor* w = ctx.new_tensor_2d(type::q4_K, 512, 96);
    tensor* x = ctx.new_tensor_2d(type::f32, 512, n);
    tensor* y = mul_mat(ctx, w, x);
    buffer_ptr buf = alloc_ctx_tensors(ctx, d->buffer_type());
    std::mt19937 rng(1);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    std::vector<float> wf(512 * 96), xf(static_cast<size_t>(512 * n));
    for (float& v : wf) v = dist(rng);
    for (float& v : xf) v = dist(rng);
    std::vector<uint8_t> wq(nbytes(*w));
    traits(type::q4_K).from_float_ref(wf.data(), wq.data(), static_cast<int64_t>(wf.size()));
    tensor_set(*w, wq.data(), 0, wq.size());
    tensor_set(*x, xf.data(), 0, nbytes(*x));
    graph g;
    g.build_forward_expand(y);
    be->graph_compute(g);
    const auto& steps = dynamic_cast<cuda::backend&>(*be).last_steps();
    if (n == 1) {
      CHECK(steps.count("mat_vec") == 1);
      CHECK(steps.count("quantize") == 1);
    } else {
      CHECK(steps.count("gemm") == 1);
      CHECK(steps.count("dequant") == 1);
    }
    std::vector<float> got(static_cast<size_t>(96 * n));
    tensor_get(*y, got.data(), 0, nbytes(*y));
    std::vector<float> wd(wf.size());
    traits(type::q4_K).to_float(wq.data(), wd.data(), static_cast<int64_t>(wd.size()));
    std::vector<float> ref(got.size());
    std::vector<double> bound(got.size());  // what the conformance runner allows a product's element
    for (int64_t j = 0; j < n; ++j) {
      const testing::abs_row act = testing::abs_row_of({xf.begin() + j * 512, xf.begin() + (j + 1) * 512});
      for (int64_t i = 0; i < 96; ++i) {
        double s = 0;
        for (int64_t l = 0; l < 512; ++l) s += static_cast<double>(wd[static_cast<size_t>(i * 512 + l)]) * xf[static_cast<size_t>(j * 512 + l)];
        ref[static_cast<size_t>(j * 96 + i)] = static_cast<float>(s);
        bound[static_cast<size_t>(j * 96 + i)] =
            testing::dot_bound(type::q4_K, testing::abs_row_of({wd.begin() + i * 512, wd.begin() + (i + 1) * 512}), act);
      }
    }
    CHECK(testing::nmse(got, ref) < 1e-4);
    CHECK(testing::elements_outside(got, ref, bound) == 0);
  }
}

TEST_CASE("a kernel's failure on the CUDA device is an error naming the node, and the backend keeps serving", "[cuda][gpu]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* x = ctx.new_tensor_1d(type::f32, 1024);
  tensor* y = scale(ctx, x, 2.0f);
  buffer_ptr buf = alloc_ctx_tensors(ctx, d->buffer_type());
  graph g;
  g.build_forward_expand(y);
  backend_ptr be = d->init_backend();
  tensor* q = cpy(ctx, x, ctx.new_tensor_1d(type::q4_0, 1024));
  graph bad;
  bad.build_forward_expand(q);
  CHECK_THROWS_WITH(be->graph_compute(bad), Catch::Contains("CUDA0") && Catch::Contains("not supported"));
  std::vector<float> in(1024, 1.5f), out(1024);
  tensor_set(*x, in.data(), 0, nbytes(*x));
  be->graph_compute(g);
  tensor_get(*y, out.data(), 0, nbytes(*y));
  CHECK(std::all_of(out.begin(), out.end(), [](float v) { return v == 3.0f; }));
}

TEST_CASE("stories260K fully on CUDA0: the reference's greedy tokens", "[cuda][gpu][models]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = llm::model::load(*path, {.devices = {{d, 99}}});
  for (type kv : {type::f16, type::f32}) {
    INFO("KV cache " << type_name(kv));
    llm::llm_context ctx(*m, {.n_ctx = 128, .type_k = kv, .type_v = kv, .n_threads = 2});
    CHECK(test::greedy(ctx, test::stories_prompt, 32) == test::stories_ref);
  }
}

TEST_CASE("SmolLM2 fully on CUDA0: perplexity within 1% of the CPU's", "[cuda][gpu][models]") {
  cuda::device* d = first_device();
  if (d == nullptr) return;
  const auto path = test::smollm2_path();
  if (!path) return;
  const double cpu = test::story_ppl(*path, {});
  const double gpu = test::story_ppl(*path, {.devices = {{d, 99}}});
  WARN("perplexity over story.txt: CPU " << cpu << ", CUDA0 " << gpu);
  CHECK(std::abs(gpu - cpu) / cpu < 0.01);
}
