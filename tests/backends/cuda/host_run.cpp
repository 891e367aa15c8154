#include "tests/backends/cuda/host_run.h"

#include <type_traits>

// CUDA's names on the host (threadIdx, __syncthreads, __shfl_xor_sync), before the kernels that use them.
#include "tests/backends/cuda/host_lanes.h"

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/kernels/kernels.cuh"
#include "runtime/error.h"

namespace troupe::test {

namespace {

using namespace cuda::kern;

// Runs kernel with the grid and block plan.h gives step s. Element-wise kernels' threads never
// synchronize (independent lanes); the row and matrix kernels' groups shuffle and wait (cooperative).
template <class Kernel>
void launch_as_planned(const cuda::step& s, lanes::mode m, Kernel&& kernel) {
  const cuda::launch_dims d = cuda::dims_of(s);
  lanes::launch(dim3(d.grid_x, d.grid_y), dim3(d.block), m, kernel);
}

// cuBLAS's cublasGemmEx(OP_T, OP_N) by its definition: D[i + j ldc] = sum_l A[l + i lda] B[l + j ldb].
void gemm_on_host(const gemm_args& g) {
  const int64_t es = g.ab_type == f32_code ? 4 : 2;
  for (int64_t i3 = 0; i3 < g.ne3; ++i3) {
    for (int64_t i2 = 0; i2 < g.ne2; ++i2) {
      const uint8_t* a = g.a + (i2 / g.r2) * g.a_nb2 + (i3 / g.r3) * g.a_nb3;
      const uint8_t* b = g.b + (i3 * g.ne2 + i2) * g.b_plane;
      auto* d = reinterpret_cast<float*>(g.d + i2 * g.d_nb2 + i3 * g.d_nb3);
      for (int64_t j = 0; j < g.n; ++j) {
        for (int64_t i = 0; i < g.m; ++i) {
          double s = 0;
          for (int64_t l = 0; l < g.k; ++l) {
            s += static_cast<double>(load_float(a + (l + i * g.lda) * es, g.ab_type)) *
                 static_cast<double>(load_float(b + (l + j * g.ldb) * es, g.ab_type));
          }
          d[i + j * g.ldc] = static_cast<float>(s);
        }
      }
    }
  }
}

class emulated_backend;

class emulated_device final : public device_i {
 public:
  std::string_view name() const override { return "CUDA-on-host"; }
  std::string description() const override { return "the CUDA backend's plan and kernels, every thread of them, run on the host"; }
  device_type type() const override { return device_type::gpu; }
  device_memory memory() const override { return cpu::cpu_device().memory(); }
  device_caps caps() const override { return {}; }
  backend_ptr init_backend() override;
  buffer_type_i& buffer_type() override { return cpu::cpu_device().buffer_type(); }
  bool supports_op(const tensor& t) const override { return cuda::supports(t); }
  bool supports_buft(const buffer_type_i& b) const override { return b.is_host(); }
};

class emulated_backend final : public backend_i {
 public:
  explicit emulated_backend(emulated_device& d) : dev_(d) {}
  std::string_view name() const override { return dev_.name(); }
  device_i& device() const override { return dev_; }
  void graph_compute(graph& g) override {
    for (size_t i = 0; i < g.n_nodes(); ++i) {
      for (const cuda::step& s : cuda::plan(*g.node(i), scratch_)) run_on_host(s);
    }
  }

 private:
  emulated_device& dev_;
  host_scratch scratch_;
};

backend_ptr emulated_device::init_backend() { return std::make_unique<emulated_backend>(*this); }

}  // namespace

uint8_t* host_scratch::get(int slot, size_t bytes) {
  auto& m = memory_[static_cast<size_t>(slot)];
  if (m.size() * sizeof(double) < bytes) m.resize((bytes + sizeof(double) - 1) / sizeof(double));
  requested_[static_cast<size_t>(slot)] = bytes;
  return reinterpret_cast<uint8_t*>(m.data());
}

std::map<std::string, int, std::less<>>& host_steps_run() {
  static std::map<std::string, int, std::less<>> counts;
  return counts;
}

void run_on_host(const cuda::step& s) {
  ++host_steps_run()[std::string(cuda::step_name(s))];
  const int64_t n = cuda::units_of(s);
  constexpr auto independent = lanes::mode::independent;
  constexpr auto cooperative = lanes::mode::cooperative;
  std::visit(
      [&](const auto& st) {
        using S = std::decay_t<decltype(st)>;
        const auto& a = st.a;
        using A = std::decay_t<decltype(a)>;
        if constexpr (std::is_same_v<S, cuda::binary_step>) {
          launch_as_planned(s, independent, [&] { each_unit<A, binary_at>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::unary_step>) {
          launch_as_planned(s, independent, [&] { each_unit<A, unary_at>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::glu_step>) {
          launch_as_planned(s, independent, [&] { each_unit<A, glu_at>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::concat_pad_step>) {
          launch_as_planned(s, independent, [&] { each_unit<A, concat_pad_at>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::rope_step>) {
          launch_as_planned(s, independent, [&] { each_unit<A, rope_at>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::cpy_step>) {
          launch_as_planned(s, independent, [&] { each_unit<A, cpy_at>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::set_rows_step>) {
          launch_as_planned(s, independent, [&] { each_unit<A, set_rows_at>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::get_rows_step>) {
          with_weight_type(a.t, [&](auto t) {
            launch_as_planned(s, independent, [&] { each_unit<A, get_rows_at<decltype(t)::value>>(a, n); });
          });
        } else if constexpr (std::is_same_v<S, cuda::dequant_step>) {
          with_weight_type(a.t, [&](auto t) {
            launch_as_planned(s, independent, [&] { each_unit<A, dequant_at<decltype(t)::value>>(a, n); });
          });
        } else if constexpr (std::is_same_v<S, cuda::rows_step>) {
          launch_as_planned(s, cooperative, [&] { each_row<A, rows_row<block_group>>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::soft_max_step>) {
          launch_as_planned(s, cooperative, [&] { each_row<A, soft_max_row<block_group>>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::quantize_step>) {
          launch_as_planned(s, cooperative, [&] { each_warp<A, quantize_block<warp_group>>(a, n); });
        } else if constexpr (std::is_same_v<S, cuda::mat_vec_step>) {
          with_weight_type(a.t, [&](auto t) {
            constexpr type T = decltype(t)::value;
            const auto columns = [&](auto cols) {
              launch_as_planned(s, cooperative, [&] { mat_vec_kernel<T, decltype(cols)::value, !is_float_type(T)>(a); });
            };
            switch (a.n) {  // the columns kernels_matmul.cu instantiates
              case 1: columns(std::integral_constant<int, 1>{}); break;
              case 2: columns(std::integral_constant<int, 2>{}); break;
              case 4: columns(std::integral_constant<int, 4>{}); break;
              case 8: columns(std::integral_constant<int, 8>{}); break;
              default: throw backend_error("a matrix-vector step of " + std::to_string(a.n) + " columns");
            }
          });
        } else {
          static_assert(std::is_same_v<S, cuda::gemm_step>);
          gemm_on_host(a);
        }
      },
      s);
}

std::unique_ptr<device_i> make_emulated_cuda_device() { return std::make_unique<emulated_device>(); }

}  // namespace troupe::test
