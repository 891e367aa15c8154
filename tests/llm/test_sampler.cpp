// Sampler stages on hand-made logits, chains built from parameters, seeds, and parameter errors.
#include <catch2/catch.hpp>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "llm/sampler.h"

using namespace troupe::llm;

namespace {

using ids = std::vector<token_id>;

// Runs one stage over logits and returns the remaining ids in order.
ids after(std::unique_ptr<sampler_stage_i> stage, const std::vector<float>& logits) {
  candidates c;
  c.assign(logits);
  stage->apply(c);
  ids out;
  for (const token_candidate& t : c.data) out.push_back(t.id);
  return out;
}

// Logits whose softmax is exactly {0.5, 0.25, 0.125, 0.125} (up to rounding).
const std::vector<float> halves = {std::log(0.5f), std::log(0.25f), std::log(0.125f), std::log(0.125f)};

template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const sampling_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_CASE("sampler: candidates", "[sampler]") {
  candidates c;
  c.assign(std::vector<float>{1.0f, 3.0f, 2.0f, 3.0f});
  CHECK_FALSE(c.sorted);
  c.sort();
  REQUIRE(c.sorted);
  CHECK(c.data[0].id == 1);  // ties: lower id first
  CHECK(c.data[1].id == 3);
  CHECK(c.data[2].id == 2);
  CHECK(c.data[3].id == 0);
  c.assign(halves);
  c.softmax();
  CHECK(c.data[0].p == Approx(0.5f));
  CHECK(c.data[1].p == Approx(0.25f));
  CHECK(c.data[3].p == Approx(0.125f));
  CHECK_THROWS_AS(c.assign(std::vector<float>{}), sampling_error);
  CHECK_THROWS_AS(c.assign(std::vector<float>{0.0f, std::nanf("")}), sampling_error);
  CHECK_THROWS_AS(c.assign(std::vector<float>{std::numeric_limits<float>::infinity()}), sampling_error);
  const float ninf = -std::numeric_limits<float>::infinity();
  c.assign(std::vector<float>{ninf, ninf});
  CHECK_THROWS_AS(c.softmax(), sampling_error);
}

TEST_CASE("sampler: greedy", "[sampler]") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f};
  sampler_chain chain;
  chain.add(make_greedy());
  CHECK(chain.sample(logits) == 1);  // 1 and 4 tie: the lower id
  sampler_chain empty;              // no stages: greedy too
  CHECK(empty.sample(logits) == 1);
  CHECK(empty.describe() == "greedy");
  const float ninf = -std::numeric_limits<float>::infinity();
  CHECK(empty.sample(std::vector<float>{ninf, -5.0f, ninf}) == 1);
}

TEST_CASE("sampler: logit_bias adds to a token's logit and -100 bans it", "[sampler]") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f};
  sampling_params p = sampling_params{};
  p.temperature = 0.0f;
  p.penalty_last_n = 0;
  CHECK(sampler_chain(p).sample(logits) == 1);
  p.logit_bias = {{1, -100.0f}};  // banned: 4 (tied with 1) is next
  CHECK(sampler_chain(p).sample(logits) == 4);
  p.logit_bias = {{1, -100.0f}, {4, -0.5f}, {3, 2.25f}};  // 3: 2.75 beats 4: 2.5 and 2: 2
  sampler_chain c(p);
  CHECK(c.describe() == "logit_bias -> greedy");
  CHECK(c.sample(logits) == 3);
  CHECK(c.last().data.size() == 5);
  // Every token banned: an error, not a token.
  p.logit_bias.clear();
  for (int32_t i = 0; i < 5; ++i) p.logit_bias.push_back({i, -100.0f});
  CHECK_THROWS_AS(sampler_chain(p).sample(logits), sampling_error);
  // Sampling at temperature 1 never draws a banned token.
  sampling_params s;
  s.top_k = 0;
  s.top_p = 1.0f;
  s.min_p = 0.0f;
  s.penalty_last_n = 0;
  s.logit_bias = {{1, -100.0f}, {4, -100.0f}};
  for (uint32_t seed = 1; seed <= 50; ++seed) {
    s.seed = seed;
    const token_id t = sampler_chain(s).sample(logits);
    CHECK(t != 1);
    CHECK(t != 4);
  }
  sampling_params bad;
  bad.logit_bias = {{-1, 1.0f}};
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("logit_bias"));
  bad.logit_bias = {{2, 101.0f}};
  CHECK_THROWS_WITH(bad.validate(), Catch::Contains("logit_bias"));
}

TEST_CASE("sampler: top_k", "[sampler]") {
  const std::vector<float> logits = {1.0f, 3.0f, 2.0f, 0.5f, 3.0f};
  CHECK(after(make_top_k(2), logits) == ids{1, 4});
  CHECK(after(make_top_k(3), logits) == ids{1, 4, 2});
  CHECK(after(make_top_k(1), logits) == ids{1});
  CHECK(after(make_top_k(0), logits) == ids{1, 4, 2, 0, 3});   // off, but sorted
  CHECK(after(make_top_k(10), logits) == ids{1, 4, 2, 0, 3});
}

TEST_CASE("sampler: top_p", "[sampler]") {
  CHECK(after(make_top_p(0.4f), halves) == ids{0});           // 0.5 >= 0.4
  CHECK(after(make_top_p(0.6f), halves) == ids{0, 1});        // 0.75 >= 0.6
  CHECK(after(make_top_p(0.8f), halves) == ids{0, 1, 2});     // 0.875 >= 0.8
  CHECK(after(make_top_p(0.95f), halves) == ids{0, 1, 2, 3});
  CHECK(after(make_top_p(1.0f), halves) == ids{0, 1, 2, 3});  // off
  CHECK(after(make_top_p(0.4f, 3), halves) == ids{0, 1, 2});  // min_keep
}

TEST_CASE("sampler: min_p", "[sampler]") {
  CHECK(after(make_min_p(0.3f), halves) == ids{0, 1});        // p >= 0.15
  CHECK(after(make_min_p(0.2f), halves) == ids{0, 1, 2, 3});  // p >= 0.1
  CHECK(after(make_min_p(0.6f), halves) == ids{0});           // p >= 0.3
  CHECK(after(make_min_p(0.6f, 2), halves) == ids{0, 1});     // min_keep
  CHECK(after(make_min_p(0.0f), halves) == ids{0, 1, 2, 3});  // off (order unchanged)
}

TEST_CASE("sampler: temperature", "[sampler]") {
  candidates c;
  c.assign(std::vector<float>{1.0f, 3.0f, 2.0f, 0.5f, 3.0f});
  make_temperature(2.0f)->apply(c);
  REQUIRE(c.data.size() == 5);
  CHECK(c.data[0].logit == 0.5f);
  CHECK(c.data[1].logit == 1.5f);
  CHECK(c.data[2].logit == 1.0f);
  CHECK(c.data[3].logit == 0.25f);
  // Temperature 0 keeps only the highest logits.
  CHECK(after(make_temperature(0.0f), {1.0f, 3.0f, 2.0f, 0.5f, 3.0f}) == ids{1, 4});
  // A low temperature sharpens the distribution.
  c.assign(std::vector<float>{0.0f, 1.0f});
  make_temperature(0.5f)->apply(c);
  c.softmax();
  CHECK(c.data[0].id == 1);
  CHECK(c.data[0].p == Approx(1.0 / (1.0 + std::exp(-2.0))));
}

TEST_CASE("sampler: repetition, frequency and presence penalties", "[sampler]") {
  auto stage = make_penalties(3, 2.0f, 0.5f, 0.25f);
  stage->accept(1);
  stage->accept(1);
  stage->accept(2);
  candidates c;
  c.assign(std::vector<float>{1.0f, 3.0f, -2.0f, 0.5f});
  stage->apply(c);
  CHECK(c.data[0].logit == 1.0f);    // unseen
  CHECK(c.data[1].logit == 0.25f);   // seen twice: 3 / 2 - (2 * 0.5 + 0.25)
  CHECK(c.data[2].logit == -4.75f);  // seen once, negative: -2 * 2 - (0.5 + 0.25)
  CHECK(c.data[3].logit == 0.5f);
  CHECK_FALSE(c.sorted);
  // Only the last 3 tokens count.
  stage->accept(0);
  stage->accept(0);
  stage->accept(0);
  c.assign(std::vector<float>{1.0f, 3.0f, -2.0f, 0.5f});
  stage->apply(c);
  CHECK(c.data[0].logit == 1.0f / 2.0f - (3 * 0.5f + 0.25f));
  CHECK(c.data[1].logit == 3.0f);
  CHECK(c.data[2].logit == -2.0f);
  stage->reset();
  c.assign(std::vector<float>{1.0f, 3.0f});
  stage->apply(c);
  CHECK(c.data[0].logit == 1.0f);
  // The greedy choice moves away from a repeated token.
  sampler_chain chain;
  chain.add(make_penalties(64, 1.5f, 0.0f, 0.0f)).add(make_greedy());
  const std::vector<float> logits = {2.0f, 1.5f};
  CHECK(chain.sample(logits) == 0);
  chain.accept(0);
  CHECK(chain.sample(logits) == 1);  // 2 / 1.5 < 1.5
  chain.reset();
  CHECK(chain.sample(logits) == 0);
}

TEST_CASE("sampler: dist draws by probability with a seeded mt19937", "[sampler]") {
  // Two equally likely tokens: token 1 iff the draw u >= 0.5. std::mt19937's first output for the default
  // seed 5489 is 3499211612 (fixed by the standard's algorithm), so u = (3499211612 >> 8) / 2^24 = 0.8147.
  sampler_chain chain;
  chain.add(make_dist(5489));
  CHECK(chain.sample(std::vector<float>{0.0f, 0.0f}) == 1);
  // The same draws as a reference computed here from mt19937 directly (sorted order: highest first).
  std::mt19937 ref(5489);
  ref();  // the draw above
  const std::vector<float> logits = {std::log(0.2f), std::log(0.5f), std::log(0.3f)};  // sorted: 1, 2, 0
  for (int i = 0; i < 20; ++i) {
    const double u = static_cast<double>(ref() >> 8) / 16777216.0;
    const token_id expected = u < 0.5 ? 1 : u < 0.8 ? 2 : 0;
    CHECK(chain.sample(logits) == expected);
  }
}

TEST_CASE("sampler: dist frequencies follow the probabilities", "[sampler]") {
  sampler_chain chain;
  chain.add(make_dist(1234));
  const std::vector<float> logits = {std::log(0.5f), std::log(0.25f), std::log(0.25f)};
  int counts[3] = {0, 0, 0};
  for (int i = 0; i < 10000; ++i) ++counts[chain.sample(logits)];
  CHECK(counts[0] == Approx(5000).margin(250));
  CHECK(counts[1] == Approx(2500).margin(250));
  CHECK(counts[2] == Approx(2500).margin(250));
  // After top_k(1) the draw has one choice.
  sampler_chain narrow;
  narrow.add(make_top_k(1)).add(make_dist(1234));
  for (int i = 0; i < 20; ++i) CHECK(narrow.sample(logits) == 0);
}

TEST_CASE("sampler: the same seed gives the same tokens", "[sampler]") {
  sampling_params p;
  p.seed = 42;
  p.temperature = 1.5f;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  std::mt19937 gen(99);
  std::uniform_real_distribution<float> dist(-2.0f, 2.0f);
  std::vector<std::vector<float>> steps(64, std::vector<float>(100));
  for (auto& s : steps) {
    for (float& l : s) l = dist(gen);
  }
  const auto run = [&](uint32_t seed) {
    sampling_params q = p;
    q.seed = seed;
    sampler_chain chain(q);
    ids out;
    for (const auto& s : steps) {
      out.push_back(chain.sample(s));
      chain.accept(out.back());
    }
    return out;
  };
  const ids a = run(42);
  CHECK(run(42) == a);
  CHECK(run(43) != a);
  // reset() rewinds the generator.
  sampler_chain chain(p);
  const token_id first = chain.sample(steps[0]);
  chain.sample(steps[1]);
  chain.reset();
  CHECK(chain.sample(steps[0]) == first);
}

TEST_CASE("sampler: chains from parameters", "[sampler]") {
  sampling_params p;
  CHECK(sampler_chain(p).describe() == "top_k -> top_p -> min_p -> temperature -> dist");
  p.repeat_penalty = 1.1f;
  CHECK(sampler_chain(p).describe() == "penalties -> top_k -> top_p -> min_p -> temperature -> dist");
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  CHECK(sampler_chain(p).describe() == "penalties -> temperature -> dist");
  p.temperature = 0.0f;
  sampler_chain greedy(p);
  CHECK(greedy.describe() == "penalties -> greedy");
  CHECK(greedy.sample(std::vector<float>{0.1f, 0.9f, 0.3f}) == 1);
  // A chain of one token's worth of logits.
  sampling_params d;
  CHECK(sampler_chain(d).sample(std::vector<float>{7.0f}) == 0);
}

TEST_CASE("sampler: bad parameters name the parameter", "[sampler]") {
  const auto bad = [](auto change) {
    sampling_params p;
    change(p);
    return error_of([&] { sampler_chain chain(p); });
  };
  CHECK_THAT(bad([](sampling_params& p) { p.top_p = 0.0f; }), Catch::Contains("top_p must be in (0, 1]"));
  CHECK_THAT(bad([](sampling_params& p) { p.top_p = 1.5f; }), Catch::Contains("top_p") && Catch::Contains("1.5"));
  CHECK_THAT(bad([](sampling_params& p) { p.top_p = std::nanf(""); }), Catch::Contains("top_p"));
  CHECK_THAT(bad([](sampling_params& p) { p.min_p = -0.1f; }), Catch::Contains("min_p must be in [0, 1]"));
  CHECK_THAT(bad([](sampling_params& p) { p.top_k = -1; }), Catch::Contains("top_k must be >= 0"));
  CHECK_THAT(bad([](sampling_params& p) { p.temperature = -1.0f; }), Catch::Contains("temperature"));
  CHECK_THAT(bad([](sampling_params& p) { p.temperature = INFINITY; }), Catch::Contains("temperature"));
  CHECK_THAT(bad([](sampling_params& p) { p.repeat_penalty = 0.0f; }), Catch::Contains("repeat_penalty must be > 0"));
  CHECK_THAT(bad([](sampling_params& p) { p.penalty_last_n = -1; }), Catch::Contains("penalty_last_n"));
  CHECK_THAT(bad([](sampling_params& p) { p.presence_penalty = NAN; }), Catch::Contains("presence_penalty"));
  CHECK(bad([](sampling_params&) {}) == "no error");
  CHECK_THROWS_AS(make_top_p(0.0f), sampling_error);
  CHECK_THROWS_AS(make_min_p(2.0f), sampling_error);
  CHECK_THROWS_AS(make_top_k(-3), sampling_error);
  CHECK_THROWS_AS(make_temperature(-0.5f), sampling_error);
  CHECK_THROWS_AS(make_penalties(-1, 1.0f, 0.0f, 0.0f), sampling_error);
  sampler_chain chain;
  CHECK_THROWS_AS(chain.add(nullptr), sampling_error);
  CHECK_THROWS_AS(chain.sample(std::vector<float>{}), sampling_error);
}
