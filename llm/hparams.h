// Model hyperparameters, read from GGUF keys ("<arch>.embedding_length", ...).
//
//   hparams hp = hparams::from_gguf(file);   // throws error naming the missing or bad key
//   hp.n_embd_head_k                          // head dim, defaults to n_embd / n_head
//
// Units: counts are elements or tokens; 0 means "not set" only where a comment says so.
#pragma once

#include <cstdint>
#include <string>

#include "loader/gguf.h"
#include "runtime/ops.h"

namespace troupe::llm {

enum class arch : uint8_t { llama, qwen2, qwen3, gemma3, qwen2moe, qwen3moe, granite, olmo2, gemma2, phi3, mistral3 };

// How a mixture of experts' router turns its logits into the experts' weights (<arch>.expert_gating_func,
// numbered as llama.cpp: 1 softmax, 2 sigmoid).
enum class expert_gating : uint8_t { softmax = 1, sigmoid = 2 };

// The architecture for a general.architecture value; throws error naming it when troupe has no graph for it.
arch arch_from_name(const std::string& name);

struct hparams {
  arch a = arch::llama;
  std::string name;          // general.architecture
  uint32_t n_vocab = 0;      // tokens (from the token list, else the embedding's ne[1])
  uint32_t n_ctx_train = 0;  // training context
  uint32_t n_embd = 0;       // model width
  uint32_t n_layer = 0;
  uint32_t n_head = 0;
  uint32_t n_head_kv = 0;    // < n_head: grouped-query attention
  uint32_t n_ff = 0;         // feed-forward width
  uint32_t n_embd_head_k = 0;
  uint32_t n_embd_head_v = 0;
  uint32_t n_rot = 0;        // rotated dims per head (partial rotary when < n_embd_head_k)
  float rms_eps = 1e-5f;
  float rope_freq_base = 10000.0f;
  float rope_freq_scale = 1.0f;  // 1 / linear scaling factor
  rope_mode rope = rope_mode::normal;
  // Sliding-window attention (gemma3): window in tokens, and every swa_pattern-th layer is global.
  uint32_t n_swa = 0;  // 0: no sliding window
  uint32_t swa_pattern = 0;
  float rope_freq_base_swa = 10000.0f;
  float attn_scale = 0.0f;  // 0: 1 / sqrt(n_embd_head_k)
  // granite's multipliers (0: none): the embeddings times embedding_scale, each block's attention and
  // feed-forward outputs times residual_scale before their residual add, the logits divided by logit_scale.
  float embedding_scale = 0.0f;
  float residual_scale = 0.0f;
  float logit_scale = 0.0f;
  // gemma2's soft caps (0: none): the attention scores and the logits become cap * tanh(x / cap).
  float attn_softcap = 0.0f;
  float final_softcap = 0.0f;
  // The context the model was trained on before its rope was stretched (<arch>.rope.scaling.
  // original_context_length): phi3 takes its long rope factors beyond it, YaRN's correction range and
  // mistral3's attention temperature are measured in it.
  uint32_t n_ctx_orig = 0;  // 0: n_ctx_train
  // rope's magnitude factor (cos and sin are multiplied by it): <arch>.rope.scaling.attn_factor, with YaRN
  // the attention factor below.
  float rope_attn_factor = 1.0f;
  // YaRN (<arch>.rope.scaling.type "yarn"): rope_freq_scale = 1 / factor interpolates the low frequencies,
  // the dimension pairs between the corrections of yarn_beta_fast and yarn_beta_slow rotations blend into
  // the original (extrapolated) angles, and cos / sin are scaled by the attention factor: 1 + 0.1 ln(factor),
  // or (1 + 0.1 ln factor) / (1 + 0.1 m ln factor) with <arch>.rope.scaling.yarn_log_multiplier m.
  bool rope_yarn = false;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  // mistral3's attention temperature (Llama 4's): the queries of a token at position p are multiplied by
  // 1 + attn_temp_scale * ln(1 + floor(p / n_ctx_orig)) after rope. 0: none.
  float attn_temp_scale = 0.0f;
  // <arch>.pooling_type, as llama.cpp numbers it: -1 not declared (embeddings use mean), 0 none, 1 mean,
  // 2 cls (the first token), 3 last, 4 rank (refused: a reranker's head is not loaded).
  int32_t pooling = -1;
  // Mixture of experts (qwen2moe, qwen3moe, llama with experts: Mixtral). n_expert == 0: a dense model.
  uint32_t n_expert = 0;       // <arch>.expert_count
  uint32_t n_expert_used = 0;  // <arch>.expert_used_count: experts each token is routed to
  uint32_t n_ff_exp = 0;       // <arch>.expert_feed_forward_length (default n_ff): an expert's width
  uint32_t n_ff_shexp = 0;     // <arch>.expert_shared_feed_forward_length: the shared expert's (qwen2moe)
  expert_gating gating = expert_gating::softmax;
  bool expert_weights_norm = false;   // the chosen experts' weights divided by their sum
  float expert_weights_scale = 1.0f;  // and then scaled by this

  uint32_t n_embd_k_gqa() const { return n_embd_head_k * n_head_kv; }
  uint32_t n_embd_v_gqa() const { return n_embd_head_v * n_head_kv; }
  bool is_swa(uint32_t il) const { return n_swa > 0 && swa_pattern > 0 && (il + 1) % swa_pattern != 0; }
  uint32_t ctx_orig() const { return n_ctx_orig > 0 ? n_ctx_orig : n_ctx_train; }
  // The query multiplier of mistral3's attention temperature at position pos (1 without one).
  float attn_temp(int32_t pos) const;

  static hparams from_gguf(const gguf_file& f);
};

}  // namespace troupe::llm
