// Quantizing a real model: types, fallbacks, weights close to the source, and generation that still
// follows the reference.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "loader/model_loader.h"
#include "backends/cpu/cpu_backend.h"
#include "loader/quantize.h"
#include "runtime/llm/llm_context.h"
#include "tests/test_models.h"

using namespace troupe;

TEST_CASE("fallback types for rows that do not fit a type's blocks", "[quantize]") {
  CHECK(quantize_type_for(type::q4_K, 4096) == type::q4_K);
  CHECK(quantize_type_for(type::q4_K, 576) == type::q5_0);
  CHECK(quantize_type_for(type::q6_K, 576) == type::q8_0);
  CHECK(quantize_type_for(type::q5_K, 64) == type::q5_1);
  CHECK(quantize_type_for(type::q3_K, 96) == type::q4_0);
  CHECK(quantize_type_for(type::q8_0, 172) == type::f16);
  CHECK(quantize_type_for(type::q4_K, 100) == type::f16);
  CHECK(file_type_of(type::q8_0) == 7);
}

TEST_CASE("stories260K quantized to q8_0 and q4_0: types, fallbacks, error bounds, generation", "[quantize][model]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const std::vector<int32_t> ref = {432, 383, 286, 261, 376, 298, 315, 421};
  for (type t : {type::q8_0, type::q4_0}) {
    INFO("type " << type_name(t));
    const auto out = std::filesystem::temp_directory_path() / ("troupe_stories_" + std::string(type_name(t)) + ".gguf");
    const quantize_report r = quantize_model(*path, out, t, 2);
    CHECK(r.n_quantized == 32);  // 7 matrices a layer minus ffn_down (rows of 172), plus embeddings and output
    REQUIRE(r.fallbacks.size() == 5);
    for (const auto& f : r.fallbacks) {
      CHECK(f.tensor.find("ffn_down") != std::string::npos);
      CHECK(f.used == type::f16);
    }
    CHECK(r.bytes_out < r.bytes_in / 2);

    // Every quantized weight is close to its source: normalized error within the type's bound.
    model_loader src(*path), dst(out);
    placement_params pp;
    pp.host = &cpu::cpu_device().buffer_type();
    model_weights a = src.load(src.plan(pp)), b = dst.load(dst.plan(pp));
    const double bound = t == type::q8_0 ? 1e-4 : 1e-2;
    for (const auto& ti : src.tensors()) {
      tensor* x = a.get(ti.name);
      tensor* y = b.get(ti.name);
      const int64_t n = nelements(*x), ne0 = x->ne[0];
      std::vector<float> fx(static_cast<size_t>(n)), fy(static_cast<size_t>(n));
      for (int64_t row = 0; row < n / ne0; ++row) {
        traits(x->type).to_float(static_cast<char*>(x->data) + row * x->nb[1], fx.data() + row * ne0, ne0);
        traits(y->type).to_float(static_cast<char*>(y->data) + row * y->nb[1], fy.data() + row * ne0, ne0);
      }
      double err = 0, norm = 0;
      for (size_t i = 0; i < fx.size(); ++i) {
        err += (fx[i] - fy[i]) * static_cast<double>(fx[i] - fy[i]);
        norm += fx[i] * static_cast<double>(fx[i]);
      }
      INFO("tensor " << ti.name);
      CHECK(err / norm <= bound);
    }

    // q8_0 keeps the reference's first greedy tokens.
    if (t == type::q8_0) {
      auto m = llm::model::load(out);
      llm::llm_context ctx(*m, {.n_ctx = 64, .n_threads = 2});
      llm::batch bt;
      const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
      for (size_t i = 0; i < prompt.size(); ++i) bt.add(prompt[i], static_cast<int32_t>(i), 0, i + 1 == prompt.size());
      ctx.decode(bt);
      std::vector<int32_t> got;
      for (int i = 0; i < 8; ++i) {
        const auto l = ctx.logits(0);
        got.push_back(static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin()));
        bt.clear();
        bt.add(got.back(), static_cast<int32_t>(prompt.size()) + i, 0, true);
        ctx.decode(bt);
      }
      CHECK(got == ref);
    }
    std::filesystem::remove(out);
  }
}
