// Loading a model's weights: open (split-aware), plan placement, map ranges, place and upload.
//
//   model_loader loader("models/model.gguf");                 // parses every split's header region
//   placement plan = loader.plan({.host = &cpu.buffer_type(), .devices = {{&gpu.buffer_type(), 99}}});
//   model_weights w = loader.load(plan, {.progress = [](uint64_t done, uint64_t total) { return true; }});
//   tensor* wq = w.get("blk.0.attn_q.weight");                // placed, data ready
//   w.bytes_by_buft();                                         // model memory per buffer type
//
// With mmap (the default), a context whose buffer type is its device's default one and whose device can
// wrap host memory (the CPU) gets one buffer per file range over the mapping: no copy, and pages are read
// on first use (prefetched with posix_madvise WILLNEED). Every other context gets buffers of its type and
// the bytes are copied in, from the mapping or, without mmap, read with pread into staging memory. Non-host
// contexts are loaded first; once every device context is loaded, mapped pages no host context reads are
// released. Every tensor is checked before anything is read: a type troupe cannot compute with is refused
// with the tensor's name and type.
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "loader/gguf.h"
#include "loader/gguf_split.h"
#include "loader/load_job.h"
#include "loader/mmap.h"
#include "loader/placement.h"
#include "loader/ranges.h"
#include "runtime/backend.h"
#include "runtime/context.h"
#include "runtime/memory.h"

namespace troupe {

// Loading was cancelled by the progress callback.
class load_cancelled : public error {
 public:
  using error::error;
};

struct load_params {
  bool use_mmap = true;    // map the files; weights used in place where possible
  bool use_mlock = false;  // lock mapped weights in RAM
  bool prefetch = true;    // posix_madvise(WILLNEED) on the mapped ranges
  // With mmap, a host buffer type's weights of huge_pages_min bytes or more are copied out of the mapping
  // into 2 MiB pages (runtime/huge_pages.h) where the kernel offers transparent huge pages, no mlock is
  // asked for and they take at most half the available memory; otherwise they are used in place. Generation
  // streams every weight per token and reads them ~40% faster from huge pages than from the file's 4 KiB
  // pages. The copied ranges are released from the mapping afterwards, as device ranges are.
  bool huge_pages = true;
  uint64_t huge_pages_min = uint64_t{16} << 20;
  size_t staging_size = size_t{64} << 20;  // bytes per read without mmap
  // Called after each tensor with (bytes loaded, bytes total); returning false cancels the load.
  std::function<bool(uint64_t, uint64_t)> progress;
};

// A loaded model's weights: tensors placed in buffers, per buffer type.
class model_weights {
 public:
  model_weights() = default;
  model_weights(model_weights&&) noexcept = default;
  model_weights& operator=(model_weights&&) noexcept = default;
  ~model_weights();

  // The weight `name` in buft's context (null: its primary one). Throws error when absent.
  tensor* get(const std::string& name, buffer_type_i* buft = nullptr) const;
  // As get, but null when the model has no such weight.
  tensor* find(const std::string& name, buffer_type_i* buft = nullptr) const;
  const placement& plan() const { return plan_; }
  // Bytes of weight buffers held per buffer type (the model memory of the breakdown: buffer sizes, as
  // llama.cpp counts it).
  std::map<buffer_type_i*, size_t> bytes_by_buft() const;
  const std::vector<buffer_ptr>& buffers() const { return buffers_; }
  // The buffer that contains [addr, addr + n), or null (lookup by address containment).
  buffer_i* buffer_containing(const void* addr, size_t n) const;
  // Adds (sign > 0) or removes (sign < 0) this model's weight bytes as "model" memory in the ledger.
  void account(memory_ledger& ledger, int sign = 1) const;
  // Bytes served in place from the mapping, and bytes copied into buffers.
  uint64_t mapped_bytes() const { return mapped_bytes_; }
  uint64_t copied_bytes() const { return copied_bytes_; }

 private:
  friend class model_loader;
  friend class load_job;
  placement plan_;
  std::map<buffer_type_i*, std::unique_ptr<context>> contexts_;
  std::vector<buffer_ptr> buffers_;
  std::vector<std::unique_ptr<mapped_file>> maps_;
  std::vector<std::unique_ptr<memory_lock>> locks_;
  uint64_t mapped_bytes_ = 0;
  uint64_t copied_bytes_ = 0;
};

class model_loader {
 public:
  explicit model_loader(const std::filesystem::path& path);

  const gguf_file& meta() const { return files_.metadata(); }
  const gguf_split_files& files() const { return files_; }
  const std::vector<gguf_tensor_info>& tensors() const { return files_.tensors(); }
  // The architecture name (general.architecture) and its block count ("<arch>.block_count", 0 if absent).
  std::string arch() const;
  int n_layer() const;

  placement plan(const placement_params& p) const { return plan_placement(tensors(), n_layer(), p); }
  // Loads every weight of the plan. Throws gguf_error/type_error for tensors troupe cannot use,
  // backend_error when a buffer cannot be allocated, load_cancelled when the progress callback says so.
  model_weights load(const placement& plan, const load_params& params = {}) const;
  // The same load in stages, one buffer type at a time (see load_job.h): for loading several devices at
  // once. The loader must outlive the job.
  load_job begin(const placement& plan, const load_params& params = {}) const;

 private:
  gguf_split_files files_;
};

}  // namespace troupe
