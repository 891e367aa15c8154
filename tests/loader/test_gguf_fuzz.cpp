// A bounded fuzz of the GGUF parser that runs in every test run (libFuzzer's fuzz_gguf goes further):
// random mutations and truncations of the header region of a real model and of a writer-made file. Every
// input must parse or throw gguf_error; nothing may crash (the sanitizer build catches memory errors), and
// inputs that parse must round-trip through the writer.
#include <catch2/catch.hpp>

#include <cstring>
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
  int realigned = 0;    // of those, written with the default alignment (theirs is above max_written_alignment)
};

// The largest alignment a round trip writes as it is. A file with a larger one parses only if its tensors
// still lie inside it (with no tensors, the data section may start past the end of the file), but writing it
// pads the header to the alignment: up to 2 GiB of zeros for 2^31. Such a file is written with the default
// alignment instead, which changes only the general.alignment value and where the data section starts
// (checked on its own).
constexpr uint32_t max_written_alignment = 65536;

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

// Parses, and on success checks that the writer reproduces the model: the same metadata, the same tensors
// (names, types, shapes and data), and the written file written again byte for byte.
void try_parse(std::span<const std::byte> bytes, fuzz_stats& stats) {
  try {
    const gguf_file f = parse_gguf(bytes);
    ++stats.parsed;
    gguf_writer w = gguf_writer::from(f, bytes);
    std::vector<gguf_kv> metadata = f.metadata();
    const bool realign = f.alignment() > max_written_alignment;
    if (realign) {
      w.set_alignment(gguf_default_alignment);
      for (gguf_kv& kv : metadata) {
        if (kv.key == gguf_alignment_key) kv.value = gguf_default_alignment;
      }
    }
    const std::vector<std::byte> written = w.write();
    const gguf_file g = parse_gguf(written);
    REQUIRE(g.metadata() == metadata);
    REQUIRE(g.tensors().size() == f.tensors().size());
    for (size_t i = 0; i < f.tensors().size(); ++i) {
      const gguf_tensor_info& a = f.tensors()[i];
      const gguf_tensor_info& b = g.tensors()[i];
      REQUIRE(b.name == a.name);
      REQUIRE(b.type == a.type);
      REQUIRE(b.n_dims == a.n_dims);
      REQUIRE(b.ne == a.ne);
      REQUIRE(b.n_bytes == a.n_bytes);
      REQUIRE(std::memcmp(written.data() + b.file_offset, bytes.data() + a.file_offset, a.n_bytes) == 0);
    }
    REQUIRE(gguf_writer::from(g, written).write() == written);
    if (realign) {
      // The two headers hold the same fields at the same sizes (the alignment's value is a uint32 either
      // way), so f's data section starts where g's does (the header's end rounded up to 32), rounded up to
      // f's alignment.
      REQUIRE(g.alignment() == gguf_default_alignment);
      const uint64_t a = f.alignment();
      REQUIRE(f.data_offset() == (g.data_offset() + a - 1) / a * a);
      ++stats.realigned;
    }
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
  INFO("parsed " << stats.parsed << ", rejected " << stats.rejected << ", round trips " << stats.round_trips
                  << " (realigned " << stats.realigned << ")");
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

TEST_CASE("gguf fuzz: files whose alignment is above 64 KiB round-trip too", "[gguf][fuzz]") {
  // 2^31, the largest uint32 power of two, and no tensors: the data section starts past the end of the file.
  test::raw_gguf none;
  none.header(0, 2).kv_str("general.architecture", "llama").kv_u32("general.alignment", 0x80000000u);
  // 2^17 and one f32 tensor at the start of a data section inside the file.
  test::raw_gguf one;
  one.header(1, 1).kv_u32("general.alignment", 1u << 17).tensor("t", {8}, 0, 0).pad(size_t{1} << 17);
  for (int i = 1; i <= 8; ++i) one.f32(static_cast<float>(i));
  const gguf_file f = parse_gguf(one.span());
  REQUIRE(f.data_offset() == (1u << 17));
  REQUIRE(f.tensor("t").file_offset == (1u << 17));
  fuzz_stats stats;
  try_parse(none.span(), stats);
  try_parse(one.span(), stats);
  CHECK(stats.parsed == 2);
  CHECK(stats.realigned == 2);
  CHECK(stats.round_trips == 2);
}
