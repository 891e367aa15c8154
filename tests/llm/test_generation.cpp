// Model loading and greedy generation against the reference implementation's token ids, and F16 weights
// against the F32 ones they were converted from.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>

#include "loader/quantize.h"
#include "runtime/error.h"
#include "llm/llm_context.h"
#include "tests/support/greedy.h"
#include "tests/support/logits.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

using test::argmax_of;
using test::greedy;
using test::stories_prompt;
using test::stories_ref;

}  // namespace

TEST_CASE("stories260K: the 32 greedy tokens of the reference, f16 and f32 KV caches", "[llm][generation]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  CHECK(m->hp().n_layer == 5);
  CHECK(m->hp().n_embd == 64);
  CHECK(m->hp().n_head_kv == 4);
  CHECK(m->hp().n_vocab == 512);
  for (type kv_type : {type::f32, type::f16}) {
    INFO("kv cache " << type_name(kv_type));
    llm_context ctx(*m, {.n_ctx = 256, .type_k = kv_type, .type_v = kv_type, .n_threads = 2});
    CHECK(greedy(ctx, stories_prompt, 32) == stories_ref);
  }
}

TEST_CASE("stories260K: prompt in several micro-batches, several sequences, prefix reuse", "[llm][generation]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  // Micro-batches of 2 tokens: the same result.
  llm_context small(*m, {.n_ctx = 128, .n_ubatch = 2, .n_threads = 1});
  CHECK(greedy(small, stories_prompt, 8) == std::vector<int32_t>(stories_ref.begin(), stories_ref.begin() + 8));

  // Two sequences decoded in one batch give the same tokens as each alone.
  llm_context ctx(*m, {.n_ctx = 256, .n_seq_max = 2, .n_threads = 2});
  batch b;
  for (int32_t s = 0; s < 2; ++s) {
    for (size_t i = 0; i < stories_prompt.size(); ++i) {
      b.add(stories_prompt[i], static_cast<int32_t>(i), s, i + 1 == stories_prompt.size());
    }
  }
  ctx.decode(b);
  REQUIRE(ctx.n_outputs() == 2);
  std::vector<int32_t> next = {argmax_of(ctx.logits(0)), argmax_of(ctx.logits(1))};
  std::vector<std::vector<int32_t>> got(2);
  for (int step = 0; step < 6; ++step) {
    b.clear();
    for (int32_t s = 0; s < 2; ++s) {
      got[static_cast<size_t>(s)].push_back(next[static_cast<size_t>(s)]);
      b.add(next[static_cast<size_t>(s)], static_cast<int32_t>(stories_prompt.size()) + step, s, true);
    }
    ctx.decode(b);
    next = {argmax_of(ctx.logits(0)), argmax_of(ctx.logits(1))};
  }
  const std::vector<int32_t> want(stories_ref.begin(), stories_ref.begin() + 6);
  CHECK(got[0] == want);
  CHECK(got[1] == want);

  // Prefix reuse: drop sequence 1, copy sequence 0's prompt into it, continue from the prompt's end.
  ctx.kv().seq_rm(1, -1, -1);
  CHECK(ctx.kv().seq_pos_max(1) == -1);
  ctx.kv().seq_rm(0, static_cast<int32_t>(stories_prompt.size()), -1);
  ctx.kv().seq_cp(0, 1, -1, -1);
  CHECK(ctx.kv().seq_pos_max(1) == static_cast<int32_t>(stories_prompt.size()) - 1);
  b.clear();
  b.add(stories_ref[0], static_cast<int32_t>(stories_prompt.size()), 1, true);
  ctx.decode(b);
  CHECK(argmax_of(ctx.logits(0)) == stories_ref[1]);
}

TEST_CASE("decode errors: bad token ids, sequences, a full context", "[llm][errors]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  llm_context ctx(*m, {.n_ctx = 32, .n_threads = 1});
  batch b;
  b.add(512, 0, 0, true);
  CHECK_THROWS_WITH(ctx.decode(b), Catch::Contains("token id 512") && Catch::Contains("outside the vocabulary"));
  b.clear();
  b.add(1, 0, 3, true);
  CHECK_THROWS_WITH(ctx.decode(b), Catch::Contains("sequence id 3"));
  b.clear();
  for (int i = 0; i < 40; ++i) b.add(1, i, 0, false);
  CHECK_THROWS_WITH(ctx.decode(b), Catch::Contains("do not fit the context"));
  CHECK(ctx.kv().used_cells() == 0);
  CHECK_THROWS_WITH(model::load("/nonexistent/model.gguf"), Catch::Contains("does not exist"));
}

TEST_CASE("llama-2-tiny-random: F16 weights, 32000-token vocabulary, deterministic, and the logits of its F32 copy", "[llm][generation]") {
  const auto path = test::model_path("llama-2-tiny-random.gguf");
  if (!path) return;
  auto m = model::load(*path);
  CHECK(m->hp().n_vocab == 32000);
  CHECK(m->tok_embd()->type == type::f16);
  llm_context a(*m, {.n_ctx = 64, .n_threads = 1});
  llm_context b(*m, {.n_ctx = 64, .n_threads = 2});
  const std::vector<int32_t> prompt = {1, 15043, 3186};
  const auto ta = greedy(a, prompt, 16);
  const auto tb = greedy(b, prompt, 16);
  CHECK(ta == tb);
  CHECK(std::all_of(ta.begin(), ta.end(), [](int32_t t) { return t >= 0 && t < 32000; }));

  // The reference: the same weights converted to F32, which is exact (every f16 value is an f32 value), run
  // by the F32 kernels that the stories260K cases hold to the reference implementation's tokens. The f16
  // dot takes its activations in f32, so both compute the same products; only the order of float sums may
  // differ between kernels (about 1e-7 relative; equal bits on the CPU today). 1e-4 relative bounds that,
  // where a wrong f16 value, conversion or dot (rows of 8 here: a SIMD kernel's tail only) is off by far
  // more. The positions are teacher-forced: both models read the same tokens.
  const auto f32 = std::filesystem::temp_directory_path() / "troupe_tiny_random_f32.gguf";
  quantize_model(*path, f32, type::f32, 2);
  auto r = model::load(f32);
  REQUIRE(r->tok_embd()->type == type::f32);
  llm_context want_ctx(*r, {.n_ctx = 64, .n_threads = 2});
  llm_context got_ctx(*m, {.n_ctx = 64, .n_threads = 2});
  std::vector<int32_t> tokens = prompt;
  tokens.insert(tokens.end(), ta.begin(), ta.end());
  const auto want = test::logits_of(want_ctx, tokens);
  const auto got = test::logits_of(got_ctx, tokens);
  REQUIRE(got.size() == tokens.size());
  CHECK(test::relative_rms(got, want) <= 1e-4);
  std::filesystem::remove(f32);
}

TEST_CASE("stories260K converted to F16: the reference's 32 greedy tokens, and logits within 0.05 of F32", "[llm][generation]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const auto f16 = std::filesystem::temp_directory_path() / "troupe_stories_f16.gguf";
  const quantize_report report = quantize_model(*path, f16, type::f16, 2);
  CHECK(report.fallbacks.empty());
  auto m = model::load(f16);
  REQUIRE(m->tok_embd()->type == type::f16);
  llm_context ctx(*m, {.n_ctx = 256, .n_threads = 2});
  CHECK(greedy(ctx, stories_prompt, 32) == stories_ref);

  // Logits at every position of the prompt and the reference's tokens, against the F32 source. Each f16
  // weight is its f32 value rounded (2^-11 relative at most; the activations stay f32): measured, 0.013 to
  // 0.014 at most on logits up to 22, with the scalar, AVX2 and AVX-512 kernels. 0.05 is below half of the
  // smallest gap between the F32 model's top two logits at these positions (0.13), so within it no greedy
  // token can change; a wrong f16 kernel, conversion or weight is far outside it.
  auto src = model::load(*path);
  llm_context want_ctx(*src, {.n_ctx = 256, .n_threads = 2});
  llm_context got_ctx(*m, {.n_ctx = 256, .n_threads = 2});
  std::vector<int32_t> tokens = stories_prompt;
  tokens.insert(tokens.end(), stories_ref.begin(), stories_ref.end());
  const auto want = test::logits_of(want_ctx, tokens);
  const auto got = test::logits_of(got_ctx, tokens);
  REQUIRE(got.size() == tokens.size());
  CHECK(test::max_abs_diff(got, want) <= 0.05);
  std::filesystem::remove(f16);
}

TEST_CASE("compute memory is reserved for the rows of logits a decode outputs, and a batch with every row grows it and gets the same logits", "[llm][generation][memory]") {
  const auto path = test::model_path("llama-2-tiny-random.gguf");  // a 32000-token vocabulary
  if (!path) return;
  auto m = model::load(*path);
  const auto compute_bytes = [](const llm_context& c) {
    size_t n = 0;
    for (const auto& [bt, bytes] : c.compute_bytes_by_buft()) n += bytes;
    return n;
  };
  const llm::context_params one_row{.n_ctx = 256, .n_ubatch = 128, .n_threads = 2};  // one sequence: one row
  llm::context_params every_row = one_row;
  every_row.n_outputs_reserved = 128;
  llm_context one(*m, one_row);
  llm_context all(*m, every_row);
  const size_t before = compute_bytes(one);
  const size_t rows = size_t{127} * m->hp().n_vocab * sizeof(float);  // the logits of 127 more rows
  INFO("compute bytes: one row " << before << ", every row " << compute_bytes(all));
  CHECK(compute_bytes(all) >= rows);  // (the logits reuse memory that earlier nodes freed)
  CHECK(before < rows / 10);
  // Greedy decoding outputs one row per step: no growth, the same tokens.
  const std::vector<int32_t> prompt = {1, 450, 4996, 17354, 1701, 29916};
  CHECK(greedy(one, prompt, 8) == greedy(all, prompt, 8));
  CHECK(compute_bytes(one) == before);
  // Every token with logits: the compute memory grows, and each row equals the context reserved for all.
  batch b;
  for (size_t i = 0; i < 100; ++i) b.add(static_cast<int32_t>((i * 37) % 32000), static_cast<int32_t>(i), 0, true);
  llm_context grown(*m, one_row);
  llm_context reserved(*m, every_row);
  grown.decode(b);
  reserved.decode(b);
  CHECK(compute_bytes(grown) >= size_t{99} * m->hp().n_vocab * sizeof(float));
  REQUIRE(grown.n_outputs() == 100);
  REQUIRE(reserved.n_outputs() == 100);
  for (size_t i = 0; i < 100; ++i) {
    const auto x = grown.logits(i);
    const auto y = reserved.logits(i);
    REQUIRE(std::equal(x.begin(), x.end(), y.begin()));
  }
}
