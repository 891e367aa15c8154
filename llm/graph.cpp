#include "llm/graph.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/ops.h"

namespace troupe::llm {

graph_builder::graph_builder(context& c, const model& mdl, const kv_cache& cache, const graph_shape& s)
    : ctx(c), m(mdl), hp(mdl.hp()), kv(cache), shape(s) {
  const int64_t n = s.n_tokens;
  in.tokens = ctx.new_tensor_1d(type::i32, n);
  in.tokens->set_name("inp_tokens");
  in.pos = ctx.new_tensor_1d(type::i32, n);
  in.pos->set_name("inp_pos");
  in.mask = ctx.new_tensor_2d(type::f32, s.n_kv, n);
  in.mask->set_name("inp_mask");
  if (hp.n_swa > 0) {
    in.mask_swa = ctx.new_tensor_2d(type::f32, s.n_kv, n);
    in.mask_swa->set_name("inp_mask_swa");
  }
  in.k_idx = ctx.new_tensor_1d(type::i64, n);
  in.k_idx->set_name("inp_k_idx");
  in.v_idx = kv.any_v_trans() ? ctx.new_tensor_1d(type::i64, static_cast<int64_t>(hp.n_embd_v_gqa()) * n) : in.k_idx;
  in.v_idx->set_name(kv.any_v_trans() ? "inp_v_idx" : "inp_k_idx");
  in.out_ids = ctx.new_tensor_1d(type::i32, s.n_outputs);
  in.out_ids->set_name("inp_out_ids");
  if (hp.attn_temp_scale > 0.0f) {
    in.attn_temp = ctx.new_tensor_3d(type::f32, 1, 1, n);
    in.attn_temp->set_name("inp_attn_temp");
  }
  for (tensor* t : {in.tokens, in.pos, in.mask, in.mask_swa, in.k_idx, in.v_idx, in.out_ids, in.attn_temp}) {
    if (t != nullptr) t->flags |= flag_input;
  }
}

tensor* graph_builder::rms(tensor* x, tensor* w, float eps) const {
  tensor* r = rms_norm(ctx, x, eps);
  return w ? mul(ctx, r, w) : r;
}

tensor* graph_builder::embed() const { return get_rows(ctx, m.tok_embd(), in.tokens); }

tensor* graph_builder::linear(tensor* w, tensor* x, tensor* b) const {
  tensor* y = mul_mat(ctx, w, x);
  return b ? add(ctx, y, b) : y;
}

tensor* graph_builder::rope_of(tensor* x, float freq_base) const {
  rope_params p;
  p.n_dims = static_cast<int32_t>(hp.n_rot);
  p.mode = hp.rope;
  p.n_ctx_orig = static_cast<int32_t>(hp.ctx_orig());
  p.freq_base = freq_base;
  p.freq_scale = hp.rope_freq_scale;
  p.attn_factor = hp.rope_attn_factor;
  if (hp.rope_yarn) {
    p.ext_factor = 1.0f;
    p.beta_fast = hp.yarn_beta_fast;
    p.beta_slow = hp.yarn_beta_slow;
  }
  return rope(ctx, x, in.pos, m.rope_factors(kv.size()), p);
}

void rope_turn_rows(const model& m, uint32_t il, uint32_t n_ctx, float* rows, int64_t n_rows, int32_t delta) {
  const hparams& hp = m.hp();
  if (hp.rope != rope_mode::normal && hp.rope != rope_mode::neox) throw error("context shift: this model's rope mode cannot be turned");
  rope_params p;
  p.n_dims = static_cast<int32_t>(hp.n_rot);
  p.mode = hp.rope;
  p.n_ctx_orig = static_cast<int32_t>(hp.ctx_orig());
  p.freq_base = hp.is_swa(il) ? hp.rope_freq_base_swa : hp.rope_freq_base;
  p.freq_scale = hp.rope_freq_scale;
  if (hp.rope_yarn) {
    p.ext_factor = 1.0f;
    p.beta_fast = hp.yarn_beta_fast;
    p.beta_slow = hp.yarn_beta_slow;
  }
  const int64_t head = hp.n_embd_head_k, n_head = hp.n_head_kv, n_dims = p.n_dims;
  if (n_dims <= 0 || n_dims > head || n_dims % 2 != 0) throw error("context shift: the rope's dimensions do not fit a head");
  std::vector<float> factors;
  if (const tensor* ff = m.rope_factors(n_ctx)) {
    factors.resize(static_cast<size_t>(n_dims / 2));
    tensor_get(*ff, factors.data(), 0, factors.size() * sizeof(float));
  }
  float corr[2];
  rope_yarn_corr_dims(p, corr);
  // cos and sin of each pair's angle at position delta, as the rope kernels compute it, magnitude 1.
  std::vector<float> cs(static_cast<size_t>(n_dims));
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_dims));
  float theta = static_cast<float>(delta);
  for (int64_t i0 = 0; i0 < n_dims; i0 += 2) {
    const float extrap = theta / (factors.empty() ? 1.0f : factors[static_cast<size_t>(i0 / 2)]);
    float th = p.freq_scale * extrap;
    if (p.ext_factor != 0.0f) {
      const float y = (static_cast<float>(i0 / 2) - corr[0]) / std::max(0.001f, corr[1] - corr[0]);
      const float mix = (1.0f - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
      th = th * (1 - mix) + extrap * mix;
    }
    cs[static_cast<size_t>(i0)] = std::cos(th);
    cs[static_cast<size_t>(i0) + 1] = std::sin(th);
    theta *= theta_scale;
  }
  const bool neox = p.mode == rope_mode::neox;
  const int64_t step = neox ? 1 : 2, other = neox ? n_dims / 2 : 1;
  for (int64_t r = 0; r < n_rows * n_head; ++r) {
    float* x = rows + r * head;
    for (int64_t ic = 0; ic < n_dims / 2; ++ic) {
      const int64_t i = ic * step;
      const float c = cs[static_cast<size_t>(2 * ic)], s = cs[static_cast<size_t>(2 * ic + 1)];
      const float x0 = x[i], x1 = x[i + other];
      x[i] = x0 * c - x1 * s;
      x[i + other] = x0 * s + x1 * c;
    }
  }
}

tensor* graph_builder::softcap(tensor* x, float cap) const {
  return scale(ctx, sigmoid(ctx, scale(ctx, x, 2.0f / cap)), 2.0f * cap, -cap);
}

tensor* graph_builder::attention(uint32_t il, tensor* q, tensor* k, tensor* v, float kq_scale, tensor* mask, float cap) const {
  const int64_t n_tokens = shape.n_tokens, n_kv = shape.n_kv;
  const int64_t hd_k = hp.n_embd_head_k, hd_v = hp.n_embd_head_v;
  const int64_t n_head_kv = hp.n_head_kv, n_head = hp.n_head;
  const int64_t n_embd_k = hp.n_embd_k_gqa(), n_embd_v = hp.n_embd_v_gqa();
  tensor* ck = kv.k(il);  // [n_embd_k_gqa, n_ctx]
  tensor* cv = kv.v(il);

  // Store this micro-batch's keys and values in their cells. The views read below are views of the
  // set_rows results, so the graph orders every write before the reads.
  tensor* k_stored = set_rows(ctx, ck, reshape(ctx, k, n_embd_k, n_tokens), in.k_idx);
  tensor* v_stored;
  const bool v_trans = kv.v_trans(il);
  if (v_trans) {
    // One element per "row": element (d, t) of v goes to cache element d * n_ctx + cell(t).
    tensor* cells = view_2d(ctx, cv, 1, static_cast<int64_t>(kv.size()) * n_embd_v, type_size(cv->type), 0);
    v_stored = set_rows(ctx, cells, reshape(ctx, v, 1, n_embd_v * n_tokens), in.v_idx);
  } else {
    v_stored = set_rows(ctx, cv, reshape(ctx, v, n_embd_v, n_tokens), in.k_idx);
  }

  const size_t k_row = row_size(ck->type, n_embd_k);
  tensor* kview = view_3d(ctx, k_stored, hd_k, n_kv, n_head_kv, k_row, row_size(ck->type, hd_k), 0);  // [hd, n_kv, h_kv]
  tensor* qp = permute(ctx, q, 0, 2, 1, 3);                                                              // [hd, n_tok, h]
  // K and V the unfused graph's kernels read as they are: f32 and f16. Others (bf16, the quantized types) are
  // products by K's rows and V converted to f32.
  const auto direct = [](const tensor* t) { return t->type == type::f32 || t->type == type::f16; };
  // Caches of other types (bf16, the quantized ones) take the fused op too: it reads K and V in their type (the
  // query rows converted to K's dot type, V's rows converted a block of cells at a time), where the unfused
  // graph converts the whole V and holds an [n_kv, n_tok, n_head] score matrix (1.1 GB for a 512-token
  // micro-batch of a 32-head model at 16k cells). Its values are the unfused graph's within rounding (V summed
  // in another order), and a quantized cache turns a rounding difference into a different code for the next
  // rows, so the two graphs' logits part after some steps, each as close to an f32 cache's
  // (tests/llm/test_programs.cpp); the fused op's are the same for a row whatever the batch it comes in.
  if (shape.flash_attn && !v_trans && mask != nullptr && cap == 0.0f && kv.cpu_layer(il)) {
    // CPU layers (K and V in a row per cell: the CPU's layout): one op, the scores of a few query rows at a
    // time in cache instead of a score matrix in memory; for f32 / f16 caches the same values as the unfused
    // graph below.
    tensor* vview = view_3d(ctx, v_stored, hd_v, n_kv, n_head_kv, row_size(cv->type, n_embd_v), row_size(cv->type, hd_v), 0);
    tensor* out = flash_attn(ctx, qp, kview, vview, mask, kq_scale);  // [hd_v, h, n_tok]
    return reshape(ctx, out, hd_v * n_head, n_tokens);
  }
  // CPU layers (V in a row per cell: the CPU's layout) skip the scores the mask hides whole.
  tensor* kq = mask != nullptr && !v_trans && direct(cv) ? mul_mat_masked(ctx, kview, qp, mask)
                                                    : mul_mat(ctx, kview, qp);                          // [n_kv, n_tok, h]
  if (cap > 0.0f) {
    kq = softcap(scale(ctx, kq, kq_scale), cap);
    kq_scale = 1.0f;
  }
  kq = soft_max(ctx, kq, mask, kq_scale);

  tensor* vt;  // [n_kv, hd_v, h_kv]
  const size_t esz = type_size(cv->type);
  if (v_trans) {
    vt = view_3d(ctx, v_stored, n_kv, hd_v, n_head_kv, kv.size() * esz, kv.size() * esz * static_cast<size_t>(hd_v), 0);
  } else {
    tensor* vq = view_3d(ctx, v_stored, hd_v, n_kv, n_head_kv, row_size(cv->type, n_embd_v), row_size(cv->type, hd_v), 0);
    if (!direct(cv)) {
      tensor* vf = cpy(ctx, vq, ctx.new_tensor_3d(type::f32, hd_v, n_kv, n_head_kv));
      vt = cont(ctx, permute(ctx, vf, 1, 0, 2, 3));
    } else {
      // A row per cell, read as columns: the CPU's product walks V's rows in cell order (see kv_cache).
      vt = permute(ctx, vq, 1, 0, 2, 3);
    }
  }
  tensor* kqv = mul_mat(ctx, vt, kq);                 // [hd_v, n_tok, h]
  tensor* out = cont(ctx, permute(ctx, kqv, 0, 2, 1, 3));  // [hd_v, h, n_tok]
  return reshape(ctx, out, hd_v * n_head, n_tokens);
}

tensor* graph_builder::ffn(const layer_weights& l, tensor* x, bool use_geglu) const {
  tensor* g = mul_mat(ctx, l.ffn_gate, x);
  tensor* u = mul_mat(ctx, l.ffn_up, x);
  tensor* a = use_geglu ? geglu(ctx, g, u) : swiglu(ctx, g, u);
  return mul_mat(ctx, l.ffn_down, a);
}

expert_routing route_experts(context& ctx, const hparams& hp, tensor* logits) {
  const int64_t n = logits->ne[1], n_expert = hp.n_expert, n_used = hp.n_expert_used;
  tensor* probs = hp.gating == expert_gating::sigmoid ? sigmoid(ctx, logits) : soft_max(ctx, logits, nullptr, 1.0f);
  tensor* chosen = top_k(ctx, probs, static_cast<int>(n_used));                      // [n_used, n] i32
  tensor* w = get_rows(ctx, reshape(ctx, probs, 1, n_expert, n), chosen);            // [1, n_used, n]
  if (hp.expert_weights_norm) {
    tensor* w2 = reshape(ctx, w, n_used, n);
    w = reshape(ctx, div(ctx, w2, sum_rows(ctx, w2)), 1, n_used, n);
  }
  if (hp.expert_weights_scale != 1.0f) w = scale(ctx, w, hp.expert_weights_scale);
  return {chosen, w};
}

tensor* graph_builder::moe_ffn(const layer_weights& l, tensor* x) const {
  const int64_t n = shape.n_tokens, n_embd = hp.n_embd;
  const auto [chosen, w] = route_experts(ctx, hp, mul_mat(ctx, l.ffn_gate_inp, x));  // logits [n_expert, n]
  tensor* xe = reshape(ctx, x, n_embd, 1, n);  // every chosen expert reads the token's row
  tensor* up = mul_mat_id(ctx, l.ffn_up_exps, xe, chosen);      // [n_ff_exp, n_used, n]
  tensor* gate = mul_mat_id(ctx, l.ffn_gate_exps, xe, chosen);
  tensor* down = mul_mat_id(ctx, l.ffn_down_exps, swiglu(ctx, gate, up), chosen);  // [n_embd, n_used, n]
  down = mul(ctx, down, w);
  // The sum over the chosen experts, in choice order: rows of the [n_used, n_embd, n] view.
  tensor* out = reshape(ctx, sum_rows(ctx, permute(ctx, down, 1, 0, 2, 3)), n_embd, n);
  if (l.ffn_gate_inp_shexp != nullptr) {
    tensor* g = sigmoid(ctx, mul_mat(ctx, l.ffn_gate_inp_shexp, x));  // [1, n]
    tensor* sh = mul_mat(ctx, l.ffn_down_shexp, swiglu(ctx, mul_mat(ctx, l.ffn_gate_shexp, x), mul_mat(ctx, l.ffn_up_shexp, x)));
    out = add(ctx, out, mul(ctx, sh, g));
  }
  return out;
}

tensor* graph_builder::head(tensor* x) const {
  tensor* rows = get_rows(ctx, x, in.out_ids);  // [n_embd, n_outputs]
  tensor* h = rms(rows, m.output_norm(), hp.rms_eps);
  if (shape.embeddings) {
    h->set_name("embeddings");
    h->flags |= flag_output;
    return h;
  }
  tensor* logits = mul_mat(ctx, m.output(), h);  // [n_vocab, n_outputs]
  if (hp.logit_scale > 0.0f) logits = scale(ctx, logits, 1.0f / hp.logit_scale);  // granite
  if (hp.final_softcap > 0.0f) logits = softcap(logits, hp.final_softcap);         // gemma2
  logits->set_name("logits");
  logits->flags |= flag_output;
  return logits;
}

tensor* build_graph(graph_builder& b) {
  switch (b.hp.a) {
    case arch::llama:
    case arch::qwen2:
    case arch::qwen3:
    case arch::qwen2moe:
    case arch::qwen3moe:
    case arch::granite:
    case arch::mistral3: return build_llama(b);
    case arch::gemma2: return build_gemma2(b);
    case arch::gemma3: return build_gemma3(b);
    case arch::olmo2: return build_olmo2(b);
    case arch::phi3: return build_phi3(b);
  }
  throw error("no graph builder for architecture " + b.hp.name);
}

}  // namespace troupe::llm
