// In-process objects that messages refer to by id: a staged load job, a decode split task, a graph. The
// objects never cross a process boundary; their ids do (as uint64_t fields of messages), and in another
// process an id finds nothing, so the request fails with errc::not_found instead of touching memory.
//
//   auto task = std::make_shared<split_task>();
//   const uint64_t id = env.objects.put(task);                        // any shared_ptr<T>
//   std::shared_ptr<split_task> t = env.objects.get<split_task>(id);  // null: absent or another type
//   env.objects.erase(id);
//
// Thread-safe: the actors that use one registry run on different threads.
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <typeindex>
#include <unordered_map>

namespace troupe::actors {

class local_registry {
 public:
  template <class T>
  uint64_t put(std::shared_ptr<T> obj) {
    std::lock_guard lock(mutex_);
    const uint64_t id = next_++;
    entries_[id] = entry{std::type_index(typeid(T)), std::move(obj)};
    return id;
  }
  template <class T>
  std::shared_ptr<T> get(uint64_t id) const {
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(id);
    if (it == entries_.end() || it->second.type != std::type_index(typeid(T))) return nullptr;
    return std::static_pointer_cast<T>(it->second.obj);
  }
  void erase(uint64_t id) {
    std::shared_ptr<void> keep;  // destroyed outside the lock
    std::lock_guard lock(mutex_);
    const auto it = entries_.find(id);
    if (it == entries_.end()) return;
    keep = std::move(it->second.obj);
    entries_.erase(it);
  }
  size_t size() const {
    std::lock_guard lock(mutex_);
    return entries_.size();
  }

 private:
  struct entry {
    std::type_index type = std::type_index(typeid(void));
    std::shared_ptr<void> obj;
  };
  mutable std::mutex mutex_;
  std::unordered_map<uint64_t, entry> entries_;
  uint64_t next_ = 1;
};

}  // namespace troupe::actors
