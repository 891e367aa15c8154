// A bounded fuzz of the GGUF parser that runs in every test run (libFuzzer's fuzz_gguf goes further):
// random mutations and truncations of the header region of a real model and of a writer-made file. Every
// input must parse or throw gguf_error; nothing may crash (the sanitizer build catches memory errors), and
// inputs that parse must round-trip through the writer.
#include <catch2/catch.hpp>

#include <random>

#include "loader/gguf.h"
#include "loader/gguf_writer.h"
#include "tests/loader/gguf_bytes.h"
#include "tests/test_models.h"

using namespace troupe;

namespace {

struct fuzz_stats {
  int parsed = 0;
  int rejected = 0;
  int round_trips = 0;  // parsed inputs written again and compared
};

// Values that tend to reach edge cases when written over a length, count, type or offset field.
uint64_t interesting(std::mt19937_64& rng, uint64_t file_size) {
  static const uint64_t fixed[] = {0, 1, 2, 3, 4, 5, 9, 12, 13, 16, 31, 32, 33, 63, 64, 255, 256, 65535,
                                   0x7fffffff, 0x80000000, 0xffffffff, 0x7fffffffffffffff, 0x8000000000000000,
                                   0xffffffffffffffff, 0xfffffffffffffff0};
  switch (rng() % 4) {
    case 0: return fixed[rng() % std::size(fixed)];
    case 1: return file_size + (rng() % 64) - 32;
    case 2: return rng() % (file_size + 1);
    default: return rng();
  }
}

// Mutates bytes[0, region) in place: a few random bytes, or an interesting 1/4/8-byte little-endian value.
void mutate(std::vector<std::byte>& bytes, size_t region, std::mt19937_64& rng) {
  const int n = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < n; ++k) {
    const size_t at = rng() % region;
    if (rng() % 2) {
      bytes[at] = static_cast<std::byte>(rng());
    } else {
      const size_t width = std::array<size_t, 3>{1, 4, 8}[rng() % 3];
      const uint64_t v = interesting(rng, bytes.size());
      for (size_t i = 0; i < width && at + i < bytes.size(); ++i) bytes[at + i] = static_cast<std::byte>(v >> (8 * i));
    }
  }
}

// Parses, and on success checks that the writer reproduces the model.
void try_parse(std::span<const std::byte> bytes, fuzz_stats& stats) {
  try {
    const gguf_file f = parse_gguf(bytes);
    ++stats.parsed;
    if (f.alignment() > 65536) return;
    const std::vector<std::byte> written = gguf_writer::from(f, bytes).write();
    const gguf_file g = parse_gguf(written);
    REQUIRE(g.metadata() == f.metadata());
    REQUIRE(g.tensors().size() == f.tensors().size());
    REQUIRE(gguf_writer::from(g, written).write() == written);
    ++stats.round_trips;
  } catch (const gguf_error&) {
    ++stats.rejected;
  }
}

void fuzz(std::vector<std::byte> original, size_t region, int iterations, uint64_t seed) {
  std::mt19937_64 rng(seed);
  fuzz_stats stats;
  std::vector<std::byte> bytes = original;
  for (int i = 0; i < iterations; ++i) {
    if (i % 8 == 7) {  // a truncation instead of a mutation
      const size_t keep = rng() % (region + 1);
      try_parse(std::span<const std::byte>(original).first(keep), stats);
      continue;
    }
    mutate(bytes, region, rng);
    try_parse(bytes, stats);
    std::copy(original.begin(), original.begin() + static_cast<std::ptrdiff_t>(region), bytes.begin());
  }
  // Both outcomes were reached: the mutations hit fields the parser checks, and some inputs still parsed and
  // went through the writer (a parser that rejected everything, or a round trip never tried, fails here).
  INFO("parsed " << stats.parsed << ", rejected " << stats.rejected << ", round trips " << stats.round_trips);
  CHECK(stats.rejected > 0);
  CHECK(stats.parsed > 0);
  CHECK(stats.round_trips > 0);
}


}  // namespace

TEST_CASE("gguf fuzz: mutations of a writer-made file", "[gguf][fuzz]") {
  gguf_writer w;
  w.add("general.architecture", "llama");
  w.add("general.alignment", uint32_t{32});
  w.add("llama.block_count", uint32_t{2});
  w.add("tokenizer.ggml.tokens", std::vector<std::string>{"<unk>", "<s>", "</s>", "a", "b"});
  w.add("tokenizer.ggml.scores", std::vector<float>{0, 0, 0, -1, -2});
  w.add("flags", std::vector<bool>{true, false});
  w.add("nested", std::vector<gguf_array>{gguf_array(std::vector<int64_t>{1, 2}),
                                          gguf_array(std::vector<gguf_array>{gguf_array(std::vector<uint8_t>{3})})});
  const std::vector<std::byte> data(4096);
  w.add_tensor("token_embd.weight", type::f32, {8, 5}, std::span(data).first(160));
  w.add_tensor("blk.0.attn_q.weight", type::q4_0, {32, 8}, std::span(data).first(8 * 18));
  w.add_tensor("blk.0.ffn_up.weight", type::q6_K, {256, 2}, std::span(data).first(2 * 210));
  w.add_tensor("output_norm.weight", type::f16, {8}, std::span(data).first(16));
  const std::vector<std::byte> bytes = w.write();
  const gguf_file f = parse_gguf(bytes);
  fuzz(bytes, static_cast<size_t>(f.data_offset()), 3000, 1);
}

TEST_CASE("gguf fuzz: mutations of stories260K's header region", "[gguf][fuzz][models]") {
  const auto path = test::model_path("stories260K.gguf");
  if (!path) return;
  const std::vector<std::byte> bytes = test::read_file_bytes(*path);
  const gguf_file f = parse_gguf(bytes);
  fuzz(bytes, static_cast<size_t>(f.data_offset()), 2000, 2);
}
