#include "loader/placement.h"

#include <algorithm>

#include "runtime/error.h"

namespace troupe {

int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  size_t i = 4;
  int64_t v = 0;
  if (i >= name.size() || name[i] < '0' || name[i] > '9') return -1;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    v = v * 10 + (name[i] - '0');
    if (v > 1000000) return -1;
    ++i;
  }
  if (i >= name.size() || name[i] != '.') return -1;
  return static_cast<int>(v);
}

const std::vector<buffer_type_i*>& placement::uses(const std::string& name) const {
  const auto it = uses_.find(name);
  if (it == uses_.end()) throw error("placement: no tensor named '" + name + "' in the plan");
  return it->second;
}

void placement::set(const std::string& name, buffer_type_i* buft) {
  uses_[name] = {buft};
  if (std::find(order_.begin(), order_.end(), buft) == order_.end()) order_.push_back(buft);
}

void placement::add_use(const std::string& name, buffer_type_i* buft) {
  auto& u = uses_[name];
  if (std::find(u.begin(), u.end(), buft) == u.end()) u.push_back(buft);
  if (std::find(order_.begin(), order_.end(), buft) == order_.end()) order_.push_back(buft);
}

buffer_type_i* placement::layer_buft(int il) const {
  if (il < 0 || static_cast<size_t>(il) >= layer_.size()) return host_;
  return layer_[static_cast<size_t>(il)];
}

placement plan_placement(const std::vector<gguf_tensor_info>& tensors, int n_layer, const placement_params& p) {
  if (p.host == nullptr) throw error("placement: no host buffer type");
  if (n_layer < 0) throw error("placement: negative layer count " + std::to_string(n_layer));
  placement plan;
  plan.host_ = p.host;
  plan.order_.push_back(p.host);

  std::vector<std::pair<std::regex, buffer_type_i*>> overrides;
  for (const auto& [pattern, buft] : p.overrides) {
    try {
      overrides.emplace_back(std::regex(pattern, std::regex::ECMAScript), buft);
    } catch (const std::regex_error& e) {
      throw error("placement: bad tensor override pattern '" + pattern + "': " + e.what());
    }
  }

  // Layers: devices take the last ones, device 0 first.
  int offloaded = 0;
  for (const auto& [buft, n] : p.devices) {
    if (n < 0) throw error("placement: negative layer count for buffer type " + std::string(buft->name()));
    offloaded += n;
  }
  plan.layer_.assign(static_cast<size_t>(n_layer), p.host);
  int il = n_layer - std::min(offloaded, n_layer);
  buffer_type_i* last = p.host;
  for (const auto& [buft, n] : p.devices) {
    for (int k = 0; k < n && il < n_layer; ++k) plan.layer_[static_cast<size_t>(il++)] = buft;
    if (n > 0) last = buft;
  }
  plan.output_ = offloaded > n_layer ? last : p.host;

  for (const gguf_tensor_info& t : tensors) {
    buffer_type_i* buft = nullptr;
    for (const auto& [re, b] : overrides) {
      if (std::regex_search(t.name, re)) {
        buft = b;
        break;
      }
    }
    if (buft == nullptr) {
      const int layer = layer_of(t.name);
      if (layer >= 0) {
        buft = plan.layer_buft(layer);
      } else if (t.name.rfind("output", 0) == 0) {
        buft = plan.output_;
      } else {
        buft = p.host;
      }
    }
    plan.set(t.name, buft);
  }
  return plan;
}

}  // namespace troupe
