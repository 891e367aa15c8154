// The layers of the source tree point one way (docs/architecture.md, "Layers and targets"): from the ground
// up runtime/, loader/, backends/, llm/, actors/, net/, then tools/ and examples/. An #include may name a
// file of its own floor or one below, never one above, and no source includes a header of tests/.
#include <catch2/catch.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <unistd.h>

namespace fs = std::filesystem;

namespace {

struct floor_def {
  const char* folder;
  int level;
};

// Folders in the order they stand; tools/ and examples/ share the top floor.
constexpr floor_def floors[] = {{"runtime", 0}, {"loader", 1}, {"backends", 2}, {"llm", 3},
                                {"actors", 4},  {"net", 5},    {"tools", 6},    {"examples", 6}};

std::optional<int> level_of(const std::string& rel) {
  const std::string top = rel.substr(0, rel.find('/'));
  for (const floor_def& f : floors) {
    if (top == f.folder) return f.level;
  }
  return std::nullopt;
}

bool is_source(const fs::path& p) {
  static const std::vector<std::string> exts{".h", ".hpp", ".cpp", ".cu", ".cuh", ".inc"};
  return std::find(exts.begin(), exts.end(), p.extension().string()) != exts.end();
}

struct scan_result {
  size_t files = 0;
  size_t includes = 0;  // quoted includes that name a file of the tree
  std::vector<std::string> climbing;  // "file:line: includes target (floor a above floor b)"
  std::vector<std::string> test_headers;  // "file:line: includes tests/..."
};

// Every quoted #include of the source folders under root, resolved from the root (the project's include
// path) or else from the including file's folder.
scan_result scan(const fs::path& root) {
  static const std::regex include_re(R"re(^\s*#\s*include\s*"([^"]+)")re");
  scan_result r;
  for (const floor_def& f : floors) {
    const fs::path dir = root / f.folder;
    if (!fs::is_directory(dir)) continue;
    for (const auto& entry : fs::recursive_directory_iterator(dir)) {
      if (!entry.is_regular_file() || !is_source(entry.path())) continue;
      const std::string file = fs::relative(entry.path(), root).generic_string();
      ++r.files;
      std::ifstream in(entry.path());
      std::string line;
      for (int n = 1; std::getline(in, line); ++n) {
        std::smatch m;
        if (!std::regex_search(line, m, include_re)) continue;
        const std::string name = m[1].str();
        std::string target;
        if (fs::exists(root / name)) {
          target = fs::path(name).lexically_normal().generic_string();
        } else if (fs::exists(entry.path().parent_path() / name)) {
          target = fs::relative(fs::weakly_canonical(entry.path().parent_path() / name), fs::weakly_canonical(root))
                       .generic_string();
        } else {
          continue;  // a generated file or a system header in quotes
        }
        ++r.includes;
        const std::string where = file + ":" + std::to_string(n) + ": includes " + target;
        if (target.rfind("tests/", 0) == 0) {
          r.test_headers.push_back(where);
          continue;
        }
        const std::optional<int> to = level_of(target);
        if (to && *to > f.level) {
          r.climbing.push_back(where + " (floor " + std::to_string(*to) + " above " + std::string(f.folder) +
                               "'s " + std::to_string(f.level) + ")");
        }
      }
    }
  }
  return r;
}

void write_file(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text;
}

std::string joined(const std::vector<std::string>& lines) {
  std::string out;
  for (const std::string& l : lines) out += l + "\n";
  return out;
}

}  // namespace

TEST_CASE("layers: no include of the source tree climbs a floor") {
  const scan_result r = scan(TROUPE_SOURCE_DIR);
  // The scan saw the tree (a wrong root would find nothing and pass).
  REQUIRE(r.files > 250);
  REQUIRE(r.includes > 600);
  INFO(joined(r.climbing));
  CHECK(r.climbing.empty());
}

TEST_CASE("layers: no source includes a header of tests/") {
  const scan_result r = scan(TROUPE_SOURCE_DIR);
  REQUIRE(r.files > 250);
  INFO(joined(r.test_headers));
  CHECK(r.test_headers.empty());
}

TEST_CASE("layers: the scan names the file and line of an include that climbs") {
  const fs::path root = fs::temp_directory_path() / ("troupe_layers_" + std::to_string(::getpid()));
  fs::remove_all(root);
  write_file(root / "runtime/tensor.h", "#pragma once\n");
  write_file(root / "llm/model.h", "#pragma once\n#include \"runtime/tensor.h\"\n");
  write_file(root / "backends/cpu/kernels.cpp", "// kernels\n#include \"runtime/tensor.h\"\n\n#include \"llm/model.h\"\n");
  write_file(root / "net/http/route.cpp", "#include \"local.h\"\n#include \"tests/support/ring.h\"\n");
  write_file(root / "net/http/local.h", "#include \"../../actors/x.h\"\n");
  write_file(root / "actors/x.h", "#include <vector>\n#include \"missing.h\"\n");
  write_file(root / "tests/support/ring.h", "#pragma once\n");
  const scan_result r = scan(root);
  fs::remove_all(root);
  CHECK(r.files == 6);
  CHECK(r.includes == 6);
  REQUIRE(r.climbing.size() == 1);
  CHECK(r.climbing[0] == "backends/cpu/kernels.cpp:4: includes llm/model.h (floor 3 above backends's 2)");
  REQUIRE(r.test_headers.size() == 1);
  CHECK(r.test_headers[0] == "net/http/route.cpp:2: includes tests/support/ring.h");
}
