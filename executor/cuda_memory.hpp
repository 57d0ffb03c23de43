// cuda_memory.hpp: memory backends for the executor's arenas on a GPU machine: device memory for
// the device arena, pinned host memory for the offload pool, so checkpoint copies can run
// asynchronously. The arena's accounting is unchanged; what lives outside it (CUDA context, cuBLAS
// workspace, NCCL buffers) is what cudaMemGetInfo shows beyond the arena's bytes, reported by
// device_memory_outside_arena_bytes.
// Plain C++ (the CUDA runtime API from a .cpp): built only where CUDA is.
#pragma once

#include <cstddef>
#include <map>
#include <vector>

#include "executor/arena.hpp"

namespace longseq {

// Stream-ordered device memory (cudaMallocAsync / cudaFreeAsync on the default stream, where
// every kernel runs): unlike cudaFree, a free does not synchronize the device, so an offload copy
// on the side stream keeps running while the next layer computes. The current device's pool keeps
// what is freed (release threshold: unlimited) instead of returning it to the driver at every
// synchronization, so a step's many tensors are not cudaMalloc'd anew each time;
// device_memory_outside_arena_bytes trims it before measuring. Construct it after choosing the GPU.
class CudaDeviceMemoryBackend final : public MemoryBackend {
 public:
  CudaDeviceMemoryBackend();
  void* allocate(size_t bytes) override;
  void release(void* data) noexcept override;
  void fill_zero(void* data, size_t bytes) override;
};

// Pinned host memory (cudaMallocHost). cudaFreeHost synchronizes the device, so released blocks
// are kept for reuse by size (every checkpoint of a run has the same size) and returned to CUDA
// when the backend is destroyed.
class PinnedHostMemoryBackend final : public MemoryBackend {
 public:
  PinnedHostMemoryBackend() = default;
  PinnedHostMemoryBackend(const PinnedHostMemoryBackend&) = delete;
  PinnedHostMemoryBackend& operator=(const PinnedHostMemoryBackend&) = delete;
  ~PinnedHostMemoryBackend() override;
  void* allocate(size_t bytes) override;
  void release(void* data) noexcept override;
  void fill_zero(void* data, size_t bytes) override;

 private:
  std::map<void*, size_t> sizes_;                 // every block handed out, with its size
  std::multimap<size_t, void*> released_;         // blocks ready for reuse
};

// Bytes in use on the current device (total - free, from cudaMemGetInfo, after synchronizing and
// trimming the pool to what is live) minus what `device` holds: the context, library workspaces
// and communication buffers.
double device_memory_outside_arena_bytes(const Arena& device);

}  // namespace longseq
