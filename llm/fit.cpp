#include "llm/fit.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "runtime/error.h"
#include "llm/model.h"

namespace troupe::llm {
namespace {

constexpr double mib = 1024.0 * 1024.0;

std::string in_mib(uint64_t b) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(b) / mib);
  return buf;
}

// "blk.N." -> N, else -1.
int layer_of(const std::string& name) {
  if (name.rfind("blk.", 0) != 0) return -1;
  size_t i = 4;
  int n = 0;
  bool digits = false;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    n = n * 10 + (name[i] - '0');
    digits = true;
    if (n > 100000) return -1;
    ++i;
  }
  return digits && i < name.size() && name[i] == '.' ? n : -1;
}

}  // namespace

uint64_t layer_costs::total() const {
  uint64_t t = output;
  for (size_t il = 0; il < weights.size(); ++il) t += layer(il);
  return t;
}

layer_costs estimate_costs(const model& m, const cost_params& p) {
  const hparams& hp = m.hp();
  layer_costs c;
  c.weights.assign(hp.n_layer, 0);
  c.kv.assign(hp.n_layer, 0);
  bool has_output = false;
  uint64_t embd = 0;
  for (const gguf_tensor_info& t : m.meta().tensors()) {
    const int il = layer_of(t.name);
    if (il >= 0 && static_cast<uint32_t>(il) < hp.n_layer) {
      c.weights[static_cast<size_t>(il)] += t.n_bytes;
    } else if (t.name == "output.weight") {
      c.output += t.n_bytes;
      has_output = true;
    } else if (t.name == "output_norm.weight") {
      c.output += t.n_bytes;
    } else if (t.name == "token_embd.weight") {
      embd = t.n_bytes;
      c.host += t.n_bytes;
    } else {
      c.host += t.n_bytes;
    }
  }
  if (!has_output) c.output += embd;  // tied: the output layer's device holds a copy of the embedding
  const uint64_t cells = p.n_ctx;
  const uint64_t per_cell = row_size(p.kv_type, hp.n_embd_k_gqa()) + row_size(p.kv_type, hp.n_embd_v_gqa());
  for (uint64_t& kv : c.kv) kv = cells * per_cell;
  // Compute: a micro-batch's activations (residual, attention and feed-forward intermediates: about 8 rows of
  // the widest dimension per token), its attention scores over the context, and one row of logits per token.
  const uint64_t wide = std::max<uint64_t>(hp.n_embd, hp.n_ff);
  c.compute = uint64_t{p.n_ubatch} * (8 * wide * 4 + uint64_t{hp.n_head} * cells * 4 + uint64_t{hp.n_vocab} * 4);
  return c;
}

fit_plan fit_layers(const layer_costs& c, const std::vector<fit_device>& devices, uint64_t margin) {
  if (devices.empty()) throw error("fit: no device to place the model on");
  const size_t n_layer = c.weights.size();
  // What each device can take for layers: its free memory less the margin and its compute share.
  std::vector<uint64_t> usable;
  for (const fit_device& d : devices) {
    const uint64_t reserved = margin + c.compute;
    usable.push_back(d.free > reserved ? d.free - reserved : 0);
  }
  const uint64_t need = c.total();
  const uint64_t offered = std::accumulate(usable.begin(), usable.end(), uint64_t{0});
  if (offered < need) {
    uint64_t free = 0;
    for (const fit_device& d : devices) free += d.free;
    throw error("fit: the model needs " + in_mib(need) + " for its layers (weights " +
                in_mib(std::accumulate(c.weights.begin(), c.weights.end(), uint64_t{0}) + c.output) + ", KV cache " +
                in_mib(std::accumulate(c.kv.begin(), c.kv.end(), uint64_t{0})) + ") plus " + in_mib(c.compute) +
                " of compute per device; the " + std::to_string(devices.size()) + " device(s) have " + in_mib(free) +
                " free, " + in_mib(offered) + " after a margin of " + in_mib(margin) + " each: short by " +
                in_mib(need - offered));
  }
  // Items in order: the layers, then the output (which goes with the last layer's device).
  std::vector<uint64_t> item(c.weights.size() + 1);
  for (size_t il = 0; il < n_layer; ++il) item[il] = c.layer(il);
  item[n_layer] = c.output;
  // Device i's share of the bytes is proportional to what it can take: it takes items while it is under its
  // share (by more than half the next item) and has room, the last device the rest. When whole layers and
  // the proportions disagree at the end (a device near full), each device is filled to its room instead.
  std::vector<int> count;
  std::vector<uint64_t> held;
  auto assign = [&](bool proportional) {
    count.assign(devices.size(), 0);
    held.assign(devices.size(), 0);
    size_t next = 0;
    uint64_t placed = 0;
    double share_before = 0;
    for (size_t i = 0; i < devices.size() && next < item.size(); ++i) {
      share_before += static_cast<double>(usable[i]);
      const double target = static_cast<double>(need) * share_before / static_cast<double>(offered);
      const bool last = i + 1 == devices.size();
      while (next < item.size() && held[i] + item[next] <= usable[i] &&
             (!proportional || last || static_cast<double>(placed) + static_cast<double>(item[next]) / 2 <= target)) {
        held[i] += item[next];
        placed += item[next];
        ++count[i];
        ++next;
      }
    }
    return next == item.size();
  };
  if (!assign(true) && !assign(false)) {
    throw error("fit: the layers do not divide over the devices' free memory (each device takes whole layers, "
                "and none has room for the next one); free more memory or add a device");
  }
  fit_plan p;
  for (size_t i = 0; i < devices.size(); ++i) {
    if (count[i] == 0) continue;
    p.layers.emplace_back(devices[i].name, count[i]);
    p.bytes.push_back(held[i] + c.compute);
  }
  return p;
}

}  // namespace troupe::llm
