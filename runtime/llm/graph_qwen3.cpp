// qwen3: the llama block with per-head RMS norms on queries and keys (before rope), neox rope, no biases.
#include <cmath>

#include "runtime/llm/graph.h"
#include "runtime/ops.h"

namespace troupe::llm {

tensor* build_qwen3(graph_builder& b) {
  context& c = b.ctx;
  const hparams& hp = b.hp;
  const int64_t n = b.shape.n_tokens;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd_head_k));

  tensor* x = b.embed();
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const layer_weights& l = b.m.layers()[il];
    tensor* h = b.rms(x, l.attn_norm, hp.rms_eps);
    tensor* q = reshape(c, mul_mat(c, l.wq, h), hp.n_embd_head_k, hp.n_head, n);
    tensor* k = reshape(c, mul_mat(c, l.wk, h), hp.n_embd_head_k, hp.n_head_kv, n);
    tensor* v = reshape(c, mul_mat(c, l.wv, h), hp.n_embd_head_v, hp.n_head_kv, n);
    q = b.rope_of(b.rms(q, l.q_norm, hp.rms_eps), hp.rope_freq_base);  // QK norm: per head (rows of head_dim)
    k = b.rope_of(b.rms(k, l.k_norm, hp.rms_eps), hp.rope_freq_base);
    x = add(c, x, mul_mat(c, l.wo, b.attention(il, q, k, v, kq_scale, b.in.mask)));
    x = add(c, x, b.ffn(l, b.rms(x, l.ffn_norm, hp.rms_eps), false));
  }
  return b.head(x);
}

}  // namespace troupe::llm
