// The trace of a prompt pipelined onto a device whose graphs queue (a remote peer, Vulkan): the next
// micro-batch's graph went out ("submit" on the transfers track) before the device's first split (the first
// micro-batch it computed) ended.
#pragma once

#include <catch2/catch.hpp>

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "runtime/trace.h"

namespace troupe::test {

inline void check_next_submitted_before_first_split_ended(const std::vector<trace::event>& ev, std::string_view device) {
  const auto find = [&](std::string_view track, std::string_view name, int64_t ub) {
    return std::find_if(ev.begin(), ev.end(), [&](const trace::event& e) {
      return e.track == track && e.name == name &&
             std::find(e.args.begin(), e.args.end(), std::pair<std::string, int64_t>("ubatch", ub)) != e.args.end();
    });
  };
  const auto first = std::find_if(ev.begin(), ev.end(), [&](const trace::event& e) { return e.track == device && e.name == "split"; });
  REQUIRE(first != ev.end());
  int64_t ub0 = -1;
  for (const auto& [k, v] : first->args) {
    if (k == "ubatch") ub0 = v;
  }
  const auto split0 = find(device, "split", ub0);
  const auto sent1 = find("transfers", "submit", ub0 + 1);
  REQUIRE(split0 != ev.end());
  REQUIRE(sent1 != ev.end());
  CHECK(sent1->begin_us < split0->begin_us + split0->dur_us);
}

}  // namespace troupe::test
