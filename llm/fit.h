// Placing a model by memory (llama.cpp's --fit; troupe's `-ngl auto`, `placement = "auto"`, and a cluster's
// placement over its nodes' devices): what each layer needs, and contiguous layer ranges for devices in
// proportion to their free memory, keeping a margin on each.
//
//   const layer_costs c = estimate_costs(*model::open(path), {.n_ctx = 4096});
//   fit_plan p = fit_layers(c, {{"RPC[10.0.0.2:50052]#0", free0}, {"RPC[10.0.0.3:50052]#0", free1}});
//   p.layers   // {{"RPC[10.0.0.2:50052]#0", 16}, {"RPC[10.0.0.3:50052]#0", 15}}: placement terms
//
// A layer's cost is its weights (the GGUF's "blk.N." tensors) and its KV cache for n_ctx cells at the cache's
// type; the output layer (output.weight, or the tied token embedding it reads, and output_norm) goes with
// the last device, and each device that holds layers needs a compute share (the activations of an n_ubatch
// micro-batch and the logits). The token embedding itself stays in host memory (it is read by row).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "runtime/types.h"

namespace troupe::llm {

class model;

struct layer_costs {
  std::vector<uint64_t> weights;  // per layer
  std::vector<uint64_t> kv;       // per layer
  uint64_t output = 0;            // the output layer's weights
  uint64_t compute = 0;           // per device that holds layers
  uint64_t host = 0;              // what stays in host memory (the token embedding)
  uint64_t layer(size_t il) const { return weights[il] + kv[il]; }
  uint64_t total() const;         // every layer and the output (compute not included)
};

struct cost_params {
  uint32_t n_ctx = 4096;
  uint32_t n_ubatch = 512;
  type kv_type = type::f16;
};

// From the model's GGUF tensor infos and hyperparameters (m need not be loaded: model::open).
layer_costs estimate_costs(const model& m, const cost_params& p);

struct fit_device {
  std::string name;
  uint64_t free = 0;  // bytes free on it now
};

struct fit_plan {
  std::vector<std::pair<std::string, int>> layers;  // (device, layers) in order: placement terms (the last
                                                    // device's count includes the output layer)
  std::vector<uint64_t> bytes;                      // per entry of `layers`: what it will hold (compute too)
};

// Contiguous ranges in device order, in proportion to each device's free memory less `margin` (and its
// compute share), never more than that; devices given nothing are left out. Throws error when the model does
// not fit, naming what it needs, what the devices offer and the shortfall in MiB.
fit_plan fit_layers(const layer_costs& c, const std::vector<fit_device>& devices, uint64_t margin = uint64_t{512} << 20);

}  // namespace troupe::llm
