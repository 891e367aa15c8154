#include "llm/hparams.h"

#include <cmath>

#include "runtime/error.h"

namespace troupe::llm {

arch arch_from_name(const std::string& name) {
  if (name == "llama") return arch::llama;
  if (name == "qwen2") return arch::qwen2;
  if (name == "qwen3") return arch::qwen3;
  if (name == "gemma3") return arch::gemma3;
  if (name == "qwen2moe") return arch::qwen2moe;
  if (name == "qwen3moe") return arch::qwen3moe;
  if (name == "granite") return arch::granite;
  if (name == "olmo2") return arch::olmo2;
  if (name == "gemma2") return arch::gemma2;
  if (name == "phi3") return arch::phi3;
  if (name == "mistral3") return arch::mistral3;
  throw error("model architecture '" + name +
              "' is not supported (troupe runs llama (with or without experts), mistral3, qwen2, qwen2moe, qwen3, "
              "qwen3moe, gemma2, gemma3, granite, olmo2 and phi3)");
}

namespace {

uint32_t get_u32(const gguf_file& f, const std::string& key) {
  const uint64_t v = f.get_uint(key).value();
  if (v > UINT32_MAX) throw gguf_error(f.message(key, "value " + std::to_string(v) + " is too large", std::nullopt));
  return static_cast<uint32_t>(v);
}

uint32_t get_u32_or(const gguf_file& f, const std::string& key, uint32_t fallback) {
  return f.contains(key) ? get_u32(f, key) : fallback;
}

float get_f32_or(const gguf_file& f, const std::string& key, float fallback) {
  if (!f.contains(key)) return fallback;
  const double v = f.get_float(key).value();
  if (!std::isfinite(v)) throw gguf_error(f.message(key, "value is not finite", std::nullopt));
  return static_cast<float>(v);
}

// An error naming key in f, in the format of every gguf_error.
gguf_error bad_key(const gguf_file& f, const std::string& key, const std::string& why) {
  return gguf_error(f.message(key, why, std::nullopt));
}

// key's value (fallback when absent), which must be positive.
float positive_f32(const gguf_file& f, const std::string& key, float fallback) {
  const float v = get_f32_or(f, key, fallback);
  if (!(v > 0.0f)) throw bad_key(f, key, "must be positive");
  return v;
}

// The mixture-of-experts keys: required by qwen2moe / qwen3moe, optional for llama and mistral3 (Mixtral
// declares them; a dense llama has none). Each bad value is an error naming its key.
void read_experts(const gguf_file& f, hparams& hp) {
  const std::string p = hp.name + ".";
  auto bad = [&](const std::string& key, const std::string& why) { return bad_key(f, key, why); };
  const bool moe_arch = hp.a == arch::qwen2moe || hp.a == arch::qwen3moe;
  if (!moe_arch && !f.contains(p + "expert_count")) return;
  if (!moe_arch && hp.a != arch::llama && hp.a != arch::mistral3) {
    const uint32_t n = get_u32(f, p + "expert_count");
    if (n == 0) return;
    const bool has_variant = hp.a == arch::qwen2 || hp.a == arch::qwen3;
    throw bad(p + "expert_count", "experts are not part of " + hp.name +
                                      (has_variant ? " (its mixture-of-experts variant is " + hp.name + "moe)" : ""));
  }
  hp.n_expert = get_u32(f, p + "expert_count");
  if (hp.n_expert == 0) {
    if (moe_arch) throw bad(p + "expert_count", "must be positive for " + hp.name);
    return;  // llama that declares no experts: dense
  }
  if (hp.n_expert > 4096) throw bad(p + "expert_count", "at most 4096 experts, got " + std::to_string(hp.n_expert));
  hp.n_expert_used = get_u32(f, p + "expert_used_count");
  if (hp.n_expert_used == 0 || hp.n_expert_used > hp.n_expert) {
    throw bad(p + "expert_used_count", "must be in [1, expert_count = " + std::to_string(hp.n_expert) + "], got " +
                                           std::to_string(hp.n_expert_used));
  }
  hp.n_ff_exp = get_u32_or(f, p + "expert_feed_forward_length", hp.n_ff);
  if (hp.n_ff_exp == 0) throw bad(p + "expert_feed_forward_length", "must be positive");
  if (hp.a == arch::qwen2moe) {
    hp.n_ff_shexp = get_u32_or(f, p + "expert_shared_feed_forward_length", hp.n_ff_exp);
    if (hp.n_ff_shexp == 0) throw bad(p + "expert_shared_feed_forward_length", "must be positive");
  }
  // The architectures' own choices (llama.cpp's): qwen2moe keeps the softmax weights of the chosen experts
  // as they are, Mixtral and qwen3moe renormalize them over the chosen ones. A file may say otherwise.
  hp.expert_weights_norm = hp.a != arch::qwen2moe;
  if (f.contains(p + "expert_weights_norm")) {
    const gguf_value* v = f.find(p + "expert_weights_norm");
    const bool* b = v->get_if<bool>();
    if (b == nullptr) throw bad(p + "expert_weights_norm", "must be a bool");
    hp.expert_weights_norm = *b;
  }
  hp.expert_weights_scale = get_f32_or(f, p + "expert_weights_scale", 1.0f);
  if (!(hp.expert_weights_scale > 0.0f)) throw bad(p + "expert_weights_scale", "must be positive");
  if (f.contains(p + "expert_gating_func")) {
    const uint32_t g = get_u32(f, p + "expert_gating_func");
    if (g != 1 && g != 2) {
      throw bad(p + "expert_gating_func", "must be 1 (softmax) or 2 (sigmoid), got " + std::to_string(g));
    }
    hp.gating = static_cast<expert_gating>(g);
  }
}

// <arch>.rope.scaling.*: the type (none, linear, yarn; longrope with phi3's factor tensors), the factor,
// the original context, YaRN's betas and log multiplier, the magnitude factor. rope.scale_linear is the
// older spelling of a linear factor.
void read_rope_scaling(const gguf_file& f, hparams& hp) {
  const std::string p = hp.name + ".";
  auto bad = [&](const std::string& key, const std::string& why) { return bad_key(f, key, why); };
  auto positive = [&](const std::string& key, float fallback) { return positive_f32(f, key, fallback); };
  const std::string type_key = p + "rope.scaling.type";
  const std::string type = f.contains(type_key) ? f.get<std::string>(type_key).value() : std::string();
  const float linear = get_f32_or(f, p + "rope.scale_linear", 0.0f);
  const float factor = get_f32_or(f, p + "rope.scaling.factor", 0.0f);
  if (linear < 0.0f) throw bad(p + "rope.scale_linear", "must not be negative");
  if (factor < 0.0f) throw bad(p + "rope.scaling.factor", "must not be negative");
  const std::string orig_key = p + "rope.scaling.original_context_length";
  hp.n_ctx_orig = get_u32_or(f, orig_key, hp.n_ctx_train);
  if (f.contains(orig_key) && hp.n_ctx_orig == 0) throw bad(orig_key, "must be positive");
  hp.rope_attn_factor = positive(p + "rope.scaling.attn_factor", 1.0f);
  if (type.empty() || type == "linear") {
    if (linear > 0.0f) hp.rope_freq_scale = 1.0f / linear;
    else if (factor > 0.0f) hp.rope_freq_scale = 1.0f / factor;
  } else if (type == "none" || type == "longrope") {
    hp.rope_freq_scale = 1.0f;  // longrope: phi3's factor tensors do the scaling
  } else if (type == "yarn") {
    if (!(factor >= 1.0f)) throw bad(p + "rope.scaling.factor", "YaRN needs a factor of at least 1");
    hp.rope_yarn = true;
    hp.rope_freq_scale = 1.0f / factor;
    hp.yarn_beta_fast = positive(p + "rope.scaling.yarn_beta_fast", 32.0f);
    hp.yarn_beta_slow = positive(p + "rope.scaling.yarn_beta_slow", 1.0f);
    const float log_mul = get_f32_or(f, p + "rope.scaling.yarn_log_multiplier", 0.0f);
    if (log_mul < 0.0f) throw bad(p + "rope.scaling.yarn_log_multiplier", "must not be negative");
    // The attention factor as Hugging Face computes it (mscale 1, mscale_all_dim the log multiplier). The rope
    // kernels multiply a YaRN rope by 1 + 0.1 ln(factor) themselves (as ggml's), so that part is divided out.
    auto mscale = [&](float m) { return 1.0f + 0.1f * m * std::log(factor); };
    const float attention = log_mul != 0.0f ? mscale(1.0f) / mscale(log_mul) : mscale(1.0f);
    hp.rope_attn_factor *= attention / mscale(1.0f);
  } else {
    throw bad(type_key, "unknown rope scaling type '" + type + "' (troupe knows none, linear, yarn and longrope)");
  }
}

}  // namespace

float hparams::attn_temp(int32_t pos) const {
  if (attn_temp_scale == 0.0f) return 1.0f;
  const float periods = std::floor(static_cast<float>(pos) / static_cast<float>(ctx_orig()));
  return static_cast<float>(std::log(static_cast<double>(periods) + 1.0) * attn_temp_scale + 1.0);
}

hparams hparams::from_gguf(const gguf_file& f) {
  hparams hp;
  hp.name = f.get<std::string>("general.architecture").value();
  hp.a = arch_from_name(hp.name);
  const std::string p = hp.name + ".";
  hp.n_ctx_train = get_u32(f, p + "context_length");
  hp.n_embd = get_u32(f, p + "embedding_length");
  hp.n_layer = get_u32(f, p + "block_count");
  hp.n_ff = get_u32(f, p + "feed_forward_length");
  hp.n_head = get_u32(f, p + "attention.head_count");
  hp.n_head_kv = get_u32_or(f, p + "attention.head_count_kv", hp.n_head);
  auto bad = [&](const std::string& key, const std::string& why) { return bad_key(f, key, why); };
  if (hp.n_embd == 0) throw bad(p + "embedding_length", "must be positive");
  if (hp.n_layer == 0) throw bad(p + "block_count", "must be positive");
  if (hp.n_head == 0) throw bad(p + "attention.head_count", "must be positive");
  if (hp.n_head_kv == 0 || hp.n_head % hp.n_head_kv != 0) {
    throw bad(p + "attention.head_count_kv", "must divide attention.head_count (" + std::to_string(hp.n_head) + ")");
  }
  hp.n_embd_head_k = get_u32_or(f, p + "attention.key_length", hp.n_embd / hp.n_head);
  hp.n_embd_head_v = get_u32_or(f, p + "attention.value_length", hp.n_embd / hp.n_head);
  if (hp.n_embd_head_k == 0 || hp.n_embd_head_k % 2 != 0) throw bad(p + "attention.key_length", "head size must be even and positive");
  hp.n_rot = get_u32_or(f, p + "rope.dimension_count", hp.n_embd_head_k);
  if (hp.n_rot == 0 || hp.n_rot > hp.n_embd_head_k || hp.n_rot % 2 != 0) {
    throw bad(p + "rope.dimension_count", "must be even and at most the head size " + std::to_string(hp.n_embd_head_k));
  }
  hp.rms_eps = get_f32_or(f, p + "attention.layer_norm_rms_epsilon", 1e-5f);
  hp.rope_freq_base = get_f32_or(f, p + "rope.freq_base", 10000.0f);
  if (!(hp.rope_freq_base > 0.0f)) throw bad(p + "rope.freq_base", "must be positive");
  auto positive = [&](const std::string& key, float fallback) { return positive_f32(f, key, fallback); };
  read_rope_scaling(f, hp);
  switch (hp.a) {
    case arch::llama:
      hp.rope = rope_mode::normal;
      break;
    case arch::granite:
      hp.rope = rope_mode::normal;
      if (!f.contains(p + "logit_scale")) throw bad(p + "logit_scale", "granite needs it (the logits are divided by it)");
      hp.logit_scale = positive(p + "logit_scale", 1.0f);
      if (f.contains(p + "embedding_scale")) hp.embedding_scale = positive(p + "embedding_scale", 1.0f);
      if (f.contains(p + "residual_scale")) hp.residual_scale = positive(p + "residual_scale", 1.0f);
      if (f.contains(p + "attention.scale")) hp.attn_scale = positive(p + "attention.scale", 1.0f);
      break;
    case arch::phi3:
      // Its sliding window is not applied (as llama.cpp: the converted files' window does not match the
      // models' training).
      hp.rope = rope_mode::neox;
      break;
    case arch::mistral3:
      // llama's block; with YaRN, and the queries scaled by the attention temperature beyond the original
      // context.
      hp.rope = rope_mode::normal;
      hp.attn_temp_scale = get_f32_or(f, p + "attention.temperature_scale", 0.0f);
      if (hp.attn_temp_scale < 0.0f) throw bad(p + "attention.temperature_scale", "must not be negative");
      if (hp.attn_temp_scale > 0.0f && hp.ctx_orig() == 0) {
        throw bad(p + "attention.temperature_scale",
                  "needs a positive rope.scaling.original_context_length or context_length (its period)");
      }
      break;
    case arch::olmo2:
      hp.rope = rope_mode::neox;
      if (f.contains(p + "attention.sliding_window")) {
        throw bad(p + "attention.sliding_window", "sliding-window attention (OLMo 3) is not supported yet");
      }
      break;
    case arch::gemma2:
      // Every other layer attends over a sliding window (the first of each pair), all with the same rope
      // base; queries scaled by 1 / sqrt(head size), or 1 / sqrt(n_embd / n_head) for the 27B (46 layers).
      hp.rope = rope_mode::neox;
      hp.n_swa = get_u32_or(f, p + "attention.sliding_window", 4096);
      hp.swa_pattern = 2;
      hp.rope_freq_base_swa = hp.rope_freq_base;
      hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_layer == 46 ? hp.n_embd / hp.n_head : hp.n_embd_head_k));
      hp.attn_softcap = positive(p + "attn_logit_softcapping", 50.0f);
      hp.final_softcap = positive(p + "final_logit_softcapping", 30.0f);
      break;
    case arch::qwen2:
    case arch::qwen3:
    case arch::qwen2moe:
    case arch::qwen3moe:
      hp.rope = rope_mode::neox;
      break;
    case arch::gemma3:
      hp.rope = rope_mode::neox;
      hp.n_swa = get_u32_or(f, p + "attention.sliding_window", 0);
      hp.swa_pattern = 6;
      hp.rope_freq_base_swa = 10000.0f;
      hp.attn_scale = 1.0f / std::sqrt(static_cast<float>(hp.n_embd_head_k));
      break;
  }
  read_experts(f, hp);
  if (f.contains(p + "pooling_type")) {
    const uint32_t pt = get_u32(f, p + "pooling_type");
    if (pt > 4) throw bad(p + "pooling_type", "must be 0 (none), 1 (mean), 2 (cls), 3 (last) or 4 (rank), got " + std::to_string(pt));
    hp.pooling = static_cast<int32_t>(pt);
  }
  if (f.contains("tokenizer.ggml.tokens")) {
    const gguf_value* v = f.find("tokenizer.ggml.tokens");
    if (const auto* toks = v->get_if<std::vector<std::string>>()) hp.n_vocab = static_cast<uint32_t>(toks->size());
  }
  return hp;
}

}  // namespace troupe::llm
