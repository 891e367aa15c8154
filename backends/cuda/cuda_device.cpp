#include "backends/cuda/cuda_device.h"

#include <algorithm>
#include <cstring>

#include "backends/cuda/cuda_backend.h"
#include "backends/cuda/plan.h"

namespace troupe::cuda {

void check(cudaError_t e, std::string_view who, const std::string& call) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // clears the error (unless it is sticky), so that the next launch check does not see it
  const std::string what = std::string(who) + ": " + call + ": " + cudaGetErrorName(e) + ": " + cudaGetErrorString(e);
  if (e == cudaErrorMemoryAllocation) throw out_of_memory_error(what);
  throw backend_error(what);
}

// ---- buffer types and buffers ----

buffer_type::buffer_type(cuda::device& dev, bool pinned_host)
    : dev_(dev), pinned_(pinned_host), name_(std::string(dev.name()) + (pinned_host ? "_host" : "")) {}

size_t buffer_type::max_size() const { return pinned_ ? SIZE_MAX : dev_.info().total; }

device_i& buffer_type::device() const { return dev_; }

buffer_ptr buffer_type::alloc_buffer(size_t size) {
  if (size > max_size()) {
    throw out_of_memory_error("buffer type " + name_ + ": " + std::to_string(size) + " bytes exceed its max size " +
                              std::to_string(max_size()));
  }
  dev_.make_current();
  void* p = nullptr;
  const size_t n = std::max<size_t>(size, alignment());
  const std::string call = (pinned_ ? "cudaMallocHost of " : "cudaMalloc of ") + std::to_string(size) + " bytes";
  check(pinned_ ? cudaMallocHost(&p, n) : cudaMalloc(&p, n), name_, call);
  return std::make_unique<cuda::buffer>(*this, dev_, p, size, pinned_);
}

buffer::buffer(buffer_type& type, cuda::device& dev, void* memory, size_t size, bool pinned)
    : buffer_i(type, size), dev_(dev), memory_(memory), pinned_(pinned) {}

buffer::~buffer() {
  if (cudaSetDevice(dev_.info().index) != cudaSuccess) return;
  if (pinned_) {
    cudaFreeHost(memory_);
  } else {
    cudaFree(memory_);  // waits for the device's work that may still use it
  }
}

void buffer::set_tensor(tensor& t, const void* data, size_t offset, size_t size) {
  uint8_t* dst = static_cast<uint8_t*>(t.data) + offset;
  if (pinned_) {
    std::memcpy(dst, data, size);
  } else {
    dev_.upload(dst, data, size);
  }
}

void buffer::get_tensor(const tensor& t, void* data, size_t offset, size_t size) {
  const uint8_t* src = static_cast<const uint8_t*>(t.data) + offset;
  if (pinned_) {
    std::memcpy(data, src, size);
  } else {
    dev_.download(data, src, size);
  }
}

void buffer::memset_tensor(tensor& t, uint8_t value, size_t offset, size_t size) {
  uint8_t* dst = static_cast<uint8_t*>(t.data) + offset;
  if (pinned_) {
    std::memset(dst, value, size);
  } else {
    dev_.fill(dst, value, size);
  }
}

bool buffer::copy_tensor(const tensor& src, tensor& dst) {
  if (src.buffer == nullptr || dynamic_cast<const cuda::buffer*>(src.buffer) == nullptr) return false;
  dev_.copy(dst.data, src.data, nbytes(src));
  return true;
}

void buffer::clear(uint8_t value) {
  if (pinned_) {
    std::memset(memory_, value, size());
  } else {
    dev_.fill(memory_, value, size());
  }
}

// ---- the device ----

device::device(const device_info& info)
    : info_(info),
      name_("CUDA" + std::to_string(info.index)),
      description_(info.name + " (compute " + std::to_string(info.cc_major) + "." + std::to_string(info.cc_minor) + ")") {
  device_buft_ = std::make_unique<cuda::buffer_type>(*this, false);
  host_buft_ = std::make_unique<cuda::buffer_type>(*this, true);
}

device::~device() {
  if (transfer_ == nullptr || cudaSetDevice(info_.index) != cudaSuccess) return;
  cudaStreamSynchronize(transfer_);
  for (int k = 0; k < 2; ++k) {
    if (staged_[k] != nullptr) cudaEventDestroy(staged_[k]);
    if (staging_[k] != nullptr) cudaFreeHost(staging_[k]);
  }
  cudaStreamDestroy(transfer_);
}

// The transfer stream and the staging buffers, made at the first transfer (a program that only lists the
// devices pins no memory). Under transfer_mu_; a failure leaves what was made for the next try.
void device::ensure_transfers() {
  make_current();
  if (transfer_ == nullptr) check(cudaStreamCreateWithFlags(&transfer_, cudaStreamNonBlocking), name_, "cudaStreamCreateWithFlags");
  for (int k = 0; k < 2; ++k) {
    if (staging_[k] == nullptr) check(cudaMallocHost(&staging_[k], staging_bytes), name_, "cudaMallocHost of the staging buffers");
    if (staged_[k] == nullptr) check(cudaEventCreateWithFlags(&staged_[k], cudaEventDisableTiming), name_, "cudaEventCreateWithFlags");
  }
}

void device::make_current() const { check(cudaSetDevice(info_.index), name_, "cudaSetDevice"); }

device_memory device::memory() const {
  make_current();
  size_t free = 0, total = 0;
  check(cudaMemGetInfo(&free, &total), name_, "cudaMemGetInfo");
  return {free, total};
}

backend_ptr device::init_backend() { return std::make_unique<cuda::backend>(*this); }

bool device::supports_op(const tensor& t) const { return cuda::supports(t); }

bool device::supports_buft(const buffer_type_i& b) const { return &b == device_buft_.get() || &b == host_buft_.get(); }

void device::upload(void* dst, const void* src, size_t size) {
  std::lock_guard lock(transfer_mu_);
  ensure_transfers();
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Staging buffer k is refilled once the copy out of it (two pieces ago) has completed; meanwhile the
  // other one's copy runs.
  int k = 0;
  for (size_t done = 0; done < size; done += staging_bytes, k ^= 1) {
    const size_t piece = std::min(staging_bytes, size - done);
    check(cudaEventSynchronize(staged_[k]), name_, "upload (an earlier piece)");
    std::memcpy(staging_[k], s + done, piece);
    check(cudaMemcpyAsync(d + done, staging_[k], piece, cudaMemcpyHostToDevice, transfer_), name_,
          "cudaMemcpyAsync of " + std::to_string(piece) + " bytes to the device");
    check(cudaEventRecord(staged_[k], transfer_), name_, "cudaEventRecord");
  }
  check(cudaStreamSynchronize(transfer_), name_, "upload of " + std::to_string(size) + " bytes");
}

void device::download(void* dst, const void* src, size_t size) {
  std::lock_guard lock(transfer_mu_);
  ensure_transfers();
  auto* d = static_cast<uint8_t*>(dst);
  const auto* s = static_cast<const uint8_t*>(src);
  // Piece i is copied into staging (i % 2) while the host copies piece i - 1 out of the other one.
  size_t pending_at = 0, pending = 0;  // the piece waiting in staging k ^ 1
  int k = 0;
  for (size_t done = 0; done < size; done += staging_bytes, k ^= 1) {
    const size_t piece = std::min(staging_bytes, size - done);
    check(cudaMemcpyAsync(staging_[k], s + done, piece, cudaMemcpyDeviceToHost, transfer_), name_,
          "cudaMemcpyAsync of " + std::to_string(piece) + " bytes from the device");
    check(cudaEventRecord(staged_[k], transfer_), name_, "cudaEventRecord");
    if (pending > 0) {
      check(cudaEventSynchronize(staged_[k ^ 1]), name_, "download");
      std::memcpy(d + pending_at, staging_[k ^ 1], pending);
    }
    pending_at = done;
    pending = piece;
  }
  if (pending > 0) {
    check(cudaEventSynchronize(staged_[k ^ 1]), name_, "download of " + std::to_string(size) + " bytes");
    std::memcpy(d + pending_at, staging_[k ^ 1], pending);
  }
}

void device::fill(void* dst, uint8_t value, size_t size) {
  std::lock_guard lock(transfer_mu_);
  ensure_transfers();
  check(cudaMemsetAsync(dst, value, size, transfer_), name_, "cudaMemsetAsync of " + std::to_string(size) + " bytes");
  check(cudaStreamSynchronize(transfer_), name_, "cudaMemsetAsync");
}

void device::copy(void* dst, const void* src, size_t size) {
  std::lock_guard lock(transfer_mu_);
  ensure_transfers();
  check(cudaMemcpyAsync(dst, src, size, cudaMemcpyDefault, transfer_), name_, "cudaMemcpyAsync of " + std::to_string(size) + " bytes");
  check(cudaStreamSynchronize(transfer_), name_, "cudaMemcpyAsync");
}

// ---- the devices of this machine ----

namespace {

struct devices_state {
  std::vector<std::unique_ptr<device>> owned;
  std::vector<device*> list;
};

// A device per probed one: making it asks the driver nothing (streams and staging come with the first
// transfer, cuda_backend.cpp's with the first backend).
const devices_state& state() {
  static const devices_state s = [] {
    devices_state st;
    for (const device_info& info : probe()) {
      st.owned.push_back(std::make_unique<device>(info));
      st.list.push_back(st.owned.back().get());
    }
    return st;
  }();
  return s;
}

}  // namespace

std::vector<device*> devices() { return state().list; }

std::string status() {
  const devices_state& s = state();
  if (s.list.empty()) return cuda::probe_status();
  return std::to_string(s.list.size()) + (s.list.size() == 1 ? " device" : " devices");
}

}  // namespace troupe::cuda
