#include "executor/cuda_memory.hpp"

#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <new>

namespace longseq {

namespace {
// The device or the driver refusing surfaces as std::bad_alloc, as the host backend's operator
// new does (the arena checks its own budget before asking).
void* checked(cudaError_t status, void* pointer) {
  if (status != cudaSuccess) throw std::bad_alloc();
  return pointer;
}
}  // namespace

CudaDeviceMemoryBackend::CudaDeviceMemoryBackend() {
  int device = 0;
  cudaMemPool_t pool = nullptr;
  if (cudaGetDevice(&device) != cudaSuccess || cudaDeviceGetDefaultMemPool(&pool, device) != cudaSuccess) throw std::bad_alloc();
  uint64_t keep_everything = UINT64_MAX;
  cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &keep_everything);
}

void* CudaDeviceMemoryBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* pointer = nullptr;
  return checked(cudaMallocAsync(&pointer, bytes, cudaStreamLegacy), pointer);
}
void CudaDeviceMemoryBackend::release(void* data) noexcept {
  if (data) cudaFreeAsync(data, cudaStreamLegacy);
}
void CudaDeviceMemoryBackend::fill_zero(void* data, size_t bytes) {
  if (cudaMemsetAsync(data, 0, bytes, cudaStreamLegacy) != cudaSuccess) throw std::bad_alloc();
}

PinnedHostMemoryBackend::~PinnedHostMemoryBackend() {
  for (auto& [pointer, bytes] : sizes_) cudaFreeHost(pointer);
}
void* PinnedHostMemoryBackend::allocate(size_t bytes) {
  if (bytes == 0) return nullptr;
  if (auto reusable = released_.find(bytes); reusable != released_.end()) {
    void* pointer = reusable->second;
    released_.erase(reusable);
    return pointer;
  }
  void* pointer = nullptr;
  checked(cudaMallocHost(&pointer, bytes), pointer);
  sizes_[pointer] = bytes;
  return pointer;
}
void PinnedHostMemoryBackend::release(void* data) noexcept {
  if (!data) return;
  try {
    released_.emplace(sizes_.at(data), data);
  } catch (...) {  // not ours: nothing to keep
  }
}
void PinnedHostMemoryBackend::fill_zero(void* data, size_t bytes) { std::memset(data, 0, bytes); }

double device_memory_outside_arena_bytes(const Arena& device) {
  int current = 0;
  cudaMemPool_t pool = nullptr;
  if (cudaDeviceSynchronize() == cudaSuccess && cudaGetDevice(&current) == cudaSuccess &&
      cudaDeviceGetDefaultMemPool(&pool, current) == cudaSuccess)
    cudaMemPoolTrimTo(pool, 0);  // what the arena released goes back: only live bytes remain
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return 0;
  return static_cast<double>(total_bytes - free_bytes) - device.current_bytes();
}

}  // namespace longseq
