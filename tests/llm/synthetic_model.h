// Small random-weight models of each supported architecture, written as GGUF files, for checking the graph
// builders against an independent reference (scripts/reference-forward computes the expected logits with
// numpy from the same file). Weights come from a fixed linear congruential generator, so the file is the
// same on every machine.
#pragma once

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "loader/gguf_writer.h"

namespace troupe::testing {

struct synthetic_shape {
  uint32_t n_embd = 64, n_head = 4, n_head_kv = 2, head_dim = 16, n_ff = 96, n_layer = 6, n_vocab = 128;
  // Mixtures of experts (qwen2moe, qwen3moe, "mixtral": llama with experts).
  uint32_t n_expert = 8, n_expert_used = 2, n_ff_exp = 32, n_ff_shexp = 48;
};

inline bool synthetic_is_moe(const std::string& name) { return name == "qwen2moe" || name == "qwen3moe" || name == "mixtral"; }

// `name` is an architecture troupe runs, or "mixtral" (a llama file with experts, as Mixtral's).
// edit, when set, may change the metadata (gguf_writer::set) before the file is written.
inline void write_synthetic_model(const std::string& name, const std::filesystem::path& path, synthetic_shape s = {},
                                  const std::function<void(gguf_writer&)>& edit = {}) {
  const std::string arch = name == "mixtral" ? "llama" : name;
  const bool moe = synthetic_is_moe(name);
  uint64_t state = 0x9e3779b97f4a7c15ull ^ (name.size() * 7919) ^ (moe ? static_cast<uint64_t>(name[4]) << 20 : 0);
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<float>((state >> 40) & 0xffffff) / static_cast<float>(0x1000000) - 0.5f;  // [-0.5, 0.5)
  };
  gguf_writer w;
  w.add("general.architecture", arch);
  const std::string p = arch + ".";
  w.add(p + "context_length", uint32_t{arch == "mistral3" ? 8192u : 256u});
  w.add(p + "embedding_length", s.n_embd);
  w.add(p + "block_count", s.n_layer);
  w.add(p + "feed_forward_length", s.n_ff);
  w.add(p + "attention.head_count", s.n_head);
  w.add(p + "attention.head_count_kv", s.n_head_kv);
  w.add(p + "attention.key_length", s.head_dim);
  w.add(p + "attention.value_length", s.head_dim);
  w.add(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.add(p + "rope.freq_base", arch == "gemma3" ? 1000000.0f : 10000.0f);
  const bool gemma = arch == "gemma3" || arch == "gemma2";
  if (gemma) w.add(p + "attention.sliding_window", uint32_t{4});
  if (arch == "gemma2") {  // caps small enough to bend these scores and logits
    w.add(p + "attn_logit_softcapping", 5.0f);
    w.add(p + "final_logit_softcapping", 3.0f);
  }
  if (arch == "phi3") w.add(p + "rope.scaling.original_context_length", uint32_t{128});
  if (arch == "mistral3") {  // YaRN whose correction range covers rotated pairs 2..6 of 8, and a temperature
    w.add(p + "rope.scaling.type", std::string("yarn"));
    w.add(p + "rope.scaling.factor", 4.0f);
    w.add(p + "rope.scaling.original_context_length", uint32_t{2048});
    w.add(p + "rope.scaling.yarn_beta_fast", 32.0f);
    w.add(p + "rope.scaling.yarn_beta_slow", 1.0f);
    w.add(p + "rope.scaling.yarn_log_multiplier", 0.5f);
    w.add(p + "attention.temperature_scale", 0.5f);
  }
  if (arch == "granite") {
    w.add(p + "logit_scale", 4.0f);
    w.add(p + "embedding_scale", 1.5f);
    w.add(p + "residual_scale", 0.5f);
    w.add(p + "attention.scale", 0.3f);
  }
  if (moe) {
    w.add(p + "expert_count", s.n_expert);
    w.add(p + "expert_used_count", s.n_expert_used);
    if (name != "mixtral") w.add(p + "expert_feed_forward_length", s.n_ff_exp);
    if (name == "qwen2moe") w.add(p + "expert_shared_feed_forward_length", s.n_ff_shexp);
  }

  std::vector<std::vector<float>> keep;  // data must outlive write_file
  auto tensor = [&](const std::string& tname, std::vector<int64_t> shape, float scale, float offset = 0.0f) {
    size_t n = 1;
    for (int64_t d : shape) n *= static_cast<size_t>(d);
    keep.emplace_back(n);
    for (float& x : keep.back()) x = offset + scale * next();
    w.add_tensor(tname, type::f32, std::span<const int64_t>(shape), std::as_bytes(std::span(keep.back())));
  };
  const int64_t e = s.n_embd, q = int64_t{s.n_head} * s.head_dim, kv = int64_t{s.n_head_kv} * s.head_dim;
  // gemma3 scales embeddings by sqrt(n_embd) and ties the output to them: small embeddings keep the
  // blocks, not the identity, in charge of its logits.
  tensor("token_embd.weight", {e, s.n_vocab}, gemma ? 0.05f : 1.0f);
  tensor("output_norm.weight", {e}, 0.2f, 1.0f);
  if (!gemma) tensor("output.weight", {e, s.n_vocab}, 0.5f);
  if (arch == "phi3") {  // long-context rope factors: the short ones apply to contexts up to 128
    tensor("rope_factors_long.weight", {s.head_dim / 2}, 4.0f, 8.0f);
    tensor("rope_factors_short.weight", {s.head_dim / 2}, 1.0f, 1.2f);
  }
  for (uint32_t il = 0; il < s.n_layer; ++il) {
    const std::string b = "blk." + std::to_string(il) + ".";
    if (arch != "olmo2") tensor(b + "attn_norm.weight", {e}, 0.2f, 1.0f);
    if (arch == "phi3") {
      tensor(b + "attn_qkv.weight", {e, q + 2 * kv}, 0.4f);  // q, k and v rows in one matrix
    } else {
      tensor(b + "attn_q.weight", {e, q}, 0.4f);
      tensor(b + "attn_k.weight", {e, kv}, 0.4f);
      tensor(b + "attn_v.weight", {e, kv}, 0.4f);
    }
    tensor(b + "attn_output.weight", {q, e}, 0.3f);
    if (arch == "qwen2" || arch == "qwen2moe") {
      tensor(b + "attn_q.bias", {q}, 0.2f);
      tensor(b + "attn_k.bias", {kv}, 0.2f);
      tensor(b + "attn_v.bias", {kv}, 0.2f);
    }
    if (arch == "qwen3" || arch == "qwen3moe" || arch == "gemma3") {
      tensor(b + "attn_q_norm.weight", {s.head_dim}, 0.2f, 1.0f);
      tensor(b + "attn_k_norm.weight", {s.head_dim}, 0.2f, 1.0f);
    }
    if (arch == "olmo2") {  // QK norms over all heads at once
      tensor(b + "attn_q_norm.weight", {q}, 0.2f, 1.0f);
      tensor(b + "attn_k_norm.weight", {kv}, 0.2f, 1.0f);
    }
    if (gemma || arch == "olmo2") {
      tensor(b + "post_attention_norm.weight", {e}, 0.2f, 1.0f);
      tensor(b + "post_ffw_norm.weight", {e}, 0.2f, 1.0f);
    }
    if (arch != "olmo2") tensor(b + "ffn_norm.weight", {e}, 0.2f, 1.0f);
    if (moe) {
      const int64_t ff = name == "mixtral" ? s.n_ff : s.n_ff_exp, ne = s.n_expert;
      tensor(b + "ffn_gate_inp.weight", {e, ne}, 2.0f);  // a router with clear preferences
      tensor(b + "ffn_gate_exps.weight", {e, ff, ne}, 0.4f);
      tensor(b + "ffn_up_exps.weight", {e, ff, ne}, 0.4f);
      tensor(b + "ffn_down_exps.weight", {ff, e, ne}, 0.3f);
      if (name == "qwen2moe") {
        tensor(b + "ffn_gate_inp_shexp.weight", {e}, 0.4f);
        tensor(b + "ffn_gate_shexp.weight", {e, s.n_ff_shexp}, 0.4f);
        tensor(b + "ffn_up_shexp.weight", {e, s.n_ff_shexp}, 0.4f);
        tensor(b + "ffn_down_shexp.weight", {s.n_ff_shexp, e}, 0.3f);
      }
      continue;
    }
    if (arch == "phi3") {
      tensor(b + "ffn_up.weight", {e, 2 * s.n_ff}, 0.4f);  // the gate's rows, then the up's
    } else {
      tensor(b + "ffn_gate.weight", {e, s.n_ff}, 0.4f);
      tensor(b + "ffn_up.weight", {e, s.n_ff}, 0.4f);
    }
    tensor(b + "ffn_down.weight", {s.n_ff, e}, 0.3f);
  }
  if (edit) edit(w);
  w.write_file(path);
}

}  // namespace troupe::testing
