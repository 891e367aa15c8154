// Replays a committed fuzz corpus through a libFuzzer entry point in the normal build (g++ or clang, no
// libFuzzer): every input the fuzzers kept must still be handled. The entry points trap on a wrong answer, so
// a regression ends this program with a signal after it printed the input it was replaying.
//   replay_gguf tests/fuzz/gguf/
// Inputs are replayed in name order; an empty or missing corpus is a failure, not a pass.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
extern "C" int LLVMFuzzerInitialize(int* argc, char*** argv) __attribute__((weak));

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR...\n", argv[0]);
    return 2;
  }
  if (LLVMFuzzerInitialize != nullptr) LLVMFuzzerInitialize(&argc, &argv);
  std::vector<std::filesystem::path> inputs;
  for (int i = 1; i < argc; ++i) {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator(argv[i], ec)) {
      if (e.is_regular_file()) inputs.push_back(e.path());
    }
    if (ec) {
      std::fprintf(stderr, "cannot read the corpus %s: %s\n", argv[i], ec.message().c_str());
      return 1;
    }
  }
  if (inputs.empty()) {
    std::fprintf(stderr, "no inputs in the corpus\n");
    return 1;
  }
  std::sort(inputs.begin(), inputs.end());
  size_t bytes = 0;
  for (const auto& p : inputs) {
    std::ifstream in(p, std::ios::binary);
    const std::vector<char> data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) {
      std::fprintf(stderr, "cannot read %s\n", p.c_str());
      return 1;
    }
    // Printed first, so that a trap or a sanitizer report follows the name of the input that caused it.
    std::fprintf(stderr, "%s (%zu bytes)\n", p.filename().c_str(), data.size());
    LLVMFuzzerTestOneInput(reinterpret_cast<const uint8_t*>(data.data()), data.size());
    bytes += data.size();
  }
  std::printf("replayed %zu inputs, %zu bytes: all handled\n", inputs.size(), bytes);
  return 0;
}
