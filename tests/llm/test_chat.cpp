// The chat path end to end on the default chat model: template, special-token tokenization, generation
// with prefix reuse across turns, detokenization. And the troupe-chat program's bad-input exits.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>

#include "llm/chat_template.h"
#include "llm/generator.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

TEST_CASE("SmolLM2-135M-Instruct: a short multi-turn chat answers sensibly", "[llm][chat]") {
  const auto path = test::smollm2_path();
  if (!path) return;
  auto m = model::load(*path);
  vocab v(m->meta());
  chat_template tmpl(m->meta());
  CHECK(tmpl.kind() == chat_template_kind::chatml);
  llm_context ctx(*m, {.n_ctx = 512, .n_threads = 2});
  generator gen(ctx, v);
  generate_params p;
  p.max_tokens = 64;
  p.temperature = 0.0f;  // greedy: the answer is deterministic

  std::vector<chat_message> chat = {{"user", "Hi! Can you name three colors?"}};
  std::string streamed;
  generate_result r = gen.generate(v.tokenize(tmpl.apply(chat, true), true, true), p, [&](std::string_view s, token_id) {
    streamed += s;
    return true;
  });
  INFO("answer 1: " << r.text);
  CHECK(streamed == r.text);
  // Colours named in the answer (the exact wording depends on the rounding of the quantized weights).
  int colours = 0;
  for (const char* c : {"Red", "Blue", "Green", "Yellow", "Orange", "Purple"}) colours += r.text.find(c) != std::string::npos;
  CHECK(colours >= 2);

  chat.push_back({"assistant", r.text});
  chat.push_back({"user", "Which one is the color of the sky?"});
  const auto second = v.tokenize(tmpl.apply(chat, true), true, true);
  r = gen.generate(second, p);
  INFO("answer 2: " << r.text);
  CHECK((r.text.find("blue") != std::string::npos || r.text.find("Blue") != std::string::npos));
  // The second turn reused the first turn's cache: only the new tokens were decoded.
  CHECK(r.n_prompt_decoded < r.n_prompt / 2);
}

TEST_CASE("generation stops at stop strings and at the token limit, and can be cancelled", "[llm][chat]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::load(*path);
  vocab v(m->meta());
  llm_context ctx(*m, {.n_ctx = 128, .n_threads = 1});
  generator gen(ctx, v);
  generate_params p;
  p.temperature = 0.0f;
  p.max_tokens = 32;
  const auto prompt = v.tokenize("Once upon a time", true);
  generate_result r = gen.generate(prompt, p);
  CHECK(r.text == ", there was a little girl named Lily. She loved to play outside in the park. One day, she saw");
  CHECK(r.finish == "length");
  CHECK(r.tokens.size() == 32);

  p.stop = {" little girl"};
  std::string streamed;
  r = gen.generate(prompt, p, [&](std::string_view s, token_id) {
    streamed += s;
    return true;
  });
  CHECK(r.text == ", there was a");
  CHECK(streamed == ", there was a");
  CHECK(r.finish == "stop");
  CHECK(r.n_prompt_decoded == 1);  // the prompt was cached: only its last token was decoded again

  p.stop.clear();
  int pieces = 0;
  r = gen.generate(prompt, p, [&](std::string_view, token_id) { return ++pieces < 3; });
  CHECK(r.finish == "cancelled");
  CHECK(r.tokens.size() == 3);

  CHECK_THROWS_WITH(gen.generate(std::vector<token_id>(200, 1), p), Catch::Contains("the context holds 128"));
}
