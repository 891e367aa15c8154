// libFuzzer entry point for the peer server's frame handler (session::handle), the code every byte a client
// sends goes through. Build with clang (see tests/fuzz/CMakeLists.txt):
//   CXX=clang++ cmake -S . -B build-fuzz -DTROUPE_FUZZ=ON -DTROUPE_CUDA=OFF -DTROUPE_VULKAN=OFF
//   cmake --build build-fuzz --target fuzz_rpc
//   TROUPE_FUZZ_WRITE_SEEDS=corpus ./build-fuzz/tests/fuzz/fuzz_rpc -runs=0     # writes seed sessions
//   ./build-fuzz/tests/fuzz/fuzz_rpc -max_total_time=600 corpus/ tests/fuzz/rpc/
// An input is a sequence of frames [code u8][length u16][payload]. Unless its first byte is 0xff, a valid
// hello is handled first so the fuzzer spends its time past the handshake. Every reply must be well formed;
// borrowed reply bytes (get_tensor) are read so that ASan checks they lie in live memory. Buffers are capped
// (1 MiB each, 4 MiB per session) so that allocation limits, not the machine, bound the fuzzer's memory.
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "backends/cpu/cpu_backend.h"
#include "net/rpc/cache.h"
#include "net/rpc/frame_handler.h"
#include "runtime/log.h"
#include "tests/net/rpc_frames.h"

namespace {

using namespace troupe;
using namespace troupe::rpc;

const tensor_cache& fuzz_cache() {
  static tensor_cache c(std::filesystem::temp_directory_path() / "troupe-fuzz-rpc-cache");
  return c;
}

frame_handler_config& config() {
  static frame_handler_config cfg = [] {
    frame_handler_config c;
    c.devices = {&cpu::cpu_device()};
    c.make_backend = [](device_i&) -> backend_ptr { return cpu::make_cpu_backend({.n_threads = 1}); };
    c.cache = &fuzz_cache();
    c.max_buffer_size = 1u << 20;
    c.max_connection_bytes = 4u << 20;
    c.max_buffers = 64;
    return c;
  }();
  return cfg;
}

void write_seeds(const char* dir) {
  std::filesystem::create_directories(dir);
  int i = 0;
  for (const auto& s : testing::sample_sessions()) {
    const auto bytes = testing::encode_frames(s);
    std::ofstream(std::filesystem::path(dir) / ("seed" + std::to_string(i++)), std::ios::binary)
        .write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  set_log_level(log_level::none);
  if (const char* dir = std::getenv("TROUPE_FUZZ_WRITE_SEEDS")) write_seeds(dir);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::span<const uint8_t> in(data, size);
  const bool raw = size > 0 && data[0] == 0xff;
  frame_handler s(config(), "fuzz");
  if (!raw) {
    const auto h = testing::hello();
    if (s.handle(h.code, h.payload).st != status::ok) __builtin_trap();
  }
  for (const auto& f : testing::decode_frames(raw ? in.subspan(1) : in)) {
    const reply r = s.handle(f.code, f.payload);
    if (r.st != status::ok && r.tail.size() != 0) __builtin_trap();  // errors carry only a message
    volatile uint8_t sink = 0;
    for (uint8_t b : r.tail) sink = sink ^ b;
    (void)sink;
    if (r.close) break;
  }
  return 0;
}
