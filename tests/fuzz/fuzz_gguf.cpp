// libFuzzer entry point for the GGUF parser and writer. Build with clang (see tests/fuzz/CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -DTROUPE_FUZZ=ON -DTROUPE_CUDA=OFF -DTROUPE_VULKAN=OFF
//   cmake --build build-fuzz --target fuzz_gguf
//   mkdir -p corpus && head -c 20000 ../shared/models/stories260K.gguf > corpus/stories_head.gguf
//   ./build-fuzz/tests/fuzz/fuzz_gguf -max_len=65536 corpus/ tests/fuzz/gguf/
// Any input must either parse or throw gguf_error; anything else (another exception, a sanitizer report, a
// crash) is a bug. Inputs that parse are written back and must round-trip exactly.
#include <cstddef>
#include <cstdint>
#include <span>

#include "loader/gguf.h"
#include "loader/gguf_writer.h"

namespace {

void round_trip(const troupe::gguf_file& f, std::span<const std::byte> bytes) {
  if (f.alignment() > 65536) return;  // valid, but the written padding would be needlessly large
  const std::vector<std::byte> written = troupe::gguf_writer::from(f, bytes).write();
  const troupe::gguf_file g = troupe::parse_gguf(written);
  if (g.metadata() != f.metadata() || g.tensors().size() != f.tensors().size()) __builtin_trap();
  for (size_t i = 0; i < f.tensors().size(); ++i) {
    const auto& a = f.tensors()[i];
    const auto& b = g.tensors()[i];
    if (a.name != b.name || a.type != b.type || a.ne != b.ne || a.n_dims != b.n_dims || a.n_bytes != b.n_bytes) {
      __builtin_trap();
    }
  }
  if (troupe::gguf_writer::from(g, written).write() != written) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const std::byte> bytes(reinterpret_cast<const std::byte*>(data), size);
  try {
    const troupe::gguf_file f = troupe::parse_gguf(bytes, "fuzz");
    round_trip(f, bytes);
  } catch (const troupe::gguf_error&) {
    // rejected with a message: fine
  }
  return 0;
}
