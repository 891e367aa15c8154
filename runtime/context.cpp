#include "runtime/context.h"

#include <cstdlib>
#include <string>

#include "runtime/error.h"

namespace troupe {

void context::arena_free::operator()(void* p) const { std::free(p); }

context::context(const context_params& params) : params_(params) {
  if (!params_.no_alloc && params_.mem_size > 0) {
    const size_t size = (params_.mem_size + data_alignment - 1) / data_alignment * data_alignment;
    void* p = std::aligned_alloc(data_alignment, size);
    if (p == nullptr) {
      throw capacity_error("context: cannot allocate a data arena of " + std::to_string(size) + " bytes");
    }
    arena_.reset(p);
  }
}

context::~context() = default;

tensor* context::new_tensor_impl(type t, int n_dims, const int64_t* ne, tensor* view_src, size_t view_offs) {
  if (n_dims < 1 || n_dims > max_dims) {
    throw op_error("new_tensor: " + std::to_string(n_dims) + " dimensions (1 to 4 allowed)");
  }
  if (!traits(t).known) {
    throw type_error("new_tensor: unknown type id " + std::to_string(static_cast<uint32_t>(t)));
  }
  std::array<int64_t, max_dims> shape{1, 1, 1, 1};
  for (int i = 0; i < n_dims; ++i) {
    if (ne[i] < 0) throw op_error("new_tensor: negative size " + std::to_string(ne[i]) + " in dimension " + std::to_string(i));
    shape[static_cast<size_t>(i)] = ne[i];
  }
  if (shape[0] % block_size(t) != 0) {
    throw op_error("new_tensor: ne[0] = " + std::to_string(shape[0]) + " is not a multiple of the block size " +
                   std::to_string(block_size(t)) + " of type " + std::string(type_name(t)));
  }
  if (tensors_.size() >= params_.max_tensors) {
    throw capacity_error("context: all " + std::to_string(params_.max_tensors) +
                         " tensor slots are used (raise context_params::max_tensors)");
  }
  tensor& x = tensors_.emplace_back();
  x.type = t;
  x.ne = shape;
  x.nb = dense_strides(t, shape);
  if (view_src != nullptr) {
    x.view_src = view_src->view_src ? view_src->view_src : view_src;
    x.view_offs = view_offs + (view_src->view_src ? view_src->view_offs : 0);
    x.buffer = view_src->buffer;
    if (view_src->data != nullptr) x.data = static_cast<char*>(view_src->data) + view_offs;
    return &x;
  }
  if (!params_.no_alloc && arena_) {
    const size_t size = nbytes(x);
    const size_t offs = (mem_used_ + data_alignment - 1) / data_alignment * data_alignment;
    if (offs + size > params_.mem_size) {
      tensors_.pop_back();
      throw capacity_error("context: tensor of " + std::to_string(size) + " bytes does not fit the data arena (" +
                           std::to_string(mem_used_) + " of " + std::to_string(params_.mem_size) + " bytes used)");
    }
    x.data = static_cast<char*>(arena_.get()) + offs;
    mem_used_ = offs + size;
  } else if (!params_.no_alloc && nbytes(x) > 0) {
    tensors_.pop_back();
    throw capacity_error("context: no data arena (mem_size = 0) for a tensor that needs data; use no_alloc");
  }
  return &x;
}

tensor* context::new_tensor(type t, int n_dims, const int64_t* ne) {
  return new_tensor_impl(t, n_dims, ne, nullptr, 0);
}

tensor* context::new_tensor_1d(type t, int64_t ne0) { return new_tensor(t, 1, &ne0); }

tensor* context::new_tensor_2d(type t, int64_t ne0, int64_t ne1) {
  const int64_t ne[2] = {ne0, ne1};
  return new_tensor(t, 2, ne);
}

tensor* context::new_tensor_3d(type t, int64_t ne0, int64_t ne1, int64_t ne2) {
  const int64_t ne[3] = {ne0, ne1, ne2};
  return new_tensor(t, 3, ne);
}

tensor* context::new_tensor_4d(type t, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3) {
  const int64_t ne[4] = {ne0, ne1, ne2, ne3};
  return new_tensor(t, 4, ne);
}

tensor* context::view_tensor(tensor* a) {
  tensor* v = new_tensor_impl(a->type, max_dims, a->ne.data(), a, 0);
  v->nb = a->nb;
  return v;
}

tensor* context::find(std::string_view name) const {
  for (const auto& t : tensors_) {
    if (t.get_name() == name) return const_cast<tensor*>(&t);
  }
  return nullptr;
}

}  // namespace troupe
