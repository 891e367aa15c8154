// Mixture-of-experts routing (route_experts: the graph's gating, top-k choice and weights) on router logits
// whose choice is known, for each gating variant the architectures use; and the mixture-of-experts
// hyperparameters' validation by key.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "runtime/graph.h"
#include "llm/graph.h"
#include "llm/llm_context.h"
#include "runtime/ops.h"
#include "tests/llm/synthetic_model.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

struct routed {
  std::vector<int32_t> chosen;  // [n_used, n]
  std::vector<float> weights;   // [n_used, n]
};

// Routes n tokens of logits (n_expert per token, token-major) with hp's gating on the CPU.
routed route(const hparams& hp, const std::vector<float>& logits, int64_t n) {
  context ctx({.max_tensors = 32, .no_alloc = true});
  tensor* l = ctx.new_tensor_2d(type::f32, hp.n_expert, n);
  const expert_routing r = route_experts(ctx, hp, l);
  graph g;
  g.build_forward_expand(r.chosen);
  g.build_forward_expand(r.weights);
  buffer_ptr buf = alloc_ctx_tensors(ctx, cpu::cpu_device().buffer_type());
  tensor_set(*l, logits.data(), 0, nbytes(*l));
  cpu::make_cpu_backend({.n_threads = 2})->graph_compute(g);
  routed out;
  out.chosen.resize(static_cast<size_t>(nelements(*r.chosen)));
  out.weights.resize(static_cast<size_t>(nelements(*r.weights)));
  tensor_get(*r.chosen, out.chosen.data(), 0, nbytes(*r.chosen));
  tensor_get(*r.weights, out.weights.data(), 0, nbytes(*r.weights));
  return out;
}

hparams moe_hp(uint32_t n_expert, uint32_t n_used, expert_gating gating, bool norm, float scale) {
  hparams hp;
  hp.n_expert = n_expert;
  hp.n_expert_used = n_used;
  hp.gating = gating;
  hp.expert_weights_norm = norm;
  hp.expert_weights_scale = scale;
  return hp;
}

double softmax_of(const std::vector<float>& row, size_t i) {
  double mx = -INFINITY, s = 0;
  for (float v : row) mx = std::max<double>(mx, v);
  for (float v : row) s += std::exp(v - mx);
  return std::exp(row[i] - mx) / s;
}

}  // namespace

TEST_CASE("mixture-of-experts routing chooses the known experts, best first, with each gating's weights", "[llm][moe]") {
  // Three tokens, six experts. Token 0 prefers 4 then 1; token 1 has a tie between 2 and 5 (the lower index
  // wins) below 0; token 2's best is the last expert.
  const std::vector<std::vector<float>> rows = {
      {0.1f, 2.0f, -1.0f, 0.5f, 3.0f, 1.0f},
      {4.0f, -2.0f, 1.5f, 0.0f, -1.0f, 1.5f},
      {-0.5f, 0.2f, 0.3f, 0.1f, 0.0f, 2.5f},
  };
  std::vector<float> logits;
  for (const auto& r : rows) logits.insert(logits.end(), r.begin(), r.end());
  const std::vector<std::vector<int32_t>> want = {{4, 1, 5}, {0, 2, 5}, {5, 2, 1}};

  SECTION("softmax, renormalized over the chosen (Mixtral, qwen3moe)") {
    const routed r = route(moe_hp(6, 3, expert_gating::softmax, true, 1.0f), logits, 3);
    for (size_t t = 0; t < 3; ++t) {
      double sum = 0;
      for (size_t s = 0; s < 3; ++s) sum += std::exp(static_cast<double>(rows[t][static_cast<size_t>(want[t][s])]));
      for (size_t s = 0; s < 3; ++s) {
        INFO("token " << t << ", choice " << s);
        CHECK(r.chosen[t * 3 + s] == want[t][s]);
        const double w = std::exp(static_cast<double>(rows[t][static_cast<size_t>(want[t][s])])) / sum;
        CHECK(std::abs(r.weights[t * 3 + s] - w) < 1e-6);
      }
    }
  }
  SECTION("softmax over all experts, kept as is (qwen2moe)") {
    const routed r = route(moe_hp(6, 3, expert_gating::softmax, false, 1.0f), logits, 3);
    for (size_t t = 0; t < 3; ++t) {
      for (size_t s = 0; s < 3; ++s) {
        INFO("token " << t << ", choice " << s);
        CHECK(r.chosen[t * 3 + s] == want[t][s]);
        CHECK(std::abs(r.weights[t * 3 + s] - softmax_of(rows[t], static_cast<size_t>(want[t][s]))) < 1e-6);
      }
    }
  }
  SECTION("sigmoid, renormalized and scaled") {
    const routed r = route(moe_hp(6, 2, expert_gating::sigmoid, true, 2.5f), logits, 3);
    for (size_t t = 0; t < 3; ++t) {
      auto sig = [&](size_t e) { return 1.0 / (1.0 + std::exp(-static_cast<double>(rows[t][e]))); };
      const double s0 = sig(static_cast<size_t>(want[t][0])), s1 = sig(static_cast<size_t>(want[t][1]));
      INFO("token " << t);
      CHECK(r.chosen[t * 2] == want[t][0]);
      CHECK(r.chosen[t * 2 + 1] == want[t][1]);
      CHECK(std::abs(r.weights[t * 2] - 2.5 * s0 / (s0 + s1)) < 1e-5);
      CHECK(std::abs(r.weights[t * 2 + 1] - 2.5 * s1 / (s0 + s1)) < 1e-5);
    }
  }
}

TEST_CASE("mixture-of-experts hyperparameters are validated by key", "[llm][moe]") {
  const auto path = std::filesystem::temp_directory_path() / "troupe_moe_keys.gguf";
  auto with = [&](const std::string& arch, const std::function<void(gguf_writer&)>& edit) {
    testing::write_synthetic_model(arch, path, {}, edit);
  };
  struct bad_case {
    const char* arch;
    const char* key;
    std::function<void(gguf_writer&)> edit;
  };
  const std::vector<bad_case> cases = {
      {"qwen3moe", "qwen3moe.expert_used_count", [](gguf_writer& w) { w.set("qwen3moe.expert_used_count", uint32_t{9}); }},
      {"qwen3moe", "qwen3moe.expert_used_count", [](gguf_writer& w) { w.set("qwen3moe.expert_used_count", uint32_t{0}); }},
      {"qwen3moe", "qwen3moe.expert_count", [](gguf_writer& w) { w.set("qwen3moe.expert_count", uint32_t{0}); }},
      {"qwen3moe", "qwen3moe.expert_gating_func", [](gguf_writer& w) { w.set("qwen3moe.expert_gating_func", uint32_t{3}); }},
      {"qwen2moe", "qwen2moe.expert_weights_scale", [](gguf_writer& w) { w.set("qwen2moe.expert_weights_scale", -1.0f); }},
      {"qwen2moe", "qwen2moe.expert_weights_norm", [](gguf_writer& w) { w.set("qwen2moe.expert_weights_norm", uint32_t{1}); }},
      {"qwen2moe", "qwen2moe.expert_feed_forward_length",
       [](gguf_writer& w) { w.set("qwen2moe.expert_feed_forward_length", uint32_t{0}); }},
  };
  for (const bad_case& c : cases) {
    INFO(c.arch << ": " << c.key);
    with(c.arch, c.edit);
    CHECK_THROWS_WITH(model::load(path), Catch::Contains(c.key));
  }
  // A dense architecture declaring experts names its mixture-of-experts variant.
  with("qwen3", [](gguf_writer& w) { w.set("qwen3.expert_count", uint32_t{8}); });
  CHECK_THROWS_WITH(model::load(path), Catch::Contains("qwen3.expert_count") && Catch::Contains("qwen3moe"));
  // A router whose shape does not match expert_count names the tensor.
  with("mixtral", [](gguf_writer& w) { w.set("llama.expert_count", uint32_t{4}); });
  CHECK_THROWS_WITH(model::load(path), Catch::Contains("ffn_gate_inp.weight"));
  std::filesystem::remove(path);
}
