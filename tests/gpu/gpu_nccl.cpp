// gpu_nccl: the NCCL communicator against the MPI one, under mpirun with one GPU per rank. Every
// collective of the Communicator interface runs on both on the same inputs; the results must be
// identical for data movement and equal to within fp32 summation order for reductions.
// Exits 77 (CTest: SKIPPED) when this machine has fewer GPUs than ranks.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "executor/mpi_communicator.hpp"
#include "executor/nccl_communicator.hpp"
#include "kernels/cuda/device_query.hpp"
#include "kernels/cuda/kernels.hpp"

namespace {

using longseq::Communicator;
namespace gpu = longseq::cuda;

int failures = 0;
void expect(bool condition, const char* what, int rank) {
  if (condition) return;
  ++failures;
  std::printf("rank %d: FAILED: %s\n", rank, what);
}

// Runs `collective` on device copies through NCCL and on host copies through MPI; compares.
template <typename Collective>
void compare(const char* name, Communicator& nccl, Communicator& mpi, const std::vector<float>& input, size_t output_size,
             Collective collective, float tolerance) {
  std::vector<float> host_out(output_size, 0.0f), host_in = input;
  collective(mpi, host_in.data(), host_out.data());
  float* device_in = static_cast<float*>(gpu::device_malloc(input.size() * sizeof(float)));
  float* device_out = static_cast<float*>(gpu::device_malloc(output_size * sizeof(float)));
  gpu::copy_to_device(device_in, input.data(), input.size() * sizeof(float));
  gpu::device_memset_zero(device_out, output_size * sizeof(float));
  collective(nccl, device_in, device_out);
  std::vector<float> from_device(output_size), device_in_after(input.size());
  gpu::copy_to_host(from_device.data(), device_out, output_size * sizeof(float));
  gpu::copy_to_host(device_in_after.data(), device_in, input.size() * sizeof(float));
  gpu::device_free(device_in);
  gpu::device_free(device_out);
  double worst = 0;
  for (size_t i = 0; i < output_size; ++i) worst = std::max(worst, static_cast<double>(std::fabs(from_device[i] - host_out[i])));
  for (size_t i = 0; i < input.size(); ++i) worst = std::max(worst, static_cast<double>(std::fabs(device_in_after[i] - host_in[i])));
  expect(worst <= tolerance, name, mpi.rank());
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rank = 0, size = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  const longseq::CudaDeviceInfo info = longseq::cuda_device_query();
  if (info.device_count < size) {
    if (rank == 0) std::printf("SKIPPED: %d CUDA device(s) visible, %d ranks need one each\n", info.device_count, size);
    MPI_Finalize();
    return 77;
  }
  {
    longseq::MpiCommunicator mpi(MPI_COMM_WORLD);
    longseq::NcclCommunicator nccl(MPI_COMM_WORLD, rank % info.device_count);
    const int64_t count = 1000;
    std::vector<float> per_rank(static_cast<size_t>(count * size));
    for (size_t i = 0; i < per_rank.size(); ++i) per_rank[i] = static_cast<float>(rank * 100000 + static_cast<int64_t>(i)) * 1e-3f;
    const std::vector<float> one_block(per_rank.begin(), per_rank.begin() + count);
    const size_t all = per_rank.size();
    compare("all_to_all", nccl, mpi, per_rank, all, [&](Communicator& c, float* in, float* out) { c.all_to_all(in, out, count); }, 0.0f);
    compare("all_gather", nccl, mpi, one_block, all, [&](Communicator& c, float* in, float* out) { c.all_gather(in, out, count); }, 0.0f);
    compare("reduce_scatter", nccl, mpi, per_rank, static_cast<size_t>(count),
            [&](Communicator& c, float* in, float* out) { c.reduce_scatter(in, out, count); }, 1e-2f);
    compare("all_reduce", nccl, mpi, one_block, 0, [&](Communicator& c, float* in, float*) { c.all_reduce(in, count); }, 1e-2f);
    compare("broadcast from the last rank", nccl, mpi, one_block, 0,
            [&](Communicator& c, float* in, float*) { c.broadcast(in, count, size - 1); }, 0.0f);
  }
  int any_failures = 0;
  MPI_Allreduce(&failures, &any_failures, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  if (rank == 0) std::printf("%s\n", any_failures == 0 ? "5 collectives equal over NCCL and MPI" : "NCCL collectives differ from MPI");
  MPI_Finalize();
  return any_failures == 0 ? 0 : 1;
}
