#include "backends/cpu/cpu_features.h"

#include <cstdint>
#include <cstdlib>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

namespace troupe::cpu {

namespace {

#if defined(__x86_64__) || defined(__i386__)

struct regs {
  unsigned a = 0, b = 0, c = 0, d = 0;
};

regs cpuid(unsigned leaf, unsigned sub) {
  regs r;
  if (__get_cpuid_count(leaf, sub, &r.a, &r.b, &r.c, &r.d) == 0) return {};
  return r;
}

// XCR0: which register states the OS saves on context switches. Read with xgetbv (inline asm, so this file
// needs no -mxsave).
uint64_t xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool bit(unsigned v, int i) { return ((v >> i) & 1u) != 0; }

cpu_features detect() {
  cpu_features f;
  const unsigned max_leaf = cpuid(0, 0).a;
  if (max_leaf < 1) return f;
  const regs l1 = cpuid(1, 0);
  f.sse42 = bit(l1.c, 20);
  const bool osxsave = bit(l1.c, 27);
  const uint64_t xcr = osxsave ? xcr0() : 0;
  const bool ymm_state = (xcr & 0x6) == 0x6;             // SSE and AVX state
  const bool zmm_state = ymm_state && (xcr & 0xE0) == 0xE0;  // opmask, upper zmm0-15, zmm16-31
  f.avx = bit(l1.c, 28) && ymm_state;
  f.fma = bit(l1.c, 12) && f.avx;
  f.f16c = bit(l1.c, 29) && f.avx;
  if (max_leaf >= 7) {
    const regs l7 = cpuid(7, 0);
    f.avx2 = bit(l7.b, 5) && f.avx;
    f.avx512f = bit(l7.b, 16) && zmm_state;
    f.avx512dq = bit(l7.b, 17) && f.avx512f;
    f.avx512bw = bit(l7.b, 30) && f.avx512f;
    f.avx512vl = bit(l7.b, 31) && f.avx512f;
    f.avx512vnni = bit(l7.c, 11) && f.avx512f;
    if (l7.a >= 1) {
      const regs l7s1 = cpuid(7, 1);
      f.avx_vnni = bit(l7s1.a, 4) && f.avx;
      f.avx512bf16 = bit(l7s1.a, 5) && f.avx512f;
    }
  }
  return f;
}

#else

cpu_features detect() { return {}; }

#endif

isa best_isa(const cpu_features& f) {
#if defined(__x86_64__)
  if (f.avx512_level()) return isa::avx512;
  if (f.avx2_level()) return isa::avx2;
#else
  (void)f;
#endif
  return isa::scalar;
}

}  // namespace

std::string cpu_features::describe() const {
  std::string s;
  auto add = [&](bool on, const char* name) {
    if (!on) return;
    if (!s.empty()) s += ' ';
    s += name;
  };
  add(sse42, "sse4.2");
  add(avx, "avx");
  add(avx2, "avx2");
  add(fma, "fma");
  add(f16c, "f16c");
  add(avx_vnni, "avx_vnni");
  add(avx512f, "avx512f");
  add(avx512dq, "avx512dq");
  add(avx512bw, "avx512bw");
  add(avx512vl, "avx512vl");
  add(avx512vnni, "avx512_vnni");
  add(avx512bf16, "avx512_bf16");
  return s.empty() ? "none" : s;
}

const cpu_features& host_cpu_features() {
  static const cpu_features f = detect();
  return f;
}

std::string_view isa_name(isa level) {
  switch (level) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::avx512: return "avx512";
  }
  return "scalar";
}

std::optional<isa> isa_from_name(std::string_view name) {
  for (isa l : {isa::scalar, isa::avx2, isa::avx512}) {
    if (isa_name(l) == name) return l;
  }
  return std::nullopt;
}

bool isa_supported(isa level) { return static_cast<int>(level) <= static_cast<int>(best_isa(host_cpu_features())); }

isa active_isa() {
  static const isa level = [] {
    isa best = best_isa(host_cpu_features());
    if (const char* env = std::getenv("TROUPE_CPU_ISA")) {
      const std::optional<isa> want = isa_from_name(env);
      if (want && static_cast<int>(*want) < static_cast<int>(best)) best = *want;
    }
    return best;
  }();
  return level;
}

}  // namespace troupe::cpu
