// Op conformance: every case of the table on every compiled backend, against the CPU reference path.
//
// The reference is the CPU backend in reference mode (scalar kernels, one thread, no BLAS). Every device in
// the registry is checked against it, plus the CPU backend itself at several thread counts (its optimized
// and threaded paths), each result within the case's NMSE bound and every element within its own bound
// (conformance_runner.h). A new backend joins by registering its device in register_builtin_backends(); no
// test code changes. Each target meets its own floor: a CPU target computes every case; any other device
// (Vulkan, CUDA) every case of every op the GPU backends compute (check_gpu_coverage), and what it does not
// compute by design (flash_attn, the CPU-only weight types, ...) is listed once, not skipped: the case ran.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <map>
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
#include "tests/support/skip.h"

using namespace troupe;
using namespace troupe::testing;

namespace {

struct target {
  std::string label;
  backend_ptr backend;
  bool must_support;                    // a CPU target: every case of the table
  std::map<std::string, int> compared;  // cases compared, per op (a case name's first word)
  std::vector<std::string> unsupported;  // cases its device does not compute (supports_op said so)
};

std::vector<target> targets() {
  register_builtin_backends();
  std::vector<target> out;
  for (device_i* dev : registry::instance().devices()) {
    out.push_back({std::string(dev->name()), dev->init_backend(), dev->type() == device_type::cpu, {}, {}});
  }
  for (int nth : {1, 2, 3}) {
    out.push_back({"CPU " + std::to_string(nth) + " threads", cpu::make_cpu_backend({.n_threads = nth}), true, {}, {}});
  }
  return out;
}

}  // namespace

TEST_CASE("every op on every backend matches the CPU reference", "[conformance]") {
  const auto cases = conformance_cases();
  REQUIRE(cases.size() > 100);
  auto reference = cpu::make_cpu_backend({.reference = true});
  auto devices = targets();
  for (size_t ci = 0; ci < cases.size(); ++ci) {
    const op_case& c = cases[ci];
    INFO("case: " << c.name);
    std::string why;
    const auto ref = run_case(c, ci, *reference, &why);
    INFO("unsupported node: " << why);
    REQUIRE(ref.has_value());
    REQUIRE(all_finite(*ref));
    const std::vector<double> bound = element_bounds(c, ci, *ref);
    for (target& t : devices) {
      std::string not_computed;
      if (check_case(c, ci, *ref, bound, *t.backend, t.label, t.must_support, &not_computed)) {
        ++t.compared[c.name.substr(0, c.name.find(' '))];
      } else {
        t.unsupported.push_back(c.name + " (" + not_computed + ")");
      }
    }
  }
  // Each target's own floor; the CPU targets cannot make up for a device that computed too little.
  int cpu_targets = 0, other_targets = 0;
  for (target& t : devices) {
    INFO("target: " << t.label);
    int n = 0;
    for (const auto& [op_name, k] : t.compared) n += k;
    if (t.must_support) {
      ++cpu_targets;
      CHECK(n == static_cast<int>(cases.size()));
      CHECK(t.unsupported.empty());
      continue;
    }
    ++other_targets;
    check_gpu_coverage(t.compared);
    CHECK(n > 0);
    if (!t.unsupported.empty()) {
      std::ostringstream list;
      for (size_t i = 0; i < t.unsupported.size() && i < 5; ++i) list << (i ? "; " : "") << t.unsupported[i];
      WARN(t.label << " computed " << n << " cases; " << t.unsupported.size()
                   << " others are not on the device by design (every op the GPU backends claim was covered): " << list.str()
                   << (t.unsupported.size() > 5 ? "; ..." : ""));
    }
  }
  CHECK(cpu_targets >= 4);  // the CPU device, and the CPU backend at 1, 2 and 3 threads
  // The GPU machine's script (TROUPE_REQUIRE_GPU=1) must see the table on a GPU too, not on the CPUs alone.
  if (other_targets == 0 && test::env_is("TROUPE_REQUIRE_GPU", "1")) {
    FAIL("TROUPE_REQUIRE_GPU=1 but the registry has no device other than the CPU");
  }
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
