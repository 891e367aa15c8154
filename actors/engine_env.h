// What the actors of one runtime share inside their process: given to each actor when it is spawned,
// never sent in a message. Loaded models (so that a model's scheduler and sessions use the weights,
// vocabulary and chat template the loader produced) and the registry of in-process objects messages refer
// to by id (staged loads, decode split tasks, graphs).
#pragma once

#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "actors/local_registry.h"
#include "actors/messages.h"
#include "loader/load_job.h"
#include "runtime/backend.h"
#include "llm/chat_prompt.h"
#include "llm/model.h"
#include "llm/vocab.h"
#include "runtime/sched.h"

namespace troupe::actors {

// A model the loader actor has loaded: read-only once published, shared by its scheduler and sessions.
struct loaded_model {
  std::unique_ptr<llm::model> model;
  std::unique_ptr<llm::vocab> vocab;
  std::unique_ptr<llm::chat_prompt> chat;  // the model's own chat template (or a family)
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

// One split of a model context's decode graph, run on the thread of the device actor that owns the split's
// device: the context's pipeline thread registers it, hands it to the model's decoder actor
// (decode_split{id, index}), which hands it on to the device actor, and waits here. The device actor runs
// `work` (copy the split's inputs in, compute, synchronize), keeps an exception for the pipeline thread to
// rethrow with its type (a full cache stays a capacity error) and settles the task itself; a handover that
// fails (no device actor, one that is gone, a scheduler that terminated) settles it without running it.
// `work` is valid until the task is settled.
struct split_task {
  const std::function<void()>* work = nullptr;
  std::string device;
  std::exception_ptr failure;

  // The device actor, before running work: false when the task was settled already (do not run it).
  bool begin() {
    std::lock_guard lock(mu_);
    if (settled_) return false;
    started_ = true;
    return true;
  }
  // The device actor, after running work.
  void finish() { settle({}, false); }
  // The handover failed (ignored once the device actor has begun); run_here: no device actor, the
  // waiting thread runs work itself.
  void fail(std::string why) { settle(std::move(why), false, true); }
  void run_here() { settle({}, true, true); }
  // The pipeline thread: waits until settled; returns the handover's failure ("" when none) and whether
  // to run work itself.
  std::pair<std::string, bool> wait() {
    std::unique_lock lock(mu_);
    cv_.wait(lock, [this] { return settled_; });
    return {handover_error_, run_here_};
  }

 private:
  void settle(std::string why, bool here, bool only_unstarted = false) {
    {
      std::lock_guard lock(mu_);
      if (settled_ || (only_unstarted && started_)) return;
      settled_ = true;
      handover_error_ = std::move(why);
      run_here_ = here;
    }
    cv_.notify_all();
  }
  std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false, settled_ = false, run_here_ = false;
  std::string handover_error_;
};

class engine_env {
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

 private:
  mutable std::mutex mutex_;
  std::map<std::string, std::shared_ptr<const loaded_model>> models_;
};

using engine_env_ptr = std::shared_ptr<engine_env>;

}  // namespace troupe::actors
