// Loading a model's weights in stages, one buffer type (device) at a time, so that a caller can load
// several devices at once: the actor layer's loader hands each device actor its own upload.
//
//   model_loader loader(path);
//   load_job job = loader.begin(plan, {.use_mmap = true});   // validates, builds contexts, maps the files
//   for (buffer_type_i* b : job.targets())                   // device buffer types first, then host ones
//     pool.run([&job, b] { job.upload(b); });                // concurrently: different b touch nothing shared
//   model_weights w = job.finish();                          // after every upload; releases copied pages
//
// upload(b) does for one buffer type what model_loader::load does for all: one buffer per file range over
// the mapping when b's device can wrap host memory, otherwise buffers of b (at most max_size each) and the
// bytes copied in from the mapping or read with pread. cancel() makes every running and later upload throw
// load_cancelled at its next tensor (or staging chunk). A failed or cancelled job cannot be finished; its
// destructor frees whatever was allocated.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "loader/placement.h"
#include "runtime/backend.h"

namespace troupe {

class model_loader;
class model_weights;
struct load_params;

class load_job {
 public:
  // (bytes loaded by the whole job so far, bytes the whole job loads); returning false cancels the job.
  using progress_fn = std::function<bool(uint64_t, uint64_t)>;

  // Refuses tensor types troupe cannot use (type_error naming the tensor) before anything is read. The
  // loader must outlive the job; params.progress is not used (upload takes its own).
  load_job(const model_loader& loader, const placement& plan, const load_params& params);
  ~load_job();
  load_job(load_job&&) noexcept;
  load_job& operator=(load_job&&) noexcept;
  load_job(const load_job&) = delete;
  load_job& operator=(const load_job&) = delete;

  // Buffer types that receive weights: non-host ones first, in the plan's order.
  const std::vector<buffer_type_i*>& targets() const;
  // Bytes of weights loaded into b (0 for a buffer type that is not a target).
  uint64_t bytes(const buffer_type_i* b) const;
  uint64_t total_bytes() const;
  // Bytes loaded so far over every upload (safe to read from any thread).
  uint64_t done_bytes() const;

  // Allocates b's buffers and loads its weights. Thread-safe for distinct b; each target once. Throws
  // backend_error (allocation), error (I/O, naming the file), load_cancelled.
  void upload(buffer_type_i* b, const progress_fn& progress = {});
  // Whether upload(b) has completed.
  bool uploaded(const buffer_type_i* b) const;
  // Makes running and later uploads throw load_cancelled (safe from any thread).
  void cancel();
  bool cancelled() const;

  // The weights, once every target is uploaded (throws error naming a missing one otherwise). Pages of
  // the mapping that only copied contexts read are released.
  model_weights finish();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

}  // namespace troupe
