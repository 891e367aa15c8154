#include "runtime/llm/offload.h"

#include <algorithm>

#include "runtime/backend.h"
#include "runtime/error.h"
#include "runtime/llm/model.h"
#include "runtime/log.h"

namespace troupe::llm {

std::vector<std::pair<std::string, int>> offload_layers(const offload_request& r, int n_layer) {
  std::vector<std::pair<std::string, int>> out;
  if (!r.given()) return out;
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
  // The layers to place: every one and the output, or the last N.
  const int total = r.n_gpu_layers >= 0 ? std::min(r.n_gpu_layers, n_layer + 1) : n_layer + 1;
  const int k = static_cast<int>(names.size());
  for (int i = 0; i < k; ++i) {
    const int share = total * (i + 1) / k - total * i / k;
    if (share > 0) out.emplace_back(names[static_cast<size_t>(i)], share);
  }
  return out;
}

std::vector<std::pair<std::string, int>> offload_layers(const offload_request& r, const std::string& path) {
  if (!r.given()) return {};
  return offload_layers(r, static_cast<int>(model::open(path)->hp().n_layer));
}

std::vector<std::pair<device_i*, int>> offload_devices(const offload_request& r, const std::string& path) {
  std::vector<std::pair<device_i*, int>> out;
  for (const auto& [name, layers] : offload_layers(r, path)) out.emplace_back(registry::instance().find(name), layers);
  return out;
}

}  // namespace troupe::llm
