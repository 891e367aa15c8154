// A context creates and owns tensors (their metadata, and their data when it has a data arena).
//
//   context weights({.max_tensors = 512, .no_alloc = true});      // metadata only: data placed later by
//                                                                 // an allocator or a loader
//   context scratch({.max_tensors = 16, .mem_size = 1 << 20});    // data from a 1 MiB arena
//   tensor* t = scratch.new_tensor_1d(type::f32, 1024);           // t->data points into the arena
//
// Exceeding max_tensors or mem_size throws capacity_error; nothing is allocated behind the caller's back.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <string_view>

#include "runtime/tensor.h"

namespace troupe {

struct context_params {
  size_t max_tensors = 1024;  // tensor slots, views and op results included
  size_t mem_size = 0;        // bytes of the data arena (0: none); ignored when no_alloc
  bool no_alloc = false;      // true: tensors get no data here, an allocator places them later
};

class context {
 public:
  explicit context(const context_params& params);
  ~context();
  context(const context&) = delete;
  context& operator=(const context&) = delete;

  tensor* new_tensor(type t, int n_dims, const int64_t* ne);
  tensor* new_tensor_1d(type t, int64_t ne0);
  tensor* new_tensor_2d(type t, int64_t ne0, int64_t ne1);
  tensor* new_tensor_3d(type t, int64_t ne0, int64_t ne1, int64_t ne2);
  tensor* new_tensor_4d(type t, int64_t ne0, int64_t ne1, int64_t ne2, int64_t ne3);
  // A tensor with a's type, shape and strides viewing a's data (view_src set); the caller sets the op.
  tensor* view_tensor(tensor* a);

  // The first tensor with this name, or null.
  tensor* find(std::string_view name) const;

  size_t n_tensors() const { return tensors_.size(); }

  // Tensors in creation order.
  template <class F>
  void for_each(F&& f) const {
    for (const auto& t : tensors_) f(const_cast<tensor*>(&t));
  }
  const std::deque<tensor>& tensors() const { return tensors_; }

  static constexpr size_t data_alignment = 64;

 private:
  tensor* new_tensor_impl(type t, int n_dims, const int64_t* ne, tensor* view_src, size_t view_offs);

  context_params params_;
  std::deque<tensor> tensors_;  // stable addresses
  struct arena_free {
    void operator()(void* p) const;
  };
  std::unique_ptr<void, arena_free> arena_;
  size_t mem_used_ = 0;
};

}  // namespace troupe
