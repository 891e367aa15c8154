// gemma3: embeddings scaled by sqrt(n_embd); sandwich norms (pre and post attention, pre and post
// feed-forward); QK norms; GeGLU; sliding-window attention on 5 of every 6 layers with their own rope
// base; logits from the tied embeddings. (GGUF conversion stores gemma's norm weights with the +1 applied.)
#include <cmath>

#include "llm/graph.h"
#include "runtime/ops.h"

namespace troupe::llm {

tensor* build_gemma3(graph_builder& b) {
  context& c = b.ctx;
  const hparams& hp = b.hp;
  const int64_t n = b.shape.n_tokens;
  const float kq_scale = hp.attn_scale > 0.0f ? hp.attn_scale : 1.0f / std::sqrt(static_cast<float>(hp.n_embd_head_k));

  tensor* x = scale(c, b.embed(), std::sqrt(static_cast<float>(hp.n_embd)));
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const layer_weights& l = b.m.layers()[il];
    const bool swa = hp.is_swa(il);
    const float base = swa ? hp.rope_freq_base_swa : hp.rope_freq_base;
    tensor* h = b.rms(x, l.attn_norm, hp.rms_eps);
    tensor* q = reshape(c, mul_mat(c, l.wq, h), hp.n_embd_head_k, hp.n_head, n);
    tensor* k = reshape(c, mul_mat(c, l.wk, h), hp.n_embd_head_k, hp.n_head_kv, n);
    tensor* v = reshape(c, mul_mat(c, l.wv, h), hp.n_embd_head_v, hp.n_head_kv, n);
    q = b.rope_of(b.rms(q, l.q_norm, hp.rms_eps), base);
    k = b.rope_of(b.rms(k, l.k_norm, hp.rms_eps), base);
    tensor* att = mul_mat(c, l.wo, b.attention(il, q, k, v, kq_scale, swa ? b.in.mask_swa : b.in.mask));
    x = add(c, x, b.rms(att, l.post_attn_norm, hp.rms_eps));
    tensor* f = b.ffn(l, b.rms(x, l.ffn_norm, hp.rms_eps), true);
    x = add(c, x, b.rms(f, l.post_ffn_norm, hp.rms_eps));
  }
  return b.head(x);
}

}  // namespace troupe::llm
