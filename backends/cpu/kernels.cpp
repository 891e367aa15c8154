// CPU kernel dispatch: which ops the CPU computes, the work buffer each needs, and the per-op entry point.
#include "backends/cpu/kernels.h"

#include <string>

#include "backends/cpu/kernels_internal.h"
#include "runtime/error.h"

namespace troupe::cpu {

namespace detail {

void unsupported(const tensor& node, std::string_view why) {
  std::string msg = "cpu: ";
  msg += op_name(node.op);
  msg += ": ";
  msg += why;
  msg += ": node = ";
  msg += describe(node);
  for (int i = 0; i < max_src; ++i) {
    if (node.src[static_cast<size_t>(i)] == nullptr) continue;
    msg += ", src" + std::to_string(i) + " = " + describe(*node.src[static_cast<size_t>(i)]);
  }
  throw backend_error(msg);
}

void require_work(const compute_params& params, const tensor& node, size_t need) {
  if (need == 0) return;
  if (params.wdata == nullptr || params.wsize < need) {
    unsupported(node,
                "work buffer of " + std::to_string(params.wsize) + " bytes, " + std::to_string(need) + " needed");
  }
}

namespace {

template <type S, type D>
void convert_run(const char* src, size_t ss, char* dst, size_t ds, int64_t n) {
  if constexpr (S == type::f32 && D == type::f32) {
    if (ss == 4 && ds == 4) {
      std::memcpy(dst, src, static_cast<size_t>(n) * 4);
      return;
    }
  }
  for (int64_t i = 0; i < n; ++i) {
    store_float(dst + i * static_cast<int64_t>(ds), D, load_float(src + i * static_cast<int64_t>(ss), S));
  }
}

template <type S>
void convert_from(const char* src, size_t ss, char* dst, size_t ds, type dst_t, int64_t n) {
  switch (dst_t) {
    case type::f32: convert_run<S, type::f32>(src, ss, dst, ds, n); break;
    case type::f16: convert_run<S, type::f16>(src, ss, dst, ds, n); break;
    default: convert_run<S, type::bf16>(src, ss, dst, ds, n); break;
  }
}

}  // namespace

void convert_floats(const char* src, size_t src_stride, type src_t, char* dst, size_t dst_stride, type dst_t,
                    int64_t n) {
  switch (src_t) {
    case type::f32: convert_from<type::f32>(src, src_stride, dst, dst_stride, dst_t, n); break;
    case type::f16: convert_from<type::f16>(src, src_stride, dst, dst_stride, dst_t, n); break;
    default: convert_from<type::bf16>(src, src_stride, dst, dst_stride, dst_t, n); break;
  }
}

void copy_units(const char* src, size_t src_stride, char* dst, size_t dst_stride, size_t size, int64_t n) {
  if (src_stride == size && dst_stride == size) {
    std::memcpy(dst, src, size * static_cast<size_t>(n));
    return;
  }
  for (int64_t i = 0; i < n; ++i) {
    std::memcpy(dst + i * static_cast<int64_t>(dst_stride), src + i * static_cast<int64_t>(src_stride), size);
  }
}

}  // namespace detail

using namespace detail;

bool supports_op(const tensor& node) {
  switch (node.op) {
    case op::none:
    case op::view:
    case op::reshape:
    case op::permute:
    case op::transpose: return true;
    case op::add:
    case op::sub:
    case op::mul:
    case op::div: return supports_binary(node);
    case op::scale: return supports_scale(node);
    case op::rms_norm:
    case op::norm: return supports_norm(node);
    case op::soft_max: return supports_soft_max(node);
    case op::silu:
    case op::gelu:
    case op::sigmoid: return supports_unary(node);
    case op::glu: return supports_glu(node);
    case op::rope: return supports_rope(node);
    case op::cpy:
    case op::cont: return supports_cpy(node);
    case op::get_rows: return supports_get_rows(node);
    case op::set_rows: return supports_set_rows(node);
    case op::mul_mat: return supports_mul_mat(node);
    case op::concat: return supports_concat(node);
    case op::pad: return supports_pad(node);
    case op::sum_rows:
    case op::mean: return supports_reduce(node);
    case op::argmax: return supports_argmax(node);
    case op::flash_attn: return supports_flash_attn(node);
    case op::mul_mat_id: return supports_mul_mat_id(node);
    case op::top_k: return supports_top_k(node);
    case op::count: return false;
  }
  return false;
}

size_t work_size(const tensor& node, int nth, bool reference) {
  if (nth < 1) nth = 1;
  // Only nodes the CPU supports have a work size; compute_forward rejects the others anyway.
  if (!supports_op(node)) return 0;
  switch (node.op) {
    case op::rope: return rope_work_size(node, nth);
    case op::cpy:
    case op::cont: return cpy_work_size(node, nth);
    case op::set_rows: return set_rows_work_size(node, nth);
    case op::mul_mat: return mul_mat_work_size(node, nth, reference);
    case op::flash_attn: return flash_attn_work_size(node, nth);
    case op::mul_mat_id: return mul_mat_id_work_size(node, nth);
    case op::top_k: return top_k_work_size(node, nth);
    default: return 0;
  }
}

void compute_forward(const compute_params& params, tensor& node) {
  switch (node.op) {
    case op::none:
    case op::view:
    case op::reshape:
    case op::permute:
    case op::transpose: return;
    case op::add:
    case op::sub:
    case op::mul:
    case op::div: return compute_binary(params, node);
    case op::scale: return compute_scale(params, node);
    case op::rms_norm:
    case op::norm: return compute_norm(params, node);
    case op::soft_max: return compute_soft_max(params, node);
    case op::silu:
    case op::gelu:
    case op::sigmoid: return compute_unary(params, node);
    case op::glu: return compute_glu(params, node);
    case op::rope: return compute_rope(params, node);
    case op::cpy:
    case op::cont: return compute_cpy(params, node);
    case op::get_rows: return compute_get_rows(params, node);
    case op::set_rows: return compute_set_rows(params, node);
    case op::mul_mat: return compute_mul_mat(params, node);
    case op::concat: return compute_concat(params, node);
    case op::pad: return compute_pad(params, node);
    case op::sum_rows:
    case op::mean: return compute_reduce(params, node);
    case op::argmax: return compute_argmax(params, node);
    case op::flash_attn: return compute_flash_attn(params, node);
    case op::mul_mat_id: return compute_mul_mat_id(params, node);
    case op::top_k: return compute_top_k(params, node);
    case op::count: break;
  }
  unsupported(node, "unknown op");
}

}  // namespace troupe::cpu
