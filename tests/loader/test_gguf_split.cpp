// Split models: file naming, opening every split, and the checks that make them one model.
#include <catch2/catch.hpp>

#include <unistd.h>

#include "loader/gguf_split.h"
#include "loader/gguf_writer.h"

using namespace troupe;
using Catch::Matchers::Contains;

namespace {

// Split `no` (0-based) of `count`, holding tensors named by `names`; `total` is split.tensors.count.
gguf_writer split_writer(uint16_t no, uint16_t count, int32_t total, std::vector<std::string> names) {
  gguf_writer w;
  if (no == 0) w.add("general.architecture", "llama");
  w.add("split.no", no);
  w.add("split.count", count);
  w.add("split.tensors.count", total);
  static const std::vector<std::byte> data(16 * 4);
  for (std::string& n : names) w.add_tensor(std::move(n), type::f32, {16}, data);
  return w;
}

gguf_file parsed(const gguf_writer& w, std::string name) { return parse_gguf(w.write(), name); }

std::string combine_error(std::vector<gguf_file> files) {
  try {
    combine_gguf_splits(std::move(files));
  } catch (const gguf_error& e) {
    return e.what();
  }
  return "(combined without error)";
}

// A fresh temporary directory, removed on destruction.
struct temp_dir {
  std::filesystem::path path;
  temp_dir() {
    path = std::filesystem::temp_directory_path() / ("troupe-test-split-" + std::to_string(::getpid()));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~temp_dir() { std::filesystem::remove_all(path); }
};

}  // namespace

TEST_CASE("gguf split: file names", "[gguf][split]") {
  CHECK(gguf_split_path("models/m", 0, 3) == "models/m-00001-of-00003.gguf");
  CHECK(gguf_split_path("m", 11, 12) == "m-00012-of-00012.gguf");

  const auto n = parse_gguf_split_path("dir/model-q4-00002-of-00003.gguf");
  REQUIRE(n);
  CHECK(n->prefix == "dir/model-q4");
  CHECK(n->split_no == 1);
  CHECK(n->split_count == 3);

  CHECK_FALSE(parse_gguf_split_path("model.gguf"));
  CHECK_FALSE(parse_gguf_split_path("m-00000-of-00003.gguf"));  // numbers start at 1
  CHECK_FALSE(parse_gguf_split_path("m-00004-of-00003.gguf"));
  CHECK_FALSE(parse_gguf_split_path("m-0001a-of-00003.gguf"));
  CHECK_FALSE(parse_gguf_split_path("m-00001-of-00003.bin"));
  CHECK_FALSE(parse_gguf_split_path("00001-of-00003.gguf"));
  CHECK(parse_gguf_split_path("-00001-of-00003.gguf")->prefix.empty());
}

TEST_CASE("gguf split: three splits form one tensor list", "[gguf][split]") {
  std::vector<gguf_file> files;
  files.push_back(parsed(split_writer(0, 3, 5, {"a", "b"}), "m-00001-of-00003.gguf"));
  files.push_back(parsed(split_writer(1, 3, 5, {"c"}), "m-00002-of-00003.gguf"));
  files.push_back(parsed(split_writer(2, 3, 5, {"d", "e"}), "m-00003-of-00003.gguf"));
  const gguf_split_files m = combine_gguf_splits(std::move(files));
  CHECK(m.n_files() == 3);
  REQUIRE(m.tensors().size() == 5);
  CHECK(m.tensor("a").file_index == 0);
  CHECK(m.tensor("c").file_index == 1);
  CHECK(m.tensor("e").file_index == 2);
  CHECK(m.tensor("e").file_offset == m.files()[2].tensor("e").file_offset);
  CHECK(m.metadata().get<std::string>("general.architecture").value() == "llama");
  CHECK_THROWS_WITH(m.tensor("z"), Contains("tensor 'z': not found in any of the 3 split files"));
}

TEST_CASE("gguf split: splits that disagree", "[gguf][split]") {
  SECTION("split.no out of order") {
    std::vector<gguf_file> f;
    f.push_back(parsed(split_writer(0, 2, 2, {"a"}), "s1"));
    f.push_back(parsed(split_writer(0, 2, 2, {"b"}), "s2"));
    CHECK_THAT(combine_error(std::move(f)), Contains("gguf: s2: key 'split.no': is 0, expected 1 for file 2 of 2") &&
                                                Contains("offset ") && Contains("file size "));
  }
  SECTION("split.count differs from the number of files") {
    std::vector<gguf_file> f;
    f.push_back(parsed(split_writer(0, 3, 2, {"a"}), "s1"));
    f.push_back(parsed(split_writer(1, 3, 2, {"b"}), "s2"));
    CHECK_THAT(combine_error(std::move(f)), Contains("s1: key 'split.count': is 3, but the model has 2 files"));
  }
  SECTION("split.tensors.count differs from the tensors found") {
    std::vector<gguf_file> f;
    f.push_back(parsed(split_writer(0, 2, 3, {"a"}), "s1"));
    f.push_back(parsed(split_writer(1, 2, 3, {"b"}), "s2"));
    CHECK_THAT(combine_error(std::move(f)),
               Contains("s1: key 'split.tensors.count': is 3, but the 2 files hold 2 tensors"));
  }
  SECTION("a tensor in two splits") {
    std::vector<gguf_file> f;
    f.push_back(parsed(split_writer(0, 2, 2, {"a"}), "s1"));
    f.push_back(parsed(split_writer(1, 2, 2, {"a"}), "s2"));
    CHECK_THAT(combine_error(std::move(f)), Contains("s2: tensor 'a': duplicate tensor name: also in split 1 (s1)"));
  }
  SECTION("split keys missing in a split model") {
    gguf_writer plain;
    plain.add_tensor("b", type::f32, {1}, std::vector<std::byte>(4));
    std::vector<gguf_file> f;
    f.push_back(parsed(split_writer(0, 2, 2, {"a"}), "s1"));
    f.push_back(parsed(plain, "s2"));
    CHECK_THAT(combine_error(std::move(f)), Contains("s2: key 'split.count': not found, but the model is split (file 2 of 2)"));
  }
  SECTION("split keys of the wrong type") {
    gguf_writer w;
    w.add("split.no", "zero");
    std::vector<gguf_file> f;
    f.push_back(parsed(w, "s1"));
    CHECK_THAT(combine_error(std::move(f)), Contains("s1: key 'split.no': has type string, expected an integer"));
  }
  SECTION("one file that says it is one of several") {
    std::vector<gguf_file> f;
    f.push_back(parsed(split_writer(0, 3, 1, {"a"}), "model.gguf"));
    CHECK_THAT(combine_error(std::move(f)), Contains("model.gguf: key 'split.count': is 3, but the model has 1 file"));
  }
}

TEST_CASE("gguf split: opening split files from disk", "[gguf][split]") {
  temp_dir dir;
  const std::string prefix = (dir.path / "tiny").string();
  split_writer(0, 3, 4, {"a", "b"}).write_file(gguf_split_path(prefix, 0, 3));
  split_writer(1, 3, 4, {"c"}).write_file(gguf_split_path(prefix, 1, 3));
  split_writer(2, 3, 4, {"d"}).write_file(gguf_split_path(prefix, 2, 3));

  const gguf_split_files m = open_gguf_splits(gguf_split_path(prefix, 0, 3));
  CHECK(m.n_files() == 3);
  CHECK(m.paths()[2] == gguf_split_path(prefix, 2, 3));
  CHECK(m.tensor("d").file_index == 2);
  CHECK(m.files()[1].source() == gguf_split_path(prefix, 1, 3));

  CHECK_THROWS_WITH(open_gguf_splits(gguf_split_path(prefix, 1, 3)),
                    Contains("is split 2 of 3; open the first split '" + gguf_split_path(prefix, 0, 3) + "'"));

  std::filesystem::remove(gguf_split_path(prefix, 2, 3));
  CHECK_THROWS_WITH(open_gguf_splits(gguf_split_path(prefix, 0, 3)),
                    Contains(gguf_split_path(prefix, 2, 3) + ": split 3 of 3 is missing"));

  // A single-file model with an ordinary name.
  const std::filesystem::path single = dir.path / "single.gguf";
  gguf_writer w;
  w.add_tensor("x", type::f32, {4}, std::vector<std::byte>(16));
  w.write_file(single);
  const gguf_split_files s = open_gguf_splits(single);
  CHECK(s.n_files() == 1);
  CHECK(s.tensor("x").file_index == 0);
}
