#include "executor/mpi_communicator.hpp"

#include <climits>
#include <stdexcept>
#include <string>
#include <vector>

namespace longseq {

namespace {

// MPI counts are int (2 GiB of bytes per rank's block); a larger block is refused by name rather
// than truncated.
int mpi_count(int64_t count) {
  if (count < 0 || count > INT_MAX) throw std::length_error("MPI collective of " + std::to_string(count) + " elements");
  return static_cast<int>(count);
}

void mpi_check(int code, const char* what) {
  if (code != MPI_SUCCESS) throw std::runtime_error(std::string("MPI error in ") + what);
}

}  // namespace

MpiCommunicator::MpiCommunicator(MPI_Comm comm) : MpiCommunicator(comm, false) {}

MpiCommunicator::MpiCommunicator(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::MpiCommunicator(MpiCommunicator&& other) noexcept
    : comm_(other.comm_), owned_(other.owned_), rank_(other.rank_), size_(other.size_) {
  other.owned_ = false;
}

MpiCommunicator::~MpiCommunicator() {
  if (owned_) MPI_Comm_free(&comm_);
}

MpiCommunicator MpiCommunicator::split(int color, int key) const {
  MPI_Comm group;
  mpi_check(MPI_Comm_split(comm_, color, key, &group), "MPI_Comm_split");
  return MpiCommunicator(group, true);
}

void MpiCommunicator::all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  mpi_check(MPI_Alltoall(send, mpi_count(bytes_per_rank), MPI_BYTE, recv, mpi_count(bytes_per_rank), MPI_BYTE, comm_), "MPI_Alltoall");
}

void MpiCommunicator::all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  mpi_check(MPI_Allgather(send, mpi_count(bytes_per_rank), MPI_BYTE, recv, mpi_count(bytes_per_rank), MPI_BYTE, comm_),
            "MPI_Allgather");
}

void MpiCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  mpi_check(MPI_Reduce_scatter_block(send, recv, mpi_count(count), MPI_FLOAT, MPI_SUM, comm_), "MPI_Reduce_scatter_block");
}

void MpiCommunicator::all_reduce(float* data, int64_t count) {
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
}

void MpiCommunicator::all_reduce(double* data, int64_t count) {
  mpi_check(MPI_Allreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_DOUBLE, MPI_SUM, comm_), "MPI_Allreduce");
}

void MpiCommunicator::broadcast(float* data, int64_t count, int root) {
  mpi_check(MPI_Bcast(data, mpi_count(count), MPI_FLOAT, root, comm_), "MPI_Bcast");
}

}  // namespace longseq
