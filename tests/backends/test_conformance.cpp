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
#include "tests/backends/conformance_runner.h"

using namespace troupe;
using namespace troupe::testing;

namespace {

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
      if (check_case(c, ci, *ref, *t.backend, t.label, t.must_support)) ++compared;
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
