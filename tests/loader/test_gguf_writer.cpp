// The GGUF writer and the value model: every value type, nested arrays, tensors of several types, exact
// round trips (parse(write(x)) == x, write(parse(bytes)) == bytes) and typed getters.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cmath>
#include <limits>

#include "loader/gguf.h"
#include "loader/gguf_writer.h"
#include "tests/loader/gguf_bytes.h"

using namespace troupe;
using Catch::Matchers::Contains;

namespace {

std::vector<std::byte> pattern(size_t n, uint8_t seed) {
  std::vector<std::byte> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<std::byte>((i * 31 + seed) & 0xff);
  return v;
}

// A writer with every value type, nested arrays and tensors of several types and ranks.
gguf_writer sample_writer() {
  gguf_writer w;
  w.add("u8", uint8_t{250});
  w.add("i8", int8_t{-7});
  w.add("u16", uint16_t{65000});
  w.add("i16", int16_t{-32000});
  w.add("u32", uint32_t{4000000000u});
  w.add("i32", int32_t{-2000000000});
  w.add("f32", 0.25f);
  w.add("bool", true);
  w.add("string", "llama");
  w.add("u64", uint64_t{1} << 60);
  w.add("i64", int64_t{-1} << 60);
  w.add("f64", -1.5e300);
  w.add("nan", std::numeric_limits<float>::quiet_NaN());
  w.add("empty string", "");
  w.add("a.u8", std::vector<uint8_t>{1, 2, 255});
  w.add("a.i8", std::vector<int8_t>{-1, 0, 1});
  w.add("a.u16", std::vector<uint16_t>{1, 65535});
  w.add("a.i16", std::vector<int16_t>{-5, 5});
  w.add("a.u32", std::vector<uint32_t>{7});
  w.add("a.i32", std::vector<int32_t>{1, 2, 3, -4});
  w.add("a.f32", std::vector<float>{0.5f, -0.0f, std::numeric_limits<float>::infinity()});
  w.add("a.bool", std::vector<bool>{true, false, true});
  w.add("a.string", std::vector<std::string>{"<unk>", "", "▁the", std::string("nul\0inside", 10)});
  w.add("a.u64", std::vector<uint64_t>{~uint64_t{0}});
  w.add("a.i64", std::vector<int64_t>{std::numeric_limits<int64_t>::min()});
  w.add("a.f64", std::vector<double>{1e-300, std::nan("")});
  w.add("a.empty", gguf_array::empty_of(gguf_type::string));
  w.add("a.nested", std::vector<gguf_array>{gguf_array(std::vector<int32_t>{1, 2}),
                                            gguf_array(std::vector<std::string>{"x", "y", "z"}),
                                            gguf_array(std::vector<gguf_array>{gguf_array(std::vector<bool>{false})}),
                                            gguf_array::empty_of(gguf_type::float64)});
  w.add_tensor("f32.1d", type::f32, {5}, pattern(20, 1));
  w.add_tensor("f16.2d", type::f16, {3, 7}, pattern(42, 2));
  w.add_tensor("q4_0.3d", type::q4_0, {64, 2, 3}, pattern(2 * 18 * 6, 3));
  w.add_tensor("q6_K.4d", type::q6_K, {256, 1, 2, 2}, pattern(210 * 4, 4));
  w.add_tensor("f64", type::f64, {32}, pattern(256, 5));  // known, unsupported: still written
  w.add_tensor("scalar", type::f32, std::span<const int64_t>{}, pattern(4, 6));
  return w;
}


}  // namespace

TEST_CASE("gguf writer: parse(write(x)) == x for every value type and tensor layout", "[gguf][writer]") {
  const gguf_writer w = sample_writer();
  const std::vector<std::byte> bytes = w.write();
  const gguf_file f = parse_gguf(bytes);

  CHECK(f.version() == gguf_version);
  CHECK(f.alignment() == 32);
  CHECK(f.file_size() == bytes.size());
  CHECK(f.data_offset() % 32 == 0);
  CHECK(f.metadata() == w.metadata());
  CHECK(f.tensors() == w.tensor_infos());
  CHECK(bytes.size() % 32 == 0);

  for (const gguf_tensor_info& t : f.tensors()) {
    CHECK(t.file_offset % 32 == 0);
    CHECK(t.offset % 32 == 0);
  }
  const gguf_tensor_info& q = f.tensor("q4_0.3d");
  CHECK(q.n_dims == 3);
  CHECK(q.ne == std::array<int64_t, 4>{64, 2, 3, 1});
  CHECK(q.n_bytes == 2 * 18 * 6);
  const std::vector<std::byte> expect = pattern(2 * 18 * 6, 3);
  CHECK(std::equal(expect.begin(), expect.end(), bytes.begin() + static_cast<std::ptrdiff_t>(q.file_offset)));
  CHECK(f.tensor("scalar").n_dims == 0);
  CHECK(f.tensor("scalar").n_elements() == 1);
  CHECK_FALSE(f.tensor("f64").supported());

  // NaNs compare equal to themselves (bit patterns), -0 differs from +0.
  CHECK(*f.find("nan") == gguf_value(std::numeric_limits<float>::quiet_NaN()));
  CHECK_FALSE(gguf_value(-0.0f) == gguf_value(0.0f));
}

TEST_CASE("gguf writer: write(parse(bytes)) == bytes", "[gguf][writer]") {
  const std::vector<std::byte> bytes = sample_writer().write();
  const gguf_file f = parse_gguf(bytes);
  CHECK(gguf_writer::from(f, bytes).write() == bytes);

  for (uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    gguf_writer w = sample_writer();
    w.set_alignment(alignment);
    const std::vector<std::byte> b = w.write();
    const gguf_file g = parse_gguf(b);
    CHECK(g.alignment() == alignment);
    CHECK(g.data_offset() % alignment == 0);
    CHECK(g.get<uint32_t>("general.alignment").value() == alignment);
    CHECK(gguf_writer::from(g, b).write() == b);
  }
  CHECK_THROWS_AS(gguf_writer::from(f, std::span(bytes).first(bytes.size() - 1)), gguf_error);
}

TEST_CASE("gguf writer: files on disk", "[gguf][writer]") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("troupe-test-writer-" + std::to_string(::getpid()) + ".gguf");
  const gguf_writer w = sample_writer();
  w.write_file(path);
  CHECK(test::read_file_bytes(path) == w.write());
  const gguf_file f = read_gguf(path);
  CHECK(f.metadata() == w.metadata());
  CHECK(f.tensors() == w.tensor_infos());
  CHECK(f.source() == path.string());
  std::filesystem::remove(path);

  CHECK_THROWS_WITH(read_gguf(path), Contains(path.string()) && Contains("cannot open"));
  CHECK_THROWS_WITH(w.write_file("/nonexistent-dir/x.gguf"), Contains("/nonexistent-dir/x.gguf"));
  CHECK_THROWS_WITH(read_gguf(std::filesystem::temp_directory_path()), Contains("not a regular file"));
}

TEST_CASE("gguf: reading a file does not read its tensor data", "[gguf][writer]") {
  const std::filesystem::path path =
      std::filesystem::temp_directory_path() / ("troupe-test-big-" + std::to_string(::getpid()) + ".gguf");
  gguf_writer w;
  w.add("general.name", "big");
  const std::vector<std::byte> data(8 << 20);  // 8 MiB of tensor data
  w.add_tensor_ref("big", type::f32, {2 << 20}, data);
  w.write_file(path);
  const gguf_file f = read_gguf(path);
  CHECK(f.file_size() > (8u << 20));
  CHECK(f.bytes_read() <= f.data_offset() + 64 * 1024);  // the header plus at most one read-ahead window
  std::filesystem::remove(path);
}

TEST_CASE("gguf: v2 files parse like v3", "[gguf][writer]") {
  std::vector<std::byte> bytes = sample_writer().write();
  bytes[4] = std::byte{2};
  const gguf_file f = parse_gguf(bytes);
  CHECK(f.version() == 2);
  CHECK(f.metadata() == sample_writer().metadata());
}

TEST_CASE("gguf: a file without tensors", "[gguf][writer]") {
  gguf_writer w;
  w.add("tokenizer.ggml.tokens", std::vector<std::string>{"a", "b"});
  const std::vector<std::byte> bytes = w.write();
  const gguf_file f = parse_gguf(bytes);
  CHECK(f.tensors().empty());
  CHECK(f.data_offset() == bytes.size());
  CHECK(gguf_writer::from(f, bytes).write() == bytes);
  // Without the trailing padding (as some writers leave it) the file is still valid.
  const gguf_file g = parse_gguf(std::span(bytes).first(bytes.size() - 3));
  CHECK(g.metadata() == f.metadata());
}

TEST_CASE("gguf: typed getters", "[gguf][values]") {
  const std::vector<std::byte> bytes = sample_writer().write();
  const gguf_file f = parse_gguf(bytes, "sample.gguf");

  CHECK(f.get<uint8_t>("u8").value() == 250);
  CHECK(f.get<int8_t>("i8").value() == -7);
  CHECK(f.get<uint16_t>("u16").value() == 65000);
  CHECK(f.get<int16_t>("i16").value() == -32000);
  CHECK(f.get<uint32_t>("u32").value() == 4000000000u);
  CHECK(f.get<int32_t>("i32").value() == -2000000000);
  CHECK(f.get<float>("f32").value() == 0.25f);
  CHECK(f.get<bool>("bool").value());
  CHECK(f.get<std::string>("string").value() == "llama");
  CHECK(f.get<uint64_t>("u64").value() == uint64_t{1} << 60);
  CHECK(f.get<int64_t>("i64").value() == int64_t{-1} << 60);
  CHECK(f.get<double>("f64").value() == -1.5e300);
  CHECK(f.get<std::vector<bool>>("a.bool").value() == std::vector<bool>{true, false, true});
  CHECK(f.get<std::vector<std::string>>("a.string")->at(3) == std::string("nul\0inside", 10));
  CHECK(f.get<gguf_array>("a.nested")->elem_type() == gguf_type::array);
  CHECK(f.get<std::vector<gguf_array>>("a.nested")->at(1).get_if<std::string>()->at(2) == "z");

  // Integer getters accept any integer type that fits.
  CHECK(f.get_uint("u8").value() == 250);
  CHECK(f.get_uint("u32").value() == 4000000000u);
  CHECK(f.get_int("i8").value() == -7);
  CHECK(f.get_int("u64").value() == int64_t{1} << 60);
  CHECK(f.get_float("f32").value() == 0.25);
  CHECK(f.get_float("f64").value() == -1.5e300);

  // Failures name the key and the file, and say why.
  const auto missing = f.get<uint32_t>("llama.block_count");
  CHECK_FALSE(missing);
  CHECK_THAT(missing.error(), Contains("gguf: sample.gguf: key 'llama.block_count': not found") &&
                                  Contains("file size " + std::to_string(bytes.size()) + " bytes"));
  CHECK_THROWS_AS(missing.value(), gguf_error);
  CHECK(missing.value_or(7) == 7);

  const auto wrong = f.get<std::string>("u32");
  CHECK_THAT(wrong.error(), Contains("key 'u32': has type uint32, expected string") && Contains("offset "));
  CHECK_THROWS_WITH(*wrong, Contains("key 'u32'"));
  CHECK_THAT(f.get<std::vector<int32_t>>("a.string").error(),
             Contains("has type array of string, expected array of int32"));
  CHECK_THAT(f.get_uint("i8").error(), Contains("key 'i8': value -7 is negative"));
  CHECK_THAT(f.get_int("a.u64").error(), Contains("key 'a.u64': has type array of uint64, expected an integer"));
  CHECK_THAT(f.get_float("string").error(), Contains("expected float32 or float64"));
  CHECK_THAT(f.get_int("missing").error(), Contains("key 'missing': not found"));

  CHECK(f.contains("a.f64"));
  CHECK_FALSE(f.contains("nope"));
  CHECK(f.metadata()[f.find_index("u16").value()].key == "u16");
}

TEST_CASE("gguf values: types, conversions and rendering", "[gguf][values]") {
  CHECK(gguf_value("x").type() == gguf_type::string);  // not bool
  CHECK(gguf_value(5).type() == gguf_type::int32);
  CHECK(gguf_value(5u).type() == gguf_type::uint32);
  CHECK(gguf_value(std::vector<std::string>{"a"}).type() == gguf_type::array);
  CHECK(gguf_type_name(gguf_type::boolean) == "bool");
  CHECK(gguf_type_name(static_cast<gguf_type>(99)) == "unknown");
  CHECK(gguf_type_size(gguf_type::float64) == 8);
  CHECK(gguf_type_size(gguf_type::string) == 0);

  CHECK(gguf_value(int16_t{-1}).as_uint() == std::nullopt);
  CHECK(gguf_value(int16_t{-1}).as_int() == -1);
  CHECK(gguf_value(~uint64_t{0}).as_int() == std::nullopt);
  CHECK(gguf_value(true).as_uint() == std::nullopt);
  CHECK(gguf_value(1.5).as_float() == 1.5);

  CHECK(gguf_value(uint8_t{7}).to_string() == "7");
  CHECK(gguf_value("a\"b\n").to_string() == "\"a\\\"b\\x0a\"");
  CHECK(gguf_value(std::vector<int32_t>{1, 2, 3}).to_string(2) == "[1, 2, ... (3 elements)]");
  CHECK(gguf_value(std::vector<gguf_array>{gguf_array(std::vector<bool>{true})}).to_string() == "[[true]]");
  CHECK(gguf_value(0.25f).to_string() == "0.25");
}

TEST_CASE("gguf writer: refuses what the parser would refuse", "[gguf][writer]") {
  gguf_writer w;
  w.add("k", 1);
  CHECK_THROWS_WITH(w.add("k", 2), Contains("gguf writer: key 'k': duplicate key"));
  CHECK_THROWS_WITH(w.add("", 2), Contains("empty key"));
  CHECK_THROWS_WITH(w.add("general.alignment", uint32_t{48}), Contains("alignment 48 is not a power of two"));
  CHECK_THROWS_WITH(w.add("general.alignment", uint64_t{64}), Contains("has type uint64, must be uint32"));
  CHECK_THROWS_WITH(w.set_alignment(0), Contains("not a power of two"));

  gguf_array deep(std::vector<uint8_t>{1});
  for (int d = 1; d < gguf_max_array_depth; ++d) deep = gguf_array(std::vector<gguf_array>{deep});
  w.add("deep16", deep);
  CHECK_THROWS_WITH(w.add("deep17", gguf_array(std::vector<gguf_array>{deep})),
                    Contains("key 'deep17': arrays nested deeper than 16 levels"));

  const std::vector<std::byte> d(4 * 8);
  w.add_tensor("t", type::f32, {8}, d);
  CHECK_THROWS_WITH(w.add_tensor("t", type::f32, {8}, d), Contains("tensor 't': duplicate tensor name"));
  CHECK_THROWS_WITH(w.add_tensor("u", type::f32, {9}, d), Contains("tensor 'u': data is 32 bytes, the shape and type need 36"));
  CHECK_THROWS_WITH(w.add_tensor("u", type::q4_0, {8}, d), Contains("row length 8 is not a multiple of the q4_0 block size 32"));
  CHECK_THROWS_WITH(w.add_tensor("u", type::f32, {8, 0}, d), Contains("dimension 1 is 0, must be positive"));
  CHECK_THROWS_WITH(w.add_tensor("u", type::f32, {1, 1, 1, 1, 8}, d), Contains("5 dimensions, at most 4"));
  CHECK_THROWS_WITH(w.add_tensor("u", static_cast<type>(4), {8}, d), Contains("unknown tensor type id 4"));
  CHECK_THROWS_WITH(w.add_tensor(std::string(64, 'n'), type::f32, {8}, d), Contains("name is 64 bytes long"));

  // set() replaces in place, keeping the order.
  w.set("k", "replaced");
  CHECK(w.metadata().front().value == gguf_value("replaced"));
  w.set_alignment(16);
  CHECK(w.alignment() == 16);
  const gguf_file f = parse_gguf(w.write());
  CHECK(f.alignment() == 16);
  CHECK(f.metadata() == w.metadata());
}
