// What the actors of one runtime share inside their process: given to each actor when it is spawned,
// never sent in a message. Loaded models (so that a model's scheduler and sessions use the weights,
// vocabulary and chat template the loader produced), the backends device actors own (so that in-process
// pipeline jobs can be built over them) and the registry of in-process objects messages refer to by id.
#pragma once

#include <atomic>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "actors/local_registry.h"
#include "actors/messages.h"
#include "loader/load_job.h"
#include "runtime/backend.h"
#include "runtime/llm/chat_template.h"
#include "runtime/llm/model.h"
#include "runtime/llm/vocab.h"
#include "runtime/sched.h"

namespace troupe::actors {

// A model the loader actor has loaded: read-only once published, shared by its scheduler and sessions.
struct loaded_model {
  std::unique_ptr<llm::model> model;
  std::unique_ptr<llm::vocab> vocab;
  std::unique_ptr<llm::chat_template> chat;
  model_settings settings;  // as loaded, resolved (model_settings::resolved): its context's and sessions' sizes
  model_info info;
};

// A model load in progress: the opened model and its staged load job, shared by the loader actor (which
// creates it, finishes it and can cancel it) and the device actors (which upload their parts).
struct staged_load {
  std::string model;
  std::unique_ptr<llm::model> opened;  // weights pending until the job finishes
  std::unique_ptr<load_job> job;
  progress_listener progress;          // optional: (progress_atom, load_progress)
  std::atomic<uint64_t> reported{0};   // bytes loaded at the last progress message
};

// A micro-batch of an in-process pipeline job: a graph already placed by its own scheduler (so micro-batches
// have separate compute memory and may be in flight together).
struct pipeline_microbatch {
  scheduler* sched = nullptr;
  graph* g = nullptr;
};

// Micro-batches whose splits the scheduler actor dispatches to the device actors owning their backends;
// the caller owns the schedulers and graphs and keeps them alive until the reply.
struct pipeline_job {
  std::vector<pipeline_microbatch> microbatches;
};

// One split of a model context's decode graph, handed by the model's scheduler actor to the device actor
// that owns the split's device (decode_split{id, index}): the device actor runs `work` (copy the split's
// inputs in, compute, synchronize) on its own thread and keeps an exception for the scheduler to rethrow
// with its type (a full cache stays a capacity error). The scheduler waits for the answer, so `work` is
// valid while the task is registered.
struct split_task {
  const std::function<void()>* work = nullptr;
  std::string device;
  std::exception_ptr failure;
};

class runtime_env {
 public:
  local_registry objects;

  void put_model(const std::string& name, std::shared_ptr<const loaded_model> m) {
    std::lock_guard lock(mutex_);
    models_[name] = std::move(m);
  }
  std::shared_ptr<const loaded_model> model(const std::string& name) const {
    std::lock_guard lock(mutex_);
    const auto it = models_.find(name);
    return it == models_.end() ? nullptr : it->second;
  }
  std::shared_ptr<const loaded_model> take_model(const std::string& name) {
    std::lock_guard lock(mutex_);
    const auto it = models_.find(name);
    if (it == models_.end()) return nullptr;
    auto m = std::move(it->second);
    models_.erase(it);
    return m;
  }
  std::vector<std::string> model_names() const {
    std::lock_guard lock(mutex_);
    std::vector<std::string> out;
    for (const auto& [n, m] : models_) out.push_back(n);
    return out;
  }

  // The backend a device actor owns (computes only on that actor's thread), or null.
  void set_backend(const std::string& device, backend_i* b) {
    std::lock_guard lock(mutex_);
    if (b == nullptr) {
      backends_.erase(device);
    } else {
      backends_[device] = b;
    }
  }
  backend_i* backend(const std::string& device) const {
    std::lock_guard lock(mutex_);
    const auto it = backends_.find(device);
    return it == backends_.end() ? nullptr : it->second;
  }

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const loaded_model>> models_;
  std::map<std::string, backend_i*> backends_;
};

using runtime_env_ptr = std::shared_ptr<runtime_env>;

}  // namespace troupe::actors
