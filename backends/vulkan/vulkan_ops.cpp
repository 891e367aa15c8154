// What the Vulkan backend computes (computes(), asked by device::supports_op) and how each node is recorded
// (backend::record): the shader and its push constants, built from the node's tensors.
#include <algorithm>
#include <cmath>
#include <utility>

#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_buffer.h"
#include "runtime/ops.h"

namespace troupe::vulkan {

namespace {

bool f32_strides(const tensor& t) {
  return t.type == type::f32 && std::all_of(t.nb.begin(), t.nb.end(), [](size_t nb) { return nb % 4 == 0; });
}

// Element offset and strides of a tensor in its Vulkan buffer (in elements of its type: 4 or 2 bytes).
struct f32_view {
  VkBuffer buffer = VK_NULL_HANDLE;
  uint32_t off = 0;
  uint32_t nb[4] = {};
};

// The Vulkan buffer t lies in and t's byte offset in it, which must be a multiple of `align`; throws
// backend_error naming the tensor otherwise, or when t is not in dev's memory.
std::pair<vulkan::buffer*, size_t> place_of(const vulkan::device& dev, const tensor& t, size_t align) {
  auto* b = dynamic_cast<vulkan::buffer*>(t.buffer);
  if (b == nullptr || &b->type().device() != &dev) {
    throw backend_error(std::string(dev.name()) + ": tensor " + describe(t) + " is not in this device's memory");
  }
  const size_t at = b->offset_of(t);
  if (at % align != 0) throw backend_error(std::string(dev.name()) + ": tensor " + describe(t) + " is not aligned to its type");
  return {b, at};
}

f32_view view_of(const vulkan::device& dev, const tensor& t) {
  const size_t es = type_size(t.type);
  const auto [b, at] = place_of(dev, t, es);
  f32_view v;
  v.buffer = b->handle();
  v.off = static_cast<uint32_t>(at / es);
  for (int i = 0; i < 4; ++i) v.nb[i] = static_cast<uint32_t>(t.nb[static_cast<size_t>(i)] / es);
  return v;
}

// Weights as weights.glsl reads them (mul_mat, get_rows): every float type and the quantized blocks of
// runtime/quants.h (is_gpu_weight_type), rows contiguous (whole blocks), in bytes. Fields 16 bits wide need
// even offsets.
bool readable_weights(const tensor& w) {
  if (!is_gpu_weight_type(w.type) || w.ne[0] % block_size(w.type) != 0 || w.nb[0] != type_size(w.type)) return false;
  const size_t align = w.type == type::f32 ? 4 : 2;
  return std::all_of(w.nb.begin(), w.nb.end(), [align](size_t nb) { return nb % align == 0; });
}

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

struct binary_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t b_ne[4];
  uint32_t b_off, b_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t op;
};

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

struct rows_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t d_ne0, d_ne1, d_ne2;
  uint32_t d_off, d_nb[4];
  uint32_t op;
  float eps;
};

struct concat_pad_params {
  uint32_t ne[4];
  uint32_t a_ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t b_off, b_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t op, dim;
};

struct rms_norm_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t d_off, d_nb[4];
  float eps;
};

struct soft_max_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t m_off, m_nb1, m_nb2, m_nb3;
  uint32_t m_ne2, m_ne3, m_f16, has_mask;
  uint32_t d_off, d_nb1, d_nb2, d_nb3;
  float scale, max_bias, m0, m1;
  uint32_t n_head_log2;
};

struct glu_params {
  uint32_t ne[4];
  uint32_t x_off, x_nb[4];
  uint32_t g_off, g_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t kind;
};

struct get_rows_params {
  uint32_t ne0, n, ne2;
  uint32_t a_off, a_nb1, a_nb2, a_rows;
  uint32_t i_off, i_nb0, i_nb1, i_64;
  uint32_t d_off, d_nb1, d_nb2;
};

struct cpy_params {
  uint32_t s_ne[4];
  uint32_t s_off, s_nb[4];
  uint32_t d_ne[4];
  uint32_t d_off, d_nb[4];
  uint32_t s_type, d_type, n;
  uint32_t by_word;
};

// 0 f32, 1 f16, 2 bf16: the float types the copy shader converts between.
uint32_t float_code(type t) { return t == type::f32 ? 0 : t == type::f16 ? 1 : 2; }
bool float_type(type t) { return t == type::f32 || t == type::f16 || t == type::bf16; }
bool element_strides(const tensor& t) {
  const size_t es = type_size(t.type);
  return std::all_of(t.nb.begin(), t.nb.end(), [es](size_t nb) { return nb % es == 0; });
}

struct set_rows_params {
  uint32_t ne[4];
  uint32_t s_off, s_nb[4];
  uint32_t i_off, i_nb0, i_nb1, i_nb2, i_ne1, i_ne2, i_64;
  uint32_t d_off, d_nb1, d_nb2, d_nb3, d_rows;
  uint32_t d_type;
};

struct rope_shader_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t p_off, f_off, has_ff;
  uint32_t n_dims, neox;
  float theta_scale, freq_scale, attn_factor;
  float ext_factor, corr0, corr1, yarn_mscale;
};

struct unary_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t op;
  float s;
  float bias;
};

// A tensor's four dimensions, as the shaders take them.
void dims_of(const tensor& t, uint32_t (&out)[4]) {
  for (int i = 0; i < 4; ++i) out[i] = static_cast<uint32_t>(t.ne[static_cast<size_t>(i)]);
}

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

// Workgroups for one invocation per unit (element, pair, word).
uint64_t groups_for(uint64_t units) { return (units + shader_group_size - 1) / shader_group_size; }

// The shape, source a and destination fields every element-wise shader's parameters share.
template <class Params>
void set_shape_a_d(Params& p, const uint32_t (&ne)[4], const f32_view& a, const f32_view& d) {
  std::copy(ne, ne + 4, p.ne);
  p.a_off = a.off;
  std::copy(a.nb, a.nb + 4, p.a_nb);
  p.d_off = d.off;
  std::copy(d.nb, d.nb + 4, p.d_nb);
}

}  // namespace

bool computes(const tensor& t) {
  if (is_layout_op(t.op)) return true;
  switch (t.op) {
    case op::add:
    case op::sub:
    case op::mul:
    case op::div:
      return f32_strides(t) && t.src[0] && t.src[1] && f32_strides(*t.src[0]) && f32_strides(*t.src[1]) &&
             same_shape(t, *t.src[0]) && can_repeat(*t.src[1], *t.src[0]);
    case op::scale:
    case op::silu:
    case op::gelu:
    case op::sigmoid:
    case op::rms_norm:
    case op::norm:
      return f32_strides(t) && t.src[0] && f32_strides(*t.src[0]) && same_shape(t, *t.src[0]);
    case op::sum_rows:
    case op::mean:
      return f32_strides(t) && t.src[0] && f32_strides(*t.src[0]) && nelements(t) == nrows(*t.src[0]);
    case op::argmax:
      return t.type == type::i32 && element_strides(t) && t.src[0] && f32_strides(*t.src[0]) && nelements(t) == nrows(*t.src[0]);
    case op::concat: {
      const int32_t dim = t.param<int32_t>(0);
      return f32_strides(t) && t.src[0] && t.src[1] && f32_strides(*t.src[0]) && f32_strides(*t.src[1]) && dim >= 0 && dim < 4;
    }
    case op::pad:
      return f32_strides(t) && t.src[0] && f32_strides(*t.src[0]);
    case op::cpy:
    case op::cont: {
      const tensor* a = t.src[0];
      return a != nullptr && float_type(a->type) && float_type(t.type) && element_strides(*a) && element_strides(t);
    }
    case op::rope: {
      const tensor* a = t.src[0];
      const tensor* pos = t.src[1];
      const tensor* ff = t.src[2];
      const rope_params rp = rope_params_of(t);
      if (a == nullptr || pos == nullptr || !f32_strides(*a) || !f32_strides(t) || !same_shape(t, *a)) return false;
      if (pos->type != type::i32 || pos->nb[0] != 4) return false;
      if (ff != nullptr && (ff->type != type::f32 || ff->nb[0] != 4)) return false;
      return (rp.mode == rope_mode::normal || rp.mode == rope_mode::neox) && rp.n_dims > 0 &&
             rp.n_dims % 2 == 0 && rp.n_dims <= a->ne[0];
    }
    case op::set_rows: {
      const tensor* src = t.src[1];
      const tensor* idx = t.src[2];
      if (src == nullptr || idx == nullptr || !f32_strides(*src)) return false;
      if (idx->type != type::i32 && idx->type != type::i64) return false;
      if (!element_strides(*idx) || t.nb[0] != type_size(t.type)) return false;
      if (t.type == type::q8_0) {  // rows of whole blocks, 16-bit aligned (a q8_0 KV cache)
        return t.ne[0] % 32 == 0 && std::all_of(t.nb.begin(), t.nb.end(), [](size_t nb) { return nb % 2 == 0; });
      }
      return float_type(t.type) && element_strides(t);
    }
    case op::get_rows: {
      const tensor* a = t.src[0];
      const tensor* idx = t.src[1];
      if (a == nullptr || idx == nullptr || !f32_strides(t) || t.nb[0] != 4 || !readable_weights(*a)) return false;
      if (idx->type != type::i32 && idx->type != type::i64) return false;
      const size_t is = type_size(idx->type);
      return std::all_of(idx->nb.begin(), idx->nb.end(), [is](size_t nb) { return nb % is == 0; });
    }
    case op::glu: {
      const tensor* a = t.src[0];
      const tensor* b = t.src[1];
      const int32_t kind = t.param<int32_t>(0);
      return a != nullptr && f32_strides(t) && f32_strides(*a) && (b == nullptr || f32_strides(*b)) && (kind == 0 || kind == 1);
    }
    case op::soft_max: {
      const tensor* a = t.src[0];
      const tensor* m = t.src[1];
      if (a == nullptr || !f32_strides(*a) || !f32_strides(t) || t.nb[0] != 4 || !same_shape(t, *a)) return false;
      if (m == nullptr) return true;
      if (m->type != type::f32 && m->type != type::f16) return false;
      const size_t es = type_size(m->type);
      return m->nb[0] == es && std::all_of(m->nb.begin(), m->nb.end(), [es](size_t nb) { return nb % es == 0; });
    }
    case op::mul_mat: {
      const tensor* a = t.src[0];
      const tensor* b = t.src[1];
      return a != nullptr && b != nullptr && f32_strides(t) && t.nb[0] == 4 && f32_strides(*b) && readable_weights(*a);
    }
    case op::mul_mat_id: {
      const tensor* a = t.src[0];
      const tensor* b = t.src[1];
      const tensor* ids = t.src[2];
      return a != nullptr && b != nullptr && ids != nullptr && f32_strides(t) && t.nb[0] == 4 && f32_strides(*b) &&
             readable_weights(*a) && ids->type == type::i32 && element_strides(*ids) && a->ne[3] == 1 &&
             (b->ne[1] == 1 || b->ne[1] == ids->ne[0]);
    }
    default:
      return false;
  }
}

void backend::record(tensor& node) {
  if (node.op == op::mul_mat || node.op == op::get_rows || node.op == op::mul_mat_id) {
    record_weights_op(node);
    return;
  }
  if (node.op == op::set_rows) {
    record_set_rows(node);
    return;
  }
  const f32_view a = view_of(dev_, *node.src[0]);
  const f32_view d = view_of(dev_, node);
  uint32_t ne[4];
  dims_of(node, ne);
  const uint64_t n = static_cast<uint64_t>(nelements(node));
  const uint64_t per_element = groups_for(n);
  switch (node.op) {
    case op::add:
    case op::sub:
    case op::mul:
    case op::div: {
      const f32_view b = view_of(dev_, *node.src[1]);
      binary_params p{};
      set_shape_a_d(p, ne, a, d);
      dims_of(*node.src[1], p.b_ne);
      p.b_off = b.off;
      std::copy(b.nb, b.nb + 4, p.b_nb);
      p.op = node.op == op::add ? 0 : node.op == op::sub ? 1 : node.op == op::mul ? 2 : 3;
      dispatch("binary", {a.buffer, b.buffer, d.buffer}, &p, sizeof p, per_element);
      return;
    }
    case op::norm:
    case op::sum_rows:
    case op::mean:
    case op::argmax: {
      rows_params p{};
      dims_of(*node.src[0], p.ne);
      p.a_off = a.off;
      std::copy(a.nb, a.nb + 4, p.a_nb);
      p.d_ne0 = ne[0];
      p.d_ne1 = ne[1];
      p.d_ne2 = ne[2];
      p.d_off = d.off;
      std::copy(d.nb, d.nb + 4, p.d_nb);
      p.op = node.op == op::norm ? 0 : node.op == op::sum_rows ? 1 : node.op == op::mean ? 2 : 3;
      if (node.op == op::norm) p.eps = node.param<float>(0);
      dispatch("rows", {a.buffer, d.buffer}, &p, sizeof p, groups_for(static_cast<uint64_t>(nrows(*node.src[0]))));
      return;
    }
    case op::concat:
    case op::pad: {
      concat_pad_params p{};
      std::copy(ne, ne + 4, p.ne);
      dims_of(*node.src[0], p.a_ne);
      p.a_off = a.off;
      std::copy(a.nb, a.nb + 4, p.a_nb);
      VkBuffer b_buffer = a.buffer;  // pad: bound, not read
      if (node.op == op::concat) {
        const f32_view b = view_of(dev_, *node.src[1]);
        b_buffer = b.buffer;
        p.b_off = b.off;
        std::copy(b.nb, b.nb + 4, p.b_nb);
        p.dim = static_cast<uint32_t>(node.param<int32_t>(0));
      }
      p.d_off = d.off;
      std::copy(d.nb, d.nb + 4, p.d_nb);
      p.op = node.op == op::concat ? 0 : 1;
      dispatch("concat_pad", {a.buffer, b_buffer, d.buffer}, &p, sizeof p, per_element);
      return;
    }
    case op::rms_norm: {
      rms_norm_params p{};
      set_shape_a_d(p, ne, a, d);
      p.eps = node.param<float>(0);
      dispatch("rms_norm", {a.buffer, d.buffer}, &p, sizeof p, static_cast<uint64_t>(nrows(node)));  // a workgroup per row
      return;
    }
    case op::cpy:
    case op::cont: {
      const tensor& ts = *node.src[0];
      cpy_params p{};
      dims_of(ts, p.s_ne);
      p.s_off = a.off;
      std::copy(a.nb, a.nb + 4, p.s_nb);
      std::copy(ne, ne + 4, p.d_ne);
      p.d_off = d.off;
      std::copy(d.nb, d.nb + 4, p.d_nb);
      p.s_type = float_code(ts.type);
      p.d_type = float_code(node.type);
      p.n = static_cast<uint32_t>(n);
      p.by_word = p.d_type != 0 && is_contiguous(node) && p.d_off % 2 == 0 ? 1 : 0;
      const uint64_t units = p.by_word != 0 ? (n + 1) / 2 : n;  // words of two, or elements
      dispatch("cpy", {a.buffer, d.buffer}, &p, sizeof p, groups_for(units));
      return;
    }
    case op::rope: {
      const rope_params rp = rope_params_of(node);
      const f32_view pv = view_of(dev_, *node.src[1]);
      rope_shader_params p{};
      set_shape_a_d(p, ne, a, d);
      p.p_off = pv.off;
      VkBuffer ff_buffer = pv.buffer;  // bound but not read without freq_factors
      if (node.src[2] != nullptr) {
        const f32_view fv = view_of(dev_, *node.src[2]);
        ff_buffer = fv.buffer;
        p.f_off = fv.off;
        p.has_ff = 1;
      }
      p.n_dims = static_cast<uint32_t>(rp.n_dims);
      p.neox = rp.mode == rope_mode::neox ? 1 : 0;
      const rope_constants rc = rope_constants_of(rp);
      p.theta_scale = rc.theta_scale;
      p.freq_scale = rp.freq_scale;
      p.attn_factor = rp.attn_factor;
      p.ext_factor = rc.ext_factor;
      p.corr0 = rc.corr0;
      p.corr1 = rc.corr1;
      p.yarn_mscale = rc.yarn_mscale;
      const uint64_t units = static_cast<uint64_t>(nrows(node)) * static_cast<uint64_t>(rp.n_dims / 2 + (node.ne[0] - rp.n_dims));
      dispatch("rope", {a.buffer, pv.buffer, ff_buffer, d.buffer}, &p, sizeof p, groups_for(units));
      return;
    }
    case op::glu: {
      // x and g: a and b (swapped: b and a), or the two halves of a's rows ([x | g]; swapped: [g | x]).
      const bool swapped = node.param<int32_t>(1) != 0;
      f32_view x = a;
      f32_view g = a;
      if (node.src[1] != nullptr) {
        (swapped ? x : g) = view_of(dev_, *node.src[1]);
      } else {
        (swapped ? x : g).off += ne[0] * a.nb[0];
      }
      glu_params p{};
      std::copy(ne, ne + 4, p.ne);
      p.x_off = x.off;
      std::copy(x.nb, x.nb + 4, p.x_nb);
      p.g_off = g.off;
      std::copy(g.nb, g.nb + 4, p.g_nb);
      p.d_off = d.off;
      std::copy(d.nb, d.nb + 4, p.d_nb);
      p.kind = static_cast<uint32_t>(node.param<int32_t>(0));
      dispatch("glu", {x.buffer, g.buffer, d.buffer}, &p, sizeof p, per_element);
      return;
    }
    case op::soft_max: {
      const tensor* m = node.src[1];
      soft_max_params p{};
      std::copy(ne, ne + 4, p.ne);
      p.a_off = a.off;
      std::copy(a.nb, a.nb + 4, p.a_nb);
      VkBuffer mask_buffer = d.buffer;  // bound but not read when there is no mask
      p.m_ne2 = p.m_ne3 = 1;
      if (m != nullptr) {
        const f32_view mv = view_of(dev_, *m);
        mask_buffer = mv.buffer;
        p.m_off = mv.off;
        p.m_nb1 = mv.nb[1];
        p.m_nb2 = mv.nb[2];
        p.m_nb3 = mv.nb[3];
        p.m_ne2 = static_cast<uint32_t>(m->ne[2]);
        p.m_ne3 = static_cast<uint32_t>(m->ne[3]);
        p.m_f16 = m->type == type::f16 ? 1 : 0;
        p.has_mask = 1;
      }
      p.d_off = d.off;
      p.d_nb1 = d.nb[1];
      p.d_nb2 = d.nb[2];
      p.d_nb3 = d.nb[3];
      p.scale = node.param<float>(0);
      p.max_bias = node.param<float>(1);
      const alibi_constants alibi = alibi_constants_of(p.max_bias, static_cast<uint32_t>(node.src[0]->ne[2]));
      p.n_head_log2 = alibi.n_head_log2;
      p.m0 = alibi.m0;
      p.m1 = alibi.m1;
      dispatch("soft_max", {a.buffer, mask_buffer, d.buffer}, &p, sizeof p, static_cast<uint64_t>(nrows(node)));
      return;
    }
    default: {
      unary_params p{};
      set_shape_a_d(p, ne, a, d);
      p.op = node.op == op::scale ? 0 : node.op == op::silu ? 1 : node.op == op::sigmoid ? 3 : 2;
      if (node.op == op::scale) {
        p.s = node.param<float>(0);
        p.bias = node.param<float>(1);
      }
      dispatch("unary", {a.buffer, d.buffer}, &p, sizeof p, per_element);
      return;
    }
  }
}

// set_rows: the destination's offset and strides in its elements, or in bytes for q8_0 rows.
void backend::record_set_rows(tensor& node) {
  const tensor& ts = *node.src[1];
  const tensor& ti = *node.src[2];
  const f32_view sv = view_of(dev_, ts);
  const f32_view iv = view_of(dev_, ti);
  set_rows_params p = set_rows_source(ts, sv, ti, iv);
  const bool blocks = node.type == type::q8_0;
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
  p.d_type = blocks ? 3 : float_code(node.type);
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
