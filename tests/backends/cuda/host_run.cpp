#include "tests/backends/cuda/host_run.h"

#include <type_traits>

#include "backends/cpu/cpu_backend.h"
#include "backends/cuda/kernels/bodies.h"
#include "runtime/error.h"

namespace troupe::test {

namespace {

using namespace cuda::kern;

struct host_group {
  int lane() const { return 0; }
  int size() const { return 1; }
  float sum(float v) const { return v; }
  float max(float v) const { return v; }
};


template <class Body>
void each(int64_t n, Body&& body) {
  for (int64_t i = 0; i < n; ++i) body(i);
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
  std::string description() const override { return "the CUDA backend's plan and kernel bodies, run on the host"; }
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
  host_group g;
  std::visit(
      [&](const auto& st) {
        using S = std::decay_t<decltype(st)>;
        const auto& a = st.a;
        if constexpr (std::is_same_v<S, cuda::binary_step>) {
          each(n, [&](int64_t i) { binary_at(a, i); });
        } else if constexpr (std::is_same_v<S, cuda::unary_step>) {
          each(n, [&](int64_t i) { unary_at(a, i); });
        } else if constexpr (std::is_same_v<S, cuda::glu_step>) {
          each(n, [&](int64_t i) { glu_at(a, i); });
        } else if constexpr (std::is_same_v<S, cuda::concat_pad_step>) {
          each(n, [&](int64_t i) { concat_pad_at(a, i); });
        } else if constexpr (std::is_same_v<S, cuda::rope_step>) {
          each(n, [&](int64_t i) { rope_at(a, i); });
        } else if constexpr (std::is_same_v<S, cuda::cpy_step>) {
          each(n, [&](int64_t i) { cpy_at(a, i); });
        } else if constexpr (std::is_same_v<S, cuda::set_rows_step>) {
          each(n, [&](int64_t i) { set_rows_at(a, i); });
        } else if constexpr (std::is_same_v<S, cuda::get_rows_step>) {
          with_weight_type(a.t, [&](auto t) { each(n, [&](int64_t i) { get_rows_at<decltype(t)::value>(a, i); }); });
        } else if constexpr (std::is_same_v<S, cuda::dequant_step>) {
          with_weight_type(a.t, [&](auto t) { each(n, [&](int64_t i) { dequant_at<decltype(t)::value>(a, i); }); });
        } else if constexpr (std::is_same_v<S, cuda::rows_step>) {
          each(n, [&](int64_t r) { rows_row(a, r, g); });
        } else if constexpr (std::is_same_v<S, cuda::soft_max_step>) {
          each(n, [&](int64_t r) { soft_max_row(a, r, g); });
        } else if constexpr (std::is_same_v<S, cuda::quantize_step>) {
          each(n, [&](int64_t b) { quantize_block(a, b, g); });
        } else if constexpr (std::is_same_v<S, cuda::mat_vec_step>) {
          with_weight_type(a.t, [&](auto t) {
            constexpr type T = decltype(t)::value;
            for (int64_t plane = 0; plane < a.ne2 * a.ne3; ++plane) {
              for (int64_t row = 0; row < a.m; ++row) {
                const auto one = [&](auto cols) {
                  constexpr int N = decltype(cols)::value;
                  if constexpr (is_float_type(T)) {
                    mat_vec_f_row<T, N>(a, row, plane, g);
                  } else {
                    mat_vec_q_row<T, N>(a, row, plane, g);
                  }
                };
                switch (a.n) {
                  case 1: one(std::integral_constant<int, 1>{}); break;
                  case 2: one(std::integral_constant<int, 2>{}); break;
                  case 4: one(std::integral_constant<int, 4>{}); break;
                  case 8: one(std::integral_constant<int, 8>{}); break;
                  default: throw backend_error("a matrix-vector step of " + std::to_string(a.n) + " columns");
                }
              }
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
