// pointer_map against std::unordered_map: the same contents after random inserts, lookups and clears,
// iteration over every entry, and references that stay valid up to the reserved size.
#include <catch2/catch.hpp>

#include <map>
#include <random>
#include <unordered_map>
#include <vector>

#include "runtime/pointer_map.h"

using troupe::pointer_map;

TEST_CASE("pointer_map holds what std::unordered_map holds, across clears and growth", "[runtime][pointer_map]") {
  std::vector<int> objects(5000);
  std::mt19937 rng(7);
  pointer_map<const int*, int> m;
  for (int round = 0; round < 4; ++round) {
    std::unordered_map<const int*, int> ref;
    const size_t n = 100 + static_cast<size_t>(round) * 1500;  // grows past its slots, then is cleared
    for (size_t i = 0; i < 3 * n; ++i) {
      const int* k = &objects[rng() % n];
      const int v = static_cast<int>(rng() % 1000);
      m[k] += v;
      ref[k] += v;
    }
    REQUIRE(m.size() == ref.size());
    for (const auto& [k, v] : ref) {
      REQUIRE(m.count(k) == 1);
      REQUIRE(m.at(k) == v);
    }
    for (size_t i = n; i < n + 50 && i < objects.size(); ++i) CHECK(m.find(&objects[i]) == m.end());
    std::map<const int*, int> seen;
    for (auto& [k, v] : m) seen[k] = v;
    CHECK(seen == std::map<const int*, int>(ref.begin(), ref.end()));
    m.clear();
    CHECK(m.empty());
    CHECK(m.find(&objects[0]) == m.end());
  }
}

TEST_CASE("pointer_map: references stay valid up to the reserved size", "[runtime][pointer_map]") {
  std::vector<int> objects(1000);
  pointer_map<const int*, int> m;
  m.reserve(objects.size());
  int& first = m[&objects[0]];
  first = 42;
  for (size_t i = 1; i < objects.size(); ++i) m[&objects[i]] = static_cast<int>(i);
  CHECK(first == 42);
  CHECK(&first == &m.find(&objects[0])->second);
  CHECK(m.size() == objects.size());
}

TEST_CASE("pointer_map: erase keeps every other entry findable", "[runtime][pointer_map]") {
  std::vector<int> objects(3000);
  std::mt19937 rng(11);
  pointer_map<const int*, int> m;
  std::unordered_map<const int*, int> ref;
  for (int i = 0; i < 40000; ++i) {
    const int* k = &objects[rng() % objects.size()];
    if (rng() % 3 == 0) {
      CHECK(m.erase(k) == ref.erase(k));
    } else {
      m[k] = i;
      ref[k] = i;
    }
  }
  REQUIRE(m.size() == ref.size());
  for (const int& o : objects) {
    const auto it = ref.find(&o);
    if (it == ref.end()) {
      REQUIRE(m.find(&o) == m.end());
    } else {
      REQUIRE(m.at(&o) == it->second);
    }
  }
}
