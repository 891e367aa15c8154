// Building a model's compute graph for one micro-batch. One builder function per architecture family
// (graph_llama.cpp for llama, qwen2 and qwen3; graph_gemma3.cpp); the pieces they share (norms,
// attention over the KV cache, feed-forward) live in graph_builder.
//
//   graph_builder b(ctx, model, kv, {.n_tokens = 7, .n_kv = 32, .n_outputs = 1});
//   tensor* logits = build_graph(b);   // [n_vocab, n_outputs]; b.in holds the input tensors to fill
#pragma once

#include <cstdint>

#include "runtime/context.h"
#include "llm/kv_cache.h"
#include "llm/model.h"

namespace troupe::llm {

// Turns K rows of layer il back or forth by delta positions (a context shift): each row's heads
// ([n_embd_head_k] each, n_head_kv of them) rotated by the layer's rope at position delta, with the model's
// frequencies, factors and YaRN ramp and without its magnitude factor (the rows have it already). Rotations
// compose, so rope(x, p) turned by delta is rope(x, p + delta) up to rounding. n_ctx: the cache's cells
// (which rope factors a phi3 model uses). Throws error for a rope this cannot turn.
void rope_turn_rows(const model& m, uint32_t il, uint32_t n_ctx, float* rows, int64_t n_rows, int32_t delta);

struct graph_shape {
  uint32_t n_tokens = 1;   // tokens in the micro-batch
  uint32_t n_kv = 32;      // cache cells attention covers
  uint32_t n_outputs = 1;  // rows whose logits are computed
  bool embeddings = false; // the rows' final hidden states (after the output norm) instead of logits
  bool flash_attn = true;  // attention as one fused op (flash_attn) where the layer's cache allows it
};

// The graph's inputs, filled by the caller after allocation.
struct graph_inputs {
  tensor* tokens = nullptr;    // [n_tokens] i32
  tensor* pos = nullptr;       // [n_tokens] i32
  tensor* mask = nullptr;      // [n_kv, n_tokens] f32: 0 or -inf
  tensor* mask_swa = nullptr;  // [n_kv, n_tokens] f32, sliding-window layers (gemma3), else null
  tensor* k_idx = nullptr;     // [n_tokens] i64: the cache cell of each token
  tensor* v_idx = nullptr;     // transposed V: [n_embd_v_gqa * n_tokens] i64, element (d, t) -> d * n_ctx + cell;
                               // otherwise the same as k_idx
  tensor* out_ids = nullptr;   // [n_outputs] i32: token rows whose logits are wanted
  tensor* attn_temp = nullptr; // [1, 1, n_tokens] f32: each token's query multiplier (mistral3's attention
                               // temperature, hparams::attn_temp), else null
};

class graph_builder {
 public:
  graph_builder(context& ctx, const model& m, const kv_cache& kv, const graph_shape& shape);

  context& ctx;
  const model& m;
  const hparams& hp;
  const kv_cache& kv;
  graph_shape shape;
  graph_inputs in;

  // rms_norm(x) * w (w may be null: no scale).
  tensor* rms(tensor* x, tensor* w, float eps) const;
  // Token embeddings of in.tokens: [n_embd, n_tokens].
  tensor* embed() const;
  // Rotary embedding of [head_dim, heads, n_tokens] with the model's rope settings (freq_base override
  // for sliding-window layers).
  tensor* rope_of(tensor* x, float freq_base) const;
  // Writes k, v ([head_dim, n_head_kv, n_tokens]) into layer il's cache cells and returns attention of q
  // ([head_dim, n_head, n_tokens]) over the cache: [n_embd_head_v * n_head, n_tokens], before wo. softcap > 0
  // (gemma2) caps the scaled scores before the mask and softmax: cap * tanh(score / cap).
  tensor* attention(uint32_t il, tensor* q, tensor* k, tensor* v, float kq_scale, tensor* mask, float softcap = 0.0f) const;
  // cap * tanh(x / cap), as 2 cap * sigmoid(2 x / cap) - cap (ops every backend has).
  tensor* softcap(tensor* x, float cap) const;
  // down(act(gate(x)) * up(x)) with act = silu (swiglu) or gelu (geglu).
  tensor* ffn(const layer_weights& l, tensor* x, bool geglu) const;
  // A mixture of experts' feed-forward (l.ffn_gate_inp set): the router's logits, their softmax or sigmoid,
  // the hp.n_expert_used experts of highest weight per token (top_k), their weights (renormalized and scaled
  // as hp says), the chosen experts' SwiGLU feed-forwards (mul_mat_id) weighted and summed; plus qwen2moe's
  // shared expert gated by a sigmoid. [n_embd, n_tokens] in and out.
  tensor* moe_ffn(const layer_weights& l, tensor* x) const;
  // The last step: keep the out_ids rows, final norm, output projection: [n_vocab, n_outputs].
  tensor* head(tensor* x) const;
  // y = w x (+ b when b is set).
  tensor* linear(tensor* w, tensor* x, tensor* b = nullptr) const;
};

// A mixture of experts' routing of n tokens from the router's logits [n_expert, n]: the hp.n_expert_used
// experts of highest weight per token, best first (equal weights: the lower index), and their weights after
// hp's gating (softmax or sigmoid over all experts), renormalization and scale.
struct expert_routing {
  tensor* chosen = nullptr;   // [n_used, n] i32
  tensor* weights = nullptr;  // [1, n_used, n] f32
};
expert_routing route_experts(context& ctx, const hparams& hp, tensor* logits);

// Builds the graph of b.m's architecture; returns the logits tensor (flagged output).
tensor* build_graph(graph_builder& b);

// llama, qwen2 and qwen3 (their differences are optional weights: biases, QK norms), their mixtures of
// experts (Mixtral, qwen2moe, qwen3moe), and granite (llama with multipliers).
tensor* build_llama(graph_builder& b);
tensor* build_gemma2(graph_builder& b);
tensor* build_gemma3(graph_builder& b);
tensor* build_olmo2(graph_builder& b);
tensor* build_phi3(graph_builder& b);

}  // namespace troupe::llm
