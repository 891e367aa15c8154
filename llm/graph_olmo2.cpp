// olmo2: no norm before the sublayers; RMS norms on the queries and keys over all heads at once (before
// rope, neox), and on each sublayer's output before its residual add (post_attention_norm,
// post_ffw_norm); SwiGLU feed-forward.
#include <cmath>

#include "llm/graph.h"
#include "runtime/ops.h"

namespace troupe::llm {

tensor* build_olmo2(graph_builder& b) {
  context& c = b.ctx;
  const hparams& hp = b.hp;
  const int64_t n = b.shape.n_tokens;
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd_head_k));

  tensor* x = b.embed();  // [n_embd, n_tokens]
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const layer_weights& l = b.m.layers()[il];
    tensor* q = b.rms(mul_mat(c, l.wq, x), l.q_norm, hp.rms_eps);
    tensor* k = b.rms(mul_mat(c, l.wk, x), l.k_norm, hp.rms_eps);
    tensor* v = reshape(c, mul_mat(c, l.wv, x), hp.n_embd_head_v, hp.n_head_kv, n);
    q = b.rope_of(reshape(c, q, hp.n_embd_head_k, hp.n_head, n), hp.rope_freq_base);
    k = b.rope_of(reshape(c, k, hp.n_embd_head_k, hp.n_head_kv, n), hp.rope_freq_base);
    tensor* att = mul_mat(c, l.wo, b.attention(il, q, k, v, kq_scale, b.in.mask));
    x = add(c, x, b.rms(att, l.post_attn_norm, hp.rms_eps));
    x = add(c, x, b.rms(b.ffn(l, x, false), l.post_ffn_norm, hp.rms_eps));
  }
  return b.head(x);
}

}  // namespace troupe::llm
