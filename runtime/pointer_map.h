// A hash map from pointers to values with open addressing (linear probing) in one array: no allocation per
// entry, and clear() keeps the array, so maps refilled for every graph (the allocator's plan, the
// scheduler's assignment) cost no malloc/free per node after the first graph. Keys are never null (null
// marks an empty slot). Iteration order is the slots' order. Unlike std::unordered_map, growing moves the
// entries: a reference from operator[] is valid until the next insertion that grows it (reserve first).
//
//   pointer_map<const tensor*, int> m;
//   m[t] = 3;  if (auto it = m.find(t); it != m.end()) use(it->second);
//   for (auto& [t, v] : m) ...;   m.clear();
#pragma once

#include <cassert>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <type_traits>
#include <utility>
#include <vector>

namespace troupe {

template <class K, class V>
class pointer_map {
  static_assert(std::is_pointer_v<K>, "pointer_map: keys are pointers");
  using slot = std::pair<K, V>;

  template <class S>
  class iter {
   public:
    using iterator_category = std::forward_iterator_tag;
    using value_type = slot;
    using difference_type = std::ptrdiff_t;
    using pointer = S*;
    using reference = S&;
    iter() = default;
    iter(S* at, S* end) : at_(at), end_(end) { skip(); }
    reference operator*() const { return *at_; }
    pointer operator->() const { return at_; }
    iter& operator++() {
      ++at_;
      skip();
      return *this;
    }
    iter operator++(int) {
      iter t = *this;
      ++*this;
      return t;
    }
    friend bool operator==(const iter& a, const iter& b) { return a.at_ == b.at_; }
    friend bool operator!=(const iter& a, const iter& b) { return a.at_ != b.at_; }

   private:
    void skip() {
      while (at_ != end_ && at_->first == nullptr) ++at_;
    }
    S* at_ = nullptr;
    S* end_ = nullptr;
  };

 public:
  using iterator = iter<slot>;
  using const_iterator = iter<const slot>;

  V& operator[](K k) {
    assert(k != nullptr);
    if ((n_ + 1) * 4 > slots_.size() * 3) grow();
    slot& s = slots_[probe(k)];
    if (s.first == nullptr) {
      s.first = k;
      ++n_;
    }
    return s.second;
  }
  iterator find(K k) {
    if (n_ == 0) return end();
    slot* s = &slots_[probe(k)];
    return s->first == nullptr ? end() : iterator(s, slots_.data() + slots_.size());
  }
  const_iterator find(K k) const {
    if (n_ == 0) return end();
    const slot* s = &slots_[probe(k)];
    return s->first == nullptr ? end() : const_iterator(s, slots_.data() + slots_.size());
  }
  size_t count(K k) const { return find(k) == end() ? 0 : 1; }
  // The value of k, which must be there (an internal invariant of the caller).
  const V& at(K k) const {
    const auto it = find(k);
    assert(it != end());
    return it->second;
  }
  // Removes k (backward-shift deletion: the entries after it in its probe run move up). Returns 1 when it
  // was there.
  size_t erase(K k) {
    if (n_ == 0) return 0;
    const size_t mask = slots_.size() - 1;
    size_t i = probe(k);
    if (slots_[i].first == nullptr) return 0;
    for (size_t j = (i + 1) & mask; slots_[j].first != nullptr; j = (j + 1) & mask) {
      const size_t home = (hash(slots_[j].first) >> 16) & mask;
      // The entry at j may fill the hole at i unless its home lies cyclically in (i, j].
      const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
      if (stays) continue;
      slots_[i] = std::move(slots_[j]);
      i = j;
    }
    slots_[i] = slot{};
    --n_;
    return 1;
  }
  // Empties the map, keeping its slots (values are reset when their slot is used again).
  void clear() {
    if (n_ == 0) return;
    for (slot& s : slots_) s = slot{};
    n_ = 0;
  }
  // Room for n entries without growing: references from operator[] stay valid while the map holds at most
  // n (growing moves every entry).
  void reserve(size_t n) {
    size_t cap = slots_.empty() ? 64 : slots_.size();
    while (n * 4 > cap * 3) cap *= 2;
    if (cap > slots_.size()) {
      while (slots_.size() < cap) grow();
    }
  }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

  iterator begin() { return iterator(slots_.data(), slots_.data() + slots_.size()); }
  iterator end() { return iterator(slots_.data() + slots_.size(), slots_.data() + slots_.size()); }
  const_iterator begin() const { return const_iterator(slots_.data(), slots_.data() + slots_.size()); }
  const_iterator end() const { return const_iterator(slots_.data() + slots_.size(), slots_.data() + slots_.size()); }

 private:
  static size_t hash(K k) {
    // Pointers are aligned: mix the high bits down (Fibonacci hashing).
    return static_cast<size_t>((reinterpret_cast<uintptr_t>(k) >> 4) * 0x9E3779B97F4A7C15ull);
  }
  // The slot holding k, or the empty slot where it would go. The table is never full.
  size_t probe(K k) const {
    const size_t mask = slots_.size() - 1;
    size_t i = (hash(k) >> 16) & mask;
    while (slots_[i].first != nullptr && slots_[i].first != k) i = (i + 1) & mask;
    return i;
  }
  void grow() {
    std::vector<slot> old;
    old.swap(slots_);
    slots_.resize(old.empty() ? 64 : old.size() * 2);
    n_ = 0;
    for (slot& s : old) {
      if (s.first == nullptr) continue;
      slot& t = slots_[probe(s.first)];
      t.first = s.first;
      t.second = std::move(s.second);
      ++n_;
    }
  }

  std::vector<slot> slots_;
  size_t n_ = 0;
};

}  // namespace troupe
