// The type table: ids, names, block sizes, supported flags and kernels per type; unknown ids and names;
// require_supported's message.
#include <catch2/catch.hpp>

#include <string>

#include "runtime/error.h"
#include "runtime/quants.h"
#include "runtime/types.h"

using namespace troupe;

TEST_CASE("type table: ids, names, block sizes, supported flags", "[types]") {
  const struct {
    type t;
    uint32_t id;
    const char* name;
    int64_t block;
    size_t bytes;
    bool quantized;
    bool supported;
  } rows[] = {
      {type::f32, 0, "f32", 1, 4, false, true},          {type::f16, 1, "f16", 1, 2, false, true},
      {type::q4_0, 2, "q4_0", 32, 18, true, true},       {type::q4_1, 3, "q4_1", 32, 20, true, true},
      {type::q5_0, 6, "q5_0", 32, 22, true, true},       {type::q5_1, 7, "q5_1", 32, 24, true, true},
      {type::q8_0, 8, "q8_0", 32, 34, true, true},       {type::q8_1, 9, "q8_1", 32, 36, true, true},
      {type::q2_K, 10, "q2_K", 256, 84, true, true},     {type::q3_K, 11, "q3_K", 256, 110, true, true},
      {type::q4_K, 12, "q4_K", 256, 144, true, true},    {type::q5_K, 13, "q5_K", 256, 176, true, true},
      {type::q6_K, 14, "q6_K", 256, 210, true, true},    {type::q8_K, 15, "q8_K", 256, 292, true, true},
      {type::iq2_xxs, 16, "iq2_xxs", 256, 66, true, true}, {type::iq2_xs, 17, "iq2_xs", 256, 74, true, true},
      {type::iq3_xxs, 18, "iq3_xxs", 256, 98, true, true}, {type::iq1_s, 19, "iq1_s", 256, 50, true, true},
      {type::iq4_nl, 20, "iq4_nl", 32, 18, true, true}, {type::iq3_s, 21, "iq3_s", 256, 110, true, true},
      {type::iq2_s, 22, "iq2_s", 256, 82, true, true},  {type::iq4_xs, 23, "iq4_xs", 256, 136, true, true},
      {type::i8, 24, "i8", 1, 1, false, false},          {type::i16, 25, "i16", 1, 2, false, false},
      {type::i32, 26, "i32", 1, 4, false, true},         {type::i64, 27, "i64", 1, 8, false, true},
      {type::f64, 28, "f64", 1, 8, false, false},        {type::iq1_m, 29, "iq1_m", 256, 56, true, true},
      {type::bf16, 30, "bf16", 1, 2, false, true},       {type::tq1_0, 34, "tq1_0", 256, 54, true, true},
      {type::tq2_0, 35, "tq2_0", 256, 66, true, true},   {type::mxfp4, 39, "mxfp4", 32, 17, true, true},
  };
  size_t known = 0;
  for (const auto& r : rows) {
    const type_traits& tr = traits(r.t);
    INFO("type " << r.name);
    CHECK(static_cast<uint32_t>(r.t) == r.id);
    CHECK(tr.name == r.name);
    CHECK(tr.block_size == r.block);
    CHECK(tr.type_size == r.bytes);
    CHECK(tr.is_quantized == r.quantized);
    CHECK(tr.known);
    CHECK(tr.supported == r.supported);
    CHECK(type_from_id(r.id) == r.t);
    CHECK(type_from_name(r.name) == r.t);
    const bool computes = r.supported && r.t != type::i32 && r.t != type::i64;
    CHECK((tr.to_float != nullptr) == computes);
    // The i-quants below 4 bits are read, never written (their quantizers need an importance matrix).
    const std::string name(r.name);
    const bool writes = computes && !(name.rfind("iq", 0) == 0 && name != "iq4_xs" && name != "iq4_nl");
    CHECK((tr.from_float_ref != nullptr) == writes);
    CHECK((tr.vec_dot != nullptr) == computes);
    if (computes) CHECK(traits(tr.vec_dot_type).vec_dot != nullptr);
    ++known;
  }
  uint32_t n_known = 0;
  for (uint32_t id = 0; id < type_id_count; ++id) n_known += type_from_id(id).has_value();
  CHECK(n_known == known);

  CHECK(traits(type::q4_0).vec_dot_type == type::q8_0);
  CHECK(traits(type::q5_0).vec_dot_type == type::q8_0);
  CHECK(traits(type::q8_0).vec_dot_type == type::q8_0);
  CHECK(traits(type::q4_1).vec_dot_type == type::q8_1);
  CHECK(traits(type::q5_1).vec_dot_type == type::q8_1);
  for (type t : {type::q2_K, type::q3_K, type::q4_K, type::q5_K, type::q6_K, type::q8_K, type::iq4_xs}) CHECK(traits(t).vec_dot_type == type::q8_K);
  CHECK(traits(type::iq4_nl).vec_dot_type == type::q8_0);
  CHECK(traits(type::mxfp4).vec_dot_type == type::q8_0);
  CHECK(traits(type::tq1_0).vec_dot_type == type::q8_K);
  CHECK(traits(type::tq2_0).vec_dot_type == type::q8_K);
  CHECK(traits(type::f16).vec_dot_type == type::f32);  // activations stay f32 against f16 weights
  CHECK(traits(type::bf16).vec_dot_type == type::bf16);
  CHECK(traits(type::f32).vec_dot_type == type::f32);
  CHECK(row_size(type::q4_K, 4096) == 16 * 144);
  CHECK(row_size(type::q8_0, 4096) == 128 * 34);
}

TEST_CASE("type table: unknown ids and names", "[types]") {
  for (uint32_t id : {4u, 5u, 31u, 32u, 33u, 36u, 37u, 38u, 40u, 99u, 0xFFFFFFFFu}) {
    INFO("id " << id);
    CHECK_FALSE(type_from_id(id).has_value());
    const type_traits& tr = traits(static_cast<type>(id));
    CHECK_FALSE(tr.known);
    CHECK_FALSE(tr.supported);
    CHECK(tr.name == "unknown");
    CHECK(row_size(static_cast<type>(id), 256) == 0);  // no division by zero
    CHECK_THROWS_AS(require_supported(static_cast<type>(id), "t"), type_error);
  }
  CHECK(type_from_name("Q4_K") == type::q4_K);
  CHECK(type_from_name("q4_k") == type::q4_K);
  CHECK(type_from_name("BF16") == type::bf16);
  CHECK(type_from_name("IQ2_XXS") == type::iq2_xxs);
  CHECK_FALSE(type_from_name("unknown").has_value());
  CHECK_FALSE(type_from_name("q4").has_value());
  CHECK_FALSE(type_from_name("").has_value());
}

TEST_CASE("require_supported names the tensor and the type", "[types]") {
  CHECK_NOTHROW(require_supported(type::q4_K, "blk.0.attn_q.weight"));
  CHECK_NOTHROW(require_supported(type::i32, "positions"));
  try {
    require_supported(type::i16, "blk.0.attn_q.weight");
    FAIL("require_supported did not throw for i16");
  } catch (const type_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find("blk.0.attn_q.weight") != std::string::npos);
    CHECK(msg.find("i16") != std::string::npos);
    CHECK(msg.find("25") != std::string::npos);
  }
  CHECK_THROWS_AS(require_supported(type::f64, "w"), type_error);
  CHECK_NOTHROW(require_supported(type::iq3_s, "w"));
}
