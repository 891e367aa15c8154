#include "tests/backends/conformance_runner.h"

#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <random>

#include "backends/cpu/cpu_backend.h"
#include "runtime/graph.h"
#include "tests/support/random_blocks.h"

namespace troupe::testing {

// Bytes of one input, generated from (case, input) so every backend sees the same data.
std::vector<uint8_t> make_input_bytes(const case_input& in, uint32_t seed) {
  const tensor& t = *in.t;
  std::mt19937 rng(seed);
  const size_t n = static_cast<size_t>(nelements(t));
  std::vector<uint8_t> bytes(nbytes(t));
  if (t.type == type::i32 || t.type == type::i64) {
    std::vector<int64_t> v(n);
    if (in.how == fill::unique_rows) {
      const size_t row = static_cast<size_t>(t.ne[0]);
      for (size_t r = 0; r < n / row; ++r) {
        std::vector<int64_t> perm(static_cast<size_t>(in.range));
        for (size_t i = 0; i < perm.size(); ++i) perm[i] = static_cast<int64_t>(i);
        std::shuffle(perm.begin(), perm.end(), rng);
        for (size_t i = 0; i < row; ++i) v[r * row + i] = perm[i];
      }
    } else {
      std::uniform_int_distribution<int64_t> d(0, in.range - 1);
      for (auto& x : v) x = d(rng);
    }
    for (size_t i = 0; i < n; ++i) {
      if (t.type == type::i32) {
        const auto x = static_cast<int32_t>(v[i]);
        std::memcpy(bytes.data() + i * 4, &x, 4);
      } else {
        std::memcpy(bytes.data() + i * 8, &v[i], 8);
      }
    }
    return bytes;
  }
  if (traits(t.type).is_quantized && traits(t.type).from_float_ref == nullptr) {
    // A type troupe reads but does not write (the i-quants below 4 bits): random valid blocks.
    return test::random_blocks(t.type, static_cast<int64_t>(bytes.size() / type_size(t.type)), rng);
  }
  std::vector<float> f(n);
  if (in.how == fill::causal_mask) {
    const int64_t ne0 = t.ne[0], ne1 = t.ne[1];
    for (size_t i = 0; i < n; ++i) {
      const int64_t col = static_cast<int64_t>(i) % ne0;
      const int64_t row = (static_cast<int64_t>(i) / ne0) % ne1;
      f[i] = col <= row + (ne0 - ne1) ? 0.0f : -INFINITY;
    }
  } else if (in.how == fill::shared_mask) {
    const int64_t ne0 = t.ne[0], ne1 = t.ne[1];
    for (size_t i = 0; i < n; ++i) {
      const int64_t col = static_cast<int64_t>(i) % ne0;
      const int64_t row = (static_cast<int64_t>(i) / ne0) % ne1;
      f[i] = (col / 5) % 2 == row % 2 && col <= row + (ne0 - ne1) / 2 ? 0.0f : -INFINITY;
    }
  } else {
    std::uniform_real_distribution<float> d(in.how == fill::positive ? 0.1f : -1.0f, in.how == fill::positive ? 2.0f : 1.0f);
    for (auto& x : f) x = d(rng);
  }
  const type_traits& tr = traits(t.type);
  const size_t row_bytes = row_size(t.type, t.ne[0]);
  for (int64_t r = 0; r < nrows(t); ++r) {
    tr.from_float_ref(f.data() + r * t.ne[0], bytes.data() + static_cast<size_t>(r) * row_bytes, t.ne[0]);
  }
  return bytes;
}

std::vector<float> to_f32(const tensor& t, const std::vector<uint8_t>& bytes) {
  const size_t n = static_cast<size_t>(nelements(t));
  std::vector<float> out(n);
  if (t.type == type::i32) {
    for (size_t i = 0; i < n; ++i) {
      int32_t v;
      std::memcpy(&v, bytes.data() + i * 4, 4);
      out[i] = static_cast<float>(v);
    }
    return out;
  }
  const size_t row_bytes = row_size(t.type, t.ne[0]);
  for (int64_t r = 0; r < nrows(t); ++r) {
    traits(t.type).to_float(bytes.data() + static_cast<size_t>(r) * row_bytes, out.data() + r * t.ne[0], t.ne[0]);
  }
  return out;
}

// Runs one case on one backend; empty when the device does not support one of the case's nodes.
std::optional<std::vector<float>> run_case(const op_case& c, size_t case_index, backend_i& be, std::string* unsupported) {
  device_i& dev = be.device();
  context ctx({.max_tensors = 256, .no_alloc = true});
  case_builder b(ctx);
  tensor* out = c.build(b);
  out->flags |= flag_output;
  graph g;
  g.build_forward_expand(out);
  for (tensor* node : g.nodes()) {
    if (!dev.supports_op(*node)) {
      if (unsupported) *unsupported = describe(*node) + " (" + std::string(op_name(node->op)) + ")";
      return std::nullopt;
    }
  }
  buffer_ptr buf = alloc_ctx_tensors(ctx, dev.buffer_type());
  REQUIRE(buf != nullptr);
  for (size_t i = 0; i < b.inputs().size(); ++i) {
    const case_input& in = b.inputs()[i];
    const auto bytes = make_input_bytes(in, static_cast<uint32_t>(case_index * 131 + i * 7 + 1));
    tensor_set(*in.t, bytes.data(), 0, bytes.size());
  }
  be.graph_compute(g);
  REQUIRE(is_contiguous(*out));
  std::vector<uint8_t> bytes(nbytes(*out));
  tensor_get(*out, bytes.data(), 0, bytes.size());
  return to_f32(*out, bytes);
}

double nmse(const std::vector<float>& x, const std::vector<float>& ref) {
  double err = 0.0, norm = 0.0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(x[i]) - static_cast<double>(ref[i]);
    err += d * d;
    norm += static_cast<double>(ref[i]) * static_cast<double>(ref[i]);
  }
  return norm > 0.0 ? err / norm : err;
}

bool all_finite(const std::vector<float>& v) {
  for (float x : v) {
    if (!std::isfinite(x)) return false;
  }
  return true;
}

bool check_case(const op_case& c, size_t ci, const std::vector<float>& ref, backend_i& be, const std::string& label,
                bool must_support) {
  INFO("backend: " << label);
  std::string why;
  const auto got = run_case(c, ci, be, &why);
  if (!got) {
    if (must_support) FAIL("the CPU must support every case; unsupported: " << why);
    WARN(label << " does not support " << why << "; case '" << c.name << "' skipped there");
    return false;
  }
  REQUIRE(got->size() == ref.size());
  REQUIRE(all_finite(*got));
  const double e = nmse(*got, ref);
  INFO("nmse " << e << " (bound " << c.max_nmse << ")");
  CHECK(e <= c.max_nmse);
  return true;
}

std::map<std::string, int> compare_supported_cases(backend_i& be) {
  auto reference = cpu::make_cpu_backend({.reference = true});
  const auto cases = conformance_cases();
  std::map<std::string, int> compared;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const op_case& c = cases[ci];
    INFO("case: " << c.name);
    const auto got = run_case(c, ci, be, nullptr);
    if (!got) continue;  // a node this device does not compute (supports_op said so)
    const auto ref = run_case(c, ci, *reference, nullptr);
    REQUIRE(ref.has_value());
    REQUIRE(got->size() == ref->size());
    REQUIRE(all_finite(*got));
    const double e = nmse(*got, *ref);
    INFO("nmse " << e << " (bound " << c.max_nmse << ")");
    CHECK(e <= c.max_nmse);
    ++compared[c.name.substr(0, c.name.find(' '))];
  }
  return compared;
}

bool is_gpu_mul_mat_case(const op_case& c) {
  if (c.name.rfind("mul_mat ", 0) != 0) return false;
  const auto wt = type_from_name(c.name.substr(8, c.name.find(' ', 8) - 8));
  return wt && is_gpu_weight_type(*wt);
}

void check_gpu_coverage(std::map<std::string, int>& compared) {
  // Every case of every op it claims, with broadcasting and strided inputs among them.
  for (const char* o : {"add", "sub", "mul", "div"}) {
    INFO("op " << o);
    CHECK(compared[o] >= 5);
  }
  CHECK(compared["soft_max"] >= 4);                    // plain, f32 and f16 causal masks, ALiBi
  CHECK(compared["swiglu"] + compared["geglu"] >= 6);  // split, split swapped, with b: each kind
  CHECK(compared["get_rows"] == 14);                   // f32, f16, bf16, q4_0, q8_0, q4_K, q6_K; i32 and i64
  CHECK(compared["cpy"] >= 6);                         // f32 -> f32 / f16 / bf16, back, transposed
  CHECK(compared["cont"] >= 2);
  CHECK(compared["set_rows"] == 8);  // into f32, f16, bf16 and q8_0 rows; i32 and i64 indices
  CHECK(compared["rope"] == 7);      // normal, neox, partial, linear scaling, YaRN, freq_factors
  for (const char* o : {"scale", "silu", "gelu", "rms_norm", "norm", "concat", "pad", "sum_rows", "mean", "argmax"}) {
    INFO("op " << o);
    CHECK(compared[o] >= 1);
  }
  // mul_mat: every case of the table whose weight type the GPU backends compute (f32, f16, bf16, the classic
  // and K quants) at every shape (matrix-vector and tiled, broadcast, row lengths with tails, a permuted b, a
  // KV cache view). The i-quants, ternary and MXFP4 types are CPU-only: their weights stay in host buffers.
  size_t mul_mat_cases = 0;
  for (const auto& c : conformance_cases()) mul_mat_cases += is_gpu_mul_mat_case(c) ? 1 : 0;
  CHECK(compared["mul_mat"] == static_cast<int>(mul_mat_cases));
  CHECK(mul_mat_cases >= 13 * (3 + 1 + 8) + 3 * 4 + 2);
}

}  // namespace troupe::testing
