#include "executor/cuda_memory.hpp"

#include <cuda_runtime.h>

#include <cstring>
#include <new>

namespace longseq {

namespace {
// The device or the driver refusing surfaces as std::bad_alloc, as the host backend's new[] does
// (the arena checks its own budget before asking).
void* checked(cudaError_t status, void* pointer) {
  if (status != cudaSuccess) throw std::bad_alloc();
  return pointer;
}
}  // namespace

float* CudaDeviceMemoryBackend::allocate(int64_t elements) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMalloc(&pointer, static_cast<size_t>(elements) * sizeof(float));
  return static_cast<float*>(checked(status, pointer));
}
void CudaDeviceMemoryBackend::release(float* data) noexcept { cudaFree(data); }
void CudaDeviceMemoryBackend::fill_zero(float* data, int64_t elements) {
  if (cudaMemset(data, 0, static_cast<size_t>(elements) * sizeof(float)) != cudaSuccess) throw std::bad_alloc();
}

float* PinnedHostMemoryBackend::allocate(int64_t elements) {
  void* pointer = nullptr;
  const cudaError_t status = cudaMallocHost(&pointer, static_cast<size_t>(elements) * sizeof(float));
  return static_cast<float*>(checked(status, pointer));
}
void PinnedHostMemoryBackend::release(float* data) noexcept { cudaFreeHost(data); }
void PinnedHostMemoryBackend::fill_zero(float* data, int64_t elements) { std::memset(data, 0, static_cast<size_t>(elements) * sizeof(float)); }

double device_memory_outside_arena_bytes(const Arena& device) {
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
  return static_cast<double>(total_bytes - free_bytes) - device.current_bytes();
}

}  // namespace longseq
