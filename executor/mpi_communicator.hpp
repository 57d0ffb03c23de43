// mpi_communicator.hpp: the Communicator over Open MPI (one process per rank; `mpirun -np 4` on
// one machine is a real four-rank run, a hostfile spreads it across machines). Only code that
// starts MPI includes this header.
#pragma once

#include <mpi.h>

#include <stdexcept>

#include "executor/communicator.hpp"

namespace longseq {

// MPI errors on `comm` (and on communicators split from it) are returned to longseq, which
// reports the failing rank and reason, rather than aborting the job inside Open MPI.
void mpi_errors_return(MPI_Comm comm);

class MpiCommunicator final : public Communicator {
 public:
  // Wraps an existing communicator (not owned), e.g. MPI_COMM_WORLD.
  explicit MpiCommunicator(MPI_Comm comm);
  // A sub-group: ranks with the same `color`, ordered by `key` (MPI_Comm_split); owns the handle.
  MpiCommunicator split(int color, int key) const;
  // The MPI handle (e.g. to bootstrap an NCCL communicator over the same ranks).
  MPI_Comm comm() const { return comm_; }
  MpiCommunicator(MpiCommunicator&& other) noexcept;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;
  ~MpiCommunicator() override;

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  void all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) override;
  void all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) override;
  void send_receive_bytes(const void* send, int destination, void* recv, int source, int64_t bytes) override;
  void reduce_scatter(const float* send, float* recv, int64_t count) override;
  void all_reduce(float* data, int64_t count) override;
  void all_reduce(double* data, int64_t count) override;
  void broadcast(float* data, int64_t count, int root) override;
  // Every rank of the group has arrived (with the peer timeout).
  void barrier() const;

 private:
  MpiCommunicator(MPI_Comm comm, bool owned);
  // Starts a non-blocking collective (start(&request) returns its MPI code) and waits for it.
  template <class Start>
  void collective(const char* what, Start start) const;
  MPI_Comm comm_;
  bool owned_ = false;
  int rank_ = 0, size_ = 1;
};

}  // namespace longseq
