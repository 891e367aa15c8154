// Placing a model by memory (llm/fit.h): contiguous layer ranges in proportion to free memory,
// never past a device's room, a clear shortfall when it cannot fit, and the costs read from real GGUF files.
#include <catch2/catch.hpp>

#include <numeric>

#include "llm/fit.h"
#include "llm/model.h"
#include "tests/test_models.h"

using namespace troupe;
using namespace troupe::llm;

namespace {

constexpr uint64_t mib = uint64_t{1} << 20;

layer_costs uniform(int n_layer, uint64_t weights, uint64_t kv, uint64_t output, uint64_t compute) {
  layer_costs c;
  c.weights.assign(static_cast<size_t>(n_layer), weights);
  c.kv.assign(static_cast<size_t>(n_layer), kv);
  c.output = output;
  c.compute = compute;
  return c;
}

int total_layers(const fit_plan& p) {
  int n = 0;
  for (const auto& [name, k] : p.layers) n += k;
  return n;
}

}  // namespace

TEST_CASE("fit: layers in proportion to free memory, contiguous, the output with the last", "[llm][fit]") {
  // 30 layers of 9 + 1 MiB, a 40 MiB output, 20 MiB compute; devices with 2:1 usable memory.
  const layer_costs c = uniform(30, 9 * mib, 1 * mib, 40 * mib, 20 * mib);
  const uint64_t margin = 100 * mib;
  const fit_plan p = fit_layers(c, {{"A", 600 * mib + margin + 20 * mib}, {"B", 300 * mib + margin + 20 * mib}}, margin);
  REQUIRE(p.layers.size() == 2);
  CHECK(p.layers[0].first == "A");
  CHECK(p.layers[1].first == "B");
  CHECK(total_layers(p) == 31);  // every layer and the output
  // A's share is 2/3 of 340 MiB = 226.7: 23 layers (230 MiB, the nearest whole layer); B the other 7 and the
  // output (110 MiB); each with its compute.
  CHECK(p.layers[0].second == 23);
  CHECK(p.layers[1].second == 8);
  CHECK(p.bytes[0] == 230 * mib + 20 * mib);
  CHECK(p.bytes[1] == 70 * mib + 40 * mib + 20 * mib);
}

TEST_CASE("fit: a device never gets more than its room, one with no room is left out", "[llm][fit]") {
  const layer_costs c = uniform(10, 10 * mib, 0, 10 * mib, 0);
  // Usable 30, 1000 and 5 MiB (margin 0): the proportions would give the first 3, the last nothing.
  const fit_plan p = fit_layers(c, {{"small", 30 * mib}, {"big", 1000 * mib}, {"tiny", 5 * mib}}, 0);
  REQUIRE(p.layers.size() == 1);
  CHECK(p.layers[0] == std::pair<std::string, int>("big", 11));
  // Proportions that round a device past its room fall back to filling each to its room.
  const fit_plan q = fit_layers(c, {{"A", 65 * mib}, {"B", 50 * mib}}, 0);
  REQUIRE(q.layers.size() == 2);
  CHECK(q.bytes[0] <= 65 * mib);
  CHECK(q.bytes[1] <= 50 * mib);
  CHECK(total_layers(q) == 11);
}

TEST_CASE("fit: a model that does not fit is refused with what it needs and the shortfall", "[llm][fit]") {
  const layer_costs c = uniform(4, 100 * mib, 28 * mib, 64 * mib, 32 * mib);
  try {
    fit_layers(c, {{"A", 300 * mib}, {"B", 200 * mib}}, 64 * mib);
    FAIL("no error");
  } catch (const error& e) {
    const std::string m = e.what();
    CHECK_THAT(m, Catch::Contains("needs 576.0 MiB for its layers (weights 464.0 MiB, KV cache 112.0 MiB)"));
    CHECK_THAT(m, Catch::Contains("plus 32.0 MiB of compute per device"));
    CHECK_THAT(m, Catch::Contains("have 500.0 MiB free, 308.0 MiB after a margin of 64.0 MiB each: short by 268.0 MiB"));
  }
  CHECK_THROWS_WITH(fit_layers(c, {}, 0), Catch::Contains("no device"));
}

TEST_CASE("fit: the costs of stories260K and SmolLM2 from their GGUF files", "[llm][fit]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  auto m = model::open(*path);
  const layer_costs c = estimate_costs(*m, {.n_ctx = 256, .n_ubatch = 64, .kv_type = type::f16});
  REQUIRE(c.weights.size() == m->hp().n_layer);
  uint64_t in_layers = 0, embd = 0, norm = 0, output = 0;
  for (const gguf_tensor_info& t : m->meta().tensors()) {
    if (t.name.rfind("blk.", 0) == 0) in_layers += t.n_bytes;
    if (t.name == "token_embd.weight") embd = t.n_bytes;
    if (t.name == "output_norm.weight") norm = t.n_bytes;
    if (t.name == "output.weight") output = t.n_bytes;
  }
  CHECK(std::accumulate(c.weights.begin(), c.weights.end(), uint64_t{0}) == in_layers);
  // KV: 256 cells of K and V rows (n_embd_k_gqa, n_embd_v_gqa values) in f16, per layer.
  const auto& hp = m->hp();
  CHECK(c.kv[0] == 256 * 2 * (uint64_t{hp.n_embd_k_gqa()} + hp.n_embd_v_gqa()));
  // stories260K has an output matrix of its own; the embedding stays in host memory.
  REQUIRE(output > 0);
  CHECK(c.output == output + norm);
  CHECK(c.host == embd);
  // All of it on two devices with room to spare: every layer and the output, in two contiguous ranges.
  const fit_plan p = fit_layers(c, {{"A", 1024 * mib}, {"B", 1024 * mib}}, 512 * mib);
  REQUIRE(p.layers.size() == 2);
  CHECK(total_layers(p) == static_cast<int>(hp.n_layer) + 1);

  const auto smol = test::smollm2_path();
  if (!smol) return;
  auto s = model::open(*smol);
  const layer_costs sc = estimate_costs(*s, {.n_ctx = 4096, .n_ubatch = 512, .kv_type = type::f16});
  // SmolLM2-135M: 30 layers, 3 KV heads of 64: 4096 cells * 2 * 192 * 2 bytes = 3 MiB of KV per layer.
  CHECK(sc.weights.size() == 30);
  CHECK(sc.kv[0] == 4096u * 2 * 192 * 2);
  // It ties its output to the token embedding: the output layer's device holds a copy of it.
  uint64_t s_embd = 0, s_norm = 0;
  bool s_output = false;
  for (const gguf_tensor_info& t : s->meta().tensors()) {
    if (t.name == "token_embd.weight") s_embd = t.n_bytes;
    if (t.name == "output_norm.weight") s_norm = t.n_bytes;
    s_output = s_output || t.name == "output.weight";
  }
  REQUIRE_FALSE(s_output);
  CHECK(sc.output == s_embd + s_norm);
  const fit_plan sp = fit_layers(sc, {{"A", 3 * 512 * mib}, {"B", 2 * 512 * mib}}, 512 * mib);
  CHECK(total_layers(sp) == 31);
  CHECK(sp.layers[0].second > sp.layers.back().second);  // twice the room past the margin: more layers
}
