// llama (Llama 1/2/3, TinyLlama, SmolLM2, stories): pre-norm blocks, rotary attention (normal mode) with
// grouped-query heads, SwiGLU feed-forward. Optional q/k/v biases and rope frequency factors. The same block
// serves qwen2 (q/k/v biases, neox rope: the rope mode comes from the hyperparameters) and qwen3 (per-head
// RMS norms on queries and keys before rope, no biases), and each with a mixture of experts in place of the
// feed-forward: Mixtral (llama with experts), qwen2moe (biases, a shared expert), qwen3moe (QK norms). And
// granite: the embeddings, each sublayer's output and the logits scaled by the file's multipliers, its own
// attention scale, an optional attention output bias. And mistral3 (Ministral 3, Mistral Small 3.x as
// converted by llama.cpp): llama's block with YaRN rope and the queries scaled by the attention temperature.
#include <cmath>

#include "llm/graph.h"
#include "runtime/ops.h"

namespace troupe::llm {

tensor* build_llama(graph_builder& b) {
  context& c = b.ctx;
  const hparams& hp = b.hp;
  const int64_t n = b.shape.n_tokens;
  const float kq_scale = hp.attn_scale > 0.0f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.n_embd_head_k));
  // granite's residual multiplier on each sublayer's output (1: none).
  auto residual = [&](tensor* t) { return hp.residual_scale > 0.0f ? scale(c, t, hp.residual_scale) : t; };

  tensor* x = b.embed();  // [n_embd, n_tokens]
  if (hp.embedding_scale > 0.0f) x = scale(c, x, hp.embedding_scale);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const layer_weights& l = b.m.layers()[il];
    tensor* h = b.rms(x, l.attn_norm, hp.rms_eps);
    tensor* q = reshape(c, b.linear(l.wq, h, l.bq), hp.n_embd_head_k, hp.n_head, n);
    tensor* k = reshape(c, b.linear(l.wk, h, l.bk), hp.n_embd_head_k, hp.n_head_kv, n);
    tensor* v = reshape(c, b.linear(l.wv, h, l.bv), hp.n_embd_head_v, hp.n_head_kv, n);
    if (l.q_norm != nullptr) q = b.rms(q, l.q_norm, hp.rms_eps);  // qwen3's QK norm: per head (rows of head_dim)
    if (l.k_norm != nullptr) k = b.rms(k, l.k_norm, hp.rms_eps);
    q = b.rope_of(q, hp.rope_freq_base);
    k = b.rope_of(k, hp.rope_freq_base);
    if (b.in.attn_temp != nullptr) q = mul(c, q, b.in.attn_temp);  // mistral3's attention temperature
    tensor* att = b.attention(il, q, k, v, kq_scale, b.in.mask);
    x = add(c, x, residual(b.linear(l.wo, att, l.bo)));
    tensor* f = b.rms(x, l.ffn_norm, hp.rms_eps);
    x = add(c, x, residual(l.ffn_gate_inp != nullptr ? b.moe_ffn(l, f) : b.ffn(l, f, false)));
  }
  return b.head(x);
}

}  // namespace troupe::llm
