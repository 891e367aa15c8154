// Skipping a test case so that ctest says so.
//
//   if (!path) return test::skip_unless_ci("test model " + p + " is missing");  // a failure under CI=true
//   if (dev == nullptr) return test::skip_gpu("no CUDA device (" + why + ")");  // a failure under TROUPE_REQUIRE_GPU=1
//
// A skip prints "SKIPPED: <reason>". tests/CMakeLists.txt registers every Catch2 case with
// SKIP_REGULAR_EXPRESSION "SKIPPED:", so ctest reports the case as Skipped (not Passed) and its summary lists it
// by name. CI (CI=true) must run every test that does not need hardware: there a missing model or program is a
// failure, not a skip. The GPU machine's script (scripts/cuda-check) sets TROUPE_REQUIRE_GPU=1, where a case
// that finds no GPU fails.
#pragma once

#include <catch2/catch.hpp>

#include <cstdlib>
#include <string>
#include <string_view>

namespace troupe::test {

inline bool env_is(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && std::string_view(v) == value;
}

inline bool in_ci() { return env_is("CI", "true"); }

// Skips the case, whatever the machine.
inline void skip(const std::string& reason) { WARN("SKIPPED: " << reason); }

// Skips the case on a developer's machine; fails it under CI=true.
inline void skip_unless_ci(const std::string& reason) {
  if (in_ci()) FAIL(reason << " (CI=true: CI runs every test, so this is a failure)");
  skip(reason);
}

// Skips a case that needs a GPU the machine does not have; fails it under TROUPE_REQUIRE_GPU=1.
inline void skip_gpu(const std::string& reason) {
  if (env_is("TROUPE_REQUIRE_GPU", "1")) FAIL("TROUPE_REQUIRE_GPU=1 but " << reason);
  skip(reason);
}

}  // namespace troupe::test
