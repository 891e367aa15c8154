// Choosing the next token from one position's logits: a chain of stages (penalties, filters, temperature)
// ending in a choice (greedy or a seeded random draw).
//
//   llm::sampling_params p;            // temperature 0.8, top_k 40, top_p 0.95, min_p 0.05, seed 0
//   p.seed = 1234;
//   llm::sampler_chain chain(p);       // penalties -> top_k -> top_p -> min_p -> temperature -> dist
//   for (llm::token_id t : prompt) chain.accept(t);            // the penalties see the prompt too
//   llm::token_id next = chain.sample(logits);                 // logits: [n_vocab] floats
//   chain.accept(next);                                        // remember it for the penalties
//
// Or stage by stage:
//   llm::sampler_chain c;
//   c.add(llm::make_top_k(10)).add(llm::make_temperature(0.7f)).add(llm::make_dist(42));
//
// The same seed, parameters and inputs give the same tokens on every platform: the random draw uses
// std::mt19937's output directly (no implementation-defined std distributions). Bad parameters throw
// sampling_error naming the parameter and the accepted range.
#pragma once

#include <cstdint>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "runtime/error.h"
#include "llm/vocab.h"

namespace troupe::llm {

class sampling_error : public error {
 public:
  using error::error;
};

// One candidate token.
struct token_candidate {
  token_id id;
  float logit;
  float p;  // probability; valid after softmax()
};

// The candidates for one position, as the stages narrow and reweight them.
struct candidates {
  std::vector<token_candidate> data;
  bool sorted = false;             // data is ordered by logit, highest first (ties: lower id first)
  token_id selected = token_null;  // set by the stage that chooses (greedy, dist)

  // Fills data with (id, logit) for every entry of logits. Throws sampling_error if logits is empty or
  // holds a NaN or +inf.
  void assign(std::span<const float> logits);
  void sort();     // by logit descending, ties by id; no-op when sorted
  // Sets p = softmax(logit) over the candidates (sorts first). Throws sampling_error if every logit is -inf.
  void softmax();
};

// A stage of a sampler chain.
class sampler_stage_i {
 public:
  virtual ~sampler_stage_i() = default;
  virtual std::string_view name() const = 0;
  // Narrows or reweights c, or chooses (sets c.selected).
  virtual void apply(candidates& c) = 0;
  // Told every token the sequence gets (prompt and generated). Default: nothing.
  virtual void accept(token_id) {}
  // Back to the state after construction (history, RNG). Default: nothing.
  virtual void reset() {}
};

// Repetition, frequency and presence penalties over the last `last_n` accepted tokens, as llama.cpp
// applies them: a token seen c > 0 times gets its logit divided by `repeat` when positive (multiplied when
// negative), then minus c * frequency + presence. last_n == 0 disables it. repeat > 0.
std::unique_ptr<sampler_stage_i> make_penalties(int32_t last_n, float repeat, float frequency, float presence);
// Keeps the k highest logits (ties: lower id first) and sorts. k == 0 keeps all (still sorts). k >= 0.
std::unique_ptr<sampler_stage_i> make_top_k(int32_t k);
// Keeps the most likely tokens whose probabilities add up to at least p (at least min_keep). p in (0, 1];
// 1 keeps all.
std::unique_ptr<sampler_stage_i> make_top_p(float p, size_t min_keep = 1);
// Keeps tokens with probability >= p * (the highest probability), at least min_keep. p in [0, 1]; 0 keeps all.
std::unique_ptr<sampler_stage_i> make_min_p(float p, size_t min_keep = 1);
// Divides logits by t. t >= 0; t == 0 keeps only the highest logit(s).
std::unique_ptr<sampler_stage_i> make_temperature(float t);
// Chooses the highest logit (ties: lower id).
std::unique_ptr<sampler_stage_i> make_greedy();
// Chooses at random by softmax probability, with std::mt19937 seeded with `seed`.
std::unique_ptr<sampler_stage_i> make_dist(uint32_t seed);

// A bias added to one token's logit before the other stages (OpenAI's logit_bias): -100 or less bans the
// token (its logit becomes -inf).
struct token_bias {
  int32_t token = 0;
  float bias = 0.0f;
  friend bool operator==(const token_bias&, const token_bias&) = default;
};
// Adds each bias to its token's logit (a bias <= -100 sets it to -inf). Token ids outside the candidates
// are the caller's to refuse (sequence checks them against the vocabulary).
std::unique_ptr<sampler_stage_i> make_logit_bias(std::vector<token_bias> biases);

struct sampling_params {
  uint32_t seed = 0;             // seed of the random draw
  float temperature = 0.8f;      // 0: greedy (argmax after penalties); otherwise > 0
  int32_t top_k = 40;            // 0: off
  float top_p = 0.95f;           // 1: off; in (0, 1]
  float min_p = 0.05f;           // 0: off; in [0, 1]
  int32_t penalty_last_n = 64;   // tokens of history the penalties see; 0: penalties off
  float repeat_penalty = 1.0f;   // 1: off; > 0
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  std::vector<token_bias> logit_bias;  // applied first; each bias in [-100, 100]

  // Throws sampling_error naming the first bad field.
  void validate() const;
  friend bool operator==(const sampling_params&, const sampling_params&) = default;
};

class sampler_chain {
 public:
  sampler_chain() = default;  // no stages: sample() is greedy
  // logit_bias (when given) -> penalties (when on) -> top_k -> top_p -> min_p -> temperature -> dist, or
  // logit_bias -> penalties -> greedy when temperature == 0. Validates p.
  explicit sampler_chain(const sampling_params& p);

  sampler_chain& add(std::unique_ptr<sampler_stage_i> stage);

  // Runs the stages over logits ([n_vocab] for one position) and returns the chosen token (the highest
  // remaining logit when no stage chose). Does not accept it.
  token_id sample(std::span<const float> logits);
  // Tells every stage about a token of the sequence (prompt tokens and each sampled token).
  void accept(token_id id);
  void reset();

  // "penalties -> top_k -> ... -> dist".
  std::string describe() const;
  // The candidates as the last sample() left them (for tests and diagnostics).
  const candidates& last() const { return cur_; }

 private:
  std::vector<std::unique_ptr<sampler_stage_i>> stages_;
  candidates cur_;
};

}  // namespace troupe::llm
