// The Vulkan device the Vulkan tests run on: the first one, or null after a WARN (a FAIL under CI=true,
// where scripts/install-deps installs lavapipe).
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string_view>

#include "backends/vulkan/vulkan_device.h"

namespace troupe::test {

inline vulkan::device* first_vulkan_device() {
  const auto devs = vulkan::devices();
  if (!devs.empty()) return devs[0];
  const char* ci = std::getenv("CI");
  if (ci != nullptr && std::string_view(ci) == "true") {
    FAIL("no Vulkan device under CI (scripts/install-deps installs lavapipe): " << vulkan::status());
  }
  WARN("skipped: no Vulkan device (" << vulkan::status() << ")");
  return nullptr;
}

}  // namespace troupe::test
