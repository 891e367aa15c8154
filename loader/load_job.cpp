#include "loader/load_job.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <set>

#include "loader/model_loader.h"
#include "loader/ranges.h"
#include "runtime/huge_pages.h"
#include "runtime/log.h"

namespace troupe {

namespace {

bool wraps_host_memory(const buffer_type_i& buft) {
  device_i& dev = buft.device();
  return dev.caps().buffer_from_host_ptr && &dev.buffer_type() == &buft;
}

}  // namespace

// What one target's upload produced; merged into the weights by finish().
struct target_state {
  uint64_t bytes = 0;
  std::vector<buffer_ptr> buffers;
  std::vector<std::unique_ptr<memory_lock>> locks;
  uint64_t mapped = 0;
  uint64_t copied = 0;
  bool huge_pages = false;  // a host type's weights copied out of the mapping (load_params::huge_pages)
  std::atomic<bool> started{false};
  std::atomic<bool> done{false};
};

struct load_job::impl {
  const model_loader* loader = nullptr;
  load_params params;
  bool use_mmap = false;
  model_weights w;
  std::map<std::pair<buffer_type_i*, const gguf_tensor_info*>, tensor*> made;
  std::map<buffer_type_i*, std::vector<file_range>> ranges;
  std::vector<std::unique_ptr<model_file>> readers;
  std::vector<buffer_type_i*> targets;
  std::map<const buffer_type_i*, std::unique_ptr<target_state>> state;
  uint64_t total = 0;
  std::atomic<uint64_t> done{0};
  std::atomic<bool> cancel{false};

  void report(uint64_t n, const progress_fn& progress) {
    const uint64_t now = done.fetch_add(n) + n;
    if (cancel.load()) throw load_cancelled("model loading cancelled");
    if (progress && !progress(now, total)) {
      cancel.store(true);
      throw load_cancelled("model loading cancelled");
    }
  }
  void check_cancel() const {
    if (cancel.load()) throw load_cancelled("model loading cancelled");
  }
  // The policy of load_params::huge_pages for a host buffer type that could wrap the mapping; records
  // the choice in st.
  bool into_huge_pages(const buffer_type_i& b, target_state& st) const {
    st.huge_pages = params.huge_pages && !params.use_mlock && b.is_host() && st.bytes >= params.huge_pages_min &&
                    transparent_huge_pages() && st.bytes <= available_host_memory() / 2;
    return st.huge_pages;
  }
  void upload_mapped(buffer_type_i* buft, target_state& st, const progress_fn& progress);
  void upload_copied(buffer_type_i* buft, target_state& st, const progress_fn& progress);
};

load_job::load_job(const model_loader& loader, const placement& plan, const load_params& params)
    : impl_(std::make_unique<impl>()) {
  impl& s = *impl_;
  s.loader = &loader;
  s.params = params;
  // Refuse what cannot be used before reading anything.
  for (const gguf_tensor_info& t : loader.tensors()) require_supported(t.type, t.name);

  s.w.plan_ = plan;
  // Metadata-only contexts, one per buffer type, holding each weight it uses.
  for (buffer_type_i* buft : plan.buffer_types()) {
    s.w.contexts_[buft] =
        std::make_unique<context>(context_params{.max_tensors = loader.tensors().size() + 1, .no_alloc = true});
  }
  for (const gguf_tensor_info& t : loader.tensors()) {
    for (buffer_type_i* buft : plan.uses(t.name)) {
      tensor* x = s.w.contexts_.at(buft)->new_tensor(t.type, max_dims, t.ne.data());
      x->set_name(t.name);
      x->flags |= flag_weight;
      s.made[{buft, &t}] = x;
    }
  }

  s.use_mmap = params.use_mmap && mapped_file::SUPPORTED;
  if (s.use_mmap) {
    for (const auto& p : loader.files().paths()) s.w.maps_.push_back(std::make_unique<mapped_file>(p));
  } else {
    for (const auto& p : loader.files().paths()) s.readers.push_back(std::make_unique<model_file>(p));
  }

  s.ranges = map_ranges(loader.tensors(), plan);
  // Device (non-host) contexts first: they need the staging while the least is resident; then host.
  std::vector<buffer_type_i*> order = plan.buffer_types();
  std::stable_partition(order.begin(), order.end(), [](buffer_type_i* b) { return !b->is_host(); });
  for (buffer_type_i* buft : order) {
    const auto rit = s.ranges.find(buft);
    if (rit == s.ranges.end()) continue;
    auto st = std::make_unique<target_state>();
    for (const file_range& r : rit->second) {
      for (const gguf_tensor_info* t : r.tensors) st->bytes += t->n_bytes;
    }
    s.total += st->bytes;
    s.targets.push_back(buft);
    s.state[buft] = std::move(st);
  }
}

load_job::~load_job() = default;
load_job::load_job(load_job&&) noexcept = default;
load_job& load_job::operator=(load_job&&) noexcept = default;

const std::vector<buffer_type_i*>& load_job::targets() const { return impl_->targets; }

uint64_t load_job::bytes(const buffer_type_i* b) const {
  const auto it = impl_->state.find(b);
  return it == impl_->state.end() ? 0 : it->second->bytes;
}

uint64_t load_job::total_bytes() const { return impl_->total; }
uint64_t load_job::done_bytes() const { return impl_->done.load(); }
void load_job::cancel() { impl_->cancel.store(true); }
bool load_job::cancelled() const { return impl_->cancel.load(); }

bool load_job::uploaded(const buffer_type_i* b) const {
  const auto it = impl_->state.find(b);
  return it != impl_->state.end() && it->second->done.load();
}

void load_job::upload(buffer_type_i* b, const progress_fn& progress) {
  impl& s = *impl_;
  const auto it = s.state.find(b);
  if (it == s.state.end()) {
    throw error("load job: buffer type " + std::string(b ? b->name() : "(null)") + " receives no weights");
  }
  target_state& st = *it->second;
  if (st.started.exchange(true)) throw error("load job: buffer type " + std::string(b->name()) + " uploaded twice");
  s.check_cancel();
  if (s.use_mmap && wraps_host_memory(*b) && !s.into_huge_pages(*b, st)) {
    s.upload_mapped(b, st, progress);
  } else {
    s.upload_copied(b, st, progress);
  }
  st.done.store(true);
}

void load_job::impl::upload_mapped(buffer_type_i* buft, target_state& st, const progress_fn& progress) {
  // One buffer per range over the mapping; each tensor found in its buffer by address.
  const std::vector<file_range>& rs = ranges.at(buft);
  device_i& dev = buft->device();
  for (const file_range& r : rs) {
    mapped_file& m = *w.maps_[r.file];
    if (params.prefetch) m.prefetch(r.begin, r.size());
    size_t max_tensor = 0;
    for (const gguf_tensor_info* t : r.tensors) max_tensor = std::max<size_t>(max_tensor, t->n_bytes);
    buffer_ptr buf = dev.buffer_from_host_ptr(const_cast<std::byte*>(m.data() + r.begin), r.size(), max_tensor);
    buf->set_usage(buffer_usage::weights);
    st.buffers.push_back(std::move(buf));
    if (params.use_mlock) st.locks.push_back(std::make_unique<memory_lock>(m.data() + r.begin, r.size()));
  }
  for (const file_range& r : rs) {
    const mapped_file& m = *w.maps_[r.file];
    for (const gguf_tensor_info* t : r.tensors) {
      void* addr = const_cast<std::byte*>(m.data() + t->file_offset);
      buffer_i* buf = nullptr;
      for (size_t i = 0; i < st.buffers.size() && buf == nullptr; ++i) {
        auto* base = static_cast<const char*>(st.buffers[i]->base());
        const auto* p = static_cast<const char*>(addr);
        if (p >= base && static_cast<size_t>(p - base) + t->n_bytes <= st.buffers[i]->size()) buf = st.buffers[i].get();
      }
      if (buf == nullptr) throw error("loader: no range buffer contains tensor '" + t->name + "'");
      tensor_alloc(*buf, *made.at({buft, t}), addr);
      st.mapped += t->n_bytes;
      report(t->n_bytes, progress);
    }
  }
}

void load_job::impl::upload_copied(buffer_type_i* buft, target_state& st, const progress_fn& progress) {
  const std::vector<file_range>& rs = ranges.at(buft);
  context& ctx = *w.contexts_.at(buft);
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
      st.buffers.push_back(std::move(buf));
    }
  }
  std::vector<uint8_t> staging;
  for (const file_range& r : rs) {
    for (const gguf_tensor_info* t : r.tensors) {
      tensor& x = *made.at({buft, t});
      if (use_mmap) {
        const mapped_file& m = *w.maps_[t->file_index];
        tensor_set(x, m.data() + t->file_offset, 0, t->n_bytes);
        // The source pages leave this process as they are copied (a target using the mapping in place, or a
        // second copy, faults them in again from the page cache): the weights are not resident twice.
        m.drop(t->file_offset, t->n_bytes);
      } else {
        const size_t chunk = std::max<size_t>(params.staging_size, 1);
        staging.resize(std::min<size_t>(chunk, t->n_bytes));
        for (uint64_t off = 0; off < t->n_bytes; off += staging.size()) {
          check_cancel();
          const size_t n = static_cast<size_t>(std::min<uint64_t>(staging.size(), t->n_bytes - off));
          readers[t->file_index]->read_at(t->file_offset + off, staging.data(), n);
          tensor_set(x, staging.data(), off, n);
        }
      }
      st.copied += t->n_bytes;
      report(t->n_bytes, progress);
    }
  }
}

model_weights load_job::finish() {
  impl& s = *impl_;
  if (s.cancel.load()) throw load_cancelled("model loading cancelled");
  for (buffer_type_i* b : s.targets) {
    if (!s.state.at(b)->done.load()) {
      throw error("load job: buffer type " + std::string(b->name()) + " has not been uploaded");
    }
  }
  model_weights& w = s.w;
  for (buffer_type_i* b : s.targets) {
    target_state& st = *s.state.at(b);
    for (auto& buf : st.buffers) w.buffers_.push_back(std::move(buf));
    for (auto& l : st.locks) w.locks_.push_back(std::move(l));
    w.mapped_bytes_ += st.mapped;
    w.copied_bytes_ += st.copied;
  }
  // The buffer types whose weights are used in place in the mapping.
  std::set<const buffer_type_i*> in_place;
  for (const auto& [buft, st] : s.state) {
    if (wraps_host_memory(*buft) && !st->huge_pages) in_place.insert(buft);
  }
  s.state.clear();

  // Pages that only copied contexts needed (devices', host weights in huge pages) are released from the
  // mapping.
  if (s.use_mmap) {
    std::vector<std::vector<std::pair<uint64_t, uint64_t>>> keep(w.maps_.size());
    for (const auto& [buft, rs] : s.ranges) {
      if (in_place.count(buft) == 0) continue;
      for (const file_range& r : rs) keep[r.file].emplace_back(r.begin, r.end);
    }
    for (auto& k : keep) std::sort(k.begin(), k.end());
    for (const auto& [buft, rs] : s.ranges) {
      if (in_place.count(buft) != 0) continue;
      for (const file_range& r : rs) {
        // Release [r.begin, r.end) minus every kept range of the same file.
        uint64_t cur = r.begin;
        for (const auto& [kb, ke] : keep[r.file]) {
          if (ke <= cur || kb >= r.end) continue;
          if (kb > cur) w.maps_[r.file]->release(cur, kb - cur);
          cur = std::max(cur, ke);
        }
        if (cur < r.end) w.maps_[r.file]->release(cur, r.end - cur);
      }
    }
  }
  TROUPE_LOG(debug, "loader: " << w.mapped_bytes_ << " bytes mapped in place, " << w.copied_bytes_ << " bytes copied");
  return std::move(w);
}

}  // namespace troupe
