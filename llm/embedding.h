// Text embeddings: a prompt's final hidden states (after the output norm) pooled into one vector and
// normalized to unit length, as llama.cpp's embedding mode and OpenAI's /v1/embeddings give them.
//
//   llm::llm_context ctx(model, {.n_ctx = 512, .n_ubatch = 512, .embeddings = true});
//   std::vector<float> e = llm::embed(ctx, vocab.tokenize("Hello", true));   // [n_embd], |e| = 1
//
// The pooling is the one the GGUF declares (<arch>.pooling_type: mean, cls = the first token, last);
// where it declares none (a chat model), mean. The context's cache holds sequence 0 for the duration of a
// call; prompts longer than the context are refused.
#pragma once

#include <span>
#include <vector>

#include "llm/llm_context.h"
#include "llm/vocab.h"

namespace troupe::llm {

enum class pooling { mean, cls, last };

// The pooling of a model (hparams::pooling; undeclared or none: mean). Throws error for rank.
pooling pooling_of(const hparams& hp);

// The normalized pooled embedding of tokens. ctx must have been made with embeddings = true. Throws
// error for an empty prompt, capacity_error when it does not fit the context.
std::vector<float> embed(llm_context& ctx, std::span<const token_id> tokens);

}  // namespace troupe::llm
