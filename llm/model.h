// A loaded model: hyperparameters, the weights of every layer placed on their devices, ready for graphs.
//
//   auto m = model::load("stories260K.gguf");                       // all on the CPU, mmapped
//   auto g = model::load(path, {.devices = {{&gpu, 99}}});          // layers on a device
//   m->hp().n_layer; m->layers()[0].wq;                             // [n_embd, n_embd_head_k * n_head]
//
// Errors (a missing file, an unsupported architecture or tensor type, a missing or misshapen weight) throw
// troupe::error naming the file, architecture or tensor.
#pragma once

#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "loader/model_loader.h"
#include "llm/hparams.h"

namespace troupe::llm {

struct model_params {
  std::vector<std::pair<device_i*, int>> devices;               // layers per device; empty: CPU only
  std::vector<std::pair<std::string, device_i*>> overrides;     // tensor-name regex -> device
  bool use_mmap = true;
  bool use_mlock = false;
  bool huge_pages = true;  // host weights copied into 2 MiB pages where that pays (load_params::huge_pages)
  std::function<bool(uint64_t, uint64_t)> progress;             // (bytes loaded, total); false cancels
};

// One transformer block's weights. Optional ones are null when the architecture has none.
struct layer_weights {
  tensor* attn_norm = nullptr;       // [n_embd] (olmo2: none)
  tensor* wqkv = nullptr;            // phi3 (when fused): [n_embd, n_q + 2 n_embd_k_gqa], q, k, v rows
  tensor* wq = nullptr;              // [n_embd, n_embd_head_k * n_head]
  tensor* wk = nullptr;              // [n_embd, n_embd_k_gqa]
  tensor* wv = nullptr;              // [n_embd, n_embd_v_gqa]
  tensor* wo = nullptr;              // [n_embd_head_v * n_head, n_embd]
  tensor* bq = nullptr;              // qwen2: [n_embd_head_k * n_head]
  tensor* bk = nullptr;              // qwen2: [n_embd_k_gqa]
  tensor* bv = nullptr;              // qwen2: [n_embd_v_gqa]
  tensor* bo = nullptr;              // granite (optional): [n_embd]
  tensor* q_norm = nullptr;          // qwen3, gemma3: [n_embd_head_k]; olmo2: [n_embd_head_k * n_head]
  tensor* k_norm = nullptr;          // qwen3, gemma3: [n_embd_head_k]; olmo2: [n_embd_k_gqa]
  tensor* post_attn_norm = nullptr;  // gemma2, gemma3, olmo2: [n_embd]
  tensor* ffn_norm = nullptr;        // [n_embd] (olmo2: none)
  tensor* ffn_gate = nullptr;        // [n_embd, n_ff]
  tensor* ffn_up = nullptr;          // [n_embd, n_ff]; phi3: [n_embd, 2 n_ff], the gate's rows then the up's
  tensor* ffn_down = nullptr;        // [n_ff, n_embd]
  tensor* post_ffn_norm = nullptr;   // gemma2, gemma3, olmo2: [n_embd]
  // Mixture of experts (hp.n_expert > 0) instead of ffn_gate / ffn_up / ffn_down:
  tensor* ffn_gate_inp = nullptr;        // the router: [n_embd, n_expert]
  tensor* ffn_gate_exps = nullptr;       // [n_embd, n_ff_exp, n_expert]
  tensor* ffn_up_exps = nullptr;         // [n_embd, n_ff_exp, n_expert]
  tensor* ffn_down_exps = nullptr;       // [n_ff_exp, n_embd, n_expert]
  tensor* ffn_gate_inp_shexp = nullptr;  // qwen2moe's shared expert: its gate [n_embd],
  tensor* ffn_gate_shexp = nullptr;      // [n_embd, n_ff_shexp]
  tensor* ffn_up_shexp = nullptr;        // [n_embd, n_ff_shexp]
  tensor* ffn_down_shexp = nullptr;      // [n_ff_shexp, n_embd]
  buffer_type_i* buft = nullptr;     // where the layer lives
};

class model {
 public:
  static std::unique_ptr<model> load(const std::filesystem::path& path, const model_params& params = {});

  // Loading in stages (the actor layer's loader uploads to several devices at once):
  //   auto m = model::open(path, params);                      // metadata, hyperparameters, placement
  //   load_job job = m->loader().begin(m->plan(), {...});       // then job.upload(b) per target, concurrently
  //   m->attach(job.finish());                                  // resolves every weight
  // open() reads no tensor data (params.progress and use_mmap/use_mlock are the caller's business then).
  static std::unique_ptr<model> open(const std::filesystem::path& path, const model_params& params = {});
  // Takes the loaded weights and resolves the layer tensors. Throws error naming a missing or misshapen
  // weight, or when weights are already attached.
  void attach(model_weights w);
  const model_loader& loader() const { return *loader_; }
  const placement& plan() const { return plan_; }

  const hparams& hp() const { return hp_; }
  const gguf_file& meta() const { return loader_->meta(); }
  const model_weights& weights() const { return weights_; }

  tensor* tok_embd() const { return tok_embd_; }        // [n_embd, n_vocab]
  tensor* output_norm() const { return output_norm_; }  // [n_embd]
  tensor* output() const { return output_; }            // [n_embd, n_vocab] (the embeddings when tied)
  // The rope frequency factors for a context of n_ctx cells: rope_freqs, or phi3's short factors (long
  // ones beyond its original context); null when the model has none.
  tensor* rope_factors(uint32_t n_ctx) const;
  const std::vector<layer_weights>& layers() const { return layers_; }
  // Bytes of weights per buffer type.
  std::map<buffer_type_i*, size_t> weight_bytes() const { return weights_.bytes_by_buft(); }
  uint64_t n_params() const;
  uint64_t n_bytes() const;

 private:
  model() = default;
  tensor* need(const std::string& name, std::initializer_list<int64_t> shape, buffer_type_i* buft = nullptr) const;
  tensor* maybe(const std::string& name, std::initializer_list<int64_t> shape, buffer_type_i* buft = nullptr) const;

  std::string path_;
  std::unique_ptr<model_loader> loader_;
  hparams hp_;
  placement plan_;
  bool tied_ = false;  // no output.weight: the token embeddings serve as the output layer
  model_weights weights_;
  tensor* tok_embd_ = nullptr;
  tensor* output_norm_ = nullptr;
  tensor* output_ = nullptr;
  tensor* rope_freqs_ = nullptr;
  tensor* rope_long_ = nullptr;   // phi3: rope_factors_long, [n_rot / 2]
  tensor* rope_short_ = nullptr;  // phi3: rope_factors_short
  std::vector<layer_weights> layers_;
};

}  // namespace troupe::llm
