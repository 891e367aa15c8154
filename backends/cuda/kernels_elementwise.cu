// The CUDA kernels of every op but the matrix products: a thread per unit (element-wise, rope, copies,
// get_rows, set_rows, dequantization), striding over the units beyond the grid, or a block per row (norms,
// soft_max, sums, argmax). The kernels are kernels.cuh's, which the host tests run too.
#include <type_traits>

#include "backends/cuda/kernels/kernels.cuh"
#include "backends/cuda/launch.h"
#include "runtime/error.h"

namespace troupe::cuda {

namespace {

using namespace kern;

template <class Args, void (*Body)(const Args&, int64_t)>
void run_units(const step& s, const Args& a, cudaStream_t stream) {
  const launch_dims d = dims_of(s);
  each_unit<Args, Body><<<dim3(d.grid_x, d.grid_y), d.block, 0, stream>>>(a, units_of(s));
}

template <class Args, void (*Body)(const Args&, int64_t, block_group&)>
void run_rows(const step& s, const Args& a, cudaStream_t stream) {
  const launch_dims d = dims_of(s);
  each_row<Args, Body><<<dim3(d.grid_x, d.grid_y), d.block, 0, stream>>>(a, units_of(s));
}

}  // namespace

void launch_elementwise(const step& s, cudaStream_t stream) {
  if (const auto* st = std::get_if<binary_step>(&s)) {
    run_units<binary_args, binary_at>(s, st->a, stream);
  } else if (const auto* st = std::get_if<unary_step>(&s)) {
    run_units<unary_args, unary_at>(s, st->a, stream);
  } else if (const auto* st = std::get_if<glu_step>(&s)) {
    run_units<glu_args, glu_at>(s, st->a, stream);
  } else if (const auto* st = std::get_if<concat_pad_step>(&s)) {
    run_units<concat_pad_args, concat_pad_at>(s, st->a, stream);
  } else if (const auto* st = std::get_if<rope_step>(&s)) {
    run_units<rope_args, rope_at>(s, st->a, stream);
  } else if (const auto* st = std::get_if<cpy_step>(&s)) {
    run_units<cpy_args, cpy_at>(s, st->a, stream);
  } else if (const auto* st = std::get_if<set_rows_step>(&s)) {
    run_units<set_rows_args, set_rows_at>(s, st->a, stream);
  } else if (const auto* st = std::get_if<get_rows_step>(&s)) {
    with_weight_type(st->a.t, [&](auto t) { run_units<get_rows_args, get_rows_at<decltype(t)::value>>(s, st->a, stream); });
  } else if (const auto* st = std::get_if<dequant_step>(&s)) {
    with_weight_type(st->a.t, [&](auto t) { run_units<dequant_args, dequant_at<decltype(t)::value>>(s, st->a, stream); });
  } else if (const auto* st = std::get_if<rows_step>(&s)) {
    run_rows<rows_args, rows_row<block_group>>(s, st->a, stream);
  } else if (const auto* st = std::get_if<soft_max_step>(&s)) {
    run_rows<soft_max_args, soft_max_row<block_group>>(s, st->a, stream);
  } else {
    throw backend_error("CUDA: step " + std::string(step_name(s)) + " is not an element-wise or row kernel");
  }
}

}  // namespace troupe::cuda
