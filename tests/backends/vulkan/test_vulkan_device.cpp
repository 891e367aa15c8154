// Vulkan devices on whatever driver this machine has (Mesa's lavapipe in CI): enumeration and what the
// driver reports, device-local buffers through staging (bytes back as written, at any offset and length),
// refused allocations as out-of-memory errors naming the device, and the graph allocator's chunked compute
// memory over a real driver's max_size; the backend's ops against the CPU reference (the conformance cases).
#include <catch2/catch.hpp>

#include <string>
#include <vector>

#include "backends/cpu/cpu_backend.h"
#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_buffer.h"
#include "backends/vulkan/vulkan_device.h"
#include "runtime/graph_allocator.h"
#include "runtime/ops.h"
#include "tests/backends/conformance_runner.h"
#include "tests/backends/vulkan/vulkan_test_device.h"
#include "tests/support/buffer_bytes.h"

using namespace troupe;

namespace {

vulkan::device* first_device() { return test::first_vulkan_device(); }

bool is_lavapipe(const vulkan::device& d) { return d.description().find("llvmpipe") != std::string::npos; }

}  // namespace

TEST_CASE("Vulkan devices are named Vulkan0.. and report what the driver says", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  const auto devs = vulkan::devices();
  for (size_t i = 0; i < devs.size(); ++i) CHECK(devs[i]->name() == "Vulkan" + std::to_string(i));
  CHECK_FALSE(d->description().empty());
  const device_memory m = d->memory();
  CHECK(m.total > 0);
  CHECK(m.free <= m.total);
  const vulkan::device_limits& l = d->limits();
  CHECK(l.max_storage_buffer_range > 0);
  CHECK(l.max_memory_allocation_size > 0);
  CHECK(d->buffer_type().max_size() == std::min(l.max_storage_buffer_range, l.max_memory_allocation_size));
  CHECK(d->buffer_type().alignment() >= l.min_storage_buffer_offset_alignment);
  CHECK(d->supports_buft(d->buffer_type()));
  if (is_lavapipe(*d)) {
    // ../shared's facts about this machine's driver: 128 MiB storage range, 2 GiB allocations, subgroup 8.
    CHECK(l.max_storage_buffer_range == 128u << 20);
    CHECK(l.max_memory_allocation_size == uint64_t{2} << 30);
    CHECK(l.subgroup_size == 8);
    CHECK(d->buffer_type().max_size() == 128u << 20);
  }
  CHECK(d->init_backend() != nullptr);
}

TEST_CASE("a Vulkan buffer holds the bytes written at any offset and length", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  // Larger than one staging piece (16 MiB), odd length.
  test::check_buffer_bytes(d->buffer_type(), (size_t{20} << 20) + 13);
}

TEST_CASE("an allocation the Vulkan driver refuses is an out-of-memory error naming the device", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  buffer_type_i& bt = d->buffer_type();
  try {
    bt.alloc_buffer(bt.max_size() + 1);
    FAIL("a buffer larger than max_size was allocated");
  } catch (const out_of_memory_error& e) {
    CHECK(std::string(e.what()).find(std::string(d->name())) != std::string::npos);
  }
  // The device keeps serving.
  buffer_ptr ok = bt.alloc_buffer(4096);
  CHECK(ok->size() == 4096);
}

TEST_CASE("compute memory larger than a Vulkan buffer's max_size is planned in chunks within it, and the graph runs", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  buffer_type_i& bt = d->buffer_type();
  const size_t max = bt.max_size();
  if (max > (size_t{512} << 20)) {
    WARN("skipped: this driver's max buffer size is " << max << " bytes; the test plans 2.5x lavapipe's");
    return;
  }
  // Three tensors of 0.45 x max each, all live at once (x waits while y and z are computed and summed):
  // 1.35 x max, more than one chunk can hold.
  const int64_t n = static_cast<int64_t>(max / 4 * 45 / 100);
  context ctx({.max_tensors = 16, .no_alloc = true});
  tensor* a = ctx.new_tensor_1d(type::f32, n);
  tensor* b = ctx.new_tensor_1d(type::f32, n);
  tensor* c = ctx.new_tensor_1d(type::f32, n);
  tensor* x = scale(ctx, a, 2.0f);
  tensor* y = scale(ctx, b, 3.0f);
  tensor* z = scale(ctx, c, 4.0f);
  tensor* out = add(ctx, x, add(ctx, y, z));
  graph g;
  g.build_forward_expand(out);
  graph_allocator galloc({&bt});
  REQUIRE(galloc.alloc_graph(g));
  CHECK(galloc.n_chunks(0) >= 2);
  size_t total = 0;
  for (int i = 0; i < galloc.n_chunks(0); ++i) {
    buffer_i* chunk = galloc.chunk_buffer(0, i);
    REQUIRE(chunk != nullptr);
    CHECK(chunk->size() <= max);
    CHECK(&chunk->type() == &bt);
    total += chunk->size();
  }
  CHECK(total == galloc.buffer_size(0));
  CHECK(total > max);
  // Every tensor placed in a real Vulkan buffer, and the graph runs over the chunks: out = 2a + 3b + 4c.
  std::vector<float> va(static_cast<size_t>(n)), vb(va.size()), vc(va.size());
  for (size_t i = 0; i < va.size(); ++i) {
    va[i] = static_cast<float>(i % 7);
    vb[i] = static_cast<float>(i % 5);
    vc[i] = static_cast<float>(i % 3);
  }
  for (tensor* t : {a, b, c, out}) REQUIRE(t->buffer != nullptr);
  // The inputs alone are 1.35 x max: they lie in more than one chunk.
  CHECK((a->buffer != b->buffer || b->buffer != c->buffer));
  tensor_set(*a, va.data(), 0, nbytes(*a));
  tensor_set(*b, vb.data(), 0, nbytes(*b));
  tensor_set(*c, vc.data(), 0, nbytes(*c));
  d->init_backend()->graph_compute(g);
  std::vector<float> got(va.size());
  tensor_get(*out, got.data(), 0, nbytes(*out));
  size_t wrong = 0;
  for (size_t i = 0; i < got.size(); ++i) wrong += got[i] != 2 * va[i] + 3 * vb[i] + 4 * vc[i] ? 1 : 0;
  CHECK(wrong == 0);
}

TEST_CASE("every conformance case of the ops Vulkan computes matches the CPU reference on the device", "[vulkan][conformance]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  backend_ptr be = d->init_backend();
  auto compared = testing::compare_supported_cases(*be);
  testing::check_gpu_coverage(compared);
  // Vulkan also computes the experts' products (mul_mat_id.comp) of every weight type it reads, and sigmoid.
  int moe_cases = 0;
  for (const auto& c : testing::conformance_cases()) {
    if (c.name.rfind("mul_mat_id ", 0) != 0) continue;
    const auto wt = type_from_name(c.name.substr(11, c.name.find(' ', 11) - 11));
    moe_cases += wt && is_gpu_weight_type(*wt) ? 1 : 0;
  }
  CHECK(moe_cases >= 7 * 3 + 2);
  CHECK(compared["mul_mat_id"] == moe_cases);
  CHECK(compared["sigmoid"] == 1);
}

TEST_CASE("every matrix product case matches the CPU reference with each of the matrix shaders forced", "[vulkan][conformance]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  auto reference = cpu::make_cpu_backend({.reference = true});
  const auto cases = testing::conformance_cases();
  using shader = vulkan::backend::matmul_shader;
  for (shader s : {shader::tiled, shader::registers}) {
    INFO((s == shader::tiled ? "tiled (shared memory)" : "registers"));
    backend_ptr be = d->init_backend();
    dynamic_cast<vulkan::backend&>(*be).force_matmul(s);
    int compared = 0;
    for (size_t ci = 0; ci < cases.size(); ++ci) {
      const testing::op_case& c = cases[ci];
      if (!testing::is_gpu_mul_mat_case(c) && c.name != "attention chain") continue;
      INFO("case: " << c.name);
      const auto got = testing::run_case(c, ci, *be, nullptr);
      REQUIRE(got.has_value());
      const auto ref = testing::run_case(c, ci, *reference, nullptr);
      REQUIRE(ref.has_value());
      testing::check_result(c, *got, *ref, testing::element_bounds(c, ci, *ref));  // NMSE and every element
      ++compared;
    }
    CHECK(compared > 150);
  }
}

TEST_CASE("the Vulkan device says which ops it does not compute yet, and refuses them in a graph", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  context ctx({.max_tensors = 16, .no_alloc = true});
  tensor* w = ctx.new_tensor_2d(type::f32, 64, 32);
  tensor* x = ctx.new_tensor_2d(type::f32, 64, 4);
  tensor* y = mul_mat(ctx, w, x);
  tensor* n = cpy(ctx, x, ctx.new_tensor_2d(type::q4_0, 64, 4));
  CHECK(d->supports_op(*y));
  CHECK_FALSE(d->supports_op(*n));  // quantizing copies: not written (set_rows into q8_0 is)
  CHECK(d->supports_op(*soft_max(ctx, y, nullptr, 0.5f)));
  graph g;
  g.build_forward_expand(n);
  buffer_ptr buf = alloc_ctx_tensors(ctx, d->buffer_type());
  backend_ptr be = d->init_backend();
  CHECK_THROWS_WITH(be->graph_compute(g), Catch::Contains("cpy") && Catch::Contains("not supported"));
}

TEST_CASE("Vulkan get_rows never reads outside its source: an index beyond its rows gives a zero row", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  context ctx({.max_tensors = 8, .no_alloc = true});
  tensor* a = ctx.new_tensor_2d(type::f32, 4, 3);
  tensor* idx = ctx.new_tensor_1d(type::i32, 3);
  tensor* out = get_rows(ctx, a, idx);
  graph g;
  g.build_forward_expand(out);
  buffer_ptr buf = alloc_ctx_tensors(ctx, d->buffer_type());
  const std::vector<float> rows = {0, 1, 2, 3, 10, 11, 12, 13, 20, 21, 22, 23};
  const std::vector<int32_t> picks = {2, 7, -1};
  tensor_set(*a, rows.data(), 0, sizeof(float) * rows.size());
  tensor_set(*idx, picks.data(), 0, sizeof(int32_t) * picks.size());
  d->init_backend()->graph_compute(g);
  std::vector<float> got(12);
  tensor_get(*out, got.data(), 0, sizeof(float) * got.size());
  CHECK(got == std::vector<float>{20, 21, 22, 23, 0, 0, 0, 0, 0, 0, 0, 0});
}

TEST_CASE("memory beyond the device's heap is an out-of-memory error naming the device, and it keeps serving", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  buffer_type_i& bt = d->buffer_type();
  const size_t heap = d->memory().total;
  const size_t piece = bt.max_size();
  // Buffers of max_size until the device-local heap is more than used up: the one that does not fit is
  // refused (by troupe's account of the heap the driver reports, or by the driver itself).
  std::vector<buffer_ptr> held;
  bool refused = false;
  for (size_t used = 0; used <= heap + piece && !refused; used += piece) {
    try {
      held.push_back(bt.alloc_buffer(piece));
    } catch (const out_of_memory_error& e) {
      refused = true;
      CHECK_THAT(e.what(), Catch::Contains(std::string(d->name())));
      CHECK(d->memory().free < piece);  // free memory says so too
    }
  }
  CHECK(refused);
  INFO("held " << held.size() << " buffers of " << piece << " bytes; heap " << heap);
  held.clear();
  buffer_ptr ok = bt.alloc_buffer(piece);  // all freed: the device serves again
  CHECK(ok->size() == piece);
}

TEST_CASE("a Vulkan graph has barriers only where a node reads or overwrites what an earlier one wrote, and makes its descriptor sets once", "[vulkan]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  context ctx({.max_tensors = 32, .no_alloc = true});
  tensor* w = ctx.new_tensor_2d(type::f32, 64, 48);
  tensor* x = ctx.new_tensor_2d(type::f32, 64, 3);
  // Three products of x (independent, as a layer's q, k and v), then a sum of all three (depends on them),
  // then a scale of the sum (depends on it).
  tensor* q = mul_mat(ctx, w, x);
  tensor* k = mul_mat(ctx, w, scale(ctx, x, 2.0f));
  tensor* v = mul_mat(ctx, w, scale(ctx, x, 3.0f));
  tensor* out = scale(ctx, add(ctx, add(ctx, q, k), v), 0.5f);
  graph g;
  g.build_forward_expand(out);
  buffer_ptr buf = alloc_ctx_tensors(ctx, d->buffer_type());
  std::vector<float> vw(64 * 48), vx(64 * 3);
  for (size_t i = 0; i < vw.size(); ++i) vw[i] = static_cast<float>(i % 11) - 5.0f;
  for (size_t i = 0; i < vx.size(); ++i) vx[i] = static_cast<float>(i % 3);
  tensor_set(*w, vw.data(), 0, nbytes(*w));
  tensor_set(*x, vx.data(), 0, nbytes(*x));
  backend_ptr be = d->init_backend();
  be->graph_compute(g);
  const auto stats = dynamic_cast<vulkan::backend&>(*be).last_graph();
  // Every tensor has its own memory here (alloc_ctx_tensors). In the graph's order: q and x * 2 together |
  // k | q + k and x * 3 together | v | + v | the scale: 5 barriers among 8 dispatches (one after every
  // dispatch would be 7).
  CHECK(stats.dispatches == 8);
  CHECK(stats.barriers == 5);
  CHECK(stats.descriptor_sets_made > 0);
  // The same graph again (a decode step): the descriptor sets made the first time are bound again.
  be->graph_compute(g);
  CHECK(dynamic_cast<vulkan::backend&>(*be).last_graph().descriptor_sets_made == 0);
  std::vector<float> got(48 * 3);
  tensor_get(*out, got.data(), 0, nbytes(*out));
  for (int j = 0; j < 3; ++j) {
    for (int i = 0; i < 48; ++i) {
      float dot = 0;
      for (int e = 0; e < 64; ++e) dot += vw[static_cast<size_t>(i * 64 + e)] * vx[static_cast<size_t>(j * 64 + e)];
      CHECK(got[static_cast<size_t>(j * 48 + i)] == Approx(0.5f * 6.0f * dot));
    }
  }
}

TEST_CASE("Vulkan graphs queue: uploads recorded with set_tensor_async land in order between them, and each finishes in order", "[vulkan][queue]") {
  vulkan::device* d = first_device();
  if (d == nullptr) return;
  // Eight graphs y_i = x * (i + 1), each preceded by an upload of x = i (plus its index): more graphs than
  // the ring has frames, all submitted before the first is waited for. Each graph must see the x uploaded
  // just before it, not a later one (the copies are in the stream, ordered with the graphs).
  constexpr int n = 8;
  constexpr int64_t len = 1000;
  context ctx({.max_tensors = 32, .no_alloc = true});
  tensor* x = ctx.new_tensor_1d(type::f32, len);
  std::vector<tensor*> ys;
  std::vector<graph> gs(n);
  for (int i = 0; i < n; ++i) {
    ys.push_back(scale(ctx, x, static_cast<float>(i + 1)));
    gs[static_cast<size_t>(i)].build_forward_expand(ys.back());
  }
  buffer_ptr buf = alloc_ctx_tensors(ctx, d->buffer_type());
  backend_ptr be = d->init_backend();
  auto& vb = dynamic_cast<vulkan::backend&>(*be);
  REQUIRE(be->queues_graphs());
  std::vector<std::vector<float>> inputs(n, std::vector<float>(static_cast<size_t>(len)));
  size_t most_in_flight = 0;
  for (int i = 0; i < n; ++i) {
    for (int64_t e = 0; e < len; ++e) inputs[static_cast<size_t>(i)][static_cast<size_t>(e)] = static_cast<float>(i * 1000 + e);
    be->set_tensor_async(*x, inputs[static_cast<size_t>(i)].data(), 0, nbytes(*x));
    inputs[static_cast<size_t>(i)].assign(static_cast<size_t>(len), -1.0f);  // the bytes were taken at the call
    be->graph_submit(gs[static_cast<size_t>(i)]);
    most_in_flight = std::max(most_in_flight, vb.in_flight());
  }
  CHECK(most_in_flight <= vulkan::backend::n_frames);
  CHECK(most_in_flight >= 1);
  for (int i = 0; i < n; ++i) CHECK(be->finish_oldest(std::chrono::seconds(60)));
  CHECK(vb.in_flight() == 0);
  CHECK(be->finish_oldest(std::chrono::microseconds(0)));  // none left
  for (int i = 0; i < n; ++i) {
    std::vector<float> got(static_cast<size_t>(len));
    tensor_get(*ys[static_cast<size_t>(i)], got.data(), 0, nbytes(*ys[static_cast<size_t>(i)]));
    INFO("graph " << i);
    CHECK(got[0] == static_cast<float>(i * 1000) * static_cast<float>(i + 1));
    CHECK(got[len - 1] == static_cast<float>(i * 1000 + len - 1) * static_cast<float>(i + 1));
  }
  // An upload with no graph after it lands at synchronize; get_tensor_async waits for what was queued.
  std::vector<float> last(static_cast<size_t>(len), 7.0f), back(static_cast<size_t>(len));
  be->set_tensor_async(*x, last.data(), 0, nbytes(*x));
  be->get_tensor_async(*x, back.data(), 0, nbytes(*x));
  CHECK(back == last);
  // graph_compute is a submit and a wait.
  be->graph_compute(gs[1]);
  CHECK(vb.in_flight() == 0);
  tensor_get(*ys[1], back.data(), 0, nbytes(*ys[1]));
  CHECK(back[3] == 14.0f);
  // Out of range is an error naming the tensor; nothing was recorded.
  CHECK_THROWS_WITH(be->set_tensor_async(*x, last.data(), 8, nbytes(*x)), Catch::Contains("outside it"));
  if (d->is_cpu()) {
    // On a CPU driver device memory is host memory: reads come straight from the mapping, never queued
    // behind graphs in flight.
    CHECK(dynamic_cast<vulkan::buffer&>(*buf).mapped());
  }
}
