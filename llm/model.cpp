#include "llm/model.h"

#include <sstream>

#include "backends/registry.h"
#include "runtime/error.h"

namespace troupe::llm {

namespace {

std::string shape_str(const tensor& t) {
  std::ostringstream os;
  os << "[" << t.ne[0] << ", " << t.ne[1] << ", " << t.ne[2] << ", " << t.ne[3] << "]";
  return os.str();
}

}  // namespace

tensor* model::maybe(const std::string& name, std::initializer_list<int64_t> shape, buffer_type_i* buft) const {
  tensor* t = weights_.find(name, buft);
  if (t == nullptr) return nullptr;
  std::array<int64_t, max_dims> want{1, 1, 1, 1};
  size_t i = 0;
  for (int64_t v : shape) want[i++] = v;
  if (t->ne != want) {
    std::ostringstream os;
    os << "[" << want[0] << ", " << want[1] << ", " << want[2] << ", " << want[3] << "]";
    throw error("model " + path_ + ": tensor '" + name + "' has shape " + shape_str(*t) + ", expected " + os.str());
  }
  return t;
}

tensor* model::need(const std::string& name, std::initializer_list<int64_t> shape, buffer_type_i* buft) const {
  tensor* t = maybe(name, shape, buft);
  if (t == nullptr) throw error("model " + path_ + ": missing tensor '" + name + "' (architecture " + hp_.name + ")");
  return t;
}

std::unique_ptr<model> model::open(const std::filesystem::path& path, const model_params& params) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) throw error("model file '" + path.string() + "' does not exist");
  std::unique_ptr<model> m(new model());
  m->path_ = path.string();
  m->loader_ = std::make_unique<model_loader>(path);
  // The architecture first, then every tensor's type: the two reasons a valid GGUF may not be usable.
  arch_from_name(m->loader_->arch());
  for (const gguf_tensor_info& t : m->loader_->tensors()) require_supported(t.type, t.name);
  m->hp_ = hparams::from_gguf(m->loader_->meta());
  hparams& hp = m->hp_;

  placement_params pp;
  pp.host = &host_device().buffer_type();
  for (const auto& [dev, n] : params.devices) pp.devices.emplace_back(&dev->buffer_type(), n);
  for (const auto& [re, dev] : params.overrides) pp.overrides.emplace_back(re, &dev->buffer_type());
  m->plan_ = m->loader_->plan(pp);
  m->tied_ = m->loader_->files().find_tensor("output.weight") == nullptr;
  if (m->tied_) m->plan_.add_use("token_embd.weight", m->plan_.output_buft());

  const gguf_tensor_info& embd = m->loader_->files().tensor("token_embd.weight");
  if (hp.n_vocab == 0) hp.n_vocab = static_cast<uint32_t>(embd.ne[1]);
  return m;
}

std::unique_ptr<model> model::load(const std::filesystem::path& path, const model_params& params) {
  std::unique_ptr<model> m = open(path, params);
  m->attach(m->loader_->load(m->plan_, {.use_mmap = params.use_mmap, .use_mlock = params.use_mlock, .huge_pages = params.huge_pages, .progress = params.progress}));
  return m;
}

void model::attach(model_weights w) {
  if (tok_embd_ != nullptr) throw error("model " + path_ + ": weights are already attached");
  weights_ = std::move(w);
  hparams& hp = hp_;
  model* m = this;
  const placement& plan = plan_;
  const bool tied = tied_;
  const int64_t n_embd = hp.n_embd, n_vocab = hp.n_vocab, n_ff = hp.n_ff;
  const int64_t n_q = static_cast<int64_t>(hp.n_embd_head_k) * hp.n_head;
  const int64_t n_v = static_cast<int64_t>(hp.n_embd_head_v) * hp.n_head;
  m->tok_embd_ = m->need("token_embd.weight", {n_embd, n_vocab});
  m->output_norm_ = m->need("output_norm.weight", {n_embd});
  m->output_ = tied ? m->need("token_embd.weight", {n_embd, n_vocab}, plan.output_buft())
                    : m->need("output.weight", {n_embd, n_vocab});
  m->rope_freqs_ = m->maybe("rope_freqs.weight", {hp.n_rot / 2});
  m->rope_long_ = m->maybe("rope_factors_long.weight", {hp.n_rot / 2});
  m->rope_short_ = m->maybe("rope_factors_short.weight", {hp.n_rot / 2});
  if ((m->rope_long_ == nullptr) != (m->rope_short_ == nullptr)) {
    throw error("model " + path_ + ": rope_factors_long.weight and rope_factors_short.weight come as a pair");
  }

  m->layers_.resize(hp.n_layer);
  for (uint32_t il = 0; il < hp.n_layer; ++il) {
    layer_weights& l = m->layers_[il];
    const std::string b = "blk." + std::to_string(il) + ".";
    l.buft = plan.layer_buft(static_cast<int>(il));
    const bool post_norms_only = hp.a == arch::olmo2;  // olmo2 normalizes each sublayer's output, not its input
    if (!post_norms_only) l.attn_norm = m->need(b + "attn_norm.weight", {n_embd});
    if (hp.a == arch::phi3 && m->loader_->files().find_tensor(b + "attn_qkv.weight") != nullptr) {
      l.wqkv = m->need(b + "attn_qkv.weight", {n_embd, n_q + hp.n_embd_k_gqa() + hp.n_embd_v_gqa()});
    } else {
      l.wq = m->need(b + "attn_q.weight", {n_embd, n_q});
      l.wk = m->need(b + "attn_k.weight", {n_embd, hp.n_embd_k_gqa()});
      l.wv = m->need(b + "attn_v.weight", {n_embd, hp.n_embd_v_gqa()});
    }
    l.wo = m->need(b + "attn_output.weight", {n_v, n_embd});
    if (!post_norms_only) l.ffn_norm = m->need(b + "ffn_norm.weight", {n_embd});
    if (hp.n_expert > 0) {
      const int64_t n_expert = hp.n_expert, n_ff_exp = hp.n_ff_exp;
      if (m->loader_->files().find_tensor(b + "ffn_gate.0.weight") != nullptr) {
        throw error("model " + path_ + ": tensor '" + b +
                    "ffn_gate.0.weight': experts stored one tensor each (an old Mixtral conversion) are not supported; "
                    "convert the model again with llama.cpp's convert_hf_to_gguf.py, which merges them into ffn_gate_exps");
      }
      l.ffn_gate_inp = m->need(b + "ffn_gate_inp.weight", {n_embd, n_expert});
      l.ffn_gate_exps = m->need(b + "ffn_gate_exps.weight", {n_embd, n_ff_exp, n_expert});
      l.ffn_up_exps = m->need(b + "ffn_up_exps.weight", {n_embd, n_ff_exp, n_expert});
      l.ffn_down_exps = m->need(b + "ffn_down_exps.weight", {n_ff_exp, n_embd, n_expert});
      if (hp.a == arch::qwen2moe) {
        const int64_t n_ff_sh = hp.n_ff_shexp;
        l.ffn_gate_inp_shexp = m->need(b + "ffn_gate_inp_shexp.weight", {n_embd});
        l.ffn_gate_shexp = m->need(b + "ffn_gate_shexp.weight", {n_embd, n_ff_sh});
        l.ffn_up_shexp = m->need(b + "ffn_up_shexp.weight", {n_embd, n_ff_sh});
        l.ffn_down_shexp = m->need(b + "ffn_down_shexp.weight", {n_ff_sh, n_embd});
      }
    } else if (hp.a == arch::phi3) {  // gate and up fused in one matrix
      l.ffn_up = m->need(b + "ffn_up.weight", {n_embd, 2 * n_ff});
      l.ffn_down = m->need(b + "ffn_down.weight", {n_ff, n_embd});
    } else {
      l.ffn_gate = m->need(b + "ffn_gate.weight", {n_embd, n_ff});
      l.ffn_up = m->need(b + "ffn_up.weight", {n_embd, n_ff});
      l.ffn_down = m->need(b + "ffn_down.weight", {n_ff, n_embd});
    }
    switch (hp.a) {
      case arch::llama:
      case arch::mistral3:
        l.bq = m->maybe(b + "attn_q.bias", {n_q});
        l.bk = m->maybe(b + "attn_k.bias", {hp.n_embd_k_gqa()});
        l.bv = m->maybe(b + "attn_v.bias", {hp.n_embd_v_gqa()});
        break;
      case arch::qwen2:
      case arch::qwen2moe:
        l.bq = m->need(b + "attn_q.bias", {n_q});
        l.bk = m->need(b + "attn_k.bias", {hp.n_embd_k_gqa()});
        l.bv = m->need(b + "attn_v.bias", {hp.n_embd_v_gqa()});
        break;
      case arch::qwen3:
      case arch::qwen3moe:
        l.q_norm = m->need(b + "attn_q_norm.weight", {hp.n_embd_head_k});
        l.k_norm = m->need(b + "attn_k_norm.weight", {hp.n_embd_head_k});
        break;
      case arch::gemma3:
        l.q_norm = m->need(b + "attn_q_norm.weight", {hp.n_embd_head_k});
        l.k_norm = m->need(b + "attn_k_norm.weight", {hp.n_embd_head_k});
        l.post_attn_norm = m->need(b + "post_attention_norm.weight", {n_embd});
        l.post_ffn_norm = m->need(b + "post_ffw_norm.weight", {n_embd});
        break;
      case arch::gemma2:
        l.post_attn_norm = m->need(b + "post_attention_norm.weight", {n_embd});
        l.post_ffn_norm = m->need(b + "post_ffw_norm.weight", {n_embd});
        break;
      case arch::olmo2:
        // QK norms over all heads at once (a row of n_head * head size), and the post-norms.
        l.q_norm = m->need(b + "attn_q_norm.weight", {n_q});
        l.k_norm = m->need(b + "attn_k_norm.weight", {hp.n_embd_k_gqa()});
        l.post_attn_norm = m->need(b + "post_attention_norm.weight", {n_embd});
        l.post_ffn_norm = m->need(b + "post_ffw_norm.weight", {n_embd});
        break;
      case arch::granite:
        l.bo = m->maybe(b + "attn_output.bias", {n_embd});
        break;
      case arch::phi3:
        break;
    }
  }
}


tensor* model::rope_factors(uint32_t n_ctx) const {
  if (rope_freqs_ != nullptr) return rope_freqs_;
  const uint32_t orig = hp_.ctx_orig();
  return n_ctx > orig ? rope_long_ : rope_short_;
}

uint64_t model::n_params() const {
  uint64_t n = 0;
  for (const auto& t : loader_->tensors()) n += static_cast<uint64_t>(t.n_elements());
  return n;
}

uint64_t model::n_bytes() const {
  uint64_t n = 0;
  for (const auto& t : loader_->tensors()) n += t.n_bytes;
  return n;
}

}  // namespace troupe::llm
