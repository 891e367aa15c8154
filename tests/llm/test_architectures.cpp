// Every architecture's graph builder against an independent numpy reference (scripts/reference-forward)
// on a small random-weight model of that architecture (tests/llm/synthetic_model.h; 6 layers, GQA 4/2,
// head size 16, gemma3 with a sliding window of 4 on five of its six layers, gemma2 on every other one with
// soft caps of 5 (scores) and 3 (logits), granite with its four multipliers; the mixtures of experts with 8
// experts of which each token takes 2, qwen2moe with its shared expert).
//
// The expected values were produced by:
//   scripts/reference-forward <the model this test writes> 3,17,42,5,99,7,64,1
// Our graphs run in f32 with an f32 KV cache; the reference in float64. Bounds: argmax equal at every
// position (where the reference's top two differ by more than the tolerance), last-position logits within
// 2e-3 absolute, their sum and L2 norm within 1e-3 relative.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>

#include "llm/llm_context.h"
#include "tests/llm/synthetic_model.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

struct expected {
  const char* arch;
  std::vector<int32_t> argmax;
  std::vector<float> first16;
  double sum, l2;
};

const expected refs[] = {
    {"llama",
     {121, 23, 23, 99, 3, 23, 23, 23},
     {-0.90065f, -1.12899f, 1.39502f, 1.45395f, 0.68747f, 1.19428f, -0.27194f, -0.66461f, -0.67515f, 0.72299f, -0.53934f,
      0.77459f, 1.08355f, 2.05437f, 0.40299f, -0.69708f},
     -27.40573, 13.10154},
    {"qwen2",
     {31, 96, 117, 46, 46, 96, 117, 32},
     {-0.62470f, 0.01019f, -2.95775f, 0.47537f, 1.52461f, -0.38073f, -2.10181f, -0.04545f, 0.97900f, -1.04937f, -1.84441f,
      -0.30829f, -1.15950f, 0.00944f, 1.86073f, 0.70141f},
     0.71965, 13.62114},
    {"qwen3",
     {117, 46, 101, 103, 108, 104, 103, 89},
     {-2.32368f, -0.08974f, -1.78537f, 0.18829f, 0.02178f, 0.45916f, 0.81074f, -1.80926f, 1.11709f, -0.80724f, -3.10373f,
      0.27789f, -0.54676f, 0.40268f, 2.05026f, 0.51924f},
     -30.03668, 13.89579},
    {"gemma3",
     {51, 0, 0, 17, 126, 35, 35, 120},
     {-0.17749f, 0.17798f, -0.16004f, -0.14025f, -0.07158f, 0.09978f, 0.01909f, -0.16588f, 0.06160f, -0.06279f, 0.00495f,
      -0.18451f, -0.07629f, -0.03132f, -0.02960f, -0.09972f},
     0.99406, 1.21678},
    {"granite",  // llama with multipliers: embeddings x1.5, residuals x0.5, attention scale 0.3, logits / 4
     {94, 112, 49, 80, 6, 11, 35, 82},
     {0.53577f, -0.36424f, 0.07882f, -0.30994f, -0.30917f, 0.02798f, 0.14671f, -0.10312f, -0.23267f, -0.39997f,
      -0.17028f, 0.18859f, 0.14818f, 0.36745f, 0.15136f, -0.66022f},
     -1.16318, 3.04829},
    {"olmo2",  // post-norms only, QK norms over all heads
     {127, 127, 127, 117, 117, 105, 85, 97},
     {0.76918f, -1.11253f, -1.09861f, -1.68793f, -0.83101f, 0.67964f, -1.25739f, -0.95247f, -0.11557f, -0.94386f,
      0.19266f, 0.64650f, -1.59586f, -0.68361f, -0.27752f, -1.00831f},
     11.85244, 13.32457},
    {"gemma2",  // sliding window of 4 on every other layer, scores capped at 5, logits at 3
     {88, 56, 107, 48, 107, 107, 2, 107},
     {0.07681f, 0.10387f, 0.05541f, -0.04582f, -0.20095f, -0.12353f, 0.09849f, -0.00886f, -0.05672f, -0.11091f,
      0.17975f, 0.00805f, 0.05647f, -0.10226f, 0.18460f, -0.02507f},
     -0.99069, 1.21332},
    {"phi3",  // q, k, v in one matrix, gate and up in one, the short rope factors (a context of 64 <= 128)
     {63, 89, 75, 94, 63, 97, 71, 63},
     {-1.71443f, -1.16826f, -0.90242f, 2.15765f, -1.56857f, 1.21572f, -0.61777f, 0.22374f, 1.30348f, 0.50324f,
      1.33137f, -0.51243f, -0.54686f, 1.66488f, -0.84178f, 2.11062f},
     -19.46638, 14.60521},
    {"mistral3",  // YaRN (factor 4 over an original 2048, log multiplier 0.5), temperature 0.5; from 2044
     {76, 16, 103, 103, 14, 111, 34, 23},
     {-0.35311f, 0.26555f, 0.68349f, -0.95371f, 0.20492f, -1.49950f, -2.00294f, -0.65816f, 0.34858f, -0.01909f,
      -0.97130f, -0.05624f, -3.99290f, 0.40859f, 2.23453f, -1.36810f},
     -29.58174, 13.27253},
    // Mixtures of experts: 8 experts, 2 chosen per token; the reference's smallest gap between the router
    // logits of the last expert chosen and the first left out (over every token and layer) is 0.031
    // (qwen2moe), 0.0146 (qwen3moe) and 0.0503 (mixtral): far above float32 rounding, so the choices match.
    {"qwen2moe",
     {51, 107, 34, 84, 88, 55, 56, 105},
     {0.32389f, 1.63683f, 1.11074f, -0.23665f, -1.51977f, -2.85098f, -2.30174f, 0.04489f, -1.25682f, -0.64051f,
      -1.42471f, 0.65123f, 0.27704f, -1.13959f, 0.47238f, -1.68855f},
     -18.07900, 13.50432},
    {"qwen3moe",
     {105, 45, 105, 76, 105, 106, 108, 72},
     {-0.13238f, -1.86863f, 0.45448f, 2.45171f, 0.94178f, -1.46382f, -1.03348f, -2.97046f, -0.39805f, 0.30729f,
      -0.86577f, 1.87036f, -0.57050f, -1.07526f, 0.77841f, -1.30857f},
     -21.75618, 13.96785},
    {"mixtral",  // a llama file with experts
     {59, 59, 25, 44, 44, 85, 25, 41},
     {-0.54177f, 0.17558f, 0.83033f, 0.46204f, 1.03685f, 1.67668f, -0.24588f, 0.38765f, -1.47606f, 0.17312f,
      -0.94348f, 1.25462f, -1.10415f, 0.09115f, -1.31930f, 1.08323f},
     0.67165, 11.71828},
};

// mistral3 runs from position 2044 (the reference's third argument): its attention temperature steps at
// 2048, its original context, within the eight tokens.
int32_t first_position(const std::string& arch) { return arch == "mistral3" ? 2044 : 0; }

}  // namespace

TEST_CASE("each architecture's graph matches the numpy reference", "[llm][arch]") {
  const std::vector<int32_t> tokens = {3, 17, 42, 5, 99, 7, 64, 1};
  for (const expected& e : refs) {
    INFO("architecture " << e.arch);
    const auto path = std::filesystem::temp_directory_path() / (std::string("troupe_syn_") + e.arch + ".gguf");
    testing::write_synthetic_model(e.arch, path);
    auto m = model::load(path);
    CHECK(m->hp().name == (std::string(e.arch) == "mixtral" ? "llama" : e.arch));
    CHECK((m->hp().n_expert > 0) == testing::synthetic_is_moe(e.arch));
    for (uint32_t ubatch : {8u, 3u}) {  // one micro-batch, and three that attend across micro-batches
      INFO("n_ubatch " << ubatch);
      llm_context ctx(*m, {.n_ctx = 64, .n_ubatch = ubatch, .type_k = type::f32, .type_v = type::f32, .n_threads = 2});
      batch b;
      const int32_t pos0 = first_position(e.arch);
      for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], pos0 + static_cast<int32_t>(i), 0, true);
      ctx.decode(b);
      REQUIRE(ctx.n_outputs() == tokens.size());
      for (size_t i = 0; i < tokens.size(); ++i) {
        const auto l = ctx.logits(i);
        const auto am = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
        INFO("position " << i);
        CHECK(am == e.argmax[i]);
      }
      const auto last = ctx.logits(tokens.size() - 1);
      double sum = 0, l2 = 0;
      for (float v : last) {
        sum += v;
        l2 += static_cast<double>(v) * v;
      }
      l2 = std::sqrt(l2);
      for (size_t i = 0; i < 16; ++i) CHECK(std::abs(last[i] - e.first16[i]) < 2e-3);
      CHECK(std::abs(sum - e.sum) < 1e-3 * std::max(1.0, std::abs(e.sum)) + 2e-3);
      CHECK(std::abs(l2 - e.l2) < 1e-3 * e.l2);
    }
    std::filesystem::remove(path);
  }
}

TEST_CASE("granite, gemma2, olmo2, phi3 and mistral3 hyperparameters are validated by key", "[llm][arch]") {
  const auto path = std::filesystem::temp_directory_path() / "troupe_arch_keys.gguf";
  const struct {
    const char* arch;
    const char* key;
    std::function<void(gguf_writer&)> edit;
  } cases[] = {
      {"granite", "granite.logit_scale", [](gguf_writer& w) { w.set("granite.logit_scale", 0.0f); }},
      {"granite", "granite.residual_scale", [](gguf_writer& w) { w.set("granite.residual_scale", -0.5f); }},
      {"gemma2", "gemma2.attn_logit_softcapping", [](gguf_writer& w) { w.set("gemma2.attn_logit_softcapping", 0.0f); }},
      {"olmo2", "olmo2.attention.sliding_window", [](gguf_writer& w) { w.set("olmo2.attention.sliding_window", uint32_t{4}); }},
      {"olmo2", "olmo2.expert_count", [](gguf_writer& w) { w.set("olmo2.expert_count", uint32_t{4}); }},
      {"phi3", "phi3.rope.scaling.attn_factor", [](gguf_writer& w) { w.set("phi3.rope.scaling.attn_factor", -1.0f); }},
      {"mistral3", "mistral3.rope.scaling.type", [](gguf_writer& w) { w.set("mistral3.rope.scaling.type", std::string("ntk")); }},
      {"mistral3", "mistral3.rope.scaling.factor", [](gguf_writer& w) { w.set("mistral3.rope.scaling.factor", 0.5f); }},
      {"mistral3", "mistral3.rope.scaling.yarn_beta_fast", [](gguf_writer& w) { w.set("mistral3.rope.scaling.yarn_beta_fast", 0.0f); }},
      {"mistral3", "mistral3.rope.scaling.yarn_log_multiplier", [](gguf_writer& w) { w.set("mistral3.rope.scaling.yarn_log_multiplier", -1.0f); }},
      {"mistral3", "mistral3.rope.scaling.original_context_length", [](gguf_writer& w) { w.set("mistral3.rope.scaling.original_context_length", uint32_t{0}); }},
      {"mistral3", "mistral3.attention.temperature_scale", [](gguf_writer& w) { w.set("mistral3.attention.temperature_scale", -0.1f); }},
  };
  for (const auto& c : cases) {
    INFO(c.arch << ": " << c.key);
    testing::write_synthetic_model(c.arch, path, {}, c.edit);
    CHECK_THROWS_WITH(model::load(path), Catch::Contains(c.key));
  }
  std::filesystem::remove(path);
}

TEST_CASE("phi3 takes its long rope factors for a context beyond the original one", "[llm][arch]") {
  const auto path = std::filesystem::temp_directory_path() / "troupe_phi3_long.gguf";
  testing::write_synthetic_model("phi3", path);
  auto m = model::load(path);
  const tensor* shrt = m->rope_factors(128);
  const tensor* lng = m->rope_factors(129);
  REQUIRE(shrt != nullptr);
  REQUIRE(lng != nullptr);
  CHECK(std::string(shrt->name) == "rope_factors_short.weight");
  CHECK(std::string(lng->name) == "rope_factors_long.weight");
  // A context of 256 cells computes with the long factors: other logits than the short ones give.
  const std::vector<int32_t> tokens = {3, 17, 42, 5};
  std::vector<float> last[2];
  int i = 0;
  for (uint32_t n_ctx : {64u, 256u}) {
    llm_context ctx(*m, {.n_ctx = n_ctx, .type_k = type::f32, .type_v = type::f32, .n_threads = 2});
    batch b;
    for (size_t t = 0; t < tokens.size(); ++t) b.add(tokens[t], static_cast<int32_t>(t), 0, t + 1 == tokens.size());
    ctx.decode(b);
    const auto l = ctx.logits(0);
    last[i++].assign(l.begin(), l.end());
  }
  double diff = 0;
  for (size_t v = 0; v < last[0].size(); ++v) diff = std::max(diff, std::abs(static_cast<double>(last[0][v]) - last[1][v]));
  CHECK(diff > 1e-3);
  std::filesystem::remove(path);
}

TEST_CASE("YaRN's attention factor and mistral3's temperature follow their definitions", "[llm][arch]") {
  const auto path = std::filesystem::temp_directory_path() / "troupe_mistral3_hp.gguf";
  testing::write_synthetic_model("mistral3", path);
  auto m = model::load(path);
  const hparams& hp = m->hp();
  CHECK(hp.rope_yarn);
  CHECK(hp.rope_freq_scale == Approx(0.25f));
  CHECK(hp.ctx_orig() == 2048);
  // Hugging Face's attention factor (1 + 0.1 ln 4) / (1 + 0.05 ln 4), with the kernels' own 1 + 0.1 ln 4
  // divided out.
  const double mscale = 1 + 0.1 * std::log(4.0), mscale_all = 1 + 0.05 * std::log(4.0);
  CHECK(hp.rope_attn_factor * mscale == Approx(mscale / mscale_all).epsilon(1e-6));
  // 1 below the original context, then 1 + 0.5 ln(1 + floor(pos / 2048)).
  CHECK(hp.attn_temp(0) == 1.0f);
  CHECK(hp.attn_temp(2047) == 1.0f);
  CHECK(hp.attn_temp(2048) == Approx(1 + 0.5 * std::log(2.0)));
  CHECK(hp.attn_temp(3 * 2048 + 5) == Approx(1 + 0.5 * std::log(4.0)));
  std::filesystem::remove(path);
  // A llama file with rope.scaling.type none ignores a factor; linear divides by it.
  for (const char* type : {"none", "linear"}) {
    testing::write_synthetic_model("llama", path, {}, [&](gguf_writer& w) {
      w.add("llama.rope.scaling.type", std::string(type));
      w.add("llama.rope.scaling.factor", 2.0f);
    });
    auto l = model::load(path);
    CHECK(l->hp().rope_freq_scale == (std::string(type) == "none" ? 1.0f : 0.5f));
    CHECK_FALSE(l->hp().rope_yarn);
  }
  std::filesystem::remove(path);
}
