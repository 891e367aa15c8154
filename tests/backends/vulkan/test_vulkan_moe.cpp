// A mixture of experts split as llama.cpp's --cpu-moe splits it: the experts' weights in host memory,
// mapped in place from the file, everything else on Vulkan0. Checked against the model on the CPU alone
// (greedy tokens, logits), and on the buffers' address ranges: the host buffers hold exactly the experts'
// ranges (and the token embeddings', which stay in host memory in every placement, as in llama.cpp), the
// device's buffers never an expert.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <regex>

#include "backends/registry.h"
#include "llm/llm_context.h"
#include "llm/offload.h"
#include "tests/backends/vulkan/vulkan_test_device.h"
#include "tests/llm/synthetic_model.h"
#include "tests/support/greedy.h"

using namespace troupe;

namespace {

struct span_of {
  const char* begin;
  const char* end;
};

bool is_expert(const std::string& name) { return std::regex_search(name, std::regex("\\.ffn_(up|down|gate)_exps\\.")); }

}  // namespace

TEST_CASE("Vulkan0 with --cpu-moe: the experts' bytes only in host buffers, the same tokens as the CPU alone", "[vulkan][moe]") {
  vulkan::device* d = test::first_vulkan_device();
  if (d == nullptr) return;
  register_builtin_backends();
  const auto path = std::filesystem::temp_directory_path() / "troupe_vulkan_moe.gguf";
  testing::write_synthetic_model("qwen3moe", path);
  const std::vector<int32_t> prompt = {3, 17, 42, 5, 99, 7, 64, 1};

  auto cpu = llm::model::load(path);
  llm::llm_context cpu_ctx(*cpu, {.n_ctx = 64, .type_k = type::f32, .type_v = type::f32, .n_threads = 2});
  const std::vector<int32_t> want = test::greedy(cpu_ctx, prompt, 12);
  const std::vector<float> want_logits(cpu_ctx.logits(0).begin(), cpu_ctx.logits(0).end());

  llm::offload_request r{.n_gpu_layers = 99};
  r.cpu_moe = true;
  auto split = llm::model::load(path, {.devices = llm::offload_devices(r, path.string()), .overrides = llm::cpu_moe_overrides(r)});
  llm::llm_context ctx(*split, {.n_ctx = 64, .type_k = type::f32, .type_v = type::f32, .n_threads = 2});
  CHECK(test::greedy(ctx, prompt, 12) == want);
  const auto got = ctx.logits(0);
  REQUIRE(got.size() == want_logits.size());
  double max_err = 0;
  for (size_t i = 0; i < got.size(); ++i) max_err = std::max(max_err, std::abs(static_cast<double>(got[i]) - want_logits[i]));
  CHECK(max_err < 2e-3);

  // The experts' mul_mat_id ran on the CPU, the rest of the layers on Vulkan0.
  bool moe_on_cpu = false, attention_on_vulkan = false;
  for (const scheduler::split_record& s : ctx.sched().last_run()) {
    const bool on_cpu = ctx.sched().backend(s.backend).device().type() == device_type::cpu;
    for (op o : s.ops) {
      if (o == op::mul_mat_id) {
        CHECK(on_cpu);
        moe_on_cpu = true;
      }
      if (o == op::rope && !on_cpu) attention_on_vulkan = true;
    }
  }
  CHECK(moe_on_cpu);
  CHECK(attention_on_vulkan);

  // Address ranges: every weight's bytes lie in a buffer of its own placement, host buffers are covered by
  // the experts and the token embeddings (up to alignment padding), device buffers hold no expert.
  const model_weights& w = split->weights();
  std::vector<std::pair<span_of, std::string>> host_tensors;
  size_t experts = 0, device_tensors = 0;
  for (const gguf_tensor_info& info : split->loader().tensors()) {
    for (buffer_type_i* bt : w.plan().uses(info.name)) {
      const tensor* t = w.get(info.name, bt);
      const char* p = static_cast<const char*>(t->data);
      buffer_i* buf = w.buffer_containing(p, nbytes(*t));
      INFO("tensor " << info.name << " in " << bt->name());
      REQUIRE(buf != nullptr);
      CHECK(&buf->type() == bt);
      if (bt->is_host()) {
        CHECK((is_expert(info.name) || info.name == "token_embd.weight"));
        host_tensors.push_back({{p, p + nbytes(*t)}, info.name});
      } else {
        CHECK_FALSE(is_expert(info.name));
        ++device_tensors;
      }
      experts += is_expert(info.name) ? 1 : 0;
    }
  }
  CHECK(experts == 3 * testing::synthetic_shape{}.n_layer);
  CHECK(device_tensors > 0);
  std::sort(host_tensors.begin(), host_tensors.end(), [](const auto& a, const auto& b) { return a.first.begin < b.first.begin; });
  size_t host_buffers = 0;
  for (const buffer_ptr& b : w.buffers()) {
    if (!b->type().is_host()) {
      // No host tensor's bytes inside a device buffer's memory (where the device maps host memory).
      continue;
    }
    ++host_buffers;
    const char* lo = static_cast<const char*>(b->base());
    const char* hi = lo + b->size();
    // The buffer's bytes are the tensors in it, back to back up to the file's alignment (32 bytes).
    const char* at = lo;
    size_t inside = 0;
    for (const auto& [s, name] : host_tensors) {
      if (s.begin < lo || s.end > hi) continue;
      INFO("host buffer tensor " << name);
      CHECK(s.begin - at < 32);
      at = s.end;
      ++inside;
    }
    CHECK(inside > 0);
    CHECK(hi - at < 32);
  }
  CHECK(host_buffers >= 1);
  std::filesystem::remove(path);
}

TEST_CASE("a mixture of experts fully on Vulkan0: the experts' products on the device, the same tokens as the CPU alone", "[vulkan][moe]") {
  vulkan::device* d = test::first_vulkan_device();
  if (d == nullptr) return;
  register_builtin_backends();
  const auto path = std::filesystem::temp_directory_path() / "troupe_vulkan_moe_full.gguf";
  for (const char* arch : {"qwen2moe", "mixtral"}) {
    INFO(arch);
    testing::write_synthetic_model(arch, path);
    const std::vector<int32_t> prompt = {3, 17, 42, 5, 99, 7, 64, 1};
    auto cpu = llm::model::load(path);
    llm::llm_context cpu_ctx(*cpu, {.n_ctx = 64, .type_k = type::f32, .type_v = type::f32, .n_threads = 2});
    const std::vector<int32_t> want = test::greedy(cpu_ctx, prompt, 12);
    auto full = llm::model::load(path, {.devices = llm::offload_devices({.n_gpu_layers = 99}, path.string())});
    llm::llm_context ctx(*full, {.n_ctx = 64, .type_k = type::f32, .type_v = type::f32, .n_threads = 2});
    CHECK(test::greedy(ctx, prompt, 12) == want);
    int on_vulkan = 0;
    for (const scheduler::split_record& s : ctx.sched().last_run()) {
      const bool on_cpu = ctx.sched().backend(s.backend).device().type() == device_type::cpu;
      for (op o : s.ops) on_vulkan += o == op::mul_mat_id && !on_cpu ? 1 : 0;
    }
    CHECK(on_vulkan == 3 * static_cast<int>(testing::synthetic_shape{}.n_layer));
  }
  std::filesystem::remove(path);
}
