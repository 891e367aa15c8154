// The CPU kernels attention is made of, and that a sequence's results do not depend on where its cells lie
// in the cache: mul_mat of V read transposed, soft_max among masked entries, mul_mat_masked, and the fused
// flash_attn against the unfused chain (and the sources it refuses).
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "backends/cpu/kernels.h"
#include "runtime/context.h"
#include "runtime/error.h"
#include "runtime/ops.h"
#include "tests/backends/kernel_fixture.h"

using namespace troupe;
using namespace troupe::test::kernel_fixture;

namespace {

// V as the cache keeps it in host memory: a row of hd values per cell (row c of head h at cell_of(c)), read
// transposed as mul_mat's a; b the softmax weights of n_q queries (column j), zero outside `live` cells.
struct column_case {
  tensor* v = nullptr;   // [hd, n_cells, heads]
  tensor* a = nullptr;   // permute(v): [n_cells, hd, heads], a row per cell
  tensor* b = nullptr;   // [n_cells, n_q, heads * 2]
  tensor* d = nullptr;
};

column_case column_product(context& ctx, type t, int64_t hd, int64_t n_cells, int64_t n_live, int64_t n_q,
                           const std::function<int64_t(int64_t)>& cell_of) {
  column_case c;
  const int64_t heads = 2;
  c.v = ctx.new_tensor_3d(t, hd, n_cells, heads);
  fill_random(*c.v, 91, -2.0, 2.0);  // cells nobody attends to hold values too
  c.b = ctx.new_tensor_3d(type::f32, n_cells, n_q, 2 * heads);
  fill(*c.b, std::vector<double>(static_cast<size_t>(n_cells * n_q * 2 * heads), 0.0));
  const std::vector<double> vv = random_values(static_cast<size_t>(hd * n_live * heads), 92, -2.0, 2.0);
  const std::vector<double> bv = random_values(static_cast<size_t>(n_live * n_q * 2 * heads), 93, 0.0, 1.0);
  for (int64_t h = 0; h < heads; ++h) {
    for (int64_t l = 0; l < n_live; ++l) {
      for (int64_t i = 0; i < hd; ++i) set(*c.v, vv[static_cast<size_t>((h * n_live + l) * hd + i)], i, cell_of(l), h);
    }
  }
  for (int64_t p = 0; p < 2 * heads; ++p) {
    for (int64_t j = 0; j < n_q; ++j) {
      for (int64_t l = 0; l < n_live; ++l) {
        // Query j attends to the first n_live - j live cells (causal-like), the rest weigh 0.
        const double w = l < n_live - j ? bv[static_cast<size_t>((p * n_q + j) * n_live + l)] : 0.0;
        set(*c.b, w, cell_of(l), j, p);
      }
    }
  }
  c.a = permute(ctx, c.v, 1, 0, 2, 3);
  c.d = mul_mat(ctx, c.a, c.b);
  return c;
}

}  // namespace

TEST_CASE("kernels: mul_mat of V read transposed sums its rows in cell order: the same bits wherever the cells lie", "[cpu][kernels][mul_mat]") {
  for (type t : {type::f32, type::f16}) {
    for (bool reference : {true, false}) {
      for (int nth : {1, 3}) {
        INFO(type_name(t) << (reference ? ", reference" : ", fast") << ", threads " << nth);
        context ctx(arena(32));
        const int64_t hd = 72, n_live = 45, n_q = 9;  // hd: 4 zmm + a tail; n_q: a tile of 6 and one of 3
        // Packed at the front of the cache, then spread out among other sequences' cells (a gap of 2, from
        // cell 7 on, in a longer cache).
        column_case packed = column_product(ctx, t, hd, 64, n_live, n_q, [](int64_t l) { return l; });
        column_case spread = column_product(ctx, t, hd, 112, n_live, n_q, [](int64_t l) { return 7 + 2 * l; });
        REQUIRE(cpu::supports_op(*packed.d));
        CHECK(cpu::work_size(*packed.d, nth, reference) == 0);
        compute(*packed.d, nth, reference);
        compute(*spread.d, nth, reference);
        // Against double sums over the live cells.
        std::vector<double> want, bound;
        for (int64_t p = 0; p < 4; ++p) {
          for (int64_t j = 0; j < n_q; ++j) {
            for (int64_t i = 0; i < hd; ++i) {
              double s = 0, mag = 0;
              for (int64_t l = 0; l < 64; ++l) {
                const double x = get(*packed.v, i, l, p / 2) * get(*packed.b, l, j, p);
                s += x;
                mag += std::fabs(x);
              }
              want.push_back(s);
              bound.push_back(1e-5 * mag + 1e-6);
            }
          }
        }
        CHECK(within(*packed.d, mm_expect{want, bound}));
        CHECK(bytes_of(*packed.d) == bytes_of(*spread.d));
      }
    }
  }
}

TEST_CASE("kernels: soft_max gives a row's live entries the same bits wherever they lie among masked ones", "[cpu][kernels]") {
  context ctx(arena());
  const int64_t n_live = 37;
  const std::vector<double> x = random_values(static_cast<size_t>(n_live), 94, -4.0, 4.0);
  auto row_of = [&](int64_t n, const std::function<int64_t(int64_t)>& pos) {
    tensor* a = ctx.new_tensor_2d(type::f32, n, 1);
    tensor* mask = ctx.new_tensor_2d(type::f32, n, 1);
    fill_random(*a, 95);
    fill(*mask, std::vector<double>(static_cast<size_t>(n), -INFINITY));
    for (int64_t l = 0; l < n_live; ++l) {
      set(*a, x[static_cast<size_t>(l)], pos(l), 0);
      set(*mask, 0.0, pos(l), 0);
    }
    tensor* d = soft_max(ctx, a, mask, 0.5f);
    compute(*d, 1, /*reference=*/false);
    std::vector<double> live;
    for (int64_t l = 0; l < n_live; ++l) live.push_back(get(*d, pos(l), 0));
    return live;
  };
  const std::vector<double> packed = row_of(48, [](int64_t l) { return l; });
  const std::vector<double> spread = row_of(128, [](int64_t l) { return 3 + 3 * l; });
  CHECK(packed == spread);
  double sum = 0;
  for (double v : packed) sum += v;
  CHECK(sum == Approx(1.0).epsilon(1e-6));
}

TEST_CASE("kernels: mul_mat_masked computes every element the mask keeps, bit for bit, and zeros for blocks it hides whole", "[cpu][kernels][mul_mat]") {
  context ctx(arena(32));
  const int64_t hd = 64, n_kv = 96, n_q = 40;
  tensor* k = ctx.new_tensor_3d(type::f16, hd, n_kv, 2);
  fill_random(*k, 101);
  tensor* q = ctx.new_tensor_3d(type::f32, hd, n_q, 4);
  fill_random(*q, 102);
  // Causal: query j sees cells 0 .. 40 + j; f16 like a KV mask could be, padded by 8 rows.
  tensor* mask = ctx.new_tensor_2d(type::f16, n_kv, n_q + 8);
  for_each(*mask, [&](int64_t i0, int64_t i1, int64_t, int64_t) { set(*mask, i0 <= 40 + i1 ? 0.0 : -INFINITY, i0, i1); });
  tensor* full = mul_mat(ctx, k, q);
  tensor* masked = mul_mat_masked(ctx, k, q, mask);
  CHECK(masked->src[2] == mask);
  for (int nth : {1, 3}) {
    INFO("threads " << nth);
    compute(*full, nth, /*reference=*/false);
    fill(*masked, std::vector<double>(static_cast<size_t>(n_kv * n_q * 4), std::nan("")));
    compute(*masked, nth, /*reference=*/false);
    int64_t kept = 0, zeros = 0;
    for_each(*masked, [&](int64_t i, int64_t j, int64_t h, int64_t) {
      const double got = get(*masked, i, j, h);
      if (i <= 40 + j) {
        kept += got == get(*full, i, j, h) ? 1 : 0;
      } else {
        CHECK(std::isfinite(got));
        zeros += got == 0.0 ? 1 : 0;
      }
    });
    CHECK(kept == [&] { int64_t n = 0; for (int64_t j = 0; j < n_q; ++j) n += std::min<int64_t>(n_kv, 41 + j); return n * 4; }());
    CHECK(zeros >= 16 * 16 * 4);  // at least the blocks of cells 80.. against the first queries
  }
  // The mask must cover the product.
  tensor* small = ctx.new_tensor_2d(type::f32, n_kv - 1, n_q);
  CHECK_THROWS_WITH(mul_mat_masked(ctx, k, q, small), Catch::Contains("cover"));
}

namespace {

// Attention of n_q query rows (4 heads over 2 KV heads) against the n_kv cells of k and v, as the unfused
// graph (mul_mat_masked, soft_max, the column-major mul_mat, cont) and as one flash_attn node.
struct attn_case {
  tensor* fused = nullptr;
  tensor* unfused = nullptr;
  std::vector<tensor*> chain;  // the unfused nodes in order
  tensor *q = nullptr, *k = nullptr, *v = nullptr, *mask = nullptr;
};

attn_case attention_of(context& ctx, type kv_type, int64_t hd_k, int64_t hd_v, int64_t n_kv, int64_t n_q,
                       const std::function<bool(int64_t cell, int64_t query)>& visible, int64_t n_head = 4, int64_t n_kv_head = 2) {
  attn_case c;
  c.k = ctx.new_tensor_3d(kv_type, hd_k, n_kv, n_kv_head);
  c.v = ctx.new_tensor_3d(kv_type, hd_v, n_kv, n_kv_head);
  c.q = ctx.new_tensor_3d(type::f32, hd_k, n_head, n_q);  // [hd, heads, tokens], as the graph has it
  c.mask = ctx.new_tensor_2d(type::f32, n_kv, n_q + 3);
  fill_random(*c.k, 111);
  fill_random(*c.v, 112);
  fill_random(*c.q, 113, -2.0, 2.0);
  for_each(*c.mask, [&](int64_t i0, int64_t i1, int64_t, int64_t) {
    set(*c.mask, i1 < n_q && visible(i0, i1) ? 0.0 : -INFINITY, i0, i1);
  });
  const float scale = 0.125f;
  tensor* qp = permute(ctx, c.q, 0, 2, 1, 3);
  c.fused = flash_attn(ctx, qp, c.k, c.v, c.mask, scale);
  tensor* kq = mul_mat_masked(ctx, c.k, qp, c.mask);
  tensor* sm = soft_max(ctx, kq, c.mask, scale);
  tensor* kqv = mul_mat(ctx, permute(ctx, c.v, 1, 0, 2, 3), sm);
  c.unfused = cont(ctx, permute(ctx, kqv, 0, 2, 1, 3));
  c.chain = {kq, sm, kqv, c.unfused};
  return c;
}

}  // namespace

TEST_CASE("kernels: flash_attn gives the unfused attention's bits and a sequence's output wherever its cells lie", "[cpu][kernels][attention]") {
  for (type t : {type::f32, type::f16}) {
    for (bool reference : {false, true}) {
      for (int nth : {1, 3}) {
        INFO(type_name(t) << (reference ? ", reference" : ", fast") << ", threads " << nth);
        context ctx(arena(64));
        // Two sequences sharing the cache: cell c is sequence (c / 7) % 2's, query j sequence j % 2's, and
        // sees its sequence's cells up to 60 + j; the last query sees nothing (a fully masked row).
        // hd_v 72: vectors of 16 and one of 8; 13 queries: tiles of 6, 6 and 1; 100 cells: blocks of 16 + 4.
        const int64_t n_kv = 100, n_q = 13;
        auto shared = [](int64_t c, int64_t j) { return j < 12 && (c / 7) % 2 == j % 2 && c <= 60 + j; };
        attn_case a = attention_of(ctx, t, 64, 72, n_kv, n_q, shared);
        REQUIRE(cpu::supports_op(*a.fused));
        CHECK(cpu::work_size(*a.fused, nth, reference) >= static_cast<size_t>(nth * 6 * n_kv) * sizeof(float));
        fill(*a.fused, std::vector<double>(static_cast<size_t>(nelements(*a.fused)), std::nan("")));
        compute(*a.fused, nth, reference);
        for (tensor* n : a.chain) compute(*n, nth, reference);
        CHECK(bytes_of(*a.fused) == bytes_of(*a.unfused));

        // Against softmax and weighted sums in double.
        std::vector<double> want, bound;
        for (int64_t j = 0; j < n_q; ++j) {
          for (int64_t h = 0; h < 4; ++h) {
            std::vector<double> w(static_cast<size_t>(n_kv), 0.0);
            double mx = -INFINITY, sum = 0;
            for (int64_t c = 0; c < n_kv; ++c) {
              if (!shared(c, j)) continue;
              double s = 0;
              for (int64_t d = 0; d < 64; ++d) s += get(*a.k, d, c, h / 2) * get(*a.q, d, h, j);
              w[static_cast<size_t>(c)] = s * 0.125;
              mx = std::max(mx, s * 0.125);
            }
            for (int64_t c = 0; c < n_kv; ++c) {
              if (!shared(c, j)) continue;
              w[static_cast<size_t>(c)] = std::exp(w[static_cast<size_t>(c)] - mx);
              sum += w[static_cast<size_t>(c)];
            }
            for (int64_t d = 0; d < 72; ++d) {
              double o = 0;
              for (int64_t c = 0; c < n_kv; ++c) {
                if (shared(c, j)) o += w[static_cast<size_t>(c)] / sum * get(*a.v, d, c, h / 2);
              }
              want.push_back(o);
              bound.push_back(1e-4);
            }
          }
        }
        CHECK(within(*a.fused, mm_expect{want, bound}));
      }
    }
  }
  // The same sequence (query rows 0, 2, 4, ... of the case above) packed at the front of a cache of its own:
  // its outputs have the same bits.
  for (type t : {type::f32, type::f16}) {
    INFO(type_name(t));
    context ctx(arena(64));
    const int64_t n_kv = 100, n_q = 13;
    attn_case spread = attention_of(ctx, t, 64, 72, n_kv, n_q, [](int64_t c, int64_t j) { return (c / 7) % 2 == 0 && c <= 60 + j; });
    // Sequence 0's cells: 0..6, 14..20, 28..34, ...; packed: cell p holds the p-th of them.
    std::vector<int64_t> cells;
    for (int64_t c = 0; c < n_kv; ++c) {
      if ((c / 7) % 2 == 0) cells.push_back(c);
    }
    const int64_t n_packed = static_cast<int64_t>(cells.size());
    attn_case packed = attention_of(ctx, t, 64, 72, n_packed, n_q, [&](int64_t p, int64_t j) {
      return cells[static_cast<size_t>(p)] <= 60 + j;
    });
    for (int64_t p = 0; p < n_packed; ++p) {
      const int64_t c = cells[static_cast<size_t>(p)];
      for (int64_t g = 0; g < 2; ++g) {
        for (int64_t d = 0; d < 64; ++d) set(*packed.k, get(*spread.k, d, c, g), d, p, g);
        for (int64_t d = 0; d < 72; ++d) set(*packed.v, get(*spread.v, d, c, g), d, p, g);
      }
    }
    std::memcpy(packed.q->data, spread.q->data, nbytes(*spread.q));
    compute(*spread.fused, 2, false);
    compute(*packed.fused, 2, false);
    CHECK(bytes_of(*spread.fused) == bytes_of(*packed.fused));
  }
}

TEST_CASE("kernels: flash_attn of decode rows takes a KV head's query heads together, with the unfused attention's bits", "[cpu][kernels][attention]") {
  // Each query row its own sequence with cells of its own (decode steps of several sessions): every tile is
  // one row, so an item is the query heads of one KV head (up to 6 at a time: group 8 takes two items).
  struct shape {
    int64_t n_head, n_kv_head, n_q;
  };
  for (const shape sh : {shape{4, 2, 3}, shape{16, 2, 3}, shape{32, 8, 1}, shape{6, 1, 2}, shape{4, 4, 3}}) {
    for (type t : {type::f32, type::f16}) {
      for (int nth : {1, 3}) {
        INFO(sh.n_head << " heads over " << sh.n_kv_head << ", " << sh.n_q << " rows, " << type_name(t) << ", threads " << nth);
        context ctx(arena(64));
        // Row j sees cells [40 j, 40 j + 37) (the last row of three sees nothing: a fully masked row).
        const int64_t n_kv = 120;
        auto own = [&](int64_t c, int64_t j) { return (sh.n_q < 3 || j < 2) && c >= 40 * j && c < 40 * j + 37; };
        attn_case a = attention_of(ctx, t, 64, 72, n_kv, sh.n_q, own, sh.n_head, sh.n_kv_head);
        REQUIRE(cpu::supports_op(*a.fused));
        fill(*a.fused, std::vector<double>(static_cast<size_t>(nelements(*a.fused)), std::nan("")));
        compute(*a.fused, nth, false);
        for (tensor* n : a.chain) compute(*n, nth, false);
        CHECK(bytes_of(*a.fused) == bytes_of(*a.unfused));
      }
    }
  }
}

TEST_CASE("kernels: a decode step with few KV heads is split between the threads by cells and by values, with the unfused attention's bits", "[cpu][kernels][attention]") {
  // One query row and fewer items (KV heads x chunks of 6 query heads) than twice the threads: the scores are
  // computed by ranges of 512 cells, the softmax by head, the weighted sums by ranges of 16 of V's values
  // (72: a last range of 8), every thread working; each value is computed as an item computes it.
  struct shape {
    int64_t n_head, n_kv_head;
  };
  const int64_t n_kv = 1500;
  // Two runs of visible cells across several 512-cell ranges, a masked gap between them and cells after.
  auto visible = [](int64_t c, int64_t) { return (c >= 100 && c < 700) || (c >= 900 && c < 1400); };
  for (const shape sh : {shape{9, 3}, shape{4, 1}, shape{8, 2}, shape{12, 1}}) {
    for (type t : {type::f32, type::f16}) {
      for (int nth : {2, 3}) {
        INFO(sh.n_head << " heads over " << sh.n_kv_head << ", " << type_name(t) << ", threads " << nth);
        context ctx(arena(64));
        attn_case a = attention_of(ctx, t, 64, 72, n_kv, 1, visible, sh.n_head, sh.n_kv_head);
        REQUIRE(cpu::supports_op(*a.fused));
        // The work buffer holds the shared scores of every head.
        CHECK(cpu::work_size(*a.fused, nth, false) >= static_cast<size_t>(sh.n_head * n_kv) * sizeof(float));
        fill(*a.fused, std::vector<double>(static_cast<size_t>(nelements(*a.fused)), std::nan("")));
        compute(*a.fused, nth, false);
        for (tensor* n : a.chain) compute(*n, nth, false);
        CHECK(bytes_of(*a.fused) == bytes_of(*a.unfused));
      }
    }
  }
}

namespace {

// Attention over caches of any KV type: the fused op, and the unfused graph the model builds for such a cache
// (K's rows times the query rows, the softmax, V converted to f32 and multiplied).
struct quant_attn {
  tensor *q, *k, *v, *mask, *fused, *unfused;
  std::vector<tensor*> chain;
};

quant_attn quantized_attention(context& ctx, type tk, type tv, int64_t hd, int64_t n_kv, int64_t n_q, int64_t n_head,
                               int64_t n_kv_head, const std::function<bool(int64_t, int64_t)>& visible, uint32_t seed) {
  quant_attn c{};
  c.k = ctx.new_tensor_3d(tk, hd, n_kv, n_kv_head);
  c.v = ctx.new_tensor_3d(tv, hd, n_kv, n_kv_head);
  c.q = ctx.new_tensor_3d(type::f32, hd, n_head, n_q);
  c.mask = ctx.new_tensor_2d(type::f32, n_kv, n_q);
  for (tensor* t : {c.k, c.v}) {
    const std::vector<double> vals = random_values(static_cast<size_t>(nelements(*t)), seed++, -1.0, 1.0);
    if (traits(t->type).is_quantized) {
      quantize_into(*t, vals);
    } else {
      fill(*t, vals);
    }
  }
  fill_random(*c.q, seed, -2.0, 2.0);
  for_each(*c.mask, [&](int64_t i0, int64_t i1, int64_t, int64_t) { set(*c.mask, visible(i0, i1) ? 0.0 : -INFINITY, i0, i1); });
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  tensor* qp = permute(ctx, c.q, 0, 2, 1, 3);
  c.fused = flash_attn(ctx, qp, c.k, c.v, c.mask, scale);
  tensor* kq = mul_mat(ctx, c.k, qp);
  tensor* sm = soft_max(ctx, kq, c.mask, scale);
  tensor* vf = cpy(ctx, c.v, ctx.new_tensor_3d(type::f32, hd, n_kv, n_kv_head));
  tensor* vt = cont(ctx, permute(ctx, vf, 1, 0, 2, 3));
  tensor* kqv = mul_mat(ctx, vt, sm);
  c.unfused = cont(ctx, permute(ctx, kqv, 0, 2, 1, 3));
  c.chain = {kq, sm, vf, vt, kqv, c.unfused};
  return c;
}

}  // namespace

TEST_CASE("kernels: flash_attn reads quantized KV caches in their type, within 1e-3 of the unfused graph, and a sequence's output wherever its cells lie", "[cpu][kernels][attention]") {
  struct pair_of {
    type k, v;
  };
  struct shape {
    int64_t hd, n_kv, n_q, n_head, n_kv_head;
  };
  const std::vector<pair_of> types = {{type::q8_0, type::q8_0}, {type::q4_0, type::q4_0}, {type::q4_1, type::q4_1},
                                      {type::q5_0, type::q5_0}, {type::q5_1, type::q5_1}, {type::iq4_nl, type::iq4_nl},
                                      {type::bf16, type::bf16}, {type::q8_0, type::f16},  {type::f16, type::q4_0}};
  // Prompt rows (tiles of several rows), decode rows (one each, grouped query heads), one cell, a GQA ratio of
  // 1, 4 and 8, a fully masked row, head sizes of one and of several blocks.
  const std::vector<shape> shapes = {{64, 100, 13, 4, 2}, {32, 1, 1, 2, 2}, {128, 300, 3, 32, 8}, {96, 70, 5, 8, 1}};
  for (const pair_of t : types) {
    for (const shape sh : shapes) {
      for (int nth : {1, 3}) {
        INFO("k " << type_name(t.k) << ", v " << type_name(t.v) << ", hd " << sh.hd << ", " << sh.n_kv << " cells, " << sh.n_q
                  << " rows, heads " << sh.n_head << "/" << sh.n_kv_head << ", threads " << nth);
        context ctx(arena(128));
        // Row j sees the cells of its sequence (j % 2) up to 40 + 3 j; the last of several rows sees none.
        const auto visible = [&](int64_t c, int64_t j) {
          return (sh.n_q == 1 || j + 1 < sh.n_q) && (sh.n_q < 3 || (c / 5) % 2 == j % 2) && c <= 40 + 3 * j;
        };
        quant_attn a = quantized_attention(ctx, t.k, t.v, sh.hd, sh.n_kv, sh.n_q, sh.n_head, sh.n_kv_head, visible, 7);
        REQUIRE(cpu::supports_op(*a.fused));
        fill(*a.fused, std::vector<double>(static_cast<size_t>(nelements(*a.fused)), std::nan("")));
        compute(*a.fused, nth, false);
        for (tensor* n : a.chain) compute(*n, nth, false);
        const std::vector<double> want = values(*a.unfused), got = values(*a.fused);
        REQUIRE(want.size() == got.size());
        double top = 0;
        for (double x : want) top = std::max(top, std::fabs(x));
        double worst = 0;
        for (size_t i = 0; i < want.size(); ++i) worst = std::max(worst, std::fabs(got[i] - want[i]));
        CHECK(worst <= 1e-3 * std::max(top, 1e-6));
      }
    }
  }
  // One sequence spread over a shared cache and packed at the front of its own: the same bits.
  for (const pair_of t : types) {
    INFO("k " << type_name(t.k) << ", v " << type_name(t.v));
    context ctx(arena(64));
    quant_attn spread = quantized_attention(ctx, t.k, t.v, 64, 100, 1, 4, 2, [](int64_t c, int64_t) { return (c / 7) % 2 == 0; }, 11);
    std::vector<int64_t> cells;
    for (int64_t c = 0; c < 100; ++c) {
      if ((c / 7) % 2 == 0) cells.push_back(c);
    }
    const auto n_packed = static_cast<int64_t>(cells.size());
    quant_attn packed = quantized_attention(ctx, t.k, t.v, 64, n_packed, 1, 4, 2, [](int64_t, int64_t) { return true; }, 11);
    for (int64_t p = 0; p < n_packed; ++p) {
      for (int64_t g = 0; g < 2; ++g) {
        std::memcpy(at(*packed.k, 0, p, g, 0), at(*spread.k, 0, cells[static_cast<size_t>(p)], g, 0), row_size(t.k, 64));
        std::memcpy(at(*packed.v, 0, p, g, 0), at(*spread.v, 0, cells[static_cast<size_t>(p)], g, 0), row_size(t.v, 64));
      }
    }
    std::memcpy(packed.q->data, spread.q->data, nbytes(*spread.q));
    compute(*spread.fused, 2, false);
    compute(*packed.fused, 2, false);
    CHECK(bytes_of(*spread.fused) == bytes_of(*packed.fused));
  }
}

TEST_CASE("flash_attn refuses sources it cannot take, naming the op", "[cpu][kernels][attention]") {
  context ctx(arena());
  tensor* q = ctx.new_tensor_3d(type::f32, 64, 5, 4);
  tensor* k = ctx.new_tensor_3d(type::f16, 64, 32, 2);
  tensor* v = ctx.new_tensor_3d(type::f16, 64, 32, 2);
  tensor* mask = ctx.new_tensor_2d(type::f32, 32, 5);
  CHECK_NOTHROW(flash_attn(ctx, q, k, v, mask, 0.125f));
  CHECK_THROWS_WITH(flash_attn(ctx, q, ctx.new_tensor_3d(type::f16, 32, 32, 2), v, mask, 0.125f), Catch::Contains("flash_attn") && Catch::Contains("head size"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, k, ctx.new_tensor_3d(type::f16, 64, 31, 2), mask, 0.125f), Catch::Contains("same cells"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, ctx.new_tensor_3d(type::f16, 64, 32, 3), ctx.new_tensor_3d(type::f16, 64, 32, 3), mask, 0.125f), Catch::Contains("multiple"));
  CHECK_NOTHROW(flash_attn(ctx, q, ctx.new_tensor_3d(type::q8_0, 64, 32, 2), v, mask, 0.125f));  // (a quantized cache)

  CHECK_THROWS_WITH(flash_attn(ctx, q, k, v, ctx.new_tensor_2d(type::f32, 32, 4), 0.125f), Catch::Contains("mask"));
  CHECK_THROWS_WITH(flash_attn(ctx, q, k, v, mask, 0.0f), Catch::Contains("scale"));
}
