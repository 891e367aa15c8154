// The device options every program takes, as llama.cpp spells them (header-only, over CLI11):
//
//   llm::offload_request off;
//   add_offload_options(app, off);   // -ngl / --n-gpu-layers N, --device A,B,..., --list-devices
//   app.parse(llama_spellings(argc, argv));
//
// --cpu-moe / --n-cpu-moe N keep a mixture of experts' expert weights (all, or the first N layers') on the CPU.
// CLI11 takes one-letter short options only, so llama.cpp's multi-letter ones (-ngl, -dev, -sys, -ub, -np, -ts,
// -cmoe, -ncmoe, -ctk, -ctv, -fa, -cram) are rewritten to their long forms before parsing.
// --list-devices prints the devices (backends/registry.h's format_devices) and exits. llm/offload.h
// turns the request into layers per device.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdio>
#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include "backends/cpu_instance.h"
#include "backends/registry.h"
#include "llm/offload.h"

namespace troupe::cli {

// argv without the program name, llama.cpp's spellings replaced, in the reversed order CLI11's
// parse(std::vector<std::string>&) takes.
inline std::vector<std::string> llama_spellings(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  for (std::string& a : args) {
    if (a == "-ngl") a = "--n-gpu-layers";
    else if (a == "-dev") a = "--device";
    else if (a == "-sys") a = "--sys";
    else if (a == "-ub") a = "--ubatch-size";
    else if (a == "-np") a = "--n-parallel";
    else if (a == "-ts") a = "--tensor-split";
    else if (a == "-cmoe") a = "--cpu-moe";
    else if (a == "-ncmoe") a = "--n-cpu-moe";
    else if (a == "-ctk") a = "--cache-type-k";
    else if (a == "-ctv") a = "--cache-type-v";
    else if (a == "-fa") a = "--flash-attn";
    else if (a == "-cram") a = "--cache-ram";
  }
  std::reverse(args.begin(), args.end());
  return args;
}

// N of a CPU instance's name "CPUN" (N >= 1), else 0.
inline int cpu_instance_index(const std::string& name) {
  if (name.size() < 4 || name.rfind("CPU", 0) != 0) return 0;
  if (!std::all_of(name.begin() + 3, name.end(), [](char c) { return c >= '0' && c <= '9'; })) return 0;
  return std::atoi(name.c_str() + 3);
}

// The highest N of the CPU instances (CPUN) that --device names; 0: none.
inline int max_cpu_instance(const llm::offload_request& r) {
  int top = 0;
  for (const std::string& name : r.devices) top = std::max(top, cpu_instance_index(name));
  return top;
}

// Registers the extra CPU devices (CPU1, CPU2, ...) that --device names, with n_threads threads each (0: all),
// so that a model can be split over CPU instances on any machine.
inline void add_cpu_instances(const llm::offload_request& r, int n_threads) {
  for (const std::string& name : r.devices) {
    const int index = cpu_instance_index(name);
    if (index >= 1 && registry::instance().find(name) == nullptr) add_cpu_instance({.index = index, .n_threads = n_threads});
  }
}

inline void add_offload_options(CLI::App& app, llm::offload_request& r) {
  app.add_option_function<std::string>(
      "--n-gpu-layers,--gpu-layers",
      [&r](const std::string& v) {
        if (v == "auto") {
          r.fit = true;
          return;
        }
        if (v.empty() || v.size() > 6 || v.find_first_not_of("0123456789") != std::string::npos) {
          throw CLI::ValidationError("--n-gpu-layers", "'" + v + "' is neither a layer count nor auto");
        }
        r.n_gpu_layers = std::stoi(v);
      },
      "(-ngl) layers on the first non-CPU device, the last ones (99: all); auto: by free memory over the devices");
  app.add_option("--device", r.devices, "(-dev) devices sharing the layers evenly, e.g. Vulkan0,CPU")->delimiter(',');
  app.add_option("--tensor-split", r.tensor_split, "(-ts) the --device list's shares in these proportions, e.g. 3,1")
      ->delimiter(',');
  app.add_flag("--cpu-moe", r.cpu_moe, "(-cmoe) keep every layer's expert weights (mixture of experts) on the CPU");
  app.add_option("--n-cpu-moe", r.n_cpu_moe, "(-ncmoe) keep the expert weights of the first N layers on the CPU");
  app.add_flag_callback(
      "--list-devices",
      [] {
        std::printf("%s", format_devices().c_str());
        std::exit(0);
      },
      "print the devices troupe can use and exit");
}

}  // namespace troupe::cli
