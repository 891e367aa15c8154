// What the host CPU can execute, detected once, and the instruction-set level the CPU kernels use.
//
//   const cpu_features& f = host_cpu_features();   // cpuid + xgetbv, cached
//   if (f.avx512()) ...                            // AVX-512 F/BW/VL usable (the OS saves zmm state)
//   isa level = active_isa();                      // the best available, or TROUPE_CPU_ISA if lower
//
// One binary runs on any x86-64: the SIMD kernels live in translation units compiled with their own target
// flags (backends/cpu/simd/), and nothing calls into them unless the level they need is available here.
// Non-x86 builds report no features and use the scalar kernels.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace troupe::cpu {

struct cpu_features {
  bool sse42 = false;
  bool avx = false;   // AVX usable: CPU support and OS-saved ymm state (XCR0 bits 1, 2)
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;  // each AVX-512 flag also requires OS-saved opmask / zmm state (XCR0 bits 5..7)
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512vnni = false;
  bool avx512bf16 = false;
  bool avx_vnni = false;  // VEX-encoded VNNI (AVX-VNNI), usable without AVX-512

  // The kernel levels below, in terms of these flags.
  bool avx2_level() const { return avx2 && fma && f16c; }
  bool avx512_level() const { return avx2_level() && avx512f && avx512bw && avx512vl && avx512dq && avx512vnni; }

  // "avx2 fma f16c avx512f ..." : the flags that are set, for logs and benchmark headers.
  std::string describe() const;
};

// The host's features, detected on first use.
const cpu_features& host_cpu_features();

// Instruction-set levels of the CPU kernels, each a superset of the one before.
//   scalar: the portable reference code (runtime/quants.h), also the conformance suite's baseline.
//   avx2:   AVX2 + FMA + F16C (Haswell, Zen 1 and later).
//   avx512: AVX-512 F/BW/VL/DQ + VNNI (Ice Lake, Zen 4 and later); its bf16 dot uses AVX512_BF16 where the
//           CPU has it and falls back to the avx2 one otherwise.
enum class isa { scalar = 0, avx2 = 1, avx512 = 2 };

std::string_view isa_name(isa level);
std::optional<isa> isa_from_name(std::string_view name);  // "scalar", "avx2", "avx512"

// Whether the host can run kernels of this level.
bool isa_supported(isa level);

// The best supported level, lowered to TROUPE_CPU_ISA (scalar / avx2 / avx512) when that environment
// variable names a lower one (for benchmarks and debugging; a higher or unknown name is ignored). Read once.
isa active_isa();

}  // namespace troupe::cpu
