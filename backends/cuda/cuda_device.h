// CUDA devices as troupe devices CUDA0, CUDA1, ... (llama.cpp's names), from what cudart reports
// (cuda_probe.h), with their buffer types and backends.
//
//   for (cuda::device* d : cuda::devices()) {             // empty without a GPU or a driver
//     d->memory();                                        // cudaMemGetInfo
//     buffer_ptr b = d->buffer_type().alloc_buffer(n);    // cudaMalloc; out_of_memory_error naming the device
//     buffer_type_i* pinned = d->host_buffer_type();      // cudaMallocHost: host memory the device reads
//     backend_ptr be = d->init_backend();                 // a stream, a cuBLAS handle (cuda_backend.h)
//   }
//
// Uploads go through two pinned staging buffers per device (made at the first transfer), alternately: while
// the DMA engine copies one piece, the host fills the other, so a large upload streams at the link's rate. Every CUDA call is checked;
// a failure is a backend_error (out_of_memory_error for allocations) naming the device and the call.
#pragma once

#include <cuda_runtime_api.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "backends/cuda/cuda_probe.h"
#include "runtime/backend.h"
#include "runtime/error.h"

namespace troupe::cuda {

class device;

// Throws for a failed CUDA call: out_of_memory_error for cudaErrorMemoryAllocation, backend_error otherwise,
// "<who>: <call>: <error name>: <error text>".
void check(cudaError_t e, std::string_view who, const std::string& call);

class buffer_type final : public buffer_type_i {
 public:
  buffer_type(cuda::device& dev, bool pinned_host);
  std::string_view name() const override { return name_; }
  buffer_ptr alloc_buffer(size_t size) override;
  size_t alignment() const override { return 256; }
  // Device memory: the device's total memory; pinned host memory: unbounded.
  size_t max_size() const override;
  bool is_host() const override { return pinned_; }
  device_i& device() const override;

 private:
  cuda::device& dev_;
  bool pinned_;
  std::string name_;  // "CUDA0", "CUDA0_host"
};

// A buffer of device memory (or pinned host memory) at a real address: tensors' data are device pointers.
class buffer final : public buffer_i {
 public:
  buffer(buffer_type& type, cuda::device& dev, void* memory, size_t size, bool pinned);
  ~buffer() override;
  void* base() override { return memory_; }
  void set_tensor(tensor& t, const void* data, size_t offset, size_t size) override;
  void get_tensor(const tensor& t, void* data, size_t offset, size_t size) override;
  void memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) override;
  // Directly from another CUDA buffer (device to device, peer, or pinned host).
  bool copy_tensor(const tensor& src, tensor& dst) override;
  void clear(uint8_t value) override;

 private:
  cuda::device& dev_;
  void* memory_;
  bool pinned_;
};

class device final : public device_i {
 public:
  explicit device(const device_info& info);
  ~device() override;
  device(const device&) = delete;
  device& operator=(const device&) = delete;

  std::string_view name() const override { return name_; }
  std::string description() const override { return description_; }
  device_type type() const override { return device_type::gpu; }
  device_memory memory() const override;
  device_caps caps() const override { return {.async = false, .host_buffer = true, .buffer_from_host_ptr = false, .events = true}; }
  backend_ptr init_backend() override;
  buffer_type_i& buffer_type() override { return *device_buft_; }
  buffer_type_i* host_buffer_type() override { return host_buft_.get(); }
  bool supports_op(const tensor& t) const override;
  // Its device memory and its pinned host memory.
  bool supports_buft(const buffer_type_i& b) const override;

  const device_info& info() const { return info_; }
  // Makes this device the calling thread's current one (cudaSetDevice). Throws backend_error.
  void make_current() const;

  // ---- transfers (thread-safe; each waits until its bytes have arrived) ----
  void upload(void* dst, const void* src, size_t size);      // host -> device, through pinned staging
  void download(void* dst, const void* src, size_t size);    // device -> host, through pinned staging
  void fill(void* dst, uint8_t value, size_t size);
  void copy(void* dst, const void* src, size_t size);        // any CUDA memory -> any (UVA)
  static constexpr size_t staging_bytes = size_t{8} << 20;   // each of the two staging buffers

 private:
  void ensure_transfers();

  device_info info_;
  std::string name_, description_;
  std::unique_ptr<cuda::buffer_type> device_buft_, host_buft_;
  std::mutex transfer_mu_;
  cudaStream_t transfer_ = nullptr;
  void* staging_[2] = {nullptr, nullptr};
  cudaEvent_t staged_[2] = {nullptr, nullptr};  // staging buffer k is free once its event completes
};

// This machine's CUDA devices, made at the first call (thread-safe); empty without a GPU or driver, and
// status() says why (cudart's words) or how many were found.
std::vector<device*> devices();
std::string status();

}  // namespace troupe::cuda
