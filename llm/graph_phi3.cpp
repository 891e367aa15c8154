// phi3: llama's block with q, k and v in one matrix (attn_qkv, rows q then k then v; separate matrices where
// a file has them), gate and up in one (ffn_up: the gate's rows, then the up's; SwiGLU over its halves),
// neox rope with the long-context frequency factors (model::rope_factors) and no biases.
#include <cmath>

#include "llm/graph.h"
#include "runtime/ops.h"

namespace troupe::llm {

tensor* build_phi3(graph_builder& b) {
  context& c = b.ctx;
  const hparams& hp = b.hp;
  const int64_t n = b.shape.n_tokens;
  const int64_t hd = hp.n_embd_head_k, n_q = hd * hp.n_head, n_k = hp.n_embd_k_gqa();
  const float kq_scale = 1.0f / std::sqrt(static_cast<float>(hd));

  tensor* x = b.embed();  // [n_embd, n_tokens]
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const layer_weights& l = b.m.layers()[il];
    tensor* h = b.rms(x, l.attn_norm, hp.rms_eps);
    tensor *q, *k, *v;
    if (l.wqkv != nullptr) {
      tensor* qkv = mul_mat(c, l.wqkv, h);  // [n_q + 2 n_k, n]
      const size_t es = sizeof(float);
      q = view_3d(c, qkv, hd, hp.n_head, n, hd * es, qkv->nb[1], 0);
      k = view_3d(c, qkv, hd, hp.n_head_kv, n, hd * es, qkv->nb[1], static_cast<size_t>(n_q) * es);
      v = cont(c, view_3d(c, qkv, hd, hp.n_head_kv, n, hd * es, qkv->nb[1], static_cast<size_t>(n_q + n_k) * es));
    } else {
      q = reshape(c, mul_mat(c, l.wq, h), hd, hp.n_head, n);
      k = reshape(c, mul_mat(c, l.wk, h), hd, hp.n_head_kv, n);
      v = reshape(c, mul_mat(c, l.wv, h), hp.n_embd_head_v, hp.n_head_kv, n);
    }
    q = b.rope_of(q, hp.rope_freq_base);
    k = b.rope_of(k, hp.rope_freq_base);
    x = add(c, x, mul_mat(c, l.wo, b.attention(il, q, k, v, kq_scale, b.in.mask)));
    tensor* up = mul_mat(c, l.ffn_up, b.rms(x, l.ffn_norm, hp.rms_eps));  // [2 n_ff, n]
    x = add(c, x, mul_mat(c, l.ffn_down, glu(c, up, nullptr, glu_kind::swiglu)));
  }
  return b.head(x);
}

}  // namespace troupe::llm
