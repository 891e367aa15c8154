// The wire format: little-endian encoding, frame headers, version rules, tensor entries, layout checks, HMAC.
#include <catch2/catch.hpp>

#include <cstring>
#include <fstream>

#include "backends/rpc/wire/auth.h"
#include "net/rpc/cache.h"
#include "backends/rpc/wire/protocol.h"
#include "backends/rpc/wire/validate.h"
#include "tests/net/test_server.h"

using namespace troupe;
using namespace troupe::rpc;

TEST_CASE("integers are little-endian and the reader never reads past its payload", "[rpc][protocol]") {
  std::vector<uint8_t> b;
  writer w(b);
  w.u8(0x12);
  w.u16(0x3456);
  w.u32(0x789abcde);
  w.u64(0x0102030405060708ull);
  w.i32(-2);
  w.f32(1.5f);
  w.str("hi");
  REQUIRE(b.size() == 1 + 2 + 4 + 8 + 4 + 4 + 4 + 2);
  CHECK(b[1] == 0x56);
  CHECK(b[2] == 0x34);
  CHECK(b[7] == 0x08);
  CHECK(b[14] == 0x01);
  reader r(b);
  CHECK(r.u8() == 0x12);
  CHECK(r.u16() == 0x3456);
  CHECK(r.u32() == 0x789abcdeu);
  CHECK(r.u64() == 0x0102030405060708ull);
  CHECK(r.i32() == -2);
  const uint32_t f = r.u32();
  float x;
  std::memcpy(&x, &f, 4);
  CHECK(x == 1.5f);
  CHECK(r.str(16) == "hi");
  CHECK_NOTHROW(r.done("test"));
  CHECK_THROWS_AS(r.u8(), protocol_error);

  reader r2(std::span<const uint8_t>(b).first(3));
  CHECK_THROWS_AS(r2.u32(), protocol_error);
  std::vector<uint8_t> s;
  writer(s).u32(1000);
  reader r3(s);
  CHECK_THROWS_WITH(r3.str(10), Catch::Contains("exceeds"));
}

TEST_CASE("frame headers: one code byte and a 64-bit size", "[rpc][protocol]") {
  uint8_t h[frame_header_size];
  encode_header(h, 12, 0xfedcba9876543210ull);
  CHECK(h[0] == 12);
  CHECK(h[1] == 0x10);
  CHECK(h[8] == 0xfe);
  const frame_header d = decode_header(h);
  CHECK(d.code == 12);
  CHECK(d.size == 0xfedcba9876543210ull);
  CHECK(command_from_code(static_cast<uint8_t>(command::count)) == std::nullopt);
  CHECK(command_name(command::graph_recompute) == "graph_recompute");
  CHECK(max_payload(command::hello) == max_small_payload);
}

TEST_CASE("versions: same major, and the server's minor not newer than the client's", "[rpc][protocol]") {
  CHECK(compatible({1, 0, 0}, {1, 0, 7}));
  CHECK(compatible({1, 3, 0}, {1, 2, 0}));
  CHECK_FALSE(compatible({1, 2, 0}, {1, 3, 0}));
  CHECK_FALSE(compatible({2, 0, 0}, {1, 0, 0}));
  CHECK(to_string(version{1, 2, 3}) == "1.2.3");
}

TEST_CASE("tensor entries round-trip with a fixed size", "[rpc][protocol]") {
  wire_tensor t;
  t.k = wire_tensor::kind::node;
  t.op = static_cast<uint8_t>(op::rope);
  t.type = static_cast<uint32_t>(type::q4_0);
  t.ne = {64, 2, 3, 4};
  t.nb = {18, 36, 72, 216};
  for (int i = 0; i < max_op_params; ++i) t.op_params[static_cast<size_t>(i)] = i * 1000 - 7;
  t.src = {0, 1, -1, 2};
  t.flags = 5;
  t.buffer = 99;
  t.offset = 1ull << 40;
  std::vector<uint8_t> b;
  writer w(b);
  t.write(w);
  REQUIRE(b.size() == wire_tensor::wire_size);
  reader r(b);
  const wire_tensor u = wire_tensor::read(r);
  CHECK(u.k == t.k);
  CHECK(u.op == t.op);
  CHECK(u.type == t.type);
  CHECK(u.ne == t.ne);
  CHECK(u.nb == t.nb);
  CHECK(u.op_params == t.op_params);
  CHECK(u.src == t.src);
  CHECK(u.buffer == 99);
  CHECK(u.offset == t.offset);
  b[0] = 7;  // not a kind
  reader r2(b);
  CHECK_THROWS_AS(wire_tensor::read(r2), protocol_error);
}

TEST_CASE("layout checks: spans are computed without overflow", "[rpc][validate]") {
  CHECK(checked_span(type::f32, {4, 3, 1, 1}, {4, 16, 48, 48}) == 48u);
  CHECK(checked_span(type::q4_0, {64, 2, 1, 1}, {18, 36, 72, 72}) == 72u);
  CHECK_FALSE(checked_span(type::f32, {0, 1, 1, 1}, {4, 4, 4, 4}));
  CHECK_FALSE(checked_span(type::f32, {1 << 20, 1 << 20, 1, 1}, {max_stride + 1, 4, 4, 4}));
  CHECK_FALSE(checked_span(type::f32, {max_ne, max_ne, 1, 1}, {max_stride, max_stride, 4, 4}));  // overflows
  CHECK_FALSE(checked_span(type::q4_0, {33, 1, 1, 1}, {18, 18, 18, 18}));  // not whole blocks
  CHECK_THROWS_AS(check_shape(type::f32, {1, 1, -1, 1}, "t"), protocol_error);
  CHECK_THROWS_AS(check_shape(type::f32, {1 << 30, 1 << 30, 1, 1}, "t"), protocol_error);  // 2^60 elements
  CHECK_THROWS_AS(check_shape(type::q4_0, {31, 1, 1, 1}, "t"), protocol_error);
  CHECK_NOTHROW(check_shape(type::q4_0, {64, 1, 1, 1}, "t"));
  CHECK_THROWS_AS(check_type(4, "t"), protocol_error);    // a retired id
  CHECK_THROWS_AS(check_type(1000, "t"), protocol_error);
  CHECK(check_type(0, "t") == type::f32);
  CHECK_THROWS_AS(check_range(10, 20, 25, "t"), protocol_error);
  CHECK_THROWS_AS(check_range(UINT64_MAX, 2, 25, "t"), protocol_error);
  CHECK_NOTHROW(check_range(5, 20, 25, "t"));
}

TEST_CASE("authentication proofs: keyed, bound to both nonces, compared in constant time", "[rpc][auth]") {
  const nonce a = random_nonce();
  const nonce b = random_nonce();
  CHECK(a != b);
  const mac p = client_proof("0123456789abcdef", a, b, protocol_version);
  CHECK(equal_macs(p, client_proof("0123456789abcdef", a, b, protocol_version)));
  CHECK_FALSE(equal_macs(p, client_proof("0123456789abcdeX", a, b, protocol_version)));
  CHECK_FALSE(equal_macs(p, client_proof("0123456789abcdef", b, a, protocol_version)));
  CHECK_FALSE(equal_macs(p, client_proof("0123456789abcdef", a, b, version{1, 0, 1})));
  CHECK_FALSE(equal_macs(p, server_proof("0123456789abcdef", b, a)));

  testing::temp_dir dir("troupe-key");
  const auto f = dir.path() / "key";
  std::ofstream(f) << "short\n";
  CHECK_THROWS_WITH(load_key_file(f), Catch::Contains("at least 16"));
  std::ofstream(f) << "a-long-enough-shared-key\n";
  CHECK(load_key_file(f) == "a-long-enough-shared-key");
  CHECK_THROWS(load_key_file(dir.path() / "missing"));
}

TEST_CASE("the weight cache stores by content hash and rejects damaged entries", "[rpc][cache]") {
  testing::temp_dir dir("troupe-cache");
  tensor_cache c(dir.path() / "sub");
  std::vector<uint8_t> bytes(4096);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = static_cast<uint8_t>(i * 31);
  const uint64_t h = content_hash(bytes.data(), bytes.size());
  std::vector<uint8_t> out(bytes.size());
  CHECK_FALSE(c.load(h, out.data(), out.size()));
  c.store(bytes.data(), bytes.size());
  CHECK(c.load(h, out.data(), out.size()));
  CHECK(out == bytes);
  CHECK_FALSE(c.load(h, out.data(), out.size() - 1));  // another size
  {
    std::fstream f(c.path_of(h), std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(100);
    f.put(static_cast<char>(bytes[100] ^ 1));
  }
  CHECK_FALSE(c.load(h, out.data(), out.size()));
}
