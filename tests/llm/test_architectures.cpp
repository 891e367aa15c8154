// Every architecture's graph builder against an independent numpy reference (scripts/reference-forward)
// on a small random-weight model of that architecture (tests/llm/synthetic_model.h; 6 layers, GQA 4/2,
// head size 16, gemma3 with a sliding window of 4 on five of its six layers; the mixtures of experts with 8
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

#include "runtime/llm/llm_context.h"
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
      for (size_t i = 0; i < tokens.size(); ++i) b.add(tokens[i], static_cast<int32_t>(i), 0, true);
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
