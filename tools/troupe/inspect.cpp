// troupe inspect: what a GGUF file holds and where its weights would go.
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "loader/model_loader.h"
#include "loader/ranges.h"
#include "runtime/backend.h"
#include "runtime/memory.h"
#include "tools/troupe/commands.h"

namespace troupe::cli {
namespace {

struct inspect_options {
  std::string model;
  std::vector<std::string> devices;    // NAME=LAYERS
  std::vector<std::string> overrides;  // REGEX=DEVICE
  bool all_metadata = false;
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
  std::printf("\nmemory plan (model weights):\n%s", format_memory_table(ledger, devices).c_str());
  return 0;
}

}  // namespace

command_fn add_inspect(CLI::App& app) {
  auto o = std::make_shared<inspect_options>();
  app.add_option("model", o->model, "GGUF model file (the first file of a split model)")->required();
  app.add_option("--device", o->devices, "NAME=LAYERS: put the model's last LAYERS layers on device NAME (repeatable)");
  app.add_option("--override", o->overrides, "REGEX=DEVICE: tensors whose name matches go to DEVICE (repeatable)");
  app.add_flag("--all-metadata", o->all_metadata, "print every element of long arrays");
  return [o] { return run_inspect(*o); };
}

}  // namespace troupe::cli
