// Pipelined prompts in the actor runtime: a model split over CPU and CPU1 decodes a long prompt's
// micro-batches through the two device actors at once (llm_context's pipeline handing each split to its
// device actor); the answer is the same as with one micro-batch per prompt, the pipeline slots' compute
// memory is in the breakdown while the model is loaded and gone after it is unloaded.
#include <catch2/catch.hpp>

#include <algorithm>
#include <set>

#include "actors/runtime.h"
#include "backends/cpu_instance.h"
#include "runtime/trace.h"
#include "tests/test_models.h"

using namespace troupe;

namespace {

const char* const prompt =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the sunshine. One day, "
    "she saw a big red ball in the park. She ran to the ball and kicked it very hard. The ball went up";

std::vector<int32_t> answer(engine& eng, const std::string& model) {
  session s = eng.open_session(model);
  actors::generation_params gp;
  gp.max_tokens = 12;
  gp.temperature = 0;
  const auto r = s.generate(prompt, gp);
  s.close();
  return r.tokens;
}

uint64_t compute_on(const actors::memory_breakdown& mb, const std::string& device) {
  uint64_t n = 0;
  for (const actors::buft_usage& u : mb.entries) n += u.device == device ? u.compute : 0;
  return n;
}

}  // namespace

TEST_CASE("the actor runtime pipelines a long prompt over CPU and CPU1: the same answer, its compute memory accounted", "[actors][pipeline]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  engine eng({.cpu_instances = 1, .n_threads = 1});
  actors::model_settings one{.n_ctx = 256, .n_ubatch = 512, .n_seq_max = 1, .n_threads = 1};
  one.devices = {{"CPU1", 3}};
  actors::model_settings piped = one;
  piped.n_ubatch = 8;  // the prompt in several micro-batches
  eng.load_model("one", path->string(), one);
  eng.load_model("piped", path->string(), piped);
  const auto ref = answer(eng, "one");
  const uint64_t before = compute_on(eng.memory(), "CPU1");
  trace::clear();
  trace::enable(true);
  const auto got = answer(eng, "piped");
  trace::enable(false);
  CHECK(got == ref);
  REQUIRE(ref.size() == 12);
  // The prompt's micro-batches ran their CPU1 splits on the CPU1 device actor, several micro-batches.
  std::set<int64_t> ubatches;
  for (const trace::event& e : trace::events()) {
    if (e.track == "CPU1" && e.name == "split") ubatches.insert(e.args.at(0).second);
  }
  trace::clear();
  CHECK(ubatches.size() > 12 + 4);  // the prompt's micro-batches and then one per generated token
  // Three more pipeline slots of compute memory on CPU1 (and the CPU) while "piped" is loaded.
  const uint64_t during = compute_on(eng.memory(), "CPU1");
  CHECK(during > before);
  eng.unload_model("piped");
  eng.unload_model("one");
  CHECK(compute_on(eng.memory(), "CPU1") == 0);
}
