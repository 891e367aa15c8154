// The Vulkan device the Vulkan tests run on: the first one, or null after a skip (test::skip_unless_ci: ctest
// reports the case Skipped; a FAIL under CI=true, where scripts/install-deps installs lavapipe).
#pragma once

#include <catch2/catch.hpp>

#include "backends/vulkan/vulkan_device.h"
#include "tests/support/skip.h"

namespace troupe::test {

inline vulkan::device* first_vulkan_device() {
  const auto devs = vulkan::devices();
  if (!devs.empty()) return devs[0];
  skip_unless_ci("no Vulkan device (" + vulkan::status() + "); scripts/install-deps installs lavapipe");
  return nullptr;
}

}  // namespace troupe::test
