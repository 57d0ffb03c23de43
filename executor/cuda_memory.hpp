// cuda_memory.hpp: memory backends for the executor's arenas on a GPU machine: device memory
// (cudaMalloc) for the device arena, pinned host memory (cudaMallocHost) for the offload pool,
// so checkpoint copies can run asynchronously. The arena's accounting is unchanged; what lives
// outside it (CUDA context, cuBLAS workspace, NCCL buffers) is what cudaMemGetInfo shows beyond
// the arena's bytes, reported by device_memory_outside_arena_bytes.
// Plain C++ (the CUDA runtime API from a .cpp): built only where CUDA is.
#pragma once

#include <cstdint>

#include "executor/arena.hpp"

namespace longseq {

class CudaDeviceMemoryBackend final : public MemoryBackend {
 public:
  float* allocate(int64_t elements) override;
  void release(float* data) noexcept override;
  void fill_zero(float* data, int64_t elements) override;
};

class PinnedHostMemoryBackend final : public MemoryBackend {
 public:
  float* allocate(int64_t elements) override;
  void release(float* data) noexcept override;
  void fill_zero(float* data, int64_t elements) override;
};

// Bytes in use on the current device (total - free, from cudaMemGetInfo) minus what `device`
// holds: the context, library workspaces and communication buffers.
double device_memory_outside_arena_bytes(const Arena& device);

}  // namespace longseq
