// What one answer is asked for and what it gives: the parameters of generation (sampling, length, stop
// strings) and the result. One definition, shared by the synchronous generator, the batch decoder, the
// session actor and the HTTP API (actors/messages.h makes them inspectable for CAF as they are).
//
//   llm::generate_params p = llm::generate_params::greedy(64);   // temperature 0: reproducible answers
//   p.stop = {"\n\n"};
//   p.temperature = 0.7f;                                         // the sampling_params fields, flat
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "llm/sampler.h"
#include "llm/vocab.h"

namespace troupe::llm {

// Sampling (the sampling_params fields, flat as in OpenAI's API) plus how long an answer may be and where
// it stops.
struct generate_params : sampling_params {
  int32_t max_tokens = 256;           // generated tokens at most (the context may end the answer earlier)
  std::vector<std::string> stop;      // stop strings: generation ends before the first match
  // -1: no log-probabilities; 0..max_logprobs: each generated token's log-probability and the n most
  // likely tokens' (generate_result::logprobs). The distribution is the one the token was drawn from: after
  // logit_bias, penalties, the filters and temperature; at temperature 0 (greedy) the softmax of the logits
  // after logit_bias and penalties (temperature 1), as llama-server reports it.
  int32_t logprobs = -1;
  static constexpr int32_t max_logprobs = 20;
  // A GBNF grammar (llm/grammar.h) the answer must follow; "" for none. Tokens that would leave
  // the grammar's language are banned before the other sampling stages; the answer ends ("stop") when the
  // grammar can take nothing more. Stop strings and max_tokens still apply; when the tokens left (max_tokens,
  // the context) come close to the bytes the grammar still needs, only tokens that bring its end nearer
  // are allowed, so a JSON answer closes its strings and brackets instead of being cut off.
  std::string grammar;
  // A lazy grammar (tool calls in free text): with triggers, the answer is free until one of these strings
  // appears in it; from that trigger's first byte on, the grammar constrains the rest. Text that already left
  // the grammar's language by the time the trigger completes drops the grammar (the answer stays free).
  std::vector<std::string> grammar_triggers;
  // The reasoning block (from reasoning_start at the answer's beginning, or from its first token when the
  // prompt opened it: reasoning_open, up to reasoning_end): a grammar, lazy or not, applies only after it.
  // reasoning_budget: at most this many tokens inside it, then reasoning_end is forced as the next tokens;
  // -1: no limit.
  int32_t reasoning_budget = -1;
  std::string reasoning_start, reasoning_end;
  bool reasoning_open = false;
  // Control tokens shown in the answer's text (by their text, e.g. "[TOOL_CALLS]", "<|channel|>"): the markers
  // of tool calls and reasoning, which a chat's parser must see. Other control tokens print as nothing.
  std::vector<std::string> preserved_tokens;
  // Cache positions the answer's sequence may hold (prompt and answer); 0: the context's (the session's
  // n_ctx_seq). The daemon sets its request's reservation here.
  int32_t n_ctx = 0;
  // Context shift (llama-server's --context-shift): when the answer reaches the limit above, keep the first
  // n_keep prompt tokens (-1: the whole prompt; a BOS the vocabulary adds is kept besides), drop the oldest
  // half of the rest, move the later ones down and go on, instead of ending with finish "length".
  bool context_shift = false;
  int32_t n_keep = 0;
  friend bool operator==(const generate_params&, const generate_params&) = default;

  // Greedy decoding (temperature 0) of at most max_tokens tokens.
  static generate_params greedy(int32_t max_tokens) {
    generate_params p;
    p.max_tokens = max_tokens;
    p.temperature = 0.0f;
    return p;
  }
};

// One candidate's log-probability, with its text (the token's piece; may be part of a UTF-8 character).
struct token_prob {
  token_id token = 0;
  float logprob = 0.0f;
  std::string text;
  friend bool operator==(const token_prob&, const token_prob&) = default;
};

// A generated token's log-probability and the most likely candidates at its position (highest first, ties
// by lower id).
struct token_logprob : token_prob {
  std::vector<token_prob> top;
  friend bool operator==(const token_logprob&, const token_logprob&) = default;
};

struct generate_result {
  std::vector<token_id> tokens;  // generated
  std::vector<token_logprob> logprobs;  // one per token when generate_params::logprobs >= 0
  std::string text;              // generated text (without a matched stop string)
  std::string finish;            // "stop", "length" or "cancelled"
  std::string stop_match;        // the stop string that ended the answer ("" for none: an end token, a grammar)
  int32_t n_prompt = 0;          // prompt tokens in the request
  int32_t n_prompt_decoded = 0;  // prompt tokens actually decoded (the rest reused from the cache)
  double prompt_seconds = 0;
  double gen_seconds = 0;
  friend bool operator==(const generate_result&, const generate_result&) = default;
};

}  // namespace troupe::llm
