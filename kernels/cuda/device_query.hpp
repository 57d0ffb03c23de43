// device_query.hpp: what CUDA devices this process sees. Plain C++ header (no CUDA types), so
// CPU-only code and tests can include it; the implementation is in device_query.cu.
#pragma once

#include <cstdint>
#include <string>

namespace longseq {

struct CudaDeviceInfo {
  int device_count = 0;      // 0 when there is no GPU or no driver
  std::string name;          // device 0
  int64_t total_bytes = 0;   // device 0, as cudaMemGetInfo reports it
  int64_t free_bytes = 0;
  std::string error;         // why device_count is 0, when CUDA said
};

CudaDeviceInfo cuda_device_query();

// Makes `device` this process's GPU (cudaSetDevice); throws std::runtime_error with CUDA's reason.
// Returns its free bytes (cudaMemGetInfo) at that moment.
int64_t cuda_device_select(int device);

}  // namespace longseq
