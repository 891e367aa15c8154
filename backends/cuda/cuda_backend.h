// The CUDA backend: runs graphs on one device's stream. For each node, plan() (plan.h) gives the steps
// (kernel launches, cuBLAS products) and they are queued on the stream; the graph ends with an event, and
// graph_compute returns once it has completed (a split boundary: the scheduler reads what it wrote), so a
// kernel's failure surfaces as a backend_error of this graph.
//
//   backend_ptr be = dev.init_backend();
//   be->graph_compute(g);        // every node supported (device::supports_op) and in CUDA memory
#pragma once

#include <cublas_v2.h>

#include <array>
#include <map>

#include "backends/cuda/cuda_device.h"
#include "backends/cuda/plan.h"

namespace troupe::cuda {

class backend final : public backend_i {
 public:
  explicit backend(cuda::device& dev);  // throws backend_error (stream, event, cuBLAS handle)
  ~backend() override;
  backend(const backend&) = delete;
  backend& operator=(const backend&) = delete;

  std::string_view name() const override { return dev_.name(); }
  device_i& device() const override { return dev_; }
  void graph_compute(graph& g) override;
  void synchronize() override;

  // What the last graph launched, by step name ("mat_vec", "gemm", ...).
  const std::map<std::string, int, std::less<>>& last_steps() const { return last_steps_; }

 private:
  class scratch final : public scratch_i {
   public:
    explicit scratch(backend& be) : be_(be) {}
    ~scratch() override;
    uint8_t* get(int slot, size_t bytes) override;

   private:
    backend& be_;
    std::array<void*, scratch_slots> memory_{};
    std::array<size_t, scratch_slots> size_{};
  };

  cuda::device& dev_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t done_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  scratch scratch_{*this};
  std::map<std::string, int, std::less<>> last_steps_;
};

}  // namespace troupe::cuda
