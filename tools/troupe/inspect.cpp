// troupe inspect: what a GGUF file holds and where its weights would go.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "loader/model_loader.h"
#include "loader/ranges.h"
#include "runtime/backend.h"
#include "llm/fit.h"
#include "llm/model.h"
#include "llm/offload.h"
#include "runtime/memory.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {
namespace {

struct inspect_options {
  std::string model;
  std::vector<std::string> devices;    // NAME=LAYERS
  std::vector<std::string> overrides;  // REGEX=DEVICE
  bool cpu_moe = false;                // the experts of every layer on the CPU (after the overrides)
  uint32_t n_cpu_moe = 0;              // the experts of the first N layers
  bool ranges = false;                 // list each buffer type's file ranges
  bool all_metadata = false;
  bool fit = false;           // the plan by free memory over this machine's devices
  std::string cluster;        // HOST:PORT of a coordinating `troupe serve`: the plan over its nodes' devices
  std::string api_key;        // for --cluster
  uint32_t ctx = 4096;        // the context the plan is for
  uint64_t margin_mib = 512;
};

std::pair<std::string, std::string> split_eq(const std::string& s, const char* what) {
  const auto eq = s.rfind('=');
  if (eq == std::string::npos || eq == 0 || eq + 1 == s.size()) {
    throw error(std::string(what) + " '" + s + "' is not of the form A=B");
  }
  return {s.substr(0, eq), s.substr(eq + 1)};
}

device_i& device_named(const std::string& name) {
  device_i* d = registry::instance().find(name);
  if (d == nullptr) {
    std::string known;
    for (device_i* x : registry::instance().devices()) known += (known.empty() ? "" : ", ") + std::string(x->name());
    throw error("no device named '" + name + "' (devices: " + known + ")");
  }
  return *d;
}

std::string shape_of(const gguf_tensor_info& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < std::max<uint32_t>(t.n_dims, 1); ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

std::string human_bytes(uint64_t b) {
  char buf[32];
  if (b >= (1ull << 30)) std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(b) / (1ull << 30));
  else if (b >= (1ull << 20)) std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(b) / (1ull << 20));
  else if (b >= (1ull << 10)) std::snprintf(buf, sizeof buf, "%.2f KiB", static_cast<double>(b) / (1ull << 10));
  else std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(b));
  return buf;
}

// The devices of the cluster that the daemon at o.cluster coordinates (GET /v1/cluster): every device of every
// node that is up, named as rpc::add_peer names them, with the node's name.
std::vector<std::pair<llm::fit_device, std::string>> cluster_devices(const inspect_options& o) {
  const auto colon = o.cluster.rfind(':');
  if (colon == std::string::npos) throw error("--cluster: '" + o.cluster + "' is not HOST:PORT");
  httplib::Client c(o.cluster.substr(0, colon), std::stoi(o.cluster.substr(colon + 1)));
  c.set_connection_timeout(5, 0);
  c.set_read_timeout(10, 0);
  httplib::Headers h;
  if (!o.api_key.empty()) h.emplace("Authorization", "Bearer " + o.api_key);
  const auto r = c.Get("/v1/cluster", h);
  if (!r) throw error("--cluster: no answer from http://" + o.cluster + "/v1/cluster (" + httplib::to_string(r.error()) + ")");
  if (r->status != 200) throw error("--cluster: http://" + o.cluster + "/v1/cluster answered " + std::to_string(r->status) + ": " + r->body);
  std::vector<std::pair<llm::fit_device, std::string>> out;
  try {
    const auto j = nlohmann::json::parse(r->body);
    for (const auto& n : j.at("nodes")) {
      if (n.at("state") != "up") continue;
      const std::string addr = n.at("rpc_address");
      size_t i = 0;
      for (const auto& d : n.at("devices")) {
        out.push_back({{"RPC[" + addr + "]#" + std::to_string(i++), d.at("memory_free").get<uint64_t>()}, n.at("name")});
      }
    }
  } catch (const nlohmann::json::exception& e) {
    throw error(std::string("--cluster: the cluster's description is malformed: ") + e.what());
  }
  if (out.empty()) throw error("--cluster: no node of the cluster is up");
  return out;
}

// The plan by free memory (llm/fit.h): per device, its layers and bytes.
void print_fit(const inspect_options& o) {
  std::vector<std::pair<llm::fit_device, std::string>> devs;
  if (!o.cluster.empty()) {
    devs = cluster_devices(o);
  } else {
    for (device_i* d : llm::auto_devices({})) devs.push_back({{std::string(d->name()), d->memory().free}, "this machine"});
  }
  auto m = llm::model::open(o.model);
  const llm::layer_costs costs = llm::estimate_costs(*m, {.n_ctx = o.ctx});
  std::vector<llm::fit_device> fd;
  for (const auto& [d, node] : devs) fd.push_back(d);
  std::printf("\nplacement by free memory (n_ctx %u, margin %llu MiB; each layer %s with its KV cache, the output %s, "
              "compute %s per device, %s in host memory):\n",
              o.ctx, static_cast<unsigned long long>(o.margin_mib), human_bytes(costs.layer(0)).c_str(),
              human_bytes(costs.output).c_str(), human_bytes(costs.compute).c_str(), human_bytes(costs.host).c_str());
  const llm::fit_plan p = llm::fit_layers(costs, fd, o.margin_mib << 20);
  std::printf("  %-32s %-16s %-14s %12s %12s\n", "device", "node", "layers", "bytes", "free");
  int first = 0;
  const int n_layer = static_cast<int>(m->hp().n_layer);
  for (size_t i = 0; i < p.layers.size(); ++i) {
    const auto& [name, k] = p.layers[i];
    std::string node;
    uint64_t free = 0;
    for (const auto& [d, n] : devs) {
      if (d.name == name) {
        node = n;
        free = d.free;
      }
    }
    const int last = first + k - 1;
    const std::string range = last >= n_layer ? std::to_string(first) + "-" + std::to_string(n_layer - 1) + " + output"
                                              : std::to_string(first) + "-" + std::to_string(last);
    std::printf("  %-32s %-16s %-14s %12s %12s\n", name.c_str(), node.c_str(), range.c_str(), human_bytes(p.bytes[i]).c_str(),
                human_bytes(free).c_str());
    first += k;
  }
}

int run_inspect(const inspect_options& o) {
  model_loader loader(o.model);
  const gguf_file& meta = loader.meta();
  std::printf("%s: GGUF v%u, %zu file(s), %zu metadata entries, %zu tensors, alignment %u, data at %llu\n",
              o.model.c_str(), meta.version(), loader.files().n_files(), meta.metadata().size(), loader.tensors().size(),
              meta.alignment(), static_cast<unsigned long long>(meta.data_offset()));

  std::printf("\nmetadata:\n");
  for (const gguf_kv& kv : meta.metadata()) {
    std::printf("  %-40s %-16s %s\n", kv.key.c_str(), gguf_describe_type(kv.value).c_str(),
                kv.value.to_string(o.all_metadata ? SIZE_MAX : 8).c_str());
  }

  std::printf("\ntensors:\n  %-40s %-8s %-22s %12s %12s\n", "name", "type", "shape", "bytes", "offset");
  uint64_t total = 0;
  size_t unsupported = 0;
  for (const gguf_tensor_info& t : loader.tensors()) {
    std::printf("  %-40s %-8s %-22s %12llu %12llu%s\n", t.name.c_str(), std::string(type_name(t.type)).c_str(),
                shape_of(t).c_str(), static_cast<unsigned long long>(t.n_bytes),
                static_cast<unsigned long long>(t.file_offset), t.supported() ? "" : "  (not supported by troupe)");
    total += t.n_bytes;
    unsupported += t.supported() ? 0 : 1;
  }
  std::printf("  %zu tensors, %s%s\n", loader.tensors().size(), human_bytes(total).c_str(),
              unsupported ? (", " + std::to_string(unsupported) + " of a type troupe cannot compute with").c_str() : "");

  // Placement on the requested devices (default: everything on the CPU).
  device_i& cpu = device_named("CPU");
  placement_params p;
  p.host = &cpu.buffer_type();
  for (const std::string& d : o.devices) {
    const auto [name, layers] = split_eq(d, "--device");
    int n = 0;
    try {
      n = std::stoi(layers);
    } catch (const std::exception&) {
      throw error("--device " + d + ": '" + layers + "' is not a layer count");
    }
    p.devices.emplace_back(&device_named(name).buffer_type(), n);
  }
  for (const std::string& ov : o.overrides) {
    const auto [re, name] = split_eq(ov, "--override");
    p.overrides.emplace_back(re, &device_named(name).buffer_type());
  }
  for (const std::string& re : llm::cpu_moe_patterns(o.cpu_moe, o.n_cpu_moe)) p.overrides.emplace_back(re, &cpu.buffer_type());
  const placement plan = loader.plan(p);
  const auto ranges = map_ranges(loader.tensors(), plan);

  std::printf("\nplacement (%d layers):\n  %-16s %8s %8s %14s  %s\n", loader.n_layer(), "buffer type", "tensors", "ranges",
              "bytes", "how");
  memory_ledger ledger;
  std::vector<device_memory_info> devices;
  for (buffer_type_i* buft : plan.buffer_types()) {
    size_t n_tensors = 0;
    uint64_t bytes = 0;
    const auto it = ranges.find(buft);
    const size_t n_ranges = it == ranges.end() ? 0 : it->second.size();
    if (it != ranges.end()) {
      for (const file_range& r : it->second) {
        n_tensors += r.tensors.size();
        for (const auto* t : r.tensors) bytes += t->n_bytes;
      }
    }
    device_i& dev = buft->device();
    const bool in_place = dev.caps().buffer_from_host_ptr && &dev.buffer_type() == buft;
    std::printf("  %-16s %8zu %8zu %14s  %s\n", std::string(buft->name()).c_str(), n_tensors, n_ranges,
                human_bytes(bytes).c_str(), in_place ? "mapped in place (mmap)" : "allocated and copied");
    ledger.add({std::string(buft->name()), std::string(dev.name()), buft->is_host()}, memory_kind::model,
               static_cast<int64_t>(bytes));
    if (!buft->is_host()) {
      const device_memory m = dev.memory();
      devices.push_back({std::string(dev.name()), dev.description(), m.total, m.free});
    }
  }
  if (o.ranges) {
    // Each buffer's bytes in the file: a buffer type holds exactly these ranges (host ones mapped in place).
    std::printf("\nfile ranges:\n  %-16s %14s %14s %8s  %s\n", "buffer type", "offset", "end", "tensors", "first .. last");
    for (buffer_type_i* buft : plan.buffer_types()) {
      const auto it = ranges.find(buft);
      if (it == ranges.end()) continue;
      for (const file_range& r : it->second) {
        if (r.tensors.empty()) continue;
        std::printf("  %-16s %14llu %14llu %8zu  %s .. %s\n", std::string(buft->name()).c_str(),
                    static_cast<unsigned long long>(r.begin), static_cast<unsigned long long>(r.end),
                    r.tensors.size(), r.tensors.front()->name.c_str(), r.tensors.back()->name.c_str());
      }
    }
  }
  std::printf("\nmemory plan (model weights):\n%s", format_memory_table(ledger, devices).c_str());
  if (o.fit || !o.cluster.empty()) print_fit(o);
  return 0;
}

}  // namespace

command_fn add_inspect(CLI::App& app) {
  auto o = std::make_shared<inspect_options>();
  app.add_option("model", o->model, "GGUF model file (the first file of a split model)")->required();
  app.add_option("--device", o->devices, "NAME=LAYERS: put the model's last LAYERS layers on device NAME (repeatable)");
  app.add_option("--override", o->overrides, "REGEX=DEVICE: tensors whose name matches go to DEVICE (repeatable)");
  app.add_flag("--cpu-moe,--cmoe", o->cpu_moe, "keep every layer's expert weights (mixture of experts) on the CPU");
  app.add_option("--n-cpu-moe,--ncmoe", o->n_cpu_moe, "keep the expert weights of the first N layers on the CPU");
  app.add_flag("--ranges", o->ranges, "list the file ranges each buffer type holds, with their first and last tensors");
  app.add_flag("--all-metadata", o->all_metadata, "print every element of long arrays");
  app.add_flag("--fit", o->fit, "the placement by free memory over this machine's devices (-ngl auto)");
  app.add_option("--cluster", o->cluster, "HOST:PORT of a troupe serve with [cluster]: the placement over its nodes");
  app.add_option("--api-key", o->api_key, "bearer key for --cluster's daemon");
  app.add_option("--ctx", o->ctx, "the context (KV cells) the placement is for")->check(CLI::Range(1, 1 << 24));
  app.add_option("--margin-mib", o->margin_mib, "memory each device keeps free (MiB)");
  return [o] { return run_inspect(*o); };
}

}  // namespace troupe::cli
