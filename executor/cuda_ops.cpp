#include "executor/cuda_ops.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace longseq {

namespace {
void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(status));
}
}  // namespace

CudaOps::CudaOps() {
  cudaStream_t stream = nullptr;
  // Non-blocking: the side stream must not wait for the default stream implicitly, or the copy
  // would serialize with the compute it is meant to overlap; events order the two instead.
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate (offload stream)");
  side_stream_ = stream;
}

CudaOps::~CudaOps() {
  if (side_stream_) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(side_stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(side_stream_));
  }
}

CudaOps::PendingCopy& CudaOps::PendingCopy::operator=(PendingCopy&& other) noexcept {
  if (this != &other) {
    if (done_) cudaEventDestroy(static_cast<cudaEvent_t>(done_));
    done_ = std::exchange(other.done_, nullptr);
  }
  return *this;
}

// Destroying an event whose work is still queued is allowed: CUDA releases it once complete.
CudaOps::PendingCopy::~PendingCopy() {
  if (done_) cudaEventDestroy(static_cast<cudaEvent_t>(done_));
}

CudaOps::PendingCopy CudaOps::copy_begin(void* destination, const void* source, size_t bytes, bool to_host) {
  auto side = static_cast<cudaStream_t>(side_stream_);
  // The copy starts after everything queued on the default stream so far: the kernels that wrote
  // its source (and the stream-ordered allocation of its destination).
  cudaEvent_t ready = nullptr, done = nullptr;
  cuda_check(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(ready, cudaStreamLegacy), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(side, ready, 0), "cudaStreamWaitEvent");
  cudaEventDestroy(ready);
  cuda_check(cudaMemcpyAsync(destination, source, bytes, to_host ? cudaMemcpyDeviceToHost : cudaMemcpyHostToDevice, side),
             to_host ? "offload copy to host" : "prefetch copy to device");
  cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate");
  cuda_check(cudaEventRecord(done, side), "cudaEventRecord");
  return PendingCopy(done);
}

CudaOps::PendingCopy CudaOps::copy_to_host_begin(Act* host, const Act* device, int64_t n) {
  return copy_begin(host, device, static_cast<size_t>(n) * sizeof(Act), true);
}

CudaOps::PendingCopy CudaOps::copy_to_device_begin(Act* device, const Act* host, int64_t n) {
  return copy_begin(device, host, static_cast<size_t>(n) * sizeof(Act), false);
}

void CudaOps::copy_wait(PendingCopy& copy) {
  if (copy.event()) cuda_check(cudaStreamWaitEvent(cudaStreamLegacy, static_cast<cudaEvent_t>(copy.event()), 0), "cudaStreamWaitEvent");
}

void CudaOps::copy_finish(PendingCopy& copy) {
  if (copy.event()) cuda_check(cudaEventSynchronize(static_cast<cudaEvent_t>(copy.event())), "cudaEventSynchronize");
}

}  // namespace longseq
