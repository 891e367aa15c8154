// Placement: which buffer type each weight of a model goes to.
//
//   placement_params p;
//   p.host = &cpu.buffer_type();
//   p.devices = {{&gpu0.buffer_type(), 20}, {&gpu1.buffer_type(), 13}};   // layers per device, like n_gpu_layers
//   p.overrides = {{"ffn_.*_exps", &cpu.buffer_type()}};                 // regex on the tensor name
//   placement plan = plan_placement(file.tensors(), n_layer, p);
//   plan.add_use("token_embd.weight", plan.output_buft());              // a tied output: the weight is
//                                                                        // needed in two places
//
// Rules, in order: the first override whose regex matches anywhere in the name; a layer's tensors
// ("blk.N.") go to the device holding layer N; the output layer ("output.weight", "output_norm.weight") goes
// with the last layer when the devices take more layers than the model has (as n_gpu_layers > n_layer);
// everything else (token embeddings, ...) stays on the host. Devices take the last layers: with 32 layers and
// devices {A: 20, B: 13} (33 > 32, so the output layer is offloaded too), A takes layers 0..19, B 20..31 and
// the output; with {A: 8} A takes layers 24..31 and the rest stays on the host.
#pragma once

#include <cstdint>
#include <map>
#include <regex>
#include <string>
#include <utility>
#include <vector>

#include "loader/gguf.h"
#include "runtime/backend.h"

namespace troupe {

struct placement_params {
  buffer_type_i* host = nullptr;                                 // required
  std::vector<std::pair<buffer_type_i*, int>> devices;           // (buffer type, layers), in order
  std::vector<std::pair<std::string, buffer_type_i*>> overrides;  // (ECMAScript regex, buffer type)
};

class placement {
 public:
  // Every buffer type a tensor is used in; the first is where it is placed by its rules.
  const std::vector<buffer_type_i*>& uses(const std::string& name) const;
  buffer_type_i* primary(const std::string& name) const { return uses(name).front(); }
  // Adds another buffer type the tensor is needed in (a shared weight); no effect when already there.
  void add_use(const std::string& name, buffer_type_i* buft);
  // The buffer type of layer il (-1: host layers), and of the output layer.
  buffer_type_i* layer_buft(int il) const;
  buffer_type_i* output_buft() const { return output_; }
  // Buffer types in first-use order.
  const std::vector<buffer_type_i*>& buffer_types() const { return order_; }
  const std::map<std::string, std::vector<buffer_type_i*>>& all() const { return uses_; }

 private:
  friend placement plan_placement(const std::vector<gguf_tensor_info>&, int, const placement_params&);
  void set(const std::string& name, buffer_type_i* buft);

  std::map<std::string, std::vector<buffer_type_i*>> uses_;
  std::vector<buffer_type_i*> layer_;  // per layer
  buffer_type_i* host_ = nullptr;
  buffer_type_i* output_ = nullptr;
  std::vector<buffer_type_i*> order_;
};

// Devices take the model's last layers: the device list's total (capped at n_layer) counts back from the
// last layer, and device 0 gets the first of those. Throws error for a bad regex (naming it) or a null host.
placement plan_placement(const std::vector<gguf_tensor_info>& tensors, int n_layer, const placement_params& p);

// The layer index of "blk.N.xxx", or -1.
int layer_of(const std::string& tensor_name);

}  // namespace troupe
