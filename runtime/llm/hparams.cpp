#include "runtime/llm/hparams.h"

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
  throw error("model architecture '" + name +
              "' is not supported (troupe runs llama (with or without experts), qwen2, qwen2moe, qwen3, qwen3moe and gemma3)");
}

const char* arch_name(arch a) {
  switch (a) {
    case arch::llama: return "llama";
    case arch::qwen2: return "qwen2";
    case arch::qwen3: return "qwen3";
    case arch::gemma3: return "gemma3";
    case arch::qwen2moe: return "qwen2moe";
    case arch::qwen3moe: return "qwen3moe";
  }
  return "unknown";
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

// The mixture-of-experts keys: required by qwen2moe / qwen3moe, optional for llama (Mixtral declares
// them; a dense llama has none). Each bad value is an error naming its key.
void read_experts(const gguf_file& f, hparams& hp) {
  const std::string p = hp.name + ".";
  auto bad = [&](const std::string& key, const std::string& why) { return gguf_error(f.message(key, why, std::nullopt)); };
  const bool moe_arch = hp.a == arch::qwen2moe || hp.a == arch::qwen3moe;
  if (!moe_arch && !f.contains(p + "expert_count")) return;
  if (hp.a == arch::qwen2 || hp.a == arch::qwen3 || hp.a == arch::gemma3) {
    const uint32_t n = get_u32(f, p + "expert_count");
    if (n == 0) return;
    throw bad(p + "expert_count", "experts are not part of " + hp.name + " (its mixture-of-experts variant is " +
                                      hp.name + "moe)");
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

}  // namespace

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
  auto bad = [&](const std::string& key, const std::string& why) { return gguf_error(f.message(key, why, std::nullopt)); };
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
  const float scale = get_f32_or(f, p + "rope.scale_linear", 0.0f);
  const float factor = get_f32_or(f, p + "rope.scaling.factor", 0.0f);
  if (scale > 0.0f) hp.rope_freq_scale = 1.0f / scale;
  else if (factor > 0.0f) hp.rope_freq_scale = 1.0f / factor;
  if (!(hp.rope_freq_base > 0.0f)) throw bad(p + "rope.freq_base", "must be positive");

  switch (hp.a) {
    case arch::llama:
      hp.rope = rope_mode::normal;
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
