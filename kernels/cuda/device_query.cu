// device_query.cu: CUDA runtime queries behind a CUDA-free header.
#include "kernels/cuda/device_query.hpp"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace longseq {

CudaDeviceInfo cuda_device_query() {
  CudaDeviceInfo info;
  int count = 0;
  const cudaError_t status = cudaGetDeviceCount(&count);
  if (status != cudaSuccess) {
    info.error = cudaGetErrorString(status);
    return info;
  }
  info.device_count = count;
  if (count == 0) return info;
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, 0) == cudaSuccess) info.name = properties.name;
  size_t free_bytes = 0, total_bytes = 0;
  if (cudaSetDevice(0) == cudaSuccess && cudaMemGetInfo(&free_bytes, &total_bytes) == cudaSuccess) {
    info.free_bytes = static_cast<int64_t>(free_bytes);
    info.total_bytes = static_cast<int64_t>(total_bytes);
  }
  return info;
}

int64_t cuda_device_select(int device) {
  cudaError_t status = cudaSetDevice(device);
  if (status != cudaSuccess) throw std::runtime_error(std::string("cudaSetDevice: ") + cudaGetErrorString(status));
  size_t free_bytes = 0, total_bytes = 0;
  status = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (status != cudaSuccess) throw std::runtime_error(std::string("cudaMemGetInfo: ") + cudaGetErrorString(status));
  return static_cast<int64_t>(free_bytes);
}

}  // namespace longseq
