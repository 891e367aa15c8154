#include "backends/cuda/cuda_backend.h"

#include <initializer_list>

#include "backends/cuda/launch.h"

namespace troupe::cuda {

backend::backend(cuda::device& dev) : dev_(dev) {
  dev_.make_current();
  try {
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), dev_.name(), "cudaStreamCreateWithFlags");
    check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), dev_.name(), "cudaEventCreateWithFlags");
    if (const cublasStatus_t st = cublasCreate(&cublas_); st != CUBLAS_STATUS_SUCCESS) {
      cublas_ = nullptr;
      throw backend_error(std::string(dev_.name()) + ": cublasCreate: " + error_text(st));
    }
  } catch (...) {
    if (done_ != nullptr) cudaEventDestroy(done_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
    throw;
  }
}

backend::~backend() {
  if (cudaSetDevice(dev_.info().index) != cudaSuccess) return;  // the device is gone: nothing to free on it
  cudaStreamSynchronize(stream_);
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  cudaEventDestroy(done_);
  cudaStreamDestroy(stream_);
}

backend::scratch::~scratch() {
  for (void* m : memory_) {
    if (m != nullptr) cudaFree(m);
  }
}

uint8_t* backend::scratch::get(int slot, size_t bytes) {
  const auto s = static_cast<size_t>(slot);
  if (bytes > size_[s]) {
    // Earlier steps of this graph may still read the old memory: wait for them before freeing it.
    check(cudaStreamSynchronize(be_.stream_), be_.dev_.name(), "cudaStreamSynchronize");
    if (memory_[s] != nullptr) check(cudaFree(memory_[s]), be_.dev_.name(), "cudaFree");
    memory_[s] = nullptr;
    size_[s] = 0;
    const size_t want = (bytes + (size_t{1} << 20) - 1) & ~((size_t{1} << 20) - 1);  // whole MiB: fewer regrowths
    check(cudaMalloc(&memory_[s], want), be_.dev_.name(), "cudaMalloc of " + std::to_string(want) + " bytes of scratch");
    size_[s] = want;
  }
  return static_cast<uint8_t*>(memory_[s]);
}

void backend::graph_compute(graph& g) {
  dev_.make_current();
  last_steps_.clear();
  for (size_t i = 0; i < g.n_nodes(); ++i) {
    tensor& node = *g.node(i);
    if (!dev_.supports_op(node)) {
      throw backend_error(std::string(dev_.name()) + ": node " + describe(node) + ": op " + std::string(op_name(node.op)) +
                          " not supported");
    }
    for (const tensor* t : std::initializer_list<const tensor*>{&node, node.src[0], node.src[1], node.src[2]}) {
      if (t == nullptr || t->data == nullptr) continue;
      if (t->buffer != nullptr && !dev_.supports_buft(t->buffer->type())) {
        throw backend_error(std::string(dev_.name()) + ": node " + describe(node) + ": tensor " + describe(*t) +
                            " is not in this device's memory");
      }
    }
    try {
      for (const step& s : plan(node, scratch_)) {
        launch(s, stream_, cublas_);
        ++last_steps_[std::string(step_name(s))];
      }
    } catch (const out_of_memory_error&) {
      throw;
    } catch (const backend_error& e) {
      throw backend_error(std::string(dev_.name()) + ": node " + describe(node) + ": " + e.what());
    }
  }
  check(cudaEventRecord(done_, stream_), dev_.name(), "cudaEventRecord");
  check(cudaEventSynchronize(done_), dev_.name(), "graph of " + std::to_string(g.n_nodes()) + " nodes");
}

void backend::synchronize() {
  dev_.make_current();
  check(cudaStreamSynchronize(stream_), dev_.name(), "cudaStreamSynchronize");
}

}  // namespace troupe::cuda
