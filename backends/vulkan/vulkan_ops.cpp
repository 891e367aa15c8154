// What the Vulkan backend computes (computes(), asked by device::supports_op) and how each node is recorded
// (backend::record): the shader and its push constants, built from the node's tensors. The ops over weights
// of any type (mul_mat, mul_mat_id, get_rows) and set_rows are recorded in vulkan_ops_weights.cpp.
#include <algorithm>
#include <cmath>
#include <utility>

#include "backends/vulkan/vulkan_backend.h"
#include "backends/vulkan/vulkan_buffer.h"
#include "backends/vulkan/vulkan_ops_internal.h"
#include "runtime/ops.h"

namespace troupe::vulkan {

using namespace detail;

namespace {

bool f32_strides(const tensor& t) {
  return t.type == type::f32 && std::all_of(t.nb.begin(), t.nb.end(), [](size_t nb) { return nb % 4 == 0; });
}

// Weights as weights.glsl reads them (mul_mat, get_rows): every float type and the quantized blocks of
// runtime/quants.h (is_gpu_weight_type), rows contiguous (whole blocks), in bytes. Fields 16 bits wide need
// even offsets.
bool readable_weights(const tensor& w) {
  if (!is_gpu_weight_type(w.type) || w.ne[0] % block_size(w.type) != 0 || w.nb[0] != type_size(w.type)) return false;
  const size_t align = w.type == type::f32 ? 4 : 2;
  return std::all_of(w.nb.begin(), w.nb.end(), [align](size_t nb) { return nb % align == 0; });
}

struct binary_params {
  uint32_t ne[4];
  uint32_t a_off, a_nb[4];
  uint32_t b_ne[4];
  uint32_t b_off, b_nb[4];
  uint32_t d_off, d_nb[4];
  uint32_t op;
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

struct cpy_params {
  uint32_t s_ne[4];
  uint32_t s_off, s_nb[4];
  uint32_t d_ne[4];
  uint32_t d_off, d_nb[4];
  uint32_t s_type, d_type, n;
  uint32_t by_word;
};

bool float_type(type t) { return t == type::f32 || t == type::f16 || t == type::bf16; }
bool element_strides(const tensor& t) {
  const size_t es = type_size(t.type);
  return std::all_of(t.nb.begin(), t.nb.end(), [es](size_t nb) { return nb % es == 0; });
}

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
      if (set_rows_code(t.type) >= 3) {  // rows of whole blocks, 16-bit aligned (a quantized KV cache)
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

}  // namespace troupe::vulkan
