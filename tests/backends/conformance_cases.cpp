#include "tests/backends/conformance_cases.h"

#include "runtime/ops.h"

namespace troupe::testing {

tensor* case_builder::input(type t, std::array<int64_t, 4> ne, fill how, int64_t range) {
  tensor* x = ctx_.new_tensor(t, 4, ne.data());
  x->flags |= flag_input;
  x->set_name("in" + std::to_string(inputs_.size()));
  inputs_.push_back({x, how, range});
  return x;
}

namespace {

using shape = std::array<int64_t, 4>;

// Tolerances (normalised mean squared error over the whole result): ops computed in f32 the same way
// everywhere agree to rounding; matrix products may take a different path (BLAS over dequantized weights vs.
// quantized activations), which differs by the activation quantization error. Every element is held to its
// own bound as well (conformance_runner.cpp, element_bounds: derived from the inputs for matrix products and
// flash_attn, 16 sqrt(tolerance) of the result's scale for the rest), which a single wrong element or a
// column a few percent off fails whatever the NMSE of the whole.
constexpr double exact = 1e-7;
constexpr double f32_math = 1e-6;
constexpr double matmul = 5e-4;

const type weight_types[] = {type::f32,  type::f16,  type::bf16, type::q4_0, type::q4_1, type::q5_0, type::q5_1,
                             type::q8_0, type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K,
                             type::iq4_nl, type::iq4_xs, type::mxfp4, type::tq1_0, type::tq2_0,
                             type::iq2_xxs, type::iq2_xs, type::iq2_s, type::iq3_xxs, type::iq3_s, type::iq1_s,
                             type::iq1_m};

std::string str(const shape& s) {
  return "[" + std::to_string(s[0]) + "," + std::to_string(s[1]) + "," + std::to_string(s[2]) + "," +
         std::to_string(s[3]) + "]";
}

}  // namespace

std::vector<op_case> conformance_cases() {
  std::vector<op_case> cases;
  auto add_case = [&](std::string name, double tol, std::function<tensor*(case_builder&)> f) {
    cases.push_back({std::move(name), tol, std::move(f)});
  };

  // ---- binary ops with broadcasting ----
  using binary_fn = tensor* (*)(context&, tensor*, tensor*);
  const std::pair<const char*, binary_fn> binaries[] = {{"add", add}, {"sub", sub}, {"mul", mul}, {"div", div}};
  const shape a_shape{10, 5, 4, 3};
  const shape b_shapes[] = {{10, 5, 4, 3}, {10, 1, 1, 1}, {10, 5, 1, 1}, {1, 1, 1, 1}, {5, 5, 2, 3}};
  for (auto [name, fn] : binaries) {
    for (const shape& bs : b_shapes) {
      add_case(std::string(name) + " b=" + str(bs), f32_math, [fn, a_shape, bs, name = std::string(name)](case_builder& b) {
        tensor* x = b.input(type::f32, a_shape);
        tensor* y = b.input(type::f32, bs, name == "div" ? fill::positive : fill::uniform);
        return fn(b.ctx(), x, y);
      });
    }
  }
  add_case("add on a permuted a", f32_math, [](case_builder& b) {
    tensor* x = b.input(type::f32, {10, 5, 4, 3});
    tensor* y = b.input(type::f32, {5, 10, 4, 1});
    return add(b.ctx(), permute(b.ctx(), x, 1, 0, 2, 3), y);
  });

  // ---- unary, scale, norms ----
  for (const shape& s : {shape{10, 5, 4, 3}, shape{1, 1, 1, 1}, shape{257, 3, 1, 1}}) {
    add_case("scale " + str(s), exact, [s](case_builder& b) { return scale(b.ctx(), b.input(type::f32, s), 0.75f, -0.5f); });
    add_case("silu " + str(s), f32_math, [s](case_builder& b) { return silu(b.ctx(), b.input(type::f32, s)); });
    add_case("gelu " + str(s), f32_math, [s](case_builder& b) { return gelu(b.ctx(), b.input(type::f32, s)); });
    add_case("rms_norm " + str(s), f32_math, [s](case_builder& b) { return rms_norm(b.ctx(), b.input(type::f32, s), 1e-5f); });
    add_case("norm " + str(s), f32_math, [s](case_builder& b) { return norm(b.ctx(), b.input(type::f32, s), 1e-6f); });
  }
  for (glu_kind kind : {glu_kind::swiglu, glu_kind::geglu}) {
    const std::string k = kind == glu_kind::swiglu ? "swiglu" : "geglu";
    add_case(k + " split", f32_math, [kind](case_builder& b) { return glu(b.ctx(), b.input(type::f32, {64, 5, 2, 1}), nullptr, kind); });
    add_case(k + " split swapped", f32_math,
             [kind](case_builder& b) { return glu(b.ctx(), b.input(type::f32, {64, 5, 2, 1}), nullptr, kind, true); });
    add_case(k + " with b", f32_math, [kind](case_builder& b) {
      return glu(b.ctx(), b.input(type::f32, {40, 7, 1, 1}), b.input(type::f32, {40, 7, 1, 1}), kind);
    });
  }

  // ---- rope ----
  struct rope_case {
    const char* name;
    rope_mode mode;
    int n_dims;
    float freq_scale;
    float ext_factor;
    bool factors;
  };
  const rope_case ropes[] = {
      {"normal", rope_mode::normal, 64, 1.0f, 0.0f, false},
      {"neox", rope_mode::neox, 64, 1.0f, 0.0f, false},
      {"normal partial", rope_mode::normal, 32, 1.0f, 0.0f, false},
      {"neox partial", rope_mode::neox, 16, 1.0f, 0.0f, false},
      {"neox linear scaling", rope_mode::neox, 64, 0.25f, 0.0f, false},
      {"normal yarn", rope_mode::normal, 64, 0.25f, 1.0f, false},
      {"neox freq_factors", rope_mode::neox, 64, 1.0f, 0.0f, true},
  };
  for (const rope_case& rc : ropes) {
    add_case(std::string("rope ") + rc.name, f32_math, [rc](case_builder& b) {
      tensor* x = b.input(type::f32, {64, 4, 7, 1});
      tensor* pos = b.input(type::i32, {7, 1, 1, 1}, fill::indices, 4096);
      tensor* ff = rc.factors ? b.input(type::f32, {32, 1, 1, 1}, fill::positive) : nullptr;
      rope_params p;
      p.n_dims = rc.n_dims;
      p.mode = rc.mode;
      p.freq_base = 10000.0f;
      p.freq_scale = rc.freq_scale;
      p.ext_factor = rc.ext_factor;
      p.n_ctx_orig = 2048;
      return rope(b.ctx(), x, pos, ff, p);
    });
  }

  // ---- soft_max ----
  add_case("soft_max", f32_math, [](case_builder& b) { return soft_max(b.ctx(), b.input(type::f32, {32, 8, 4, 1}), nullptr, 1.0f); });
  add_case("soft_max causal mask f32", f32_math, [](case_builder& b) {
    return soft_max(b.ctx(), b.input(type::f32, {32, 8, 4, 1}), b.input(type::f32, {32, 8, 1, 1}, fill::causal_mask), 0.125f);
  });
  add_case("soft_max causal mask f16", f32_math, [](case_builder& b) {
    return soft_max(b.ctx(), b.input(type::f32, {32, 8, 4, 1}), b.input(type::f16, {32, 16, 1, 1}, fill::causal_mask), 0.125f);
  });
  add_case("soft_max alibi", f32_math, [](case_builder& b) {
    return soft_max(b.ctx(), b.input(type::f32, {32, 8, 4, 1}), b.input(type::f32, {32, 8, 1, 1}, fill::causal_mask), 0.5f, 8.0f);
  });

  // ---- matrix products: every weight type, matrix-vector and matrix-matrix, broadcast, strided b ----
  for (type wt : weight_types) {
    const std::string tn(type_name(wt));
    for (int64_t n : {1, 7, 64, 512}) {  // up to a whole micro-batch: the matrix-matrix register tiles
      add_case("mul_mat " + tn + " 256x96 n=" + std::to_string(n), matmul, [wt, n](case_builder& b) {
        return mul_mat(b.ctx(), b.input(wt, {256, 96, 1, 1}), b.input(type::f32, {256, n, 1, 1}));
      });
    }
    add_case("mul_mat " + tn + " broadcast", matmul, [wt](case_builder& b) {
      return mul_mat(b.ctx(), b.input(wt, {256, 16, 2, 1}), b.input(type::f32, {256, 5, 6, 2}));
    });
    // Longer rows (the SIMD kernels' unrolled loops and tails), a row count that is no multiple of the
    // threads' chunks, batches of a few sequences decoding at once (the tile kernels), and batches on both
    // sides of the BLAS crossover.
    for (int64_t n : {1, 2, 3, 4, 5, 8, 17, 70}) {
      add_case("mul_mat " + tn + " 1280x67 n=" + std::to_string(n), matmul, [wt, n](case_builder& b) {
        return mul_mat(b.ctx(), b.input(wt, {1280, 67, 1, 1}), b.input(type::f32, {1280, n, 1, 1}));
      });
    }
  }
  for (type wt : {type::f32, type::f16, type::bf16}) {  // any row length: vector tails of the float dots
    for (int64_t k : {1, 15, 100, 131}) {
      add_case("mul_mat " + std::string(type_name(wt)) + " k=" + std::to_string(k), matmul, [wt, k](case_builder& b) {
        return mul_mat(b.ctx(), b.input(wt, {k, 9, 1, 1}), b.input(type::f32, {k, 3, 1, 1}));
      });
    }
  }
  add_case("mul_mat f32 permuted b", matmul, [](case_builder& b) {
    tensor* bt = b.input(type::f32, {64, 4, 5, 1});  // [k, heads, tokens] viewed as [k, tokens, heads]
    return mul_mat(b.ctx(), b.input(type::f32, {64, 12, 4, 1}), permute(b.ctx(), bt, 0, 2, 1, 3));
  });
  // V in a row per cell (the CPU's layout for host layers) read transposed: a column-major a, [n_kv, hd]
  // per head, broadcast over the query heads. Not named "mul_mat ...": the devices keep V transposed and
  // skip these, and their coverage check counts the "mul_mat " cases.
  for (type wt : {type::f32, type::f16}) {
    for (int64_t n : {1, 7, 64}) {
      add_case("column-major mul_mat " + std::string(type_name(wt)) + " n=" + std::to_string(n), matmul,
               [wt, n](case_builder& b) {
                 tensor* v = b.input(wt, {72, 40, 2, 1});  // [hd, n_kv, heads]: a row per cell
                 return mul_mat(b.ctx(), permute(b.ctx(), v, 1, 0, 2, 3), b.input(type::f32, {40, n, 4, 1}));
               });
    }
  }
  add_case("mul_mat f16 kv-cache view", matmul, [](case_builder& b) {
    tensor* cache = b.input(type::f16, {128, 32, 1, 1});  // [n_embd_kv, n_ctx]
    tensor* k = view_3d(b.ctx(), cache, 32, 20, 4, cache->nb[1], 32 * type_size(type::f16), 0);  // [head_dim, n_kv, heads]
    return mul_mat(b.ctx(), k, b.input(type::f32, {32, 3, 4, 1}));
  });

  // ---- fused attention (the CPU's: host layers keep K and V in a row per cell; devices do not take it) ----
  // q [hd, heads, tokens] read as [hd, tokens, heads]; 4 query heads over 2 KV heads; causal and two
  // sequences sharing the cache; head sizes with 16-value vectors and tails; query tiles of 6 and partial.
  for (type kt : {type::f32, type::f16}) {
    for (int64_t n : {1, 7, 64}) {
      for (fill mf : {fill::causal_mask, fill::shared_mask}) {
        const int64_t n_kv = n + 37;
        add_case("flash_attn " + std::string(type_name(kt)) + (mf == fill::causal_mask ? " causal" : " shared") +
                     " n=" + std::to_string(n),
                 matmul, [kt, n, n_kv, mf](case_builder& b) {
                   tensor* q = b.input(type::f32, {64, 4, n, 1});
                   tensor* k = b.input(kt, {64, n_kv, 2, 1});
                   tensor* v = b.input(kt, {72, n_kv, 2, 1});
                   tensor* mask = b.input(type::f32, {n_kv, n, 1, 1}, mf);
                   return flash_attn(b.ctx(), permute(b.ctx(), q, 0, 2, 1, 3), k, v, mask, 0.125f);
                 });
      }
    }
  }
  add_case("flash_attn f16 no mask head size 20", matmul, [](case_builder& b) {
    tensor* q = b.input(type::f32, {32, 2, 9, 1});
    return flash_attn(b.ctx(), permute(b.ctx(), q, 0, 2, 1, 3), b.input(type::f16, {32, 50, 1, 1}),
                      b.input(type::f16, {20, 50, 1, 1}), nullptr, 0.2f);
  });

  // ---- rows ----
  for (type wt : {type::f32, type::f16, type::bf16, type::q4_0, type::q8_0, type::q4_K, type::q6_K}) {
    for (type it : {type::i32, type::i64}) {
      add_case("get_rows " + std::string(type_name(wt)) + " idx " + std::string(type_name(it)), exact, [wt, it](case_builder& b) {
        return get_rows(b.ctx(), b.input(wt, {256, 10, 3, 1}), b.input(it, {5, 3, 1, 1}, fill::indices, 10));
      });
    }
  }
  for (type dt : {type::f32, type::f16, type::bf16, type::q8_0, type::q4_0, type::q4_1, type::q5_0, type::q5_1, type::iq4_nl}) {
    for (type it : {type::i32, type::i64}) {
      add_case("set_rows " + std::string(type_name(dt)) + " idx " + std::string(type_name(it)), exact, [dt, it](case_builder& b) {
        tensor* dst = b.input(dt, {64, 20, 2, 1});
        tensor* src = b.input(type::f32, {64, 5, 2, 1});
        tensor* idx = b.input(it, {5, 1, 1, 1}, fill::unique_rows, 20);
        return set_rows(b.ctx(), dst, src, idx);
      });
    }
  }

  // ---- copies and conversions ----
  for (type dt : {type::f32, type::f16, type::bf16, type::q8_0, type::q4_0, type::q4_K}) {
    add_case("cpy f32 -> " + std::string(type_name(dt)), exact, [dt](case_builder& b) {
      return cpy(b.ctx(), b.input(type::f32, {256, 6, 2, 1}), b.input(dt, {256, 6, 2, 1}));
    });
  }
  for (type st : {type::f16, type::bf16}) {
    add_case("cpy " + std::string(type_name(st)) + " -> f32", exact, [st](case_builder& b) {
      return cpy(b.ctx(), b.input(st, {33, 6, 2, 1}), b.input(type::f32, {33, 6, 2, 1}));
    });
  }
  add_case("cpy transposed f32 -> f16", exact, [](case_builder& b) {
    tensor* x = b.input(type::f32, {12, 9, 2, 1});
    return cpy(b.ctx(), transpose(b.ctx(), x), b.input(type::f16, {9, 12, 2, 1}));
  });
  add_case("cont permuted", exact, [](case_builder& b) {
    return cont(b.ctx(), permute(b.ctx(), b.input(type::f32, {10, 5, 4, 3}), 0, 2, 1, 3));
  });
  add_case("cont reshaped transpose", exact, [](case_builder& b) {
    return cont(b.ctx(), transpose(b.ctx(), b.input(type::f32, {10, 6, 1, 1})), 60);
  });
  for (int dim = 0; dim < 4; ++dim) {
    add_case("concat dim " + std::to_string(dim), exact, [dim](case_builder& b) {
      shape sa{6, 5, 4, 3};
      shape sb = sa;
      sb[static_cast<size_t>(dim)] = 2;
      return concat(b.ctx(), b.input(type::f32, sa), b.input(type::f32, sb), dim);
    });
  }
  add_case("pad", exact, [](case_builder& b) { return pad(b.ctx(), b.input(type::f32, {10, 5, 4, 3}), 2, 1, 0, 1); });

  // ---- reductions ----
  add_case("sum_rows", f32_math, [](case_builder& b) { return sum_rows(b.ctx(), b.input(type::f32, {33, 5, 4, 1})); });
  add_case("mean", f32_math, [](case_builder& b) { return mean(b.ctx(), b.input(type::f32, {33, 5, 4, 1})); });
  add_case("argmax", exact, [](case_builder& b) { return argmax(b.ctx(), b.input(type::f32, {100, 7, 1, 1})); });

  // ---- mixtures of experts: the chosen experts' products, the router's choice, its sigmoid gate ----
  // ids distinct per token (as a router chooses); 8 experts, 3 chosen; the token's one row for every choice,
  // or a row per choice (the down projection's input); a prompt whose experts get more than one chunk of
  // pairs.
  for (type wt : {type::f32, type::f16, type::bf16, type::q4_0, type::q8_0, type::q4_K, type::q6_K, type::iq4_nl}) {
    const std::string tn(type_name(wt));
    for (int64_t n : {1, 5, 40}) {
      add_case("mul_mat_id " + tn + " n=" + std::to_string(n), matmul, [wt, n](case_builder& b) {
        tensor* ids = b.input(type::i32, {3, n, 1, 1}, fill::unique_rows, 8);
        return mul_mat_id(b.ctx(), b.input(wt, {256, 48, 8, 1}), b.input(type::f32, {256, 1, n, 1}), ids);
      });
    }
  }
  add_case("mul_mat_id q8_0 a row per choice", matmul, [](case_builder& b) {
    tensor* ids = b.input(type::i32, {3, 6, 1, 1}, fill::unique_rows, 8);
    return mul_mat_id(b.ctx(), b.input(type::q8_0, {64, 40, 8, 1}), b.input(type::f32, {64, 3, 6, 1}), ids);
  });
  add_case("mul_mat_id q4_K 100 tokens over 4 experts", matmul, [](case_builder& b) {
    tensor* ids = b.input(type::i32, {2, 100, 1, 1}, fill::unique_rows, 4);
    return mul_mat_id(b.ctx(), b.input(type::q4_K, {256, 70, 4, 1}), b.input(type::f32, {256, 1, 100, 1}), ids);
  });
  add_case("top_k", exact, [](case_builder& b) { return top_k(b.ctx(), b.input(type::f32, {60, 7, 2, 1}), 4); });
  add_case("top_k all", exact, [](case_builder& b) { return top_k(b.ctx(), b.input(type::f32, {8, 5, 1, 1}), 8); });
  add_case("sigmoid", f32_math, [](case_builder& b) { return sigmoid(b.ctx(), b.input(type::f32, {33, 5, 4, 1})); });

  // ---- a small chain: norm -> matmul -> rope -> softmax, as in attention ----
  add_case("attention chain", matmul, [](case_builder& b) {
    context& c = b.ctx();
    tensor* x = b.input(type::f32, {64, 6, 1, 1});
    tensor* wq = b.input(type::q8_0, {64, 64, 1, 1});
    tensor* pos = b.input(type::i32, {6, 1, 1, 1}, fill::indices, 100);
    tensor* q = mul_mat(c, wq, rms_norm(c, x, 1e-5f));            // [64, 6]
    q = reshape(c, q, 16, 4, 6);                                  // [head_dim, heads, tokens]
    rope_params p;
    p.n_dims = 16;
    q = rope(c, q, pos, nullptr, p);
    tensor* qp = permute(c, q, 0, 2, 1, 3);                       // [head_dim, tokens, heads]
    tensor* kq = mul_mat(c, cont(c, qp), qp);                     // [tokens, tokens, heads]
    return soft_max(c, kq, b.input(type::f32, {6, 6, 1, 1}, fill::causal_mask), 0.25f);
  });

  return cases;
}

}  // namespace troupe::testing
