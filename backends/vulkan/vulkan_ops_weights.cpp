// How the Vulkan backend records the ops whose first source is weights of any type (mul_mat, mul_mat_id,
// get_rows: weights.glsl's shaders, one variant per weight type) and set_rows (float rows, or q8_0 blocks):
// their views are in bytes where the weights' are, and the matrix product picks its shader here.
//
// Separate from vulkan_ops.cpp (backend::record of the element-wise and row ops, computes()): these ops
// have their own views and parameter blocks and share only vulkan_ops_internal.h with the others.
#include <algorithm>
#include <string>

#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_buffer.h"
#include "backends/vulkan/vulkan_ops_internal.h"
#include "runtime/ops.h"

namespace troupe::vulkan {

using namespace detail;

namespace {

// A weights tensor's byte offset and strides in its buffer, and the suffix of its shaders' variants.
struct weights_view {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint32_t off = 0;
  uint32_t nb[4] = {};
  std::string variant;  // "_q4_K": mul_mat_vec_q4_K, ...
};

weights_view weights_of(const vulkan::device& dev, const tensor& t) {
  const auto [b, at] = place_of(dev, t, t.type == type::f32 ? 4 : 2);
  weights_view v;
  v.buffer = b->handle();
  v.off = static_cast<uint32_t>(at);
  for (int i = 0; i < 4; ++i) v.nb[i] = static_cast<uint32_t>(t.nb[static_cast<size_t>(i)]);
  v.variant = "_" + std::string(type_name(t.type));
  return v;
}

// Matrix products of up to this many activation rows take the matrix-vector shader (mul_mat_vec.comp).
constexpr int64_t mat_vec_max_cols = 8;
// mul_mat_mm.comp's output tile.
constexpr uint64_t mm_tile = 64;

struct mul_mat_params {
  uint32_t m, n, k, ne2, ne3;
  uint32_t a_off, a_nb1, a_nb2, a_nb3, a_ne2, a_ne3;
  uint32_t b_off, b_nb[4];
  uint32_t d_off, d_nb1, d_nb2, d_nb3;
};

struct mul_mat_id_params {
  uint32_t m, n_used, n_tokens, k, n_expert;
  uint32_t a_off, a_nb1, a_nb2;
  uint32_t b_off, b_nb0, b_nb1, b_nb2, n_b;
  uint32_t d_off, d_nb1, d_nb2;
  uint32_t i_off, i_nb0, i_nb1;
};

struct get_rows_params {
  uint32_t ne0, n, ne2;
  uint32_t a_off, a_nb1, a_nb2, a_rows;
  uint32_t i_off, i_nb0, i_nb1, i_64;
  uint32_t d_off, d_nb1, d_nb2;
};

struct set_rows_params {
  uint32_t ne[4];
  uint32_t s_off, s_nb[4];
  uint32_t i_off, i_nb0, i_nb1, i_nb2, i_ne1, i_ne2, i_64;
  uint32_t d_off, d_nb1, d_nb2, d_nb3, d_rows;
  uint32_t d_type;
};

// set_rows' source rows and indices (the destination's fields are the caller's).
set_rows_params set_rows_source(const tensor& ts, const f32_view& sv, const tensor& ti, const f32_view& iv) {
  set_rows_params p{};
  dims_of(ts, p.ne);
  p.s_off = sv.off;
  std::copy(sv.nb, sv.nb + 4, p.s_nb);
  p.i_off = iv.off;
  p.i_nb0 = iv.nb[0];
  p.i_nb1 = iv.nb[1];
  p.i_nb2 = iv.nb[2];
  p.i_ne1 = static_cast<uint32_t>(ti.ne[1]);
  p.i_ne2 = static_cast<uint32_t>(ti.ne[2]);
  p.i_64 = ti.type == type::i64 ? 1 : 0;
  return p;
}

}  // namespace

// set_rows: the destination's offset and strides in its elements, or in bytes for rows of blocks.
void backend::record_set_rows(tensor& node) {
  const tensor& ts = *node.src[1];
  const tensor& ti = *node.src[2];
  const f32_view sv = view_of(dev_, ts);
  const f32_view iv = view_of(dev_, ti);
  set_rows_params p = set_rows_source(ts, sv, ti, iv);
  const bool blocks = set_rows_code(node.type) >= 3;
  VkBuffer dst = VK_NULL_HANDLE;
  const uint32_t* nb = nullptr;
  weights_view dw;
  f32_view df;
  if (blocks) {
    dw = weights_of(dev_, node);
    dst = dw.buffer;
    p.d_off = dw.off;
    nb = dw.nb;
  } else {
    df = view_of(dev_, node);
    dst = df.buffer;
    p.d_off = df.off;
    nb = df.nb;
  }
  p.d_nb1 = nb[1];
  p.d_nb2 = nb[2];
  p.d_nb3 = nb[3];
  p.d_rows = static_cast<uint32_t>(node.ne[1]);
  p.d_type = blocks ? static_cast<uint32_t>(set_rows_code(node.type)) : float_code(node.type);
  const auto units = static_cast<uint64_t>(nelements(ts)) / (blocks ? 32 : 1);  // blocks, or elements
  dispatch("set_rows", {sv.buffer, iv.buffer, dst}, &p, sizeof p, groups_for(units));
}

// The ops whose first source is weights of any type (weights.glsl): a's view is in bytes.
void backend::record_weights_op(tensor& node) {
  const tensor& ta = *node.src[0];
  const weights_view w = weights_of(dev_, ta);
  uint32_t ne[4];
  dims_of(node, ne);
  const f32_view d = view_of(dev_, node);
  if (node.op == op::get_rows) {
    const tensor& ti = *node.src[1];
    const f32_view iv = view_of(dev_, ti);
    get_rows_params p{};
    p.ne0 = ne[0];
    p.n = ne[1];
    p.ne2 = ne[2];
    p.a_off = w.off;
    p.a_nb1 = w.nb[1];
    p.a_nb2 = w.nb[2];
    p.a_rows = static_cast<uint32_t>(ta.ne[1]);
    p.i_off = iv.off;
    p.i_nb0 = iv.nb[0];
    p.i_nb1 = iv.nb[1];
    p.i_64 = ti.type == type::i64 ? 1 : 0;
    p.d_off = d.off;
    p.d_nb1 = d.nb[1];
    p.d_nb2 = d.nb[2];
    dispatch(("get_rows" + w.variant).c_str(), {w.buffer, iv.buffer, d.buffer}, &p, sizeof p, groups_for(uint64_t{ne[0]} * ne[1] * ne[2]));
    return;
  }
  if (node.op == op::mul_mat_id) {
    const f32_view b = view_of(dev_, *node.src[1]);
    const f32_view iv = view_of(dev_, *node.src[2]);
    mul_mat_id_params p{};
    p.m = ne[0];
    p.n_used = ne[1];
    p.n_tokens = ne[2];
    p.k = static_cast<uint32_t>(ta.ne[0]);
    p.n_expert = static_cast<uint32_t>(ta.ne[2]);
    p.a_off = w.off;
    p.a_nb1 = w.nb[1];
    p.a_nb2 = w.nb[2];
    p.b_off = b.off;
    p.b_nb0 = b.nb[0];
    p.b_nb1 = b.nb[1];
    p.b_nb2 = b.nb[2];
    p.n_b = static_cast<uint32_t>(node.src[1]->ne[1]);
    p.d_off = d.off;
    p.d_nb1 = d.nb[1];
    p.d_nb2 = d.nb[2];
    p.i_off = iv.off;
    p.i_nb0 = iv.nb[0];
    p.i_nb1 = iv.nb[1];
    const uint64_t rows_per_group = std::max<uint64_t>(1, 64 / std::max<uint32_t>(dev_.limits().subgroup_size, 1));
    const uint64_t rows = uint64_t{ne[0]} * ne[1] * ne[2];
    dispatch(("mul_mat_id" + w.variant).c_str(), {w.buffer, b.buffer, d.buffer, iv.buffer}, &p, sizeof p,
             (rows + rows_per_group - 1) / rows_per_group);
    return;
  }
  const f32_view b = view_of(dev_, *node.src[1]);
  mul_mat_params p{};
  p.m = ne[0];
  p.n = ne[1];
  p.k = static_cast<uint32_t>(ta.ne[0]);
  p.ne2 = ne[2];
  p.ne3 = ne[3];
  p.a_off = w.off;
  p.a_nb1 = w.nb[1];
  p.a_nb2 = w.nb[2];
  p.a_nb3 = w.nb[3];
  p.a_ne2 = static_cast<uint32_t>(ta.ne[2]);
  p.a_ne3 = static_cast<uint32_t>(ta.ne[3]);
  p.b_off = b.off;
  std::copy(b.nb, b.nb + 4, p.b_nb);
  p.d_off = d.off;
  p.d_nb1 = d.nb[1];
  p.d_nb2 = d.nb[2];
  p.d_nb3 = d.nb[3];
  const uint64_t planes = uint64_t{ne[2]} * ne[3];
  const bool automatic = matmul_ == matmul_shader::automatic;
  if (automatic && node.ne[1] <= mat_vec_max_cols && dev_.limits().subgroup_arithmetic) {
    // A subgroup per row: 64 / subgroup size rows per workgroup.
    const uint64_t rows_per_group = std::max<uint64_t>(1, 64 / std::max<uint32_t>(dev_.limits().subgroup_size, 1));
    dispatch(("mul_mat_vec" + w.variant).c_str(), {w.buffer, b.buffer, d.buffer}, &p, sizeof p, (uint64_t{ne[0]} * planes + rows_per_group - 1) / rows_per_group);
  } else if (matmul_ == matmul_shader::registers || (automatic && dev_.is_cpu())) {
    // A CPU driver: 4 x 4 outputs per invocation, no shared memory.
    const uint64_t blocks = uint64_t{(ne[0] + 3) / 4} * ((ne[1] + 3) / 4);
    dispatch(("mul_mat_reg" + w.variant).c_str(), {w.buffer, b.buffer, d.buffer}, &p, sizeof p, (blocks * planes + 63) / 64);
  } else {
    const uint64_t tiles = ((ne[0] + mm_tile - 1) / mm_tile) * ((ne[1] + mm_tile - 1) / mm_tile);
    dispatch(("mul_mat_mm" + w.variant).c_str(), {w.buffer, b.buffer, d.buffer}, &p, sizeof p, tiles * planes);
  }
}

}  // namespace troupe::vulkan

namespace troupe::vulkan::detail {

int set_rows_code(type t) {
  switch (t) {
    case type::q8_0: return 3;
    case type::q4_0: return 4;
    case type::q4_1: return 5;
    case type::q5_0: return 6;
    case type::q5_1: return 7;
    case type::iq4_nl: return 8;
    default: return -1;
  }
}

}  // namespace troupe::vulkan::detail
