#include "loader/model_loader.h"

#include <algorithm>
#include <cstring>

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
  // What is held: the buffers' sizes (alignment padding and, for mapped ranges, the bytes between tensors
  // included), as llama.cpp counts model memory, not the sum of the tensors' bytes.
  std::map<buffer_type_i*, size_t> out;
  for (const auto& [buft, ctx] : contexts_) out[buft] = 0;
  for (const auto& b : buffers_) out[&b->type()] += b->size();
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

load_job model_loader::begin(const placement& plan, const load_params& params) const {
  return load_job(*this, plan, params);
}

model_weights model_loader::load(const placement& plan, const load_params& params) const {
  load_job job = begin(plan, params);
  for (buffer_type_i* b : job.targets()) job.upload(b, params.progress);
  return job.finish();
}

}  // namespace troupe
