// The memory breakdown: ledger arithmetic, the table's exact text and the JSON.
#include <catch2/catch.hpp>

#include "runtime/error.h"
#include "runtime/memory.h"

using namespace troupe;

namespace {
constexpr int64_t MiB = 1024 * 1024;

memory_ledger sample() {
  memory_ledger l;
  l.add({"CUDA0", "CUDA0", false}, memory_kind::model, 28609 * MiB);
  l.add({"CUDA0", "CUDA0", false}, memory_kind::context, 397 * MiB);
  l.add({"CUDA0", "CUDA0", false}, memory_kind::compute, 358 * MiB);
  l.add({"CPU", "", true}, memory_kind::model, 30940 * MiB);
  l.add({"CUDA_Host", "CUDA0", true}, memory_kind::compute, 16 * MiB);
  l.add({"CUDA0_REPACK", "", false}, memory_kind::model, 504 * MiB);
  return l;
}

const std::vector<device_memory_info> devices = {
    {"CUDA0", "NVIDIA GeForce RTX 5090", static_cast<size_t>(32606 * MiB), static_cast<size_t>(1057 * MiB)}};

}  // namespace

TEST_CASE("the ledger adds and releases per buffer type and kind", "[memory]") {
  memory_ledger l;
  l.add({"CPU", "", true}, memory_kind::model, 1000);
  l.add({"CPU", "", true}, memory_kind::compute, 24);
  l.add({"CPU", "", true}, memory_kind::model, -400);
  CHECK(l.usage("CPU") == memory_usage{600, 0, 24});
  CHECK(l.usage("CPU").self() == 624);
  CHECK(l.usage("nope").self() == 0);
  CHECK_THROWS_WITH(l.add({"CPU", "", true}, memory_kind::context, -1),
                    "memory ledger: releasing 1 bytes of context memory from buffer type CPU, which holds 0");
  CHECK(l.total().model == 600);
}

TEST_CASE("vendor prefixes are stripped from device descriptions, as llama.cpp strips them", "[memory]") {
  CHECK(strip_vendor("NVIDIA GeForce RTX 4090") == "RTX 4090");
  CHECK(strip_vendor("NVIDIA H200") == "H200");
  CHECK(strip_vendor("Tesla V100-SXM2-16GB") == "V100-SXM2-16GB");
  CHECK(strip_vendor("AMD Radeon RX 7900 XTX") == "RX 7900 XTX");
  CHECK(strip_vendor("AMD Instinct MI300X") == "MI300X");
  CHECK(strip_vendor("llvmpipe (LLVM 15.0.6, 256 bits)") == "llvmpipe (LLVM 15.0.6, 256 bits)");
  // Prefixes only, each in its turn: a vendor word later in the description stays.
  CHECK(strip_vendor("Intel(R) Arc(TM) A770 Graphics AMD") == "Intel(R) Arc(TM) A770 Graphics AMD");
  CHECK(strip_vendor("Tesla NVIDIA T4") == "NVIDIA T4");
  CHECK(strip_vendor("NVIDIAGeForce") == "NVIDIAGeForce");
}

TEST_CASE("the breakdown table: device, host and other rows in llama.cpp's layout", "[memory]") {
  const std::string expected =
      "troupe_memory_breakdown_print: | memory breakdown [MiB] | total   free     self   model   context   compute    unaccounted |\n"
      "troupe_memory_breakdown_print: |   - CUDA0 (RTX 5090)   | 32606 = 1057 + (29364 = 28609 +     397 +     358) +        2185 |\n"
      "troupe_memory_breakdown_print: |   - Host               |                 30956 = 30940 +       0 +      16                |\n"
      "troupe_memory_breakdown_print: |   - CUDA0_REPACK       |                   504 =   504 +       0 +       0                |\n";
  CHECK(format_memory_table(sample(), devices) == expected);
  // The prefix names whoever prints it.
  CHECK(format_memory_table(sample(), devices, "llama_memory_breakdown_print").rfind("llama_memory_breakdown_print: | memory", 0) == 0);
}

TEST_CASE("the breakdown table of two devices: MiB truncated, the sums truncated once, a negative unaccounted kept signed", "[memory]") {
  memory_ledger l;
  l.add({"CUDA0", "CUDA0", false}, memory_kind::model, 60 * MiB + 900 * 1024);
  l.add({"Vulkan0", "Vulkan0", false}, memory_kind::model, 4000 * MiB + MiB / 2);
  l.add({"Vulkan0", "Vulkan0", false}, memory_kind::context, 512 * MiB);
  l.add({"Vulkan0", "Vulkan0", false}, memory_kind::compute, 100 * MiB + 700 * 1024);
  l.add({"CPU", "", true}, memory_kind::model, 300 * MiB);
  l.add({"CPU", "", true}, memory_kind::compute, 12 * MiB + 300 * 1024);
  const std::vector<device_memory_info> two = {
      {"CUDA0", "NVIDIA H200", static_cast<size_t>(143771 * MiB), static_cast<size_t>(142000 * MiB)},
      {"Vulkan0", "AMD Radeon RX 7900 XTX", static_cast<size_t>(24560 * MiB), static_cast<size_t>(20000 * MiB)}};
  const std::string expected =
      "troupe_memory_breakdown_print: | memory breakdown [MiB]    |  total     free    self   model   context   compute    unaccounted |\n"
      "troupe_memory_breakdown_print: |   - CUDA0 (H200)          | 143771 = 142000 + (  60 =    60 +       0 +       0) +        1710 |\n"
      "troupe_memory_breakdown_print: |   - Vulkan0 (RX 7900 XTX) |  24560 =  20000 + (4613 =  4000 +     512 +     100) +         -53 |\n"
      "troupe_memory_breakdown_print: |   - Host                  |                     312 =   300 +       0 +      12                |\n";
  CHECK(format_memory_table(l, two) == expected);
}

TEST_CASE("the breakdown table of the host alone, and the Host row when nothing is held", "[memory]") {
  memory_ledger l;
  l.add({"CPU", "", true}, memory_kind::model, static_cast<int64_t>(92.1 * MiB));
  l.add({"CPU", "", true}, memory_kind::context, static_cast<int64_t>(11.5 * MiB));
  l.add({"CPU", "", true}, memory_kind::compute, static_cast<int64_t>(44.1 * MiB));
  CHECK(format_memory_table(l, {}) ==
        "troupe_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |\n"
        "troupe_memory_breakdown_print: |   - Host               |                  147 =    92 +      11 +      44                |\n");
  CHECK(format_memory_table(memory_ledger{}, {}) ==
        "troupe_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |\n"
        "troupe_memory_breakdown_print: |   - Host               |                    0 =     0 +       0 +       0                |\n");
}

TEST_CASE("unaccounted memory can be negative and is shown as such", "[memory]") {
  memory_ledger l;
  l.add({"Vulkan0", "Vulkan0", false}, memory_kind::model, 900 * MiB);
  const std::vector<device_memory_info> dev = {{"Vulkan0", "llvmpipe", static_cast<size_t>(1000 * MiB), static_cast<size_t>(300 * MiB)}};
  const std::string expected =
      "troupe_memory_breakdown_print: | memory breakdown [MiB] | total   free    self   model   context   compute    unaccounted |\n"
      "troupe_memory_breakdown_print: |   - Vulkan0 (llvmpipe) |  1000 =  300 + ( 900 =   900 +       0 +       0) +        -200 |\n"
      "troupe_memory_breakdown_print: |   - Host               |                    0 =     0 +       0 +       0                |\n";
  CHECK(format_memory_table(l, dev) == expected);
}

TEST_CASE("the breakdown as JSON, in bytes", "[memory]") {
  const std::string json = format_memory_json(sample(), devices);
  CHECK(json ==
        "{\"unit\":\"bytes\",\"devices\":[{\"name\":\"CUDA0\",\"description\":\"RTX 5090\",\"total\":" +
            std::to_string(32606 * MiB) + ",\"free\":" + std::to_string(1057 * MiB) + ",\"self\":" +
            std::to_string(29364 * MiB) + ",\"model\":" + std::to_string(28609 * MiB) + ",\"context\":" +
            std::to_string(397 * MiB) + ",\"compute\":" + std::to_string(358 * MiB) + ",\"unaccounted\":" +
            std::to_string(2185 * MiB) + "}],\"host\":{\"self\":" + std::to_string(30956 * MiB) + ",\"model\":" +
            std::to_string(30940 * MiB) + ",\"context\":0,\"compute\":" + std::to_string(16 * MiB) +
            "},\"other\":[{\"name\":\"CUDA0_REPACK\",\"self\":" + std::to_string(504 * MiB) + ",\"model\":" +
            std::to_string(504 * MiB) + ",\"context\":0,\"compute\":0}]}");
}
