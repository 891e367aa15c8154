// gemma2: embeddings scaled by sqrt(n_embd); sandwich norms (pre and post attention, pre and post
// feed-forward); GeGLU; sliding-window attention on every other layer (the first of each pair), all with the
// model's rope base; queries scaled by hp.attn_scale; the attention scores and the logits soft-capped
// (cap * tanh(x / cap)); logits from the tied embeddings. (GGUF stores gemma's norm weights with the +1.)
#include <cmath>

#include "llm/graph.h"
#include "runtime/ops.h"

namespace troupe::llm {

tensor* build_gemma2(graph_builder& b) {
  context& c = b.ctx;
  const hparams& hp = b.hp;
  const int64_t n = b.shape.n_tokens;

  tensor* x = scale(c, b.embed(), std::sqrt(static_cast<float>(hp.n_embd)));
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    const layer_weights& l = b.m.layers()[il];
    const bool swa = hp.is_swa(il);
    tensor* h = b.rms(x, l.attn_norm, hp.rms_eps);
    tensor* q = reshape(c, mul_mat(c, l.wq, h), hp.n_embd_head_k, hp.n_head, n);
    tensor* k = reshape(c, mul_mat(c, l.wk, h), hp.n_embd_head_k, hp.n_head_kv, n);
    tensor* v = reshape(c, mul_mat(c, l.wv, h), hp.n_embd_head_v, hp.n_head_kv, n);
    q = b.rope_of(q, hp.rope_freq_base);
    k = b.rope_of(k, hp.rope_freq_base);
    tensor* att = b.attention(il, q, k, v, hp.attn_scale, swa ? b.in.mask_swa : b.in.mask, hp.attn_softcap);
    x = add(c, x, b.rms(mul_mat(c, l.wo, att), l.post_attn_norm, hp.rms_eps));
    tensor* f = b.ffn(l, b.rms(x, l.ffn_norm, hp.rms_eps), true);
    x = add(c, x, b.rms(f, l.post_ffn_norm, hp.rms_eps));
  }
  return b.head(x);
}

}  // namespace troupe::llm
