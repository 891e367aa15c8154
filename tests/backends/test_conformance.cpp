// Op conformance: every case of the table on every compiled backend, against the CPU reference path.
//
// The reference is the CPU backend in reference mode (scalar kernels, one thread, no BLAS). Every device in
// the registry is checked against it, plus the CPU backend itself at several thread counts (its optimized
// and threaded paths). A new backend joins by registering its device in register_builtin_backends(); no
// test code changes. A device that does not support a case's op skips that case (and says so); the CPU
// must support every case.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <sstream>

#include "backends/cpu/cpu_backend.h"
#include "backends/registry.h"
#include "runtime/backend.h"
#include "runtime/fp16.h"
#include "runtime/graph.h"
#include "tests/backends/conformance_cases.h"

using namespace troupe;
using namespace troupe::testing;

namespace {

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
  std::vector<float> f(n);
  if (in.how == fill::causal_mask) {
    const int64_t ne0 = t.ne[0], ne1 = t.ne[1];
    for (size_t i = 0; i < n; ++i) {
      const int64_t col = static_cast<int64_t>(i) % ne0;
      const int64_t row = (static_cast<int64_t>(i) / ne0) % ne1;
      f[i] = col <= row + (ne0 - ne1) ? 0.0f : -INFINITY;
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

struct target {
  std::string label;
  backend_ptr backend;
  bool must_support;
};

std::vector<target> targets() {
  register_builtin_backends();
  std::vector<target> out;
  for (device_i* dev : registry::instance().devices()) {
    out.push_back({std::string(dev->name()), dev->init_backend(), dev->type() == device_type::cpu});
  }
  for (int nth : {1, 2, 3}) {
    out.push_back({"CPU " + std::to_string(nth) + " threads", cpu::make_cpu_backend({.n_threads = nth}), true});
  }
  return out;
}

}  // namespace

TEST_CASE("every op on every backend matches the CPU reference", "[conformance]") {
  const auto cases = conformance_cases();
  REQUIRE(cases.size() > 100);
  auto reference = cpu::make_cpu_backend({.reference = true});
  auto devices = targets();
  size_t compared = 0;
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const op_case& c = cases[ci];
    INFO("case: " << c.name);
    std::string why;
    const auto ref = run_case(c, ci, *reference, &why);
    INFO("unsupported node: " << why);
    REQUIRE(ref.has_value());
    REQUIRE(all_finite(*ref));
    for (target& t : devices) {
      INFO("backend: " << t.label);
      const auto got = run_case(c, ci, *t.backend, &why);
      if (!got) {
        if (t.must_support) FAIL("the CPU must support every case; unsupported: " << why);
        WARN(t.label << " does not support " << why << "; case '" << c.name << "' skipped there");
        continue;
      }
      REQUIRE(got->size() == ref->size());
      REQUIRE(all_finite(*got));
      const double e = nmse(*got, *ref);
      INFO("nmse " << e << " (bound " << c.max_nmse << ")");
      CHECK(e <= c.max_nmse);
      ++compared;
    }
  }
  CHECK(compared >= cases.size() * 4);
}

TEST_CASE("the reference path itself is deterministic", "[conformance]") {
  const auto cases = conformance_cases();
  auto reference = cpu::make_cpu_backend({.reference = true});
  for (size_t ci = 0; ci < cases.size(); ci += 7) {
    INFO("case: " << cases[ci].name);
    const auto a = run_case(cases[ci], ci, *reference, nullptr);
    const auto b = run_case(cases[ci], ci, *reference, nullptr);
    REQUIRE(a.has_value());
    CHECK(*a == *b);
  }
}
