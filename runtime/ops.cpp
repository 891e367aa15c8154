// Op construction: shape and type checks, result shapes, parameters. See ops.h for every op's contract.
#include "runtime/ops.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <initializer_list>
#include <string>

#include "runtime/error.h"

namespace troupe {
namespace {

// Throws op_error: "<op>: <reason>: a = <describe>, b = <describe>".
[[noreturn]] void fail(std::string_view op, const std::string& reason, std::initializer_list<const tensor*> srcs) {
  std::string msg = std::string(op) + ": " + reason;
  char label = 'a';
  const char* sep = ": ";
  for (const tensor* t : srcs) {
    if (t == nullptr) continue;
    msg += sep;
    msg += label;
    msg += " = ";
    msg += describe(*t);
    sep = ", ";
    ++label;
  }
  throw op_error(msg);
}

void require(bool ok, std::string_view op, const char* reason, std::initializer_list<const tensor*> srcs) {
  if (!ok) fail(op, reason, srcs);
}

void require_src(const tensor* t, std::string_view op, const char* what) {
  if (t == nullptr) throw op_error(std::string(op) + ": " + what + " is null");
}

tensor* new_node(context& ctx, enum op o, type t, const std::array<int64_t, max_dims>& ne,
                 std::initializer_list<tensor*> srcs) {
  tensor* r = ctx.new_tensor(t, max_dims, ne.data());
  r->op = o;
  int i = 0;
  for (tensor* s : srcs) r->src[static_cast<size_t>(i++)] = s;
  return r;
}

// A node that is a view of `of` (shares data) with the given op.
tensor* new_view_node(context& ctx, enum op o, tensor* of, std::initializer_list<tensor*> srcs) {
  tensor* r = ctx.view_tensor(of);
  r->op = o;
  int i = 0;
  for (tensor* s : srcs) r->src[static_cast<size_t>(i++)] = s;
  return r;
}

bool is_index_type(type t) { return t == type::i32 || t == type::i64; }

tensor* binary(context& ctx, enum op o, tensor* a, tensor* b) {
  const std::string_view name = op_name(o);
  require_src(a, name, "a");
  require_src(b, name, "b");
  require(a->type == type::f32 && b->type == type::f32, name, "both sources must be f32", {a, b});
  require(can_repeat(*b, *a), name, "b cannot be broadcast over a (each a.ne[i] must be a multiple of b.ne[i])",
          {a, b});
  return new_node(ctx, o, type::f32, a->ne, {a, b});
}

tensor* unary(context& ctx, enum op o, tensor* a) {
  const std::string_view name = op_name(o);
  require_src(a, name, "a");
  require(a->type == type::f32, name, "the source must be f32", {a});
  return new_node(ctx, o, type::f32, a->ne, {a});
}

tensor* reduce_rows(context& ctx, enum op o, tensor* a) {
  const std::string_view name = op_name(o);
  require_src(a, name, "a");
  require(a->type == type::f32, name, "the source must be f32", {a});
  return new_node(ctx, o, type::f32, {1, a->ne[1], a->ne[2], a->ne[3]}, {a});
}

}  // namespace

tensor* add(context& ctx, tensor* a, tensor* b) { return binary(ctx, op::add, a, b); }
tensor* sub(context& ctx, tensor* a, tensor* b) { return binary(ctx, op::sub, a, b); }
tensor* mul(context& ctx, tensor* a, tensor* b) { return binary(ctx, op::mul, a, b); }
tensor* div(context& ctx, tensor* a, tensor* b) { return binary(ctx, op::div, a, b); }

tensor* scale(context& ctx, tensor* a, float s, float bias) {
  tensor* r = unary(ctx, op::scale, a);
  r->set_param(0, s);
  r->set_param(1, bias);
  return r;
}

tensor* rms_norm(context& ctx, tensor* a, float eps) {
  require(eps >= 0.0f, "rms_norm", "eps must be >= 0", {a});
  tensor* r = unary(ctx, op::rms_norm, a);
  r->set_param(0, eps);
  return r;
}

tensor* norm(context& ctx, tensor* a, float eps) {
  require(eps >= 0.0f, "norm", "eps must be >= 0", {a});
  tensor* r = unary(ctx, op::norm, a);
  r->set_param(0, eps);
  return r;
}

tensor* silu(context& ctx, tensor* a) { return unary(ctx, op::silu, a); }
tensor* gelu(context& ctx, tensor* a) { return unary(ctx, op::gelu, a); }
tensor* sigmoid(context& ctx, tensor* a) { return unary(ctx, op::sigmoid, a); }

tensor* glu(context& ctx, tensor* a, tensor* b, glu_kind kind, bool swapped) {
  require_src(a, "glu", "a");
  require(kind == glu_kind::swiglu || kind == glu_kind::geglu, "glu", "unknown glu kind", {a, b});
  require(a->type == type::f32 && (b == nullptr || b->type == type::f32), "glu", "sources must be f32", {a, b});
  tensor* r;
  if (b != nullptr) {
    require(same_shape(*a, *b), "glu", "a and b must have the same shape", {a, b});
    r = new_node(ctx, op::glu, type::f32, a->ne, {a, b});
  } else {
    require(a->ne[0] % 2 == 0, "glu", "a.ne[0] must be even to split into halves", {a});
    r = new_node(ctx, op::glu, type::f32, {a->ne[0] / 2, a->ne[1], a->ne[2], a->ne[3]}, {a});
  }
  r->set_param(0, static_cast<int32_t>(kind));
  r->set_param(1, static_cast<int32_t>(swapped ? 1 : 0));
  return r;
}

tensor* rope(context& ctx, tensor* a, tensor* pos, tensor* freq_factors, const rope_params& p) {
  require_src(a, "rope", "a");
  require_src(pos, "rope", "pos");
  require(a->type == type::f32, "rope", "a must be f32", {a, pos, freq_factors});
  require(pos->type == type::i32, "rope", "pos must be i32", {a, pos, freq_factors});
  require(n_dims(*pos) == 1 && pos->ne[0] == a->ne[2], "rope", "pos must be 1-D with a.ne[2] entries",
          {a, pos, freq_factors});
  require(p.n_dims > 0 && p.n_dims % 2 == 0 && p.n_dims <= a->ne[0], "rope",
          "n_dims must be even, positive and <= a.ne[0]", {a, pos, freq_factors});
  require(p.mode == rope_mode::normal || p.mode == rope_mode::neox, "rope", "mode must be normal (0) or neox (2)",
          {a, pos, freq_factors});
  require(std::isfinite(p.freq_base) && p.freq_base > 0.0f && std::isfinite(p.freq_scale) && p.freq_scale > 0.0f,
          "rope", "freq_base and freq_scale must be positive", {a, pos, freq_factors});
  if (freq_factors != nullptr) {
    require(freq_factors->type == type::f32 && freq_factors->ne[0] >= p.n_dims / 2, "rope",
            "freq_factors must be f32 with at least n_dims / 2 entries", {a, pos, freq_factors});
  }
  tensor* r = new_node(ctx, op::rope, type::f32, a->ne, {a, pos, freq_factors});
  r->set_param(0, p.n_dims);
  r->set_param(1, static_cast<int32_t>(p.mode));
  r->set_param(2, p.n_ctx_orig);
  r->set_param(3, p.freq_base);
  r->set_param(4, p.freq_scale);
  r->set_param(5, p.ext_factor);
  r->set_param(6, p.attn_factor);
  r->set_param(7, p.beta_fast);
  r->set_param(8, p.beta_slow);
  return r;
}

namespace {

// Dimension at which `n_rot` full rotations happen over n_ctx_orig positions:
// n_dims * log(n_ctx_orig / (n_rot * 2 pi)) / (2 log(base)).
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot, float base) {
  return static_cast<float>(n_dims) *
         std::log(static_cast<float>(n_ctx_orig) / (n_rot * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

}  // namespace

void rope_yarn_corr_dims(const rope_params& p, float dims[2]) {
  const float start = std::floor(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_fast, p.freq_base));
  const float end = std::ceil(yarn_corr_dim(p.n_dims, p.n_ctx_orig, p.beta_slow, p.freq_base));
  dims[0] = std::max(0.0f, start);
  dims[1] = std::min(static_cast<float>(p.n_dims - 1), end);
}

rope_constants rope_constants_of(const rope_params& p) {
  rope_constants c;
  c.theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(p.n_dims));
  if (p.ext_factor != 0.0f) {
    float corr[2];
    rope_yarn_corr_dims(p, corr);
    c.ext_factor = p.ext_factor;
    c.corr0 = corr[0];
    c.corr1 = corr[1];
    c.yarn_mscale = 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  }
  return c;
}

alibi_constants alibi_constants_of(float max_bias, uint32_t n_head) {
  alibi_constants a;
  a.n_head_log2 = 1u << static_cast<uint32_t>(std::floor(std::log2(static_cast<float>(n_head))));
  a.m0 = std::pow(2.0f, -max_bias / static_cast<float>(a.n_head_log2));
  a.m1 = std::pow(2.0f, -(max_bias / 2.0f) / static_cast<float>(a.n_head_log2));
  return a;
}

rope_params rope_params_of(const tensor& t) {
  rope_params p;
  p.n_dims = t.param<int32_t>(0);
  p.mode = static_cast<rope_mode>(t.param<int32_t>(1));
  p.n_ctx_orig = t.param<int32_t>(2);
  p.freq_base = t.param<float>(3);
  p.freq_scale = t.param<float>(4);
  p.ext_factor = t.param<float>(5);
  p.attn_factor = t.param<float>(6);
  p.beta_fast = t.param<float>(7);
  p.beta_slow = t.param<float>(8);
  return p;
}

tensor* soft_max(context& ctx, tensor* a, tensor* mask, float s, float max_bias) {
  require_src(a, "soft_max", "a");
  require(a->type == type::f32, "soft_max", "a must be f32", {a, mask});
  require(max_bias >= 0.0f, "soft_max", "max_bias must be >= 0", {a, mask});
  if (mask != nullptr) {
    require(mask->type == type::f32 || mask->type == type::f16, "soft_max", "mask must be f32 or f16", {a, mask});
    require(is_contiguous_rows(*mask), "soft_max", "mask rows must be contiguous", {a, mask});
    require(mask->ne[0] == a->ne[0] && mask->ne[1] >= a->ne[1], "soft_max",
            "mask must be [a.ne[0], >= a.ne[1], ...]", {a, mask});
    require(a->ne[2] % mask->ne[2] == 0 && a->ne[3] % mask->ne[3] == 0, "soft_max",
            "mask cannot be broadcast over dims 2 and 3 of a", {a, mask});
  }
  tensor* r = new_node(ctx, op::soft_max, type::f32, a->ne, {a, mask});
  r->set_param(0, s);
  r->set_param(1, max_bias);
  return r;
}

tensor* mul_mat(context& ctx, tensor* a, tensor* b) {
  require_src(a, "mul_mat", "a");
  require_src(b, "mul_mat", "b");
  const type_traits& ta = traits(a->type);
  require(ta.supported && ta.vec_dot != nullptr, "mul_mat", "a's type cannot be multiplied", {a, b});
  require(b->type == type::f32, "mul_mat", "b must be f32", {a, b});
  require(a->ne[0] == b->ne[0], "mul_mat", "a.ne[0] != b.ne[0]", {a, b});
  require(b->ne[2] % a->ne[2] == 0 && b->ne[3] % a->ne[3] == 0, "mul_mat",
          "a cannot be broadcast over dims 2 and 3 of b", {a, b});
  // a's rows contiguous, or a an f32 / f16 matrix read transposed (column-major: nb[1] is the element size,
  // as V in a row per cache cell), which the CPU multiplies as sums of a's rows.
  const bool column_major = (a->type == type::f32 || a->type == type::f16) && a->nb[1] == type_size(a->type);
  require(is_contiguous_rows(*a) || column_major, "mul_mat",
          "a's rows must be contiguous, or a an f32 / f16 matrix read transposed (another transposed a needs cont first)",
          {a, b});
  return new_node(ctx, op::mul_mat, type::f32, {a->ne[1], b->ne[1], b->ne[2], b->ne[3]}, {a, b});
}

tensor* mul_mat_id(context& ctx, tensor* as, tensor* b, tensor* ids) {
  require_src(as, "mul_mat_id", "as");
  require_src(b, "mul_mat_id", "b");
  require_src(ids, "mul_mat_id", "ids");
  const type_traits& ta = traits(as->type);
  require(ta.supported && ta.vec_dot != nullptr, "mul_mat_id", "the experts' type cannot be multiplied", {as, b, ids});
  require(is_contiguous_rows(*as), "mul_mat_id", "the experts' rows must be contiguous", {as, b, ids});
  require(b->type == type::f32, "mul_mat_id", "b must be f32", {as, b, ids});
  require(ids->type == type::i32, "mul_mat_id", "ids must be i32", {as, b, ids});
  require(as->ne[3] == 1 && b->ne[3] == 1 && ids->ne[2] == 1 && ids->ne[3] == 1, "mul_mat_id",
          "shapes must be as = [k, m, n_expert, 1], b = [k, n_b, n_tokens, 1], ids = [n_used, n_tokens, 1, 1]",
          {as, b, ids});
  require(as->ne[0] == b->ne[0], "mul_mat_id", "as.ne[0] != b.ne[0]", {as, b, ids});
  require(ids->ne[1] == b->ne[2], "mul_mat_id", "ids and b must have the same token count (ids.ne[1] == b.ne[2])",
          {as, b, ids});
  require(b->ne[1] == 1 || b->ne[1] == ids->ne[0], "mul_mat_id", "b.ne[1] must be 1 or ids.ne[0] (n_used)",
          {as, b, ids});
  return new_node(ctx, op::mul_mat_id, type::f32, {as->ne[1], ids->ne[0], ids->ne[1], 1}, {as, b, ids});
}

tensor* mul_mat_masked(context& ctx, tensor* a, tensor* b, tensor* mask) {
  tensor* r = mul_mat(ctx, a, b);
  require_src(mask, "mul_mat_masked", "mask");
  require(mask->type == type::f32 || mask->type == type::f16, "mul_mat_masked", "the mask must be f32 or f16", {a, b, mask});
  require(mask->ne[0] >= r->ne[0] && mask->ne[1] >= r->ne[1] && r->ne[2] % mask->ne[2] == 0 && mask->ne[3] == 1,
          "mul_mat_masked", "the mask must cover the product's elements", {a, b, mask});
  r->src[2] = mask;
  return r;
}

tensor* flash_attn(context& ctx, tensor* q, tensor* k, tensor* v, tensor* mask, float scale) {
  require_src(q, "flash_attn", "q");
  require_src(k, "flash_attn", "k");
  require_src(v, "flash_attn", "v");
  require(q->type == type::f32, "flash_attn", "q must be f32", {q, k, v, mask});
  for (tensor* t : {k, v}) {
    // f32, f16, or a block type (the quantized KV caches) whose rows are whole blocks.
    require(t->ne[0] % block_size(t->type) == 0, "flash_attn", "k's and v's rows must be whole blocks of their type",
            {q, k, v, mask});
    require(t->nb[0] == type_size(t->type), "flash_attn", "k's and v's rows must be contiguous", {q, k, v, mask});
  }
  require(q->nb[0] == type_size(q->type), "flash_attn", "q's rows must be contiguous", {q, k, v, mask});
  require(q->ne[3] == 1 && k->ne[3] == 1 && v->ne[3] == 1, "flash_attn", "q, k and v must be 3-d", {q, k, v, mask});
  require(k->ne[0] == q->ne[0], "flash_attn", "k.ne[0] != q.ne[0] (the head size)", {q, k, v, mask});
  require(k->ne[1] == v->ne[1] && k->ne[2] == v->ne[2], "flash_attn", "k and v must have the same cells and heads",
          {q, k, v, mask});
  require(q->ne[2] % k->ne[2] == 0, "flash_attn", "q's heads must be a multiple of k's", {q, k, v, mask});
  require(scale > 0.0f && std::isfinite(scale), "flash_attn", "scale must be positive and finite", {q, k, v, mask});
  if (mask != nullptr) {
    require(mask->type == type::f32 || mask->type == type::f16, "flash_attn", "mask must be f32 or f16", {q, k, v, mask});
    require(is_contiguous_rows(*mask), "flash_attn", "mask rows must be contiguous", {q, k, v, mask});
    require(mask->ne[0] >= k->ne[1] && mask->ne[1] >= q->ne[1] && mask->ne[2] == 1 && mask->ne[3] == 1, "flash_attn",
            "mask must be [>= n_kv, >= n_tokens, 1, 1]", {q, k, v, mask});
  }
  tensor* r = new_node(ctx, op::flash_attn, type::f32, {v->ne[0], q->ne[2], q->ne[1], 1}, {q, k, v, mask});
  r->set_param(0, scale);
  return r;
}

tensor* get_rows(context& ctx, tensor* a, tensor* idx) {
  require_src(a, "get_rows", "a");
  require_src(idx, "get_rows", "idx");
  require(traits(a->type).to_float != nullptr, "get_rows", "a's type cannot be converted to f32", {a, idx});
  require(is_contiguous_rows(*a), "get_rows", "a's rows must be contiguous", {a, idx});
  require(is_index_type(idx->type), "get_rows", "idx must be i32 or i64", {a, idx});
  require(a->ne[3] == 1 && idx->ne[2] == 1 && idx->ne[3] == 1 && idx->ne[1] == a->ne[2], "get_rows",
          "shapes must be a = [ne0, rows, ne2, 1], idx = [n, ne2, 1, 1]", {a, idx});
  return new_node(ctx, op::get_rows, type::f32, {a->ne[0], idx->ne[0], idx->ne[1], 1}, {a, idx});
}

tensor* set_rows(context& ctx, tensor* dst, tensor* src, tensor* idx) {
  require_src(dst, "set_rows", "dst");
  require_src(src, "set_rows", "src");
  require_src(idx, "set_rows", "idx");
  require(traits(dst->type).from_float_ref != nullptr, "set_rows", "dst's type cannot be written from f32",
          {dst, src, idx});
  require(src->type == type::f32, "set_rows", "src must be f32", {dst, src, idx});
  require(is_index_type(idx->type), "set_rows", "idx must be i32 or i64", {dst, src, idx});
  require(is_contiguous_rows(*dst), "set_rows", "dst's rows must be contiguous", {dst, src, idx});
  require(dst->ne[0] == src->ne[0] && dst->ne[2] == src->ne[2] && dst->ne[3] == src->ne[3], "set_rows",
          "dst and src must agree in dims 0, 2 and 3", {dst, src, idx});
  require(idx->ne[0] == src->ne[1] && idx->ne[3] == 1, "set_rows", "idx must be [src.ne[1], ne2i, ne3i, 1]",
          {dst, src, idx});
  require(src->ne[2] % idx->ne[1] == 0 && src->ne[3] % idx->ne[2] == 0, "set_rows",
          "idx cannot be broadcast over dims 2 and 3 of src", {dst, src, idx});
  return new_view_node(ctx, op::set_rows, dst, {dst, src, idx});
}

tensor* cpy(context& ctx, tensor* a, tensor* b) {
  require_src(a, "cpy", "a");
  require_src(b, "cpy", "b");
  require(nelements(*a) == nelements(*b), "cpy", "a and b must have the same number of elements", {a, b});
  const bool same = a->type == b->type;
  const bool to_any = a->type == type::f32 && traits(b->type).from_float_ref != nullptr;
  const bool to_f32 = b->type == type::f32 && traits(a->type).to_float != nullptr;
  require(same || to_any || to_f32, "cpy", "no conversion between these types", {a, b});
  if (is_quantized(a->type) || is_quantized(b->type)) {
    require(is_contiguous_rows(*a) && is_contiguous_rows(*b) && a->ne[0] == b->ne[0], "cpy",
            "quantized copies need contiguous rows of equal length", {a, b});
  }
  return new_view_node(ctx, op::cpy, b, {a, b});
}

tensor* cont(context& ctx, tensor* a) {
  require_src(a, "cont", "a");
  return cont(ctx, a, a->ne[0], a->ne[1], a->ne[2], a->ne[3]);
}

tensor* cont(context& ctx, tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
  require_src(a, "cont", "a");
  require(ne0 * ne1 * ne2 * ne3 == nelements(*a), "cont", "the new shape must have a's element count", {a});
  if (is_quantized(a->type)) {
    require(ne0 == a->ne[0] && is_contiguous_rows(*a), "cont", "quantized tensors keep their row length", {a});
  }
  return new_node(ctx, op::cont, a->type, {ne0, ne1, ne2, ne3}, {a});
}

tensor* view_4d(context& ctx, tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3, size_t nb1,
                size_t nb2, size_t nb3, size_t offset) {
  require_src(a, "view", "a");
  require(ne0 >= 0 && ne1 >= 0 && ne2 >= 0 && ne3 >= 0, "view", "negative size", {a});
  require(ne0 % block_size(a->type) == 0, "view", "ne0 must be a multiple of the block size", {a});
  tensor probe;
  probe.type = a->type;
  probe.ne = {ne0, ne1, ne2, ne3};
  probe.nb = {type_size(a->type), nb1, nb2, nb3};
  const size_t need = nbytes(probe);
  const size_t have = nbytes(*a);
  if (need > 0 && (offset > have || need > have - offset)) {
    fail("view", "the view [" + std::to_string(ne0) + ", " + std::to_string(ne1) + ", " + std::to_string(ne2) +
                     ", " + std::to_string(ne3) + "] at byte " + std::to_string(offset) + " spans " +
                     std::to_string(need) + " bytes, past the source's " + std::to_string(have),
         {a});
  }
  tensor* r = ctx.view_tensor(a);
  tensor* root = a->view_src ? a->view_src : a;
  r->view_src = root;
  r->view_offs = (a->view_src ? a->view_offs : 0) + offset;
  if (a->data != nullptr) r->data = static_cast<char*>(a->data) + offset;
  r->ne = probe.ne;
  r->nb = probe.nb;
  r->op = op::view;
  r->src[0] = a;
  r->set_param(0, static_cast<int32_t>(static_cast<uint32_t>(offset & 0xffffffffu)));
  r->set_param(1, static_cast<int32_t>(static_cast<uint32_t>(static_cast<uint64_t>(offset) >> 32)));
  return r;
}

tensor* view_1d(context& ctx, tensor* a, int64_t ne0, size_t offset) {
  require_src(a, "view", "a");
  const size_t nb1 = row_size(a->type, ne0);
  return view_4d(ctx, a, ne0, 1, 1, 1, nb1, nb1, nb1, offset);
}

tensor* view_2d(context& ctx, tensor* a, int64_t ne0, int64_t ne1, size_t nb1, size_t offset) {
  return view_4d(ctx, a, ne0, ne1, 1, 1, nb1, nb1 * static_cast<size_t>(ne1), nb1 * static_cast<size_t>(ne1),
                 offset);
}

tensor* view_3d(context& ctx, tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, size_t nb1, size_t nb2,
                size_t offset) {
  return view_4d(ctx, a, ne0, ne1, ne2, 1, nb1, nb2, nb2 * static_cast<size_t>(ne2), offset);
}

tensor* reshape(context& ctx, tensor* a, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
  require_src(a, "reshape", "a");
  require(is_contiguous(*a), "reshape", "a must be contiguous (use cont first)", {a});
  require(ne0 >= 0 && ne1 >= 0 && ne2 >= 0 && ne3 >= 0 && ne0 * ne1 * ne2 * ne3 == nelements(*a), "reshape",
          "the new shape must have a's element count", {a});
  require(ne0 % block_size(a->type) == 0, "reshape", "ne0 must be a multiple of the block size", {a});
  tensor* r = new_view_node(ctx, op::reshape, a, {a});
  r->ne = {ne0, ne1, ne2, ne3};
  r->nb = dense_strides(a->type, r->ne);
  return r;
}

tensor* permute(context& ctx, tensor* a, int axis0, int axis1, int axis2, int axis3) {
  require_src(a, "permute", "a");
  const int axes[4] = {axis0, axis1, axis2, axis3};
  bool seen[4] = {false, false, false, false};
  for (int ax : axes) {
    if (ax < 0 || ax > 3 || seen[ax]) {
      fail("permute", "axes (" + std::to_string(axis0) + ", " + std::to_string(axis1) + ", " +
                          std::to_string(axis2) + ", " + std::to_string(axis3) + ") are not a permutation of 0..3",
           {a});
    }
    seen[ax] = true;
  }
  tensor* r = new_view_node(ctx, op::permute, a, {a});
  for (int i = 0; i < 4; ++i) {
    r->ne[static_cast<size_t>(axes[i])] = a->ne[static_cast<size_t>(i)];
    r->nb[static_cast<size_t>(axes[i])] = a->nb[static_cast<size_t>(i)];
  }
  for (int i = 0; i < 4; ++i) r->set_param(i, axes[i]);
  return r;
}

tensor* transpose(context& ctx, tensor* a) {
  require_src(a, "transpose", "a");
  tensor* r = new_view_node(ctx, op::transpose, a, {a});
  std::swap(r->ne[0], r->ne[1]);
  std::swap(r->nb[0], r->nb[1]);
  r->set_param(0, 1);
  r->set_param(1, 0);
  r->set_param(2, 2);
  r->set_param(3, 3);
  return r;
}

tensor* concat(context& ctx, tensor* a, tensor* b, int dim) {
  require_src(a, "concat", "a");
  require_src(b, "concat", "b");
  require(dim >= 0 && dim < max_dims, "concat", "dim must be 0..3", {a, b});
  require(a->type == type::f32 && b->type == type::f32, "concat", "sources must be f32", {a, b});
  for (int i = 0; i < max_dims; ++i) {
    if (i != dim && a->ne[static_cast<size_t>(i)] != b->ne[static_cast<size_t>(i)]) {
      fail("concat", "a and b differ in dimension " + std::to_string(i) + " (concatenating along " +
                         std::to_string(dim) + ")",
           {a, b});
    }
  }
  std::array<int64_t, max_dims> ne = a->ne;
  ne[static_cast<size_t>(dim)] += b->ne[static_cast<size_t>(dim)];
  tensor* r = new_node(ctx, op::concat, type::f32, ne, {a, b});
  r->set_param(0, dim);
  return r;
}

tensor* pad(context& ctx, tensor* a, int p0, int p1, int p2, int p3) {
  require_src(a, "pad", "a");
  require(a->type == type::f32, "pad", "a must be f32", {a});
  require(p0 >= 0 && p1 >= 0 && p2 >= 0 && p3 >= 0, "pad", "padding must be >= 0", {a});
  tensor* r = new_node(ctx, op::pad, type::f32, {a->ne[0] + p0, a->ne[1] + p1, a->ne[2] + p2, a->ne[3] + p3}, {a});
  r->set_param(0, p0);
  r->set_param(1, p1);
  r->set_param(2, p2);
  r->set_param(3, p3);
  return r;
}

tensor* sum_rows(context& ctx, tensor* a) { return reduce_rows(ctx, op::sum_rows, a); }
tensor* mean(context& ctx, tensor* a) { return reduce_rows(ctx, op::mean, a); }

tensor* argmax(context& ctx, tensor* a) {
  require_src(a, "argmax", "a");
  require(a->type == type::f32, "argmax", "a must be f32", {a});
  require(a->ne[2] == 1 && a->ne[3] == 1, "argmax", "a must be 2-D", {a});
  return new_node(ctx, op::argmax, type::i32, {a->ne[1], 1, 1, 1}, {a});
}

tensor* top_k(context& ctx, tensor* a, int k) {
  require_src(a, "top_k", "a");
  require(a->type == type::f32, "top_k", "a must be f32", {a});
  require(k >= 1 && k <= a->ne[0], "top_k", "k must be in [1, a.ne[0]]", {a});
  tensor* r = new_node(ctx, op::top_k, type::i32, {k, a->ne[1], a->ne[2], a->ne[3]}, {a});
  r->set_param(0, static_cast<int32_t>(k));
  return r;
}

}  // namespace troupe
