#include "loader/model_loader.h"

#include <algorithm>
#include <cstring>

#include "runtime/log.h"

namespace troupe {

// ---- model_weights ----

model_weights::~model_weights() {
  // Buffers over a mapping must go before the mapping.
  buffers_.clear();
  contexts_.clear();
  locks_.clear();
  maps_.clear();
}

tensor* model_weights::find(const std::string& name, buffer_type_i* buft) const {
  const auto& all = plan_.all();
  const auto it = all.find(name);
  if (it == all.end()) return nullptr;
  buffer_type_i* b = buft ? buft : it->second.front();
  const auto c = contexts_.find(b);
  return c == contexts_.end() ? nullptr : c->second->find(name);
}

tensor* model_weights::get(const std::string& name, buffer_type_i* buft) const {
  tensor* t = find(name, buft);
  if (t == nullptr) {
    throw error("model has no weight '" + name + "'" + (buft ? " in buffer type " + std::string(buft->name()) : ""));
  }
  return t;
}

std::map<buffer_type_i*, size_t> model_weights::bytes_by_buft() const {
  std::map<buffer_type_i*, size_t> out;
  for (const auto& [buft, ctx] : contexts_) {
    size_t n = 0;
    ctx->for_each([&](tensor* t) { n += nbytes(*t); });
    out[buft] = n;
  }
  return out;
}

void model_weights::account(memory_ledger& ledger, int sign) const {
  for (const auto& [buft, bytes] : bytes_by_buft()) {
    ledger.add({std::string(buft->name()), std::string(buft->device().name()), buft->is_host()}, memory_kind::model,
               sign * static_cast<int64_t>(bytes));
  }
}

buffer_i* model_weights::buffer_containing(const void* addr, size_t n) const {
  const auto* p = static_cast<const char*>(addr);
  for (const auto& b : buffers_) {
    const auto* base = static_cast<const char*>(b->base());
    if (p >= base && static_cast<size_t>(p - base) <= b->size() && n <= b->size() - static_cast<size_t>(p - base)) {
      return b.get();
    }
  }
  return nullptr;
}

// ---- model_loader ----

model_loader::model_loader(const std::filesystem::path& path) : files_(open_gguf_splits(path)) {}

std::string model_loader::arch() const { return meta().get<std::string>("general.architecture").value_or(""); }

int model_loader::n_layer() const {
  const std::string a = arch();
  if (a.empty()) return 0;
  const auto n = meta().get_uint(a + ".block_count");
  if (!n) return 0;
  if (*n > 100000) throw gguf_error(meta().message(a + ".block_count", "implausible layer count " + std::to_string(*n), std::nullopt));
  return static_cast<int>(*n);
}

namespace {

bool wraps_host_memory(buffer_type_i& buft) {
  device_i& dev = buft.device();
  return dev.caps().buffer_from_host_ptr && &dev.buffer_type() == &buft;
}

}  // namespace

model_weights model_loader::load(const placement& plan, const load_params& params) const {
  // Refuse what cannot be used before reading anything.
  for (const gguf_tensor_info& t : tensors()) require_supported(t.type, t.name);

  model_weights w;
  w.plan_ = plan;

  // Metadata-only contexts, one per buffer type, holding each weight it uses.
  for (buffer_type_i* buft : plan.buffer_types()) {
    w.contexts_[buft] = std::make_unique<context>(context_params{.max_tensors = tensors().size() + 1, .no_alloc = true});
  }
  std::map<std::pair<buffer_type_i*, const gguf_tensor_info*>, tensor*> made;
  for (const gguf_tensor_info& t : tensors()) {
    for (buffer_type_i* buft : plan.uses(t.name)) {
      tensor* x = w.contexts_.at(buft)->new_tensor(t.type, max_dims, t.ne.data());
      x->set_name(t.name);
      x->flags |= flag_weight;
      made[{buft, &t}] = x;
    }
  }

  const bool use_mmap = params.use_mmap && mapped_file::SUPPORTED;
  if (use_mmap) {
    for (const auto& p : files_.paths()) w.maps_.push_back(std::make_unique<mapped_file>(p));
  }
  std::vector<std::unique_ptr<model_file>> readers;
  if (!use_mmap) {
    for (const auto& p : files_.paths()) readers.push_back(std::make_unique<model_file>(p));
  }

  const auto ranges = map_ranges(tensors(), plan);
  uint64_t total = 0, done = 0;
  for (const auto& [buft, rs] : ranges) {
    for (const file_range& r : rs) {
      for (const gguf_tensor_info* t : r.tensors) total += t->n_bytes;
    }
  }
  auto report = [&](uint64_t n) {
    done += n;
    if (params.progress && !params.progress(done, total)) throw load_cancelled("model loading cancelled");
  };

  // Device (non-host) contexts first: they need the staging while the least is resident; then host.
  std::vector<buffer_type_i*> order = plan.buffer_types();
  std::stable_partition(order.begin(), order.end(), [](buffer_type_i* b) { return !b->is_host(); });

  std::vector<uint8_t> staging;
  for (buffer_type_i* buft : order) {
    const auto rit = ranges.find(buft);
    if (rit == ranges.end()) continue;
    const std::vector<file_range>& rs = rit->second;
    context& ctx = *w.contexts_.at(buft);

    if (use_mmap && wraps_host_memory(*buft)) {
      // One buffer per range over the mapping; each tensor found in its buffer by address.
      device_i& dev = buft->device();
      const size_t first_buffer = w.buffers_.size();
      for (const file_range& r : rs) {
        mapped_file& m = *w.maps_[r.file];
        if (params.prefetch) m.prefetch(r.begin, r.size());
        size_t max_tensor = 0;
        for (const gguf_tensor_info* t : r.tensors) max_tensor = std::max<size_t>(max_tensor, t->n_bytes);
        buffer_ptr buf = dev.buffer_from_host_ptr(const_cast<std::byte*>(m.data() + r.begin), r.size(), max_tensor);
        buf->set_usage(buffer_usage::weights);
        w.buffers_.push_back(std::move(buf));
        if (params.use_mlock) w.locks_.push_back(std::make_unique<memory_lock>(m.data() + r.begin, r.size()));
      }
      for (const file_range& r : rs) {
        const mapped_file& m = *w.maps_[r.file];
        for (const gguf_tensor_info* t : r.tensors) {
          void* addr = const_cast<std::byte*>(m.data() + t->file_offset);
          buffer_i* buf = nullptr;
          for (size_t i = first_buffer; i < w.buffers_.size() && buf == nullptr; ++i) {
            auto* base = static_cast<const char*>(w.buffers_[i]->base());
            const auto* p = static_cast<const char*>(addr);
            if (p >= base && static_cast<size_t>(p - base) + t->n_bytes <= w.buffers_[i]->size()) buf = w.buffers_[i].get();
          }
          if (buf == nullptr) throw error("loader: no range buffer contains tensor '" + t->name + "'");
          tensor_alloc(*buf, *made.at({buft, t}), addr);
          w.mapped_bytes_ += t->n_bytes;
          report(t->n_bytes);
        }
      }
      continue;
    }

    // Allocate and copy.
    std::vector<buffer_ptr> bufs;
    {
      // Buffers of at most max_size each, tensors in context order.
      const size_t align = buft->alignment();
      const size_t max_size = buft->max_size();
      auto pad = [align](size_t x) { return (x + align - 1) / align * align; };
      std::vector<std::vector<tensor*>> groups(1);
      std::vector<size_t> sizes(1, 0);
      ctx.for_each([&](tensor* t) {
        const size_t sz = pad(buft->alloc_size(*t));
        if (sizes.back() > 0 && sizes.back() + sz > max_size) {
          groups.emplace_back();
          sizes.push_back(0);
        }
        groups.back().push_back(t);
        sizes.back() += sz;
      });
      for (size_t g = 0; g < groups.size(); ++g) {
        if (sizes[g] == 0) continue;
        buffer_ptr buf = buft->alloc_buffer(sizes[g]);
        buf->set_usage(buffer_usage::weights);
        auto* base = static_cast<char*>(buf->base());
        size_t offs = 0;
        for (tensor* t : groups[g]) {
          tensor_alloc(*buf, *t, base + offs);
          offs += pad(buft->alloc_size(*t));
        }
        bufs.push_back(std::move(buf));
      }
    }
    for (const file_range& r : rs) {
      for (const gguf_tensor_info* t : r.tensors) {
        tensor& x = *made.at({buft, t});
        if (use_mmap) {
          const mapped_file& m = *w.maps_[t->file_index];
          tensor_set(x, m.data() + t->file_offset, 0, t->n_bytes);
        } else {
          const size_t chunk = std::max<size_t>(params.staging_size, 1);
          staging.resize(std::min<size_t>(chunk, t->n_bytes));
          for (uint64_t off = 0; off < t->n_bytes; off += staging.size()) {
            const size_t n = static_cast<size_t>(std::min<uint64_t>(staging.size(), t->n_bytes - off));
            readers[t->file_index]->read_at(t->file_offset + off, staging.data(), n);
            tensor_set(x, staging.data(), off, n);
          }
        }
        w.copied_bytes_ += t->n_bytes;
        report(t->n_bytes);
      }
    }
    for (auto& b : bufs) w.buffers_.push_back(std::move(b));
  }

  // Pages that only device contexts needed (now copied) are released from the mapping.
  if (use_mmap) {
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> keep(w.maps_.size());
    for (const auto& [buft, rs] : ranges) {
      if (!wraps_host_memory(*buft)) continue;
      for (const file_range& r : rs) keep[r.file].emplace_back(r.begin, r.end);
    }
    for (const auto& [buft, rs] : ranges) {
      if (wraps_host_memory(*buft)) continue;
      for (const file_range& r : rs) {
        // Release [r.begin, r.end) minus every kept range of the same file.
        uint64_t cur = r.begin;
        auto kept = keep[r.file];
        std::sort(kept.begin(), kept.end());
        for (const auto& [kb, ke] : kept) {
          if (ke <= cur || kb >= r.end) continue;
          if (kb > cur) w.maps_[r.file]->release(cur, kb - cur);
          cur = std::max(cur, ke);
        }
        if (cur < r.end) w.maps_[r.file]->release(cur, r.end - cur);
      }
    }
  }
  TROUPE_LOG(debug, "loader: " << w.mapped_bytes_ << " bytes mapped in place, " << w.copied_bytes_ << " bytes copied");
  return w;
}

}  // namespace troupe
