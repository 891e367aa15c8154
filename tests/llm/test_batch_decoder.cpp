// Several sequences in one decode: a sequence stepped through the batch decoder makes the generator's
// decisions; two sequences decoded together give the tokens each gives alone.
#include <catch2/catch.hpp>

#include "runtime/error.h"
#include "llm/batch_decoder.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

generate_params greedy_params(int n) {
  generate_params p;
  p.max_tokens = n;
  p.temperature = 0.0f;
  return p;
}

}  // namespace

TEST_CASE("sequence + batch decoder reproduce the generator, prefix reuse included", "[llm][batch]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  vocab v(m->meta());
  const auto prompt = v.tokenize("Once upon a time", true);
  auto p = greedy_params(24);
  p.stop = {"ball"};

  llm_context ref_ctx(*m, {.n_ctx = 256, .n_threads = 2});
  generator gen(ref_ctx, v);
  std::string streamed_ref;
  const generate_result ref = gen.generate(prompt, p, [&](std::string_view s, token_id) {
    streamed_ref += s;
    return true;
  });

  llm_context ctx(*m, {.n_ctx = 256, .n_seq_max = 2, .n_threads = 2});
  batch_decoder dec(ctx);
  sequence s(v, {}, prompt, p, ctx.params().n_ctx);
  std::string streamed;
  while (!s.done()) {
    const seq_step st{1, s.pending().keep, s.pending().tokens};
    const auto logits = dec.decode(std::span(&st, 1));
    streamed += s.advance(logits.at(0)).piece;
  }
  CHECK(s.result().tokens == ref.tokens);
  CHECK(s.result().text == ref.text);
  CHECK(s.result().finish == ref.finish);
  CHECK(streamed == streamed_ref);
  CHECK(s.cached() == gen.cached());

  // Second turn: the cached prefix is kept, only the new part decoded.
  std::vector<token_id> prompt2 = s.cached();
  const auto more = v.tokenize(" The end.", false);
  prompt2.insert(prompt2.end(), more.begin(), more.end());
  const generate_result ref2 = gen.generate(prompt2, greedy_params(8));
  sequence s2(v, s.cached(), prompt2, greedy_params(8), ctx.params().n_ctx);
  CHECK(s2.pending().keep == static_cast<int32_t>(s.cached().size()));
  while (!s2.done()) {
    const seq_step st{1, s2.pending().keep, s2.pending().tokens};
    s2.advance(dec.decode(std::span(&st, 1)).at(0));
  }
  CHECK(s2.result().n_prompt_decoded == ref2.n_prompt_decoded);
  CHECK(s2.result().tokens == ref2.tokens);
}

TEST_CASE("two sequences decoded together give each one's tokens alone", "[llm][batch]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  vocab v(m->meta());
  const std::vector<std::vector<token_id>> prompts = {v.tokenize("Once upon a time", true),
                                                      v.tokenize("The little dog", true)};
  const auto p = greedy_params(20);
  std::vector<generate_result> alone;
  for (const auto& pr : prompts) {
    llm_context c(*m, {.n_ctx = 256, .n_threads = 2});
    generator g(c, v);
    alone.push_back(g.generate(pr, p));
  }
  llm_context ctx(*m, {.n_ctx = 512, .n_seq_max = 2, .n_threads = 2});
  std::vector<std::string> streamed(2);
  const auto together = generate_together(ctx, v, prompts, p, [&](size_t i, std::string_view s, token_id) { streamed[i] += s; });
  REQUIRE(together.size() == 2);
  for (size_t i = 0; i < 2; ++i) {
    INFO("sequence " << i);
    CHECK(together[i].tokens == alone[i].tokens);
    CHECK(together[i].text == alone[i].text);
    CHECK(streamed[i] == alone[i].text);
  }
}

TEST_CASE("batch decoder: bad steps are refused before anything is decoded", "[llm][batch]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  llm_context ctx(*m, {.n_ctx = 64, .n_seq_max = 2, .n_threads = 1});
  batch_decoder dec(ctx);
  const std::vector<seq_step> bad_seq = {{2, 0, {1}}};
  CHECK_THROWS_AS(dec.decode(bad_seq), error);
  const std::vector<seq_step> twice = {{0, 0, {1}}, {0, 0, {2}}};
  CHECK_THROWS_AS(dec.decode(twice), error);
  const std::vector<seq_step> keep = {{0, 3, {1}}};
  CHECK_THROWS_AS(dec.decode(keep), error);
  const std::vector<seq_step> empty = {{0, 0, {}}};
  CHECK_THROWS_AS(dec.decode(empty), error);
  CHECK(ctx.kv().used_cells() == 0);
  // A full cache is a capacity_error.
  std::vector<seq_step> big = {{0, 0, std::vector<token_id>(40, 5)}, {1, 0, std::vector<token_id>(40, 6)}};
  CHECK_THROWS_AS(dec.decode(big), capacity_error);
  CHECK(dec.decode(std::vector<seq_step>{{1, 0, {1, 2}}}).size() == 1);
}
