#include "backends/cuda/plan.h"

#include <algorithm>
#include <cmath>

#include "backends/cuda/kernels/bodies.h"
#include "runtime/error.h"
#include "runtime/ops.h"

namespace troupe::cuda {

namespace {

using namespace kern;

bool f32_strides(const tensor& t) {
  return t.type == type::f32 && std::all_of(t.nb.begin(), t.nb.end(), [](size_t nb) { return nb % 4 == 0; });
}

bool element_strides(const tensor& t) {
  const size_t es = type_size(t.type);
  return std::all_of(t.nb.begin(), t.nb.end(), [es](size_t nb) { return nb % es == 0; });
}

// Weights as load_weight / dot32 read them: rows of whole blocks, 16-bit fields at even addresses.
bool readable_weights(const tensor& w) {
  if (!is_weight_type(w.type) || w.ne[0] % block_size(w.type) != 0 || w.nb[0] != type_size(w.type)) return false;
  const size_t align = w.type == type::f32 ? 4 : 2;
  return std::all_of(w.nb.begin(), w.nb.end(), [align](size_t nb) { return nb % align == 0; });
}

int float_code(type t) { return t == type::f32 ? f32_code : t == type::f16 ? f16_code : bf16_code; }
// set_rows' code for a destination of blocks (a quantized KV cache); -1 for other types.
int set_rows_block_code(type t) {
  switch (t) {
    case type::q8_0: return q8_0_code;
    case type::q4_0: return q4_0_code;
    case type::q4_1: return q4_1_code;
    case type::q5_0: return q5_0_code;
    case type::q5_1: return q5_1_code;
    case type::iq4_nl: return iq4_nl_code;
    default: return -1;
  }
}

uint8_t* ptr(const tensor& t) { return static_cast<uint8_t*>(t.data); }

view view_of(const tensor& t) {
  view v;
  v.p = ptr(t);
  for (int i = 0; i < 4; ++i) v.nb[i] = static_cast<int64_t>(t.nb[static_cast<size_t>(i)]);
  return v;
}

void dims(const tensor& t, int64_t (&ne)[4]) {
  for (int i = 0; i < 4; ++i) ne[i] = t.ne[static_cast<size_t>(i)];
}

// A contiguous [k, n, ne2, ne3] view of bytes at p, elements of es bytes.
view dense(uint8_t* p, size_t es, int64_t k, int64_t n, int64_t ne2) {
  view v;
  v.p = p;
  v.nb[0] = static_cast<int64_t>(es);
  v.nb[1] = v.nb[0] * k;
  v.nb[2] = v.nb[1] * n;
  v.nb[3] = v.nb[2] * ne2;
  return v;
}

void plan_mul_mat(const tensor& t, scratch_i& scratch, std::vector<step>& out) {
  const tensor& a = *t.src[0];
  const tensor& b = *t.src[1];
  const int64_t m = t.ne[0], n = t.ne[1], k = a.ne[0], ne2 = t.ne[2], ne3 = t.ne[3];
  const int64_t planes = ne2 * ne3;
  const int64_t r2 = ne2 / a.ne[2], r3 = ne3 / a.ne[3];
  const matmul_path path = choose_matmul(a.type, n);
  if (path == matmul_path::mat_vec_float || path == matmul_path::mat_vec_q) {
    mat_vec_args p{};
    p.t = a.type;
    p.a = ptr(a);
    p.a_nb1 = static_cast<int64_t>(a.nb[1]);
    p.a_nb2 = static_cast<int64_t>(a.nb[2]);
    p.a_nb3 = static_cast<int64_t>(a.nb[3]);
    p.r2 = r2;
    p.r3 = r3;
    p.m = m;
    p.n_all = n;
    p.k = k;
    p.ne2 = ne2;
    p.ne3 = ne3;
    p.b = view_of(b);
    p.d = view_of(t);
    if (path == matmul_path::mat_vec_q) {
      quantize_args q{};
      q.b = view_of(b);
      q.k = k;
      q.n = n;
      q.ne2 = ne2;
      q.ne3 = ne3;
      q.q = reinterpret_cast<act_block*>(scratch.get(0, static_cast<size_t>(planes * n * (k / 32)) * sizeof(act_block)));
      out.emplace_back(quantize_step{q});
      p.q = q.q;
    }
    for (int64_t c0 = 0; c0 < n;) {  // 8, 4, 2 or 1 columns per launch
      int64_t cols = 8;
      while (cols > n - c0) cols /= 2;
      p.c0 = c0;
      p.n = cols;
      out.emplace_back(mat_vec_step{p});
      c0 += cols;
    }
    return;
  }
  // cuBLAS: B as a contiguous copy of b in the product's input type, A the weights or their f16 copy.
  const bool dequant = path == matmul_path::cublas_dequant;
  const type ab = dequant ? type::f16 : a.type;
  const size_t es = type_size(ab);
  uint8_t* bs = scratch.get(0, static_cast<size_t>(planes * n * k) * es);
  cpy_args c{};
  dims(b, c.s_ne);
  c.s = view_of(b);
  c.s_type = f32_code;
  dims(b, c.d_ne);
  c.d = dense(bs, es, k, n, ne2);
  c.d_type = float_code(ab);
  c.n = planes * n * k;
  out.emplace_back(cpy_step{c});
  gemm_args g{};
  g.ab_type = float_code(ab);
  if (dequant) {
    dequant_args dq{};
    dq.t = a.type;
    dq.a = ptr(a);
    dq.a_nb1 = static_cast<int64_t>(a.nb[1]);
    dq.a_nb2 = static_cast<int64_t>(a.nb[2]);
    dq.a_nb3 = static_cast<int64_t>(a.nb[3]);
    dq.k = k;
    dq.m = m;
    dq.ne2 = a.ne[2];
    dq.ne3 = a.ne[3];
    dq.out = reinterpret_cast<uint16_t*>(scratch.get(1, static_cast<size_t>(a.ne[2] * a.ne[3] * m * k) * 2));
    out.emplace_back(dequant_step{dq});
    g.a = reinterpret_cast<const uint8_t*>(dq.out);
    g.lda = k;
    g.a_nb2 = m * k * 2;
    g.a_nb3 = g.a_nb2 * a.ne[2];
  } else {
    g.a = ptr(a);
    g.lda = static_cast<int64_t>(a.nb[1] / es);
    g.a_nb2 = static_cast<int64_t>(a.nb[2]);
    g.a_nb3 = static_cast<int64_t>(a.nb[3]);
  }
  g.r2 = r2;
  g.r3 = r3;
  g.b = bs;
  g.ldb = k;
  g.b_plane = n * k * static_cast<int64_t>(es);
  g.d = ptr(t);
  g.ldc = static_cast<int64_t>(t.nb[1] / 4);
  g.d_nb2 = static_cast<int64_t>(t.nb[2]);
  g.d_nb3 = static_cast<int64_t>(t.nb[3]);
  g.m = m;
  g.n = n;
  g.k = k;
  g.ne2 = ne2;
  g.ne3 = ne3;
  out.emplace_back(gemm_step{g});
}

}  // namespace

matmul_path choose_matmul(type weights, int64_t columns) {
  const bool small = columns <= mat_vec_max_cols;
  if (is_float_type(weights)) return small ? matmul_path::mat_vec_float : matmul_path::cublas;
  return small ? matmul_path::mat_vec_q : matmul_path::cublas_dequant;
}

bool supports(const tensor& t) {
  if (t.op == op::none || is_view_op(t.op)) return true;
  const tensor* a = t.src[0];
  const tensor* b = t.src[1];
  switch (t.op) {
    case op::add:
    case op::sub:
    case op::mul:
    case op::div:
      return f32_strides(t) && a && b && f32_strides(*a) && f32_strides(*b) && same_shape(t, *a) && can_repeat(*b, *a);
    case op::scale:
    case op::silu:
    case op::gelu:
    case op::rms_norm:
    case op::norm:
      return f32_strides(t) && a && f32_strides(*a) && same_shape(t, *a);
    case op::sum_rows:
    case op::mean:
      return f32_strides(t) && a && f32_strides(*a) && nelements(t) == nrows(*a);
    case op::argmax:
      return t.type == type::i32 && element_strides(t) && a && f32_strides(*a) && nelements(t) == nrows(*a);
    case op::concat: {
      const int32_t dim = t.param<int32_t>(0);
      return f32_strides(t) && a && b && f32_strides(*a) && f32_strides(*b) && dim >= 0 && dim < 4;
    }
    case op::pad:
      return f32_strides(t) && a && f32_strides(*a);
    case op::cpy:
    case op::cont:
      return a && is_float_type(a->type) && is_float_type(t.type) && element_strides(*a) && element_strides(t) &&
             nelements(*a) == nelements(t);
    case op::rope: {
      const tensor* ff = t.src[2];
      const rope_params rp = rope_params_of(t);
      if (a == nullptr || b == nullptr || !f32_strides(*a) || !f32_strides(t) || !same_shape(t, *a)) return false;
      if (b->type != type::i32 || !is_contiguous(*b) || b->ne[0] < a->ne[2]) return false;
      if (ff != nullptr && (ff->type != type::f32 || !is_contiguous(*ff) || ff->ne[0] < rp.n_dims / 2)) return false;
      return (rp.mode == rope_mode::normal || rp.mode == rope_mode::neox) && rp.n_dims > 0 && rp.n_dims % 2 == 0 &&
             rp.n_dims <= a->ne[0];
    }
    case op::set_rows: {
      const tensor* src = t.src[1];
      const tensor* idx = t.src[2];
      if (src == nullptr || idx == nullptr || !f32_strides(*src)) return false;
      if ((idx->type != type::i32 && idx->type != type::i64) || !element_strides(*idx)) return false;
      if (set_rows_block_code(t.type) >= 0) {
        return t.nb[0] == type_size(t.type) && t.ne[0] % 32 == 0 && std::all_of(t.nb.begin(), t.nb.end(), [](size_t nb) { return nb % 2 == 0; });
      }
      return is_float_type(t.type) && element_strides(t);
    }
    case op::get_rows: {
      const tensor* idx = b;
      if (a == nullptr || idx == nullptr || !f32_strides(t) || t.nb[0] != 4 || !readable_weights(*a)) return false;
      return (idx->type == type::i32 || idx->type == type::i64) && element_strides(*idx);
    }
    case op::glu: {
      const int32_t kind = t.param<int32_t>(0);
      return a != nullptr && f32_strides(t) && f32_strides(*a) && (b == nullptr || f32_strides(*b)) && (kind == 0 || kind == 1);
    }
    case op::soft_max: {
      if (a == nullptr || !f32_strides(*a) || !f32_strides(t) || t.nb[0] != 4 || !same_shape(t, *a)) return false;
      if (b == nullptr) return true;
      if (b->type != type::f32 && b->type != type::f16) return false;
      return b->nb[0] == type_size(b->type) && element_strides(*b);
    }
    case op::mul_mat: {
      if (a == nullptr || b == nullptr || !f32_strides(t) || t.nb[0] != 4 || !f32_strides(*b) || !readable_weights(*a)) return false;
      // cuBLAS reads float weights by rows of a leading dimension in elements.
      return a->nb[1] % type_size(a->type) == 0;
    }
    default:
      return false;
  }
}

std::vector<step> plan(const tensor& t, scratch_i& scratch) {
  if (!supports(t)) throw backend_error("CUDA: node " + describe(t) + ": not supported");
  std::vector<step> out;
  if (t.op == op::none || is_view_op(t.op)) return out;
  const tensor* a = t.src[0];
  int64_t ne[4];
  dims(t, ne);
  switch (t.op) {
    case op::add:
    case op::sub:
    case op::mul:
    case op::div: {
      binary_args p{};
      std::copy(ne, ne + 4, p.ne);
      dims(*t.src[1], p.b_ne);
      p.a = view_of(*a);
      p.b = view_of(*t.src[1]);
      p.d = view_of(t);
      p.op = t.op == op::add ? 0 : t.op == op::sub ? 1 : t.op == op::mul ? 2 : 3;
      out.emplace_back(binary_step{p});
      break;
    }
    case op::scale:
    case op::silu:
    case op::gelu: {
      unary_args p{};
      std::copy(ne, ne + 4, p.ne);
      p.a = view_of(*a);
      p.d = view_of(t);
      p.op = t.op == op::scale ? 0 : t.op == op::silu ? 1 : 2;
      if (t.op == op::scale) {
        p.s = t.param<float>(0);
        p.bias = t.param<float>(1);
      }
      out.emplace_back(unary_step{p});
      break;
    }
    case op::glu: {
      // x and g: a and b (swapped: b and a), or the halves of a's rows ([x | g]; swapped: [g | x]).
      const bool swapped = t.param<int32_t>(1) != 0;
      glu_args p{};
      std::copy(ne, ne + 4, p.ne);
      p.x = view_of(*a);
      p.g = view_of(*a);
      if (t.src[1] != nullptr) {
        (swapped ? p.x : p.g) = view_of(*t.src[1]);
      } else {
        (swapped ? p.x : p.g).p += ne[0] * static_cast<int64_t>(a->nb[0]);
      }
      p.d = view_of(t);
      p.kind = t.param<int32_t>(0);
      out.emplace_back(glu_step{p});
      break;
    }
    case op::concat:
    case op::pad: {
      concat_pad_args p{};
      std::copy(ne, ne + 4, p.ne);
      dims(*a, p.a_ne);
      p.a = view_of(*a);
      p.b = t.op == op::concat ? view_of(*t.src[1]) : view_of(*a);
      p.d = view_of(t);
      p.op = t.op == op::concat ? 0 : 1;
      p.dim = t.op == op::concat ? t.param<int32_t>(0) : 0;
      out.emplace_back(concat_pad_step{p});
      break;
    }
    case op::rope: {
      const rope_params rp = rope_params_of(t);
      rope_args p{};
      std::copy(ne, ne + 4, p.ne);
      p.a = view_of(*a);
      p.d = view_of(t);
      p.pos = reinterpret_cast<const int32_t*>(t.src[1]->data);
      p.ff = t.src[2] != nullptr ? reinterpret_cast<const float*>(t.src[2]->data) : nullptr;
      p.n_dims = static_cast<int>(rp.n_dims);
      p.neox = rp.mode == rope_mode::neox ? 1 : 0;
      const rope_constants rc = rope_constants_of(rp);
      p.theta_scale = rc.theta_scale;
      p.freq_scale = rp.freq_scale;
      p.attn_factor = rp.attn_factor;
      p.ext_factor = rc.ext_factor;
      p.corr0 = rc.corr0;
      p.corr1 = rc.corr1;
      p.yarn_mscale = rc.yarn_mscale;
      out.emplace_back(rope_step{p});
      break;
    }
    case op::cpy:
    case op::cont: {
      cpy_args p{};
      dims(*a, p.s_ne);
      std::copy(ne, ne + 4, p.d_ne);
      p.s = view_of(*a);
      p.d = view_of(t);
      p.s_type = float_code(a->type);
      p.d_type = float_code(t.type);
      p.n = nelements(t);
      out.emplace_back(cpy_step{p});
      break;
    }
    case op::get_rows: {
      const tensor& idx = *t.src[1];
      get_rows_args p{};
      p.t = a->type;
      p.ne0 = ne[0];
      p.n = ne[1];
      p.ne2 = ne[2];
      p.a = ptr(*a);
      p.a_nb1 = static_cast<int64_t>(a->nb[1]);
      p.a_nb2 = static_cast<int64_t>(a->nb[2]);
      p.a_rows = a->ne[1];
      p.idx = view_of(idx);
      p.i64 = idx.type == type::i64 ? 1 : 0;
      p.d = view_of(t);
      out.emplace_back(get_rows_step{p});
      break;
    }
    case op::set_rows: {
      const tensor& src = *t.src[1];
      const tensor& idx = *t.src[2];
      set_rows_args p{};
      dims(src, p.ne);
      p.s = view_of(src);
      p.idx = view_of(idx);
      p.i_ne1 = idx.ne[1];
      p.i_ne2 = idx.ne[2];
      p.i64 = idx.type == type::i64 ? 1 : 0;
      p.d = view_of(t);
      p.d_rows = t.ne[1];
      p.d_type = set_rows_block_code(t.type) >= 0 ? set_rows_block_code(t.type) : float_code(t.type);
      out.emplace_back(set_rows_step{p});
      break;
    }
    case op::norm:
    case op::rms_norm:
    case op::sum_rows:
    case op::mean:
    case op::argmax: {
      rows_args p{};
      dims(*a, p.ne);
      p.a = view_of(*a);
      p.d = view_of(t);
      std::copy(ne, ne + 4, p.d_ne);
      p.op = t.op == op::norm ? 0 : t.op == op::sum_rows ? 1 : t.op == op::mean ? 2 : t.op == op::argmax ? 3 : 4;
      if (t.op == op::norm || t.op == op::rms_norm) p.eps = t.param<float>(0);
      out.emplace_back(rows_step{p});
      break;
    }
    case op::soft_max: {
      const tensor* m = t.src[1];
      soft_max_args p{};
      std::copy(ne, ne + 4, p.ne);
      p.a = view_of(*a);
      p.d = view_of(t);
      p.m_ne2 = p.m_ne3 = 1;
      if (m != nullptr) {
        p.m = ptr(*m);
        p.m_nb1 = static_cast<int64_t>(m->nb[1]);
        p.m_nb2 = static_cast<int64_t>(m->nb[2]);
        p.m_nb3 = static_cast<int64_t>(m->nb[3]);
        p.m_ne2 = m->ne[2];
        p.m_ne3 = m->ne[3];
        p.m_f16 = m->type == type::f16 ? 1 : 0;
      }
      p.scale = t.param<float>(0);
      p.max_bias = t.param<float>(1);
      const alibi_constants alibi = alibi_constants_of(p.max_bias, static_cast<uint32_t>(a->ne[2]));
      p.n_head_log2 = static_cast<int>(alibi.n_head_log2);
      p.m0 = alibi.m0;
      p.m1 = alibi.m1;
      out.emplace_back(soft_max_step{p});
      break;
    }
    case op::mul_mat:
      plan_mul_mat(t, scratch, out);
      break;
    default:
      throw backend_error("CUDA: node " + describe(t) + ": not supported");
  }
  return out;
}

std::string_view step_name(const step& s) {
  static constexpr std::string_view names[] = {"binary",   "unary", "glu",      "concat_pad", "rope",     "cpy",     "get_rows",
                                               "set_rows", "dequant", "rows", "soft_max",   "quantize", "mat_vec", "gemm"};
  static_assert(std::size(names) == std::variant_size_v<step>, "a name per step");
  return names[s.index()];
}

int64_t units_of(const step& s) {
  return std::visit(
      [](const auto& st) -> int64_t {
        using S = std::decay_t<decltype(st)>;
        const auto& a = st.a;
        if constexpr (std::is_same_v<S, binary_step> || std::is_same_v<S, unary_step> || std::is_same_v<S, glu_step> ||
                      std::is_same_v<S, concat_pad_step>) {
          return kern::count(a.ne);
        } else if constexpr (std::is_same_v<S, rope_step>) {
          return kern::rope_units(a);
        } else if constexpr (std::is_same_v<S, cpy_step>) {
          return a.n;
        } else if constexpr (std::is_same_v<S, get_rows_step>) {
          return a.ne0 * a.n * a.ne2;
        } else if constexpr (std::is_same_v<S, set_rows_step>) {
          return kern::set_rows_units(a);
        } else if constexpr (std::is_same_v<S, dequant_step>) {
          return a.k * a.m * a.ne2 * a.ne3;
        } else if constexpr (std::is_same_v<S, rows_step> || std::is_same_v<S, soft_max_step>) {
          return kern::rows_of(a.ne);
        } else if constexpr (std::is_same_v<S, quantize_step>) {
          return a.k / 32 * a.n * a.ne2 * a.ne3;
        } else if constexpr (std::is_same_v<S, mat_vec_step>) {
          return a.m * a.ne2 * a.ne3;
        } else {
          return a.ne2 * a.ne3;  // products
        }
      },
      s);
}

uint32_t row_block(int64_t row_length) {
  if (row_length <= 32) return 32;
  return row_length >= 256 ? 256 : static_cast<uint32_t>((row_length + 31) / 32 * 32);
}

launch_dims dims_of(const step& s) {
  const int64_t units = units_of(s);
  const auto blocks_for = [](int64_t u, int64_t per_block) {
    return static_cast<uint32_t>(std::clamp<int64_t>((u + per_block - 1) / per_block, 1, max_grid_x));
  };
  launch_dims d;
  if (const auto* r = std::get_if<rows_step>(&s)) {
    d.block = r->a.op == 3 ? 32 : row_block(r->a.ne[0]);
    d.grid_x = blocks_for(units, 1);
  } else if (const auto* sm = std::get_if<soft_max_step>(&s)) {
    d.block = row_block(sm->a.ne[0]);
    d.grid_x = blocks_for(units, 1);
  } else if (std::holds_alternative<quantize_step>(s)) {
    d.block = elementwise_block;  // a warp per act_block
    d.grid_x = blocks_for(units, elementwise_block / 32);
  } else if (const auto* mv = std::get_if<mat_vec_step>(&s)) {
    d.block = 32 * mat_vec_warps;
    d.grid_x = blocks_for(mv->a.m, mat_vec_warps);
    d.grid_y = static_cast<uint32_t>(std::clamp<int64_t>(mv->a.ne2 * mv->a.ne3, 1, max_grid_y));
  } else if (std::holds_alternative<gemm_step>(s)) {
    d = {};  // cuBLAS chooses
  } else {
    d.block = elementwise_block;
    d.grid_x = blocks_for(units, elementwise_block);
  }
  return d;
}

}  // namespace troupe::cuda
