// The real GGUF models in ../shared/models, for tests that need one.
//
//   TEST_CASE("...") {
//     const auto path = troupe::test::model_path("stories260K.gguf");
//     if (!path) return;  // skipped (WARN printed); with CI=true the test has already failed
//     ...
//   }
//
// The folder is passed at compile time as TROUPE_TEST_MODEL_DIR (tests/CMakeLists.txt:
// troupe_test_models(<target>)), as is TROUPE_FETCHED_MODEL_DIR, the project's models/ folder that
// scripts/fetch-model fills (test::smollm2_path()). When a model is missing, a test is skipped with a
// warning on a developer's machine, but fails when the environment variable CI is "true": CI must run every
// test.
#pragma once

#include <catch2/catch.hpp>

#include "tests/support/skip.h"

#include <cstdlib>
#include <filesystem>
#include <optional>
#include <string>
#include <string_view>

#ifndef TROUPE_TEST_MODEL_DIR
#error "TROUPE_TEST_MODEL_DIR is not defined: call troupe_test_models(<target>) in tests/CMakeLists.txt"
#endif

namespace troupe::test {

inline std::filesystem::path model_dir() { return TROUPE_TEST_MODEL_DIR; }

// The path of a test model, or empty (after a WARN, or a FAIL under CI=true) when it is absent.
inline std::optional<std::filesystem::path> model_path(std::string_view file) {
  std::filesystem::path p = model_dir() / file;
  std::error_code ec;
  if (std::filesystem::is_regular_file(p, ec)) return p;
  skip_unless_ci("test model " + p.string() + " is missing; this test needs ../shared/models next to the project");
  return std::nullopt;
}

#ifdef TROUPE_FETCHED_MODEL_DIR
// Models that scripts/fetch-model downloads into the project's models/ folder (not committed).
inline std::filesystem::path fetched_model_dir() { return TROUPE_FETCHED_MODEL_DIR; }

// The path of a fetched model, or empty (after a WARN, or a FAIL under CI=true, where CI runs
// scripts/fetch-model first) when it is absent.
inline std::optional<std::filesystem::path> fetched_model_path(std::string_view file) {
  std::filesystem::path p = fetched_model_dir() / file;
  std::error_code ec;
  if (std::filesystem::is_regular_file(p, ec)) return p;
  skip_unless_ci("fetched model " + p.string() + " is missing; run scripts/fetch-model to download it");
  return std::nullopt;
}

// SmolLM2-135M-Instruct (Q4_1; GPT-2 byte-level BPE, pre-tokenizer "smollm", ChatML template): the default
// chat model.
inline std::optional<std::filesystem::path> smollm2_path() {
  return fetched_model_path("SmolLM2-135M-Instruct.Q4_1.gguf");
}
#endif

}  // namespace troupe::test
