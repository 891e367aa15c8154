#include "llm/offload.h"

#include <algorithm>

#include "backends/registry.h"
#include "runtime/backend.h"
#include "runtime/error.h"
#include "llm/fit.h"
#include "llm/model.h"
#include "runtime/log.h"

namespace troupe::llm {

std::vector<std::string> cpu_moe_patterns(bool all, uint32_t n_first) {
  if (all) return {"\\.ffn_(up|down|gate)_exps\\."};
  std::vector<std::string> out;
  for (uint32_t il = 0; il < n_first; ++il) out.push_back("^blk\\." + std::to_string(il) + "\\.ffn_(up|down|gate)_exps\\.");
  return out;
}

std::vector<std::pair<std::string, device_i*>> cpu_moe_overrides(const offload_request& r) {
  std::vector<std::pair<std::string, device_i*>> out;
  for (std::string& p : cpu_moe_patterns(r.cpu_moe, r.n_cpu_moe)) out.emplace_back(std::move(p), &host_device());
  return out;
}

std::vector<std::pair<std::string, int>> offload_layers(const offload_request& r, int n_layer) {
  std::vector<std::pair<std::string, int>> out;
  if (!r.given()) return out;
  if (r.fit) throw error("-ngl auto: placing by memory needs the model's file (its tensors' sizes)");
  if (!r.tensor_split.empty() && r.devices.empty()) throw error("--tensor-split: needs --device (the devices it splits over)");
  std::vector<std::string> names = r.devices;
  if (names.empty()) {
    for (device_i* d : registry::instance().devices()) {
      if (d->type() != device_type::cpu) {
        names.emplace_back(d->name());
        break;
      }
    }
    if (names.empty()) {
      TROUPE_LOG(warn, "-ngl " << r.n_gpu_layers << ": no device but the CPU; every layer stays on the CPU");
      return out;
    }
  }
  for (const std::string& n : names) {
    if (registry::instance().find(n) != nullptr) continue;
    std::string known;
    for (device_i* d : registry::instance().devices()) known += (known.empty() ? "" : ", ") + std::string(d->name());
    throw error("--device: no device named '" + n + "' (devices: " + known + ")");
  }
  // Each device's weight: evenly, or the --tensor-split proportions.
  std::vector<double> weight(names.size(), 1.0);
  if (!r.tensor_split.empty()) {
    if (r.tensor_split.size() != names.size()) {
      throw error("--tensor-split: " + std::to_string(r.tensor_split.size()) + " proportions for " +
                  std::to_string(names.size()) + " devices");
    }
    for (size_t i = 0; i < names.size(); ++i) {
      const float p = r.tensor_split[i];
      if (!(p >= 0.0f) || p > 1e6f) throw error("--tensor-split: proportion " + std::to_string(p) + " of " + names[i] + " is not a number >= 0");
      weight[i] = p;
    }
  }
  double sum = 0;
  for (double w : weight) sum += w;
  if (sum <= 0) throw error("--tensor-split: the proportions add up to 0");
  // The layers to place: every one and the output, or the last N; device i takes the layers between the
  // rounded running sums of the weights before it and up to it.
  const int total = r.n_gpu_layers >= 0 ? std::min(r.n_gpu_layers, n_layer + 1) : n_layer + 1;
  double before = 0;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto from = static_cast<int>(total * before / sum + 1e-9);
    before += weight[i];
    const int to = i + 1 == names.size() ? total : static_cast<int>(total * before / sum + 1e-9);
    if (to > from) out.emplace_back(names[i], to - from);
  }
  return out;
}

std::vector<std::pair<std::string, int>> offload_layers(const offload_request& r, const std::string& path) {
  if (!r.given()) return {};
  if (!r.fit) return offload_layers(r, static_cast<int>(model::open(path)->hp().n_layer));
  if (r.n_gpu_layers >= 0 || !r.tensor_split.empty()) throw error("-ngl auto: takes neither a layer count nor --tensor-split");
  std::vector<fit_device> fd;
  for (device_i* d : auto_devices(r.devices)) fd.push_back({std::string(d->name()), d->memory().free});
  const fit_plan p = fit_layers(estimate_costs(*model::open(path), {.n_ctx = r.fit_ctx}), fd);
  std::string said;
  for (size_t i = 0; i < p.layers.size(); ++i) {
    said += (i ? ", " : "") + p.layers[i].first + " " + std::to_string(p.layers[i].second) + " (" +
            std::to_string(p.bytes[i] >> 20) + " MiB)";
  }
  TROUPE_LOG(info, "-ngl auto: layers by free memory: " << said);
  return p.layers;
}

std::vector<device_i*> auto_devices(const std::vector<std::string>& names) {
  std::vector<device_i*> devices;
  for (const std::string& n : names) {
    device_i* d = registry::instance().find(n);
    if (d == nullptr) throw error("--device: no device named '" + n + "'");
    devices.push_back(d);
  }
  if (devices.empty()) {
    for (device_i* d : registry::instance().devices()) {
      if (d->type() != device_type::cpu) devices.push_back(d);
    }
    if (device_i* cpu = registry::instance().find("CPU")) devices.push_back(cpu);
  }
  return devices;
}

std::vector<std::pair<device_i*, int>> offload_devices(const offload_request& r, const std::string& path) {
  std::vector<std::pair<device_i*, int>> out;
  for (const auto& [name, layers] : offload_layers(r, path)) out.emplace_back(registry::instance().find(name), layers);
  return out;
}

}  // namespace troupe::llm
