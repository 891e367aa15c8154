// Hand-made malformed GGUF files, one per validation rule; each error names the key or tensor, the byte
// offset and the file size.
#include <catch2/catch.hpp>

#include <limits>

#include "loader/gguf.h"
#include "tests/loader/gguf_bytes.h"

using namespace troupe;
using namespace troupe::test;
using Catch::Matchers::Contains;

namespace {

constexpr uint32_t f32_id = 0;

// A file with one f32 tensor "w" of `ne` (at `offset` in the data section) and `data_bytes` of data.
raw_gguf one_tensor(std::vector<int64_t> ne, uint32_t type_id = f32_id, uint64_t offset = 0, size_t data_bytes = 64) {
  raw_gguf r;
  r.header(1, 0).tensor("w", std::move(ne), type_id, offset).pad(32).zeros(data_bytes);
  return r;
}

}  // namespace

TEST_CASE("gguf: a well-formed hand-made file parses", "[gguf][errors]") {
  raw_gguf r;
  r.header(1, 2).kv_str("general.architecture", "llama").kv_u32("llama.block_count", 5);
  r.tensor("w", {4, 2}, f32_id, 0).pad(32).zeros(32);
  const gguf_file f = parse_gguf(r.span());
  CHECK(f.version() == 3);
  CHECK(f.metadata().size() == 2);
  CHECK(f.tensor("w").n_bytes == 32);
  CHECK(f.tensor("w").file_offset == f.data_offset());
  CHECK(f.data_offset() % 32 == 0);
}

TEST_CASE("gguf: bad magic", "[gguf][errors]") {
  raw_gguf r;
  r.raw("GGUX").u32(3).u64(0).u64(0);
  CHECK_THAT(parse_error(r.span()), Contains("gguf: header: bad magic 'GGUX', expected 'GGUF'") &&
                                        Contains(at(0)) && Contains(file_size(24)));
  raw_gguf bin;
  bin.raw("\x7f" "ELF").u32(3).u64(0).u64(0);
  CHECK_THAT(parse_error(bin.span()), Contains("bad magic '\\x7fELF'"));
}

TEST_CASE("gguf: files too short for the header", "[gguf][errors]") {
  raw_gguf r;
  r.raw("GG");
  CHECK_THAT(parse_error(r.span()), Contains("header: unexpected end of file reading the magic (needs 4 bytes, 2 left)") &&
                                        Contains(at(0)) && Contains(file_size(2)));
  raw_gguf h;
  h.raw("GGUF").u32(3).u64(0);
  CHECK_THAT(parse_error(h.span()), Contains("reading the metadata count") && Contains(at(16)) && Contains(file_size(16)));
  CHECK_THAT(parse_error({}), Contains("reading the magic") && Contains(file_size(0)));
}

TEST_CASE("gguf: versions other than 2 and 3", "[gguf][errors]") {
  for (uint32_t v : {0u, 1u, 4u, 0x03000000u}) {
    raw_gguf r;
    r.header(0, 0, v);
    const std::string e = parse_error(r.span());
    CHECK_THAT(e, Contains("gguf: header:") && Contains(at(4)) && Contains(file_size(24)));
    if (v == 1) CHECK_THAT(e, Contains("GGUF v1 is not supported"));
    if (v == 4) CHECK_THAT(e, Contains("unsupported version 4 (troupe reads GGUF v2 and v3)"));
    if (v == 0x03000000u) CHECK_THAT(e, Contains("big-endian"));
  }
  raw_gguf v2;
  v2.header(0, 0, 2);
  CHECK(parse_gguf(v2.span()).version() == 2);
}

TEST_CASE("gguf: counts that cannot fit in the file", "[gguf][errors]") {
  raw_gguf t;
  t.header(1000000, 0).zeros(100);
  CHECK_THAT(parse_error(t.span()), Contains("header: tensor count 1000000 cannot fit in the 100 bytes after the header") &&
                                        Contains(at(8)) && Contains(file_size(124)));
  raw_gguf k;
  k.header(0, std::numeric_limits<uint64_t>::max()).zeros(100);
  CHECK_THAT(parse_error(k.span()), Contains("metadata count 18446744073709551615 cannot fit") && Contains(at(16)) &&
                                        Contains(file_size(124)));
  raw_gguf both;  // each fits alone, not together
  both.header(2, 3).zeros(2 * 24 + 2 * 14);
  CHECK_THAT(parse_error(both.span()), Contains("metadata count 3 cannot fit") && Contains(at(16)));
}

TEST_CASE("gguf: string lengths past the end of the file", "[gguf][errors]") {
  raw_gguf r;
  r.header(0, 1).key("general.name", gguf_type::string);
  const size_t len_at = r.size();
  r.u64(1000).raw("tiny");
  CHECK_THAT(parse_error(r.span()),
             Contains("key 'general.name': the value: string of 1000 bytes runs past the end of the file (4 bytes left)") &&
                 Contains(at(len_at)) && Contains(file_size(r.size())));

  raw_gguf k;  // the key itself
  k.header(0, 1).u64(uint64_t{1} << 62).raw("abc").zeros(10);
  CHECK_THAT(parse_error(k.span()), Contains("key #0: the key: string of 4611686018427387904 bytes runs past") &&
                                        Contains(at(24)) && Contains(file_size(45)));

  raw_gguf n;  // a tensor name
  n.header(1, 0).u64(500).zeros(40);
  CHECK_THAT(parse_error(n.span()), Contains("tensor #0: the name: string of 500 bytes") && Contains(at(24)));
}

TEST_CASE("gguf: array lengths past the end of the file", "[gguf][errors]") {
  raw_gguf r;
  r.header(0, 1).key("tokenizer.ggml.scores", gguf_type::array).u32(static_cast<uint32_t>(gguf_type::float32));
  const size_t count_at = r.size();
  r.u64(1000).zeros(40);
  CHECK_THAT(parse_error(r.span()),
             Contains("key 'tokenizer.ggml.scores': array of 1000 float32 elements runs past the end of the file") &&
                 Contains(at(count_at)) && Contains(file_size(r.size())));

  raw_gguf s;  // array of strings whose second element is too long
  s.header(0, 1).key("tokenizer.ggml.tokens", gguf_type::array).u32(static_cast<uint32_t>(gguf_type::string)).u64(2);
  s.str("<unk>");
  const size_t elem_at = s.size();
  s.u64(77).raw("ab");
  CHECK_THAT(parse_error(s.span()), Contains("key 'tokenizer.ggml.tokens': element 1: string of 77 bytes runs past") &&
                                        Contains(at(elem_at)) && Contains(file_size(s.size())));

  raw_gguf big;  // element count * element size overflows 64 bits
  big.header(0, 1).key("x", gguf_type::array).u32(static_cast<uint32_t>(gguf_type::uint64));
  big.u64(uint64_t{1} << 61).zeros(8);
  CHECK_THAT(parse_error(big.span()), Contains("key 'x': array of 2305843009213693952 uint64 elements runs past"));
}

TEST_CASE("gguf: duplicate keys", "[gguf][errors]") {
  raw_gguf r;
  r.header(0, 2).kv_str("general.name", "a");
  const size_t second = r.size();
  r.kv_str("general.name", "b");
  CHECK_THAT(parse_error(r.span()), Contains("key 'general.name': duplicate key (first at offset 24)") &&
                                        Contains(at(second)) && Contains(file_size(r.size())));
}

TEST_CASE("gguf: empty keys", "[gguf][errors]") {
  raw_gguf r;
  r.header(0, 1).kv_u32("", 1);
  CHECK_THAT(parse_error(r.span()), Contains("key #0: empty key") && Contains(at(24)) && Contains(file_size(r.size())));
}

TEST_CASE("gguf: general.alignment must be a uint32 power of two", "[gguf][errors]") {
  for (uint32_t a : {0u, 3u, 48u}) {
    raw_gguf r;
    r.header(0, 2).kv_str("general.name", "m");
    const size_t kv_at = r.size();
    r.kv_u32("general.alignment", a);
    CHECK_THAT(parse_error(r.span()), Contains("key 'general.alignment': alignment " + std::to_string(a) +
                                               " is not a power of two") &&
                                          Contains(at(kv_at)) && Contains(file_size(r.size())));
  }
  raw_gguf t;
  t.header(0, 1).key("general.alignment", gguf_type::uint64).u64(64);
  CHECK_THAT(parse_error(t.span()),
             Contains("key 'general.alignment': has type uint64, must be uint32") && Contains(at(24)));

  raw_gguf ok;
  ok.header(1, 1).kv_u32("general.alignment", 64).tensor("w", {16}, f32_id, 0).pad(64).zeros(64);
  const gguf_file f = parse_gguf(ok.span());
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
}

TEST_CASE("gguf: unknown value types", "[gguf][errors]") {
  raw_gguf r;
  r.header(0, 1).str("x");
  const size_t type_at = r.size();
  r.u32(13).u32(0);
  CHECK_THAT(parse_error(r.span()), Contains("key 'x': unknown value type 13") && Contains(at(type_at)) &&
                                        Contains(file_size(r.size())));

  raw_gguf a;
  a.header(0, 1).key("y", gguf_type::array);
  const size_t array_at = a.size();
  a.u32(99).u64(0);
  CHECK_THAT(parse_error(a.span()), Contains("key 'y': unknown array element type 99") && Contains(at(array_at)));
}

TEST_CASE("gguf: bool values other than 0 and 1", "[gguf][errors]") {
  raw_gguf r;
  r.header(0, 1).key("b", gguf_type::boolean);
  const size_t value_at = r.size();
  r.u8(2);
  CHECK_THAT(parse_error(r.span()), Contains("key 'b': bool value 2 is neither 0 nor 1") && Contains(at(value_at)));

  raw_gguf a;
  a.header(0, 1).key("bs", gguf_type::array).u32(static_cast<uint32_t>(gguf_type::boolean)).u64(3).u8(1).u8(0);
  const size_t bad_at = a.size();
  a.u8(255);
  CHECK_THAT(parse_error(a.span()), Contains("key 'bs': element 2: bool value 255") && Contains(at(bad_at)));
}

TEST_CASE("gguf: array nesting is bounded", "[gguf][errors]") {
  auto nested = [](int depth) {
    raw_gguf r;
    r.header(0, 1).key("deep", gguf_type::array);
    for (int d = 1; d < depth; ++d) r.u32(static_cast<uint32_t>(gguf_type::array)).u64(1);
    r.u32(static_cast<uint32_t>(gguf_type::uint8)).u64(1).u8(7);
    return r;
  };
  const gguf_file ok = parse_gguf(nested(gguf_max_array_depth).span());
  const gguf_array* a = ok.find("deep")->get_if<gguf_array>();
  for (int d = 1; d < gguf_max_array_depth; ++d) a = &a->get_if<gguf_array>()->at(0);
  CHECK(a->get_if<uint8_t>()->at(0) == 7);

  const raw_gguf deep = nested(gguf_max_array_depth + 1);
  const size_t deepest_at = 24 + 8 + 4 + 4 + 12 * gguf_max_array_depth;
  CHECK_THAT(parse_error(deep.span()), Contains("key 'deep': arrays nested deeper than 16 levels") &&
                                           Contains(at(deepest_at)) && Contains(file_size(deep.size())));
}

TEST_CASE("gguf: unknown tensor types", "[gguf][errors]") {
  for (uint32_t id : {4u, 31u, 40u, 0xffffffffu}) {
    raw_gguf r;
    r.header(1, 0).str("w").u32(1).i64(32);
    const size_t type_at = r.size();
    r.u32(id).u64(0).pad(32).zeros(128);
    CHECK_THAT(parse_error(r.span()), Contains("tensor 'w': unknown tensor type id " + std::to_string(id)) &&
                                          Contains(at(type_at)) && Contains(file_size(r.size())));
  }
}

TEST_CASE("gguf: known but unsupported tensor types parse and are reported when used", "[gguf][errors]") {
  const raw_gguf r = one_tensor({256, 2}, static_cast<uint32_t>(type::f64), 0, 2 * 256 * 8);
  const gguf_file f = parse_gguf(r.span());
  const gguf_tensor_info& t = f.tensor("w");
  CHECK(t.type == type::f64);
  CHECK(t.n_bytes == 2 * 256 * 8);
  CHECK_FALSE(t.supported());
  CHECK_THROWS_WITH(require_supported(t.type, t.name), Contains("tensor 'w'") && Contains("f64"));
  CHECK(f.tensor("w").describe() == "'w' [256, 2] f64");
}

TEST_CASE("gguf: more than 4 dimensions", "[gguf][errors]") {
  raw_gguf r;
  r.header(1, 0).str("w");
  const size_t dims_at = r.size();
  r.u32(5).zeros(64);
  CHECK_THAT(parse_error(r.span()), Contains("tensor 'w': 5 dimensions, at most 4 are allowed") && Contains(at(dims_at)) &&
                                        Contains(file_size(r.size())));
}

TEST_CASE("gguf: zero and negative dimensions", "[gguf][errors]") {
  for (int64_t bad : {int64_t{0}, int64_t{-3}}) {
    raw_gguf r;
    r.header(1, 0).str("w").u32(2).i64(4);
    const size_t ne_at = r.size();
    r.i64(bad).u32(f32_id).u64(0).pad(32).zeros(64);
    CHECK_THAT(parse_error(r.span()), Contains("tensor 'w': dimension 1 is " + std::to_string(bad) + ", must be positive") &&
                                          Contains(at(ne_at)) && Contains(file_size(r.size())));
  }
}

TEST_CASE("gguf: element counts and byte sizes that overflow 64 bits", "[gguf][errors]") {
  const raw_gguf n = one_tensor({int64_t{1} << 32, int64_t{1} << 32});
  CHECK_THAT(parse_error(n.span()), Contains("tensor 'w': element count of shape [4294967296, 4294967296] overflows 64 bits") &&
                                        Contains(at(24 + 9)) && Contains(file_size(n.size())));
  const raw_gguf b = one_tensor({int64_t{1} << 31, int64_t{1} << 31});  // 2^62 elements, 2^64 bytes
  CHECK_THAT(parse_error(b.span()), Contains("tensor 'w': byte size of [2147483648, 2147483648] f32 overflows 64 bits") &&
                                        Contains(at(24 + 9)));
}

TEST_CASE("gguf: rows that are not a whole number of blocks", "[gguf][errors]") {
  const raw_gguf r = one_tensor({33, 2}, static_cast<uint32_t>(type::q4_0));
  CHECK_THAT(parse_error(r.span()), Contains("tensor 'w': row length 33 is not a multiple of the q4_0 block size 32") &&
                                        Contains(at(24 + 9)) && Contains(file_size(r.size())));
}

TEST_CASE("gguf: misaligned data offsets", "[gguf][errors]") {
  raw_gguf r;
  r.header(1, 0).str("w").u32(1).i64(4).u32(f32_id);
  const size_t offset_at = r.size();
  r.u64(16).pad(32).zeros(64);
  CHECK_THAT(parse_error(r.span()), Contains("tensor 'w': data offset 16 is not a multiple of the alignment 32") &&
                                        Contains(at(offset_at)) && Contains(file_size(r.size())));
}

TEST_CASE("gguf: tensor data outside the file", "[gguf][errors]") {
  const raw_gguf r = one_tensor({1024}, f32_id, 0, 100);  // needs 4096 bytes
  const size_t data_at = 64;                                 // 24 + 8 + 1 + 4 + 8 + 4 + 8 = 57, aligned to 64
  CHECK_THAT(parse_error(r.span()), Contains("gguf: tensor 'w': data of 4096 bytes at [64, 4160) lies outside the file") &&
                                        Contains(at(data_at)) && Contains(file_size(164)));
  const raw_gguf far = one_tensor({8}, f32_id, uint64_t{1} << 40, 100);
  CHECK_THAT(parse_error(far.span()), Contains("tensor 'w': data of 32 bytes at [1099511627840, 1099511627872) lies outside"));
  const raw_gguf wrap = one_tensor({8}, f32_id, std::numeric_limits<uint64_t>::max() - 31, 100);
  CHECK_THAT(parse_error(wrap.span()), Contains("tensor 'w': data offset 18446744073709551584 + 32 bytes overflows 64 bits") &&
                                           Contains(at(24)));
}

TEST_CASE("gguf: overlapping tensors", "[gguf][errors]") {
  raw_gguf r;
  r.header(2, 0).tensor("a", {16}, f32_id, 0).tensor("b", {8}, f32_id, 32).pad(32);
  const size_t data_at = r.size();
  r.zeros(128);
  CHECK_THAT(parse_error(r.span()),
             Contains("tensor 'b': data [" + std::to_string(data_at + 32) + ", " + std::to_string(data_at + 64) +
                      ") overlaps tensor 'a' [" + std::to_string(data_at) + ", " + std::to_string(data_at + 64) + ")") &&
                 Contains(at(data_at + 32)) && Contains(file_size(r.size())));
}

TEST_CASE("gguf: duplicate tensor names", "[gguf][errors]") {
  raw_gguf r;
  r.header(2, 0).tensor("w", {8}, f32_id, 0);
  const size_t second = r.size();
  r.tensor("w", {8}, f32_id, 32).pad(32).zeros(64);
  CHECK_THAT(parse_error(r.span()), Contains("tensor 'w': duplicate tensor name (first at offset 24)") &&
                                        Contains(at(second)) && Contains(file_size(r.size())));
}

TEST_CASE("gguf: tensor names longer than troupe's tensors hold", "[gguf][errors]") {
  const std::string name(max_name, 'x');
  raw_gguf r;
  r.header(1, 0).tensor(name, {8}, f32_id, 0).pad(32).zeros(32);
  CHECK_THAT(parse_error(r.span()), Contains("name is 64 bytes long, at most 63 are allowed") && Contains(at(24)));
}

TEST_CASE("gguf: truncated tensor infos", "[gguf][errors]") {
  raw_gguf r;
  r.header(1, 0).str("w").u32(2).i64(8);
  r.zeros(24 - 9 - 8 - 4 - 8 + 8);  // enough bytes for the count check, not for the info
  const std::string e = parse_error(r.span());
  CHECK_THAT(e, Contains("tensor 'w': unexpected end of file") && Contains(file_size(r.size())));
}

TEST_CASE("gguf: names in messages are made printable", "[gguf][errors]") {
  raw_gguf r;
  r.header(0, 2).kv_str("a\nb'c", "x").kv_str("a\nb'c", "y");
  CHECK_THAT(parse_error(r.span()), Contains("key 'a\\x0ab\\x27c': duplicate key"));
}
