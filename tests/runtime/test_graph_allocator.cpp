// The graph allocator: the reference implementation's allocation scenarios, re-reservation, reuse across
// graphs, and randomized graphs checked by the same invariants.
#include <catch2/catch.hpp>

#include <random>
#include <set>

#include "runtime/error.h"
#include "runtime/graph_allocator.h"
#include "runtime/ops.h"
#include "tools/bench/counting_buffer_type.h"
#include "tools/bench/random_graph.h"

using namespace troupe;
using namespace troupe::testing;

namespace {

constexpr size_t unbounded = SIZE_MAX;

struct fixture {
  context ctx{{.max_tensors = 256, .no_alloc = true}};
  tensor* input(int64_t n_floats) {
    tensor* t = ctx.new_tensor_1d(type::f32, n_floats);
    t->flags |= flag_input;
    return t;
  }
};

// Plans g (its last node is the output) over one buffer type and checks the invariants.
size_t run_one(fixture& f, tensor* out, counting_buffer_type& bt) {
  (void)f;
  out->flags |= flag_output;
  graph g;
  g.build_forward_expand(out);
  graph_allocator galloc({&bt});
  galloc.alloc_graph(g);
  INFO(check_plan(g, galloc));
  CHECK(check_plan(g, galloc).empty());
  return bt.allocated;
}

}  // namespace

TEST_CASE("scenario 1: shared inputs, M=16", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M16", 16);
  tensor *x0 = f.input(2), *x1 = f.input(2), *x2 = f.input(2);
  tensor* x3 = mul(f.ctx, x0, x1);
  tensor* x4 = add(f.ctx, x1, x2);
  tensor* x5 = add(f.ctx, x3, x0);
  tensor* x6 = add(f.ctx, x4, x5);
  CHECK(run_one(f, x6, bt) <= 32);
}

TEST_CASE("scenario 2: concat larger than a chunk's remaining space, M=32", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M32", 32);
  tensor* x2 = concat(f.ctx, f.input(4), f.input(2), 0);
  CHECK(run_one(f, x2, bt) <= 56);
}

TEST_CASE("scenario 3: a tensor larger than max_size gets its own chunk and is reused in place", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M16", 16);
  tensor* x1 = scale(f.ctx, f.input(6), 2.0f);
  CHECK(run_one(f, x1, bt) == 24);
}

TEST_CASE("scenario 4: the last chunk grows past max_size", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M8", 8);
  std::vector<tensor*> in;
  for (int i = 0; i < 17; ++i) in.push_back(f.input(2));
  tensor* y = in[0];
  for (int i = 1; i < 17; ++i) y = add(f.ctx, y, in[static_cast<size_t>(i)]);
  CHECK(run_one(f, y, bt) > 128);
  CHECK(bt.largest > 8);  // the 16th chunk grew
}

TEST_CASE("scenario 5: space left in an earlier chunk is used after a new one was made", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M16", 16);
  tensor* x1 = pad(f.ctx, f.input(2), 2, 0);
  tensor* x2 = mean(f.ctx, x1);
  CHECK(run_one(f, x2, bt) <= 28);
}

TEST_CASE("scenario 6: views take no memory", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M32", 32);
  tensor* x0 = f.input(4);
  tensor* x1 = reshape(f.ctx, x0, 2, 2);
  tensor* x2 = permute(f.ctx, x1, 1, 0, 2, 3);
  tensor* x3 = view_1d(f.ctx, x2, 2, 4);
  tensor* x5 = add(f.ctx, x3, f.input(2));
  CHECK(run_one(f, x5, bt) <= 24);
}

TEST_CASE("scenario 7: views of an intermediate keep it alive", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M40", 40);
  tensor* x0 = f.input(6);
  tensor* x3 = add(f.ctx, f.input(2), f.input(2));
  tensor* x4 = pad(f.ctx, x0, 2, 0);
  tensor* x5 = scale(f.ctx, x4, 2.0f);
  tensor* x6 = add(f.ctx, x4, x5);
  tensor* x7 = view_1d(f.ctx, x6, 2, 8);
  tensor* x8 = add(f.ctx, x3, x7);
  CHECK(run_one(f, x8, bt) <= 104);
}

TEST_CASE("scenario 8: reductions and pads, bounded and unbounded chunks", "[alloc]") {
  for (size_t m : {size_t{32}, unbounded}) {
    INFO("max size " << m);
    fixture f;
    counting_buffer_type bt("M", m);
    tensor* x3 = mean(f.ctx, f.input(4));
    tensor* x4 = mean(f.ctx, f.input(4));
    tensor* x5 = pad(f.ctx, f.input(4), 2, 0);
    tensor* x6 = add(f.ctx, x3, x4);
    tensor* x7 = pad(f.ctx, x6, 5, 0);
    tensor* x8 = add(f.ctx, x5, x7);
    CHECK(run_one(f, x8, bt) <= 88);
  }
}

TEST_CASE("scenario 9: a freed block wins over the tail, alignment 4", "[alloc]") {
  fixture f;
  counting_buffer_type bt("M32a4", 32, 4);
  tensor* x1 = mean(f.ctx, f.input(6));
  tensor* x2 = mean(f.ctx, x1);
  CHECK(run_one(f, x2, bt) <= 28);
}

TEST_CASE("scenario 10: two buffer types with weights placed before planning", "[alloc]") {
  counting_buffer_type a("A", 32), b("B", unbounded);
  context wa({.max_tensors = 4, .no_alloc = true}), wb({.max_tensors = 4, .no_alloc = true});
  tensor* a0 = wa.new_tensor_1d(type::f32, 4);
  tensor* a1 = wa.new_tensor_1d(type::f32, 4);
  tensor* b0 = wb.new_tensor_1d(type::f32, 6);
  tensor* b1 = wb.new_tensor_1d(type::f32, 1);
  buffer_ptr wbuf_a = alloc_ctx_tensors(wa, a);
  buffer_ptr wbuf_b = alloc_ctx_tensors(wb, b);

  fixture f;
  tensor* x0 = f.input(4);
  tensor* x1 = mul(f.ctx, x0, a0);
  tensor* x2 = pad(f.ctx, x1, 2, 0);
  tensor* x3 = mul(f.ctx, x2, b0);
  tensor* x4 = mean(f.ctx, x3);
  tensor* x5 = add(f.ctx, x4, b1);
  tensor* x6 = pad(f.ctx, x5, 3, 0);
  tensor* x7 = add(f.ctx, x6, a1);
  tensor* x8 = scale(f.ctx, x7, 2.0f);
  x8->flags |= flag_output;
  const std::set<const tensor*> on_b{x3, x4, x5, x6};

  graph g;
  g.build_forward_expand(x8);
  graph_allocator galloc({&a, &b});
  galloc.set_assignment([&](const tensor& t) { return on_b.count(&t) ? 1 : 0; });
  galloc.alloc_graph(g);
  INFO(check_plan(g, galloc));
  CHECK(check_plan(g, galloc).empty());
  CHECK(a.allocated <= 88);
  CHECK(b.allocated <= 56);
  CHECK(a0->buffer == wbuf_a.get());  // weights untouched
  CHECK(galloc.last_plan().count(a0) == 0);
}

TEST_CASE("scenario 11: a buffer type with nothing assigned allocates nothing", "[alloc]") {
  counting_buffer_type first("first", unbounded), second("second", unbounded);
  fixture f;
  tensor* x1 = scale(f.ctx, f.input(4), 3.0f);
  x1->flags |= flag_output;
  graph g;
  g.build_forward_expand(x1);
  graph_allocator galloc({&first, &second});
  galloc.alloc_graph(g);
  CHECK(first.allocated == 16);
  CHECK(second.allocated == 0);
  CHECK(galloc.buffer_size(1) == 0);
}

TEST_CASE("reserve, then graphs that fit reuse the buffers, and a larger one re-reserves", "[alloc]") {
  counting_buffer_type bt("host", unbounded, 32);
  auto build = [](context& ctx, int64_t n) {
    tensor* x = ctx.new_tensor_2d(type::f32, 64, n);
    x->flags |= flag_input;
    tensor* y = silu(ctx, mul(ctx, x, x));
    tensor* z = add(ctx, sum_rows(ctx, y), sum_rows(ctx, x));
    z->flags |= flag_output;
    return z;
  };
  graph_allocator galloc({&bt});
  context c1({.max_tensors = 32, .no_alloc = true});
  graph worst;
  worst.build_forward_expand(build(c1, 32));
  galloc.reserve(worst);
  const size_t reserved = bt.allocated;
  CHECK(reserved > 0);
  CHECK(galloc.n_reallocations() == 1);

  context c2({.max_tensors = 32, .no_alloc = true});
  graph small;
  small.build_forward_expand(build(c2, 7));
  CHECK_FALSE(galloc.alloc_graph(small));
  CHECK(bt.allocated == reserved);
  CHECK(check_plan(small, galloc).empty());

  context c3({.max_tensors = 32, .no_alloc = true});
  graph big;
  big.build_forward_expand(build(c3, 100));
  CHECK(galloc.alloc_graph(big));
  CHECK(bt.allocated > reserved);
  CHECK(galloc.n_reallocations() == 2);
  CHECK(check_plan(big, galloc).empty());

  // The same graph again: nothing moves.
  void* before = big.node(big.n_nodes() - 1)->data;
  CHECK_FALSE(galloc.alloc_graph(big));
  CHECK(big.node(big.n_nodes() - 1)->data == before);
}

TEST_CASE("a buffer type that cannot allocate the grown last chunk is a clear error", "[alloc]") {
  // Device memory of 64 bytes: chunks are 8 bytes, 17 live inputs need more.
  class limited final : public buffer_type_i {
   public:
    std::string_view name() const override { return "tiny-device"; }
    size_t alignment() const override { return 8; }
    size_t max_size() const override { return 8; }
    device_i& device() const override { throw backend_error("no device"); }
    buffer_ptr alloc_buffer(size_t size) override {
      if (used + size > 64) throw backend_error("tiny-device: out of memory allocating " + std::to_string(size) + " bytes");
      used += size;
      return inner.alloc_buffer(size);
    }
    size_t used = 0;
    counting_buffer_type inner{"inner", unbounded};
  } bt;
  fixture f;
  tensor* y = f.input(2);
  for (int i = 0; i < 16; ++i) y = add(f.ctx, y, f.input(2));
  y->flags |= flag_output;
  graph g;
  g.build_forward_expand(y);
  graph_allocator galloc({&bt});
  CHECK_THROWS_WITH(galloc.alloc_graph(g), Catch::Contains("tiny-device: out of memory"));
}

TEST_CASE("randomized graphs keep every invariant", "[alloc][random]") {
  std::mt19937 rng(1234);
  double worst_ratio = 1.0, sum_ratio = 0.0;
  constexpr int n_graphs = 200;
  for (int gi = 0; gi < n_graphs; ++gi) {
    const size_t m = std::uniform_int_distribution<int>(0, 3)(rng) == 0 ? unbounded : size_t{16} << (rng() % 6);
    counting_buffer_type bt("rand", m, 8);
    context ctx({.max_tensors = 512, .no_alloc = true});
    tensor* out = random_graph(ctx, rng, 5 + static_cast<int>(rng() % 60));
    graph g;
    g.build_forward_expand(out);
    graph_allocator galloc({&bt});
    galloc.alloc_graph(g);
    const std::string problems = check_plan(g, galloc);
    INFO("graph " << gi << ", max size " << m << ": " << problems);
    REQUIRE(problems.empty());
    const size_t lower = live_peak(g, galloc)[0];
    const double ratio = static_cast<double>(bt.allocated) / static_cast<double>(lower);
    CHECK(bt.allocated >= lower);
    worst_ratio = std::max(worst_ratio, ratio);
    sum_ratio += ratio;
  }
  WARN("allocated / live-peak lower bound over " << n_graphs << " random graphs: mean " << sum_ratio / n_graphs
                                                 << ", worst " << worst_ratio);
}

TEST_CASE("a buffer type listed twice: both entries share one planner and one set of chunks, counted once", "[alloc]") {
  auto build = [](fixture& f, std::set<const tensor*>& on_second) {
    tensor* x0 = f.input(64);
    tensor* x1 = scale(f.ctx, x0, 2.0f);
    tensor* x2 = mul(f.ctx, x1, x1);
    tensor* x3 = add(f.ctx, x2, x1);
    tensor* x4 = silu(f.ctx, x3);
    tensor* x5 = add(f.ctx, x4, x2);
    x5->flags |= flag_output;
    on_second.insert(x1);
    on_second.insert(x3);
    on_second.insert(x5);
    return x5;
  };
  counting_buffer_type bt("host", unbounded);
  counting_buffer_type one("one", unbounded);
  {
    fixture f;
    std::set<const tensor*> on_second;
    graph g;
    g.build_forward_expand(build(f, on_second));
    graph_allocator galloc({&bt, &bt});
    galloc.set_assignment([&](const tensor& t) { return on_second.count(&t) ? 1 : 0; });
    galloc.alloc_graph(g);
    INFO(check_plan(g, galloc));
    CHECK(check_plan(g, galloc).empty());  // tensors of both entries never overlap while alive
    REQUIRE(galloc.n_chunks(0) == 1);
    CHECK(galloc.n_chunks(1) == 1);
    CHECK(galloc.chunk_buffer(1, 0) == galloc.chunk_buffer(0, 0));
    for (const tensor* t : g.nodes()) CHECK(t->buffer == galloc.chunk_buffer(0, 0));
    CHECK(galloc.buffer_size(0) == bt.allocated);  // one buffer in all
    CHECK(galloc.buffer_size(1) == 0);             // not counted twice
    // The same plan as the buffer type listed once.
    std::set<const tensor*> unused;
    graph g1;
    g1.build_forward_expand(build(f, unused));
    graph_allocator single({&one});
    single.alloc_graph(g1);
    CHECK(one.allocated == bt.allocated);
    // Reserving again (a larger graph would grow it) keeps one set of chunks.
    galloc.alloc_graph(g);
    CHECK(galloc.chunk_buffer(1, 0) == galloc.chunk_buffer(0, 0));
  }
  CHECK(bt.allocated == 0);  // nothing left behind when the allocator goes
}
