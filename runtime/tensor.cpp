#include "runtime/tensor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

namespace troupe {

std::string_view op_name(op o) {
  switch (o) {
    case op::none: return "none";
    case op::add: return "add";
    case op::sub: return "sub";
    case op::mul: return "mul";
    case op::div: return "div";
    case op::scale: return "scale";
    case op::rms_norm: return "rms_norm";
    case op::norm: return "norm";
    case op::rope: return "rope";
    case op::soft_max: return "soft_max";
    case op::silu: return "silu";
    case op::gelu: return "gelu";
    case op::glu: return "glu";
    case op::cpy: return "cpy";
    case op::cont: return "cont";
    case op::set_rows: return "set_rows";
    case op::get_rows: return "get_rows";
    case op::mul_mat: return "mul_mat";
    case op::view: return "view";
    case op::reshape: return "reshape";
    case op::permute: return "permute";
    case op::transpose: return "transpose";
    case op::concat: return "concat";
    case op::pad: return "pad";
    case op::mean: return "mean";
    case op::sum_rows: return "sum_rows";
    case op::argmax: return "argmax";
    case op::flash_attn: return "flash_attn";
    case op::mul_mat_id: return "mul_mat_id";
    case op::top_k: return "top_k";
    case op::sigmoid: return "sigmoid";
    case op::count: break;
  }
  return "unknown";
}

void tensor::set_name(std::string_view n) {
  const size_t len = std::min(n.size(), max_name - 1);
  std::memcpy(name, n.data(), len);
  name[len] = '\0';
}

int64_t nelements(const tensor& t) { return t.ne[0] * t.ne[1] * t.ne[2] * t.ne[3]; }

int64_t nrows(const tensor& t) { return t.ne[1] * t.ne[2] * t.ne[3]; }

size_t nbytes(const tensor& t) {
  for (int i = 0; i < max_dims; ++i) {
    if (t.ne[i] <= 0) return 0;
  }
  const int64_t bs = block_size(t.type);
  size_t bytes;
  if (bs == 1) {
    bytes = type_size(t.type);
    for (int i = 0; i < max_dims; ++i) bytes += static_cast<size_t>(t.ne[i] - 1) * t.nb[i];
  } else {
    bytes = static_cast<size_t>(t.ne[0] / bs) * t.nb[0];
    for (int i = 1; i < max_dims; ++i) bytes += static_cast<size_t>(t.ne[i] - 1) * t.nb[i];
  }
  return bytes;
}

int n_dims(const tensor& t) {
  for (int i = max_dims - 1; i >= 1; --i) {
    if (t.ne[i] > 1) return i + 1;
  }
  return 1;
}

std::array<size_t, max_dims> dense_strides(type ty, const std::array<int64_t, max_dims>& ne) {
  std::array<size_t, max_dims> nb{};
  nb[0] = type_size(ty);
  nb[1] = nb[0] * static_cast<size_t>(ne[0] / block_size(ty));
  nb[2] = nb[1] * static_cast<size_t>(ne[1]);
  nb[3] = nb[2] * static_cast<size_t>(ne[2]);
  return nb;
}

bool is_contiguous(const tensor& t) {
  // Dimensions of size 1 may carry any stride.
  size_t next = type_size(t.type);
  if (t.ne[0] != block_size(t.type) && t.nb[0] != next) return false;
  next *= static_cast<size_t>(t.ne[0] / block_size(t.type));
  for (int i = 1; i < max_dims; ++i) {
    if (t.ne[i] != 1) {
      if (t.nb[i] != next) return false;
      next *= static_cast<size_t>(t.ne[i]);
    }
  }
  return true;
}

bool is_contiguous_rows(const tensor& t) { return t.ne[0] == block_size(t.type) || t.nb[0] == type_size(t.type); }

bool is_transposed(const tensor& t) { return t.nb[0] > t.nb[1]; }

bool is_permuted(const tensor& t) { return t.nb[0] > t.nb[1] || t.nb[1] > t.nb[2] || t.nb[2] > t.nb[3]; }

bool same_shape(const tensor& a, const tensor& b) { return a.ne == b.ne; }

bool can_repeat(const tensor& b, const tensor& a) {
  for (int i = 0; i < max_dims; ++i) {
    if (b.ne[i] <= 0 || a.ne[i] % b.ne[i] != 0) return false;
  }
  return true;
}

std::string describe(const tensor& t) {
  std::ostringstream os;
  os << (t.name[0] ? t.name : "(unnamed)") << " [" << t.ne[0] << ", " << t.ne[1] << ", " << t.ne[2] << ", "
     << t.ne[3] << "] " << type_name(t.type);
  return os.str();
}

}  // namespace troupe
