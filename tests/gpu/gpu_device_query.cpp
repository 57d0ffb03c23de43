// gpu_device_query: the first GPU test. Exits 77 (reported by CTest as SKIPPED, never passed)
// when no GPU is visible; with one, checks that CUDA reports a device with memory.
#include <cstdio>

#include "kernels/cuda/device_query.hpp"

int main() {
  const longseq::CudaDeviceInfo info = longseq::cuda_device_query();
  if (info.device_count == 0) {
    std::printf("SKIPPED: no CUDA device visible (%s)\n", info.error.empty() ? "none found" : info.error.c_str());
    return 77;
  }
  std::printf("device 0: %s, %.2f GiB total, %.2f GiB free\n", info.name.c_str(),
              static_cast<double>(info.total_bytes) / (1 << 30), static_cast<double>(info.free_bytes) / (1 << 30));
  const bool ok = !info.name.empty() && info.total_bytes > 0 && info.free_bytes > 0 && info.free_bytes <= info.total_bytes;
  std::printf("%s\n", ok ? "1 passed, 0 failed" : "0 passed, 1 failed");
  return ok ? 0 : 1;
}
