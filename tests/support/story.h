// The perplexity text of the model tests (tests/data/story.txt) and SmolLM2-style perplexity over it, with the
// layers placed as given; for the device tests that compare a device's perplexity with the CPU's.
//
//   const double cpu = test::story_ppl(path, {});
//   const double gpu = test::story_ppl(path, {.devices = {{d, 99}}});
#pragma once

#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "llm/llm_context.h"
#include "llm/perplexity.h"
#include "llm/vocab.h"

namespace troupe::test {

inline std::string story() {
  std::ifstream in(std::string(TROUPE_TEST_DATA_DIR) + "/story.txt");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

inline double story_ppl(const std::filesystem::path& path, const llm::model_params& mp) {
  auto m = llm::model::load(path, mp);
  llm::vocab v(m->meta());
  llm::llm_context ctx(*m, {.n_ctx = 128, .n_batch = 128, .n_threads = 2});
  return llm::perplexity(ctx, v, v.tokenize(story(), true), 128).ppl;
}

}  // namespace troupe::test
