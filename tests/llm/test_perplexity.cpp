// Perplexity of the test models on one text, as shipped and quantized: each quantized model stays close
// to its source. Bounds (ratio of perplexities, quantized / source): q8_0 within 2%, q6_K within 2%
// (stories260K) or 3% (SmolLM2: only its ffn_down rows, k = 1536, hold whole 256-value blocks, and those
// multiply activations quantized per 256 values, q8_K, where the Q4_1 source's are quantized per 32, q8_1:
// measured 1.020 against 1.003 with sgemm's f32 activations, TROUPE_CPU_BLAS=on), q5_K within 5%
// (stories260K) or 15% (SmolLM2, re-quantized from Q4_1), q4_0 and q4_1 within 15%; iq4_nl and iq4_xs within
// 12% (stories260K: 1.079 measured, every iq4_xs row falls back to iq4_nl) or 22% (SmolLM2: 1.153 and 1.180;
// a Q4_1 source's evenly spaced levels do not fit a codebook, docs/quantization.md).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "loader/quantize.h"
#include "llm/perplexity.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

std::string story() {
  std::ifstream in(std::string(TROUPE_TEST_DATA_DIR) + "/story.txt");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

double ppl_of(const std::filesystem::path& path, uint32_t chunk) {
  auto m = model::load(path);
  vocab v(m->meta());
  llm_context ctx(*m, {.n_ctx = chunk, .n_batch = chunk, .n_threads = 2});
  return perplexity(ctx, v, v.tokenize(story(), true), chunk).ppl;
}

void check_family(const std::filesystem::path& src, uint32_t chunk, double ppl_min, double ppl_max, double q6_bound,
                  double q5_bound, double iq4_bound) {
  const double base = ppl_of(src, chunk);
  INFO("source perplexity " << base);
  CHECK(base > ppl_min);
  CHECK(base < ppl_max);
  const std::pair<type, double> bounds[] = {
      {type::q8_0, 0.02},  {type::q6_K, q6_bound},   {type::q5_K, q5_bound},  {type::q4_1, 0.15},
      {type::q4_0, 0.15},  {type::iq4_nl, iq4_bound}, {type::iq4_xs, iq4_bound}};
  for (const auto& [t, bound] : bounds) {
    const auto out = std::filesystem::temp_directory_path() / ("troupe_ppl_" + std::string(type_name(t)) + ".gguf");
    quantize_model(src, out, t, 2);
    const double q = ppl_of(out, chunk);
    INFO(type_name(t) << ": perplexity " << q << ", ratio " << q / base << ", bound " << 1 + bound);
    CHECK(q / base < 1.0 + bound);
    CHECK(q / base > 1.0 - bound);
    std::filesystem::remove(out);
  }
}

}  // namespace

TEST_CASE("perplexity: stories260K and its quantizations", "[llm][perplexity]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  check_family(*path, 128, 2.0, 8.0, 0.02, 0.05, 0.12);
}

TEST_CASE("perplexity: SmolLM2 as shipped and re-quantized", "[llm][perplexity]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  check_family(*path, 128, 4.0, 20.0, 0.03, 0.15, 0.22);
}

TEST_CASE("perplexity needs at least one chunk of text", "[llm][perplexity]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  vocab v(m->meta());
  llm_context ctx(*m, {.n_ctx = 128, .n_threads = 1});
  CHECK_THROWS_WITH(perplexity(ctx, v, v.tokenize("Once upon a time", true), 128), Catch::Contains("fewer than one chunk"));
}
