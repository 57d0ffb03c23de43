// nccl_communicator.hpp: the Communicator over NCCL, one rank per GPU, bootstrapped over MPI
// (rank 0 makes the NCCL unique id and broadcasts it). Buffers are device pointers (all_reduce of
// doubles also takes host scalars). Each collective runs on this communicator's stream after the
// default stream's queued kernels and is waited for before returning, so callers see the blocking
// semantics of the MPI communicator, and the same peer timeout (peer_timeout_set), past which the
// communicator is aborted and the rank fails. all_to_all is NCCL's grouped send/recv.
// Built only where CUDA, NCCL and MPI are; compiled in CI, not yet run on a GPU.
#pragma once

#include <mpi.h>

#include "executor/communicator.hpp"

namespace longseq {

class NcclCommunicator final : public Communicator {
 public:
  // Every rank of `bootstrap` calls this together; `device` is this rank's GPU (cudaSetDevice).
  NcclCommunicator(MPI_Comm bootstrap, int device);
  ~NcclCommunicator() override;
  NcclCommunicator(const NcclCommunicator&) = delete;
  NcclCommunicator& operator=(const NcclCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) override;
  void all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) override;
  void send_receive_bytes(const void* send, int destination, void* recv, int source, int64_t bytes) override;
  void reduce_scatter(const float* send, float* recv, int64_t count) override;
  void all_reduce(float* data, int64_t count) override;
  void all_reduce(double* data, int64_t count) override;
  void broadcast(float* data, int64_t count, int root) override;

 private:
  void after_compute();
  void wait(const char* what);
  void* comm_ = nullptr;    // ncclComm_t (null once aborted)
  void* stream_ = nullptr;  // cudaStream_t
  void* compute_done_ = nullptr;  // cudaEvent_t recorded on the default stream
  int rank_ = 0, size_ = 1;
};

}  // namespace longseq
