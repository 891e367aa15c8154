// llama.cpp's offload flags as layers per device, for every program (troupe-chat, troupe bench, troupe
// perplexity, troupe serve) and the daemon's model table:
//
//   -ngl N / --n-gpu-layers N   the last N layers on the first device that is not the CPU (N > n_layer: the
//                               output layer too; 99 = all)
//   --device A,B,...            the listed devices share the layers evenly, in order (device A the first
//                               ones); "CPU" keeps its share in host memory. With -ngl N they share the last
//                               N layers, the rest stays on the CPU.
//   -ngl auto                   the layers over the --device list (default: every device, the CPU last) in
//                               proportion to their free memory, keeping 512 MiB free on each (fit.h)
//   -ts / --tensor-split P,Q,...  with --device: the devices' shares in these proportions instead of evenly
//                               (the output layer counts as one layer), e.g. 3,1: three quarters on the first
//   -cmoe / --cpu-moe           a mixture of experts' expert weights (ffn_{gate,up,down}_exps) of every layer
//                               stay on the CPU whatever device their layer is on (tensor overrides, the
//                               first that matches wins; -ot / the daemon's overrides come first)
//   -ncmoe / --n-cpu-moe N      the same for the experts of the first N layers
//
//   auto layers = llm::offload_layers({.n_gpu_layers = 99}, 30);   // {{"Vulkan0", 31}}: every layer and the output
//   auto layers = llm::offload_layers({.devices = {"Vulkan0", "CPU"}}, 30);  // {{"Vulkan0", 15}, {"CPU", 16}}
//
// The result is in the placement's terms (loader/placement.h: devices take the last layers, the output goes
// with the last one when they take more than n_layer). Devices are looked up in the registry
// (register_builtin_backends() first); an unknown name throws error naming it and the known ones.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace troupe {
class device_i;
}

namespace troupe::llm {

struct offload_request {
  int n_gpu_layers = -1;             // -1: not given
  std::vector<std::string> devices;  // empty: not given
  std::vector<float> tensor_split;   // proportions per device of `devices`; empty: evenly
  // -ngl auto: the layers by free memory (llm/fit.h) over `devices`, or every device the registry
  // has (the CPU last), for a context of fit_ctx cells.
  bool fit = false;
  uint32_t fit_ctx = 4096;
  bool cpu_moe = false;    // --cpu-moe
  uint32_t n_cpu_moe = 0;  // --n-cpu-moe N
  bool given() const { return fit || n_gpu_layers >= 0 || !devices.empty() || !tensor_split.empty(); }
};

// The tensor-override patterns (regexes over tensor names) that keep experts on the CPU: every layer's
// (all), else the first n_first layers'. Empty when neither.
std::vector<std::string> cpu_moe_patterns(bool all, uint32_t n_first);
// Those patterns for r, each with the CPU device, as llm::model_params::overrides takes them.
std::vector<std::pair<std::string, device_i*>> cpu_moe_overrides(const offload_request& r);

// (device name, layers) in placement order; empty when nothing is offloaded (no flag, -ngl 0, or -ngl on a
// machine with no device but the CPU, which logs a warning and runs on the CPU as llama.cpp does).
std::vector<std::pair<std::string, int>> offload_layers(const offload_request& r, int n_layer);
// The same for the model at `path` (its layer count from the GGUF metadata; nothing else is read).
std::vector<std::pair<std::string, int>> offload_layers(const offload_request& r, const std::string& path);
// The devices -ngl auto places over: those named (throws error for an unknown name), or every device the
// registry has, the CPU last.
std::vector<device_i*> auto_devices(const std::vector<std::string>& names);
// The same as the registry's devices, as llm::model_params::devices takes them.
std::vector<std::pair<device_i*, int>> offload_devices(const offload_request& r, const std::string& path);

}  // namespace troupe::llm
