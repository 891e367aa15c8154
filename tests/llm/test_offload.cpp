// llama.cpp's offload flags as layers per device (llm/offload.h): -ngl, --device lists shared
// evenly, and --tensor-split proportions.
#include <catch2/catch.hpp>

#include "backends/cpu_instance.h"
#include "backends/registry.h"
#include "runtime/error.h"
#include "llm/offload.h"
#include "tests/test_models.h"

#include <cstdlib>

using namespace troupe;
using layers = std::vector<std::pair<std::string, int>>;

TEST_CASE("offload: --device shares the layers and the output evenly, --tensor-split in proportion", "[llm][offload]") {
  register_builtin_backends();
  if (registry::instance().find("CPU1") == nullptr) add_cpu_instance({.index = 1, .n_threads = 1});
  // 30 layers and the output: 31 to place.
  CHECK(llm::offload_layers({.devices = {"CPU", "CPU1"}}, 30) == layers{{"CPU", 15}, {"CPU1", 16}});
  CHECK(llm::offload_layers({.devices = {"CPU", "CPU1"}, .tensor_split = {1, 1}}, 30) == layers{{"CPU", 15}, {"CPU1", 16}});
  CHECK(llm::offload_layers({.devices = {"CPU", "CPU1"}, .tensor_split = {19, 12}}, 30) == layers{{"CPU", 19}, {"CPU1", 12}});
  CHECK(llm::offload_layers({.devices = {"CPU", "CPU1"}, .tensor_split = {3, 1}}, 30) == layers{{"CPU", 23}, {"CPU1", 8}});
  CHECK(llm::offload_layers({.devices = {"CPU", "CPU1"}, .tensor_split = {0, 1}}, 30) == layers{{"CPU1", 31}});
  // With -ngl N the devices share the last N.
  CHECK(llm::offload_layers({.n_gpu_layers = 10, .devices = {"CPU", "CPU1"}, .tensor_split = {4, 1}}, 30) ==
        layers{{"CPU", 8}, {"CPU1", 2}});
  CHECK_THROWS_WITH(llm::offload_layers({.devices = {"CPU", "CPU1"}, .tensor_split = {1}}, 30),
                    Catch::Contains("1 proportions for 2 devices"));
  CHECK_THROWS_WITH(llm::offload_layers({.devices = {"CPU", "CPU1"}, .tensor_split = {0, 0}}, 30),
                    Catch::Contains("add up to 0"));
  CHECK_THROWS_WITH(llm::offload_layers({.devices = {"CPU", "CPU1"}, .tensor_split = {-1, 2}}, 30),
                    Catch::Contains("of CPU is not a number >= 0"));
  CHECK_THROWS_WITH(llm::offload_layers({.n_gpu_layers = 99, .tensor_split = {1}}, 30), Catch::Contains("needs --device"));
  CHECK_THROWS_WITH(llm::offload_layers({.tensor_split = {1, 1}}, 30), Catch::Contains("needs --device"));
}

TEST_CASE("offload: -ngl auto places every layer by free memory over the devices", "[llm][offload][fit]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  register_builtin_backends();
  if (registry::instance().find("CPU1") == nullptr) add_cpu_instance({.index = 1, .n_threads = 1});
  // CPU and CPU1 share the host's free memory: about half each, every layer and the output placed.
  const layers l = llm::offload_layers({.devices = {"CPU", "CPU1"}, .fit = true, .fit_ctx = 256}, path->string());
  REQUIRE(l.size() == 2);
  CHECK(l[0].first == "CPU");
  CHECK(l[1].first == "CPU1");
  CHECK(l[0].second + l[1].second == 6);  // stories260K: 5 layers and the output
  CHECK(std::abs(l[0].second - l[1].second) <= 1);
  CHECK_THROWS_WITH(llm::offload_layers({.n_gpu_layers = 3, .fit = true}, path->string()),
                    Catch::Contains("neither a layer count nor --tensor-split"));
  CHECK_THROWS_WITH(llm::offload_layers({.fit = true}, 30), Catch::Contains("needs the model's file"));
}
