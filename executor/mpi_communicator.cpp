#include "executor/mpi_communicator.hpp"

#include <chrono>
#include <climits>
#include <fmt/format.h>
#include <thread>
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

// With MPI_ERRORS_RETURN (set by mpi_errors_return) a failed call returns its code here instead
// of Open MPI aborting the job before longseq can say which rank failed and why.
void mpi_check(int code, const char* what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  MPI_Error_string(code, text, &length);
  throw std::runtime_error(fmt::format("MPI error in {}: {}", what, std::string(text, static_cast<size_t>(length))));
}

double peer_timeout_seconds = 600;

// Waits for a non-blocking collective, polling it; a peer that has not joined after the timeout
// (stopped, stalled in an endless loop, or on another code path) ends the wait with an error, so
// the job stops with a message instead of hanging. Polling spins for the first milliseconds (as
// Open MPI's blocking collectives do), then sleeps between tests so a long wait costs no core.
void request_wait(MPI_Request& request, const char* what, int group_size) {
  using clock = std::chrono::steady_clock;
  const auto start = clock::now();
  const auto spin_until = start + std::chrono::milliseconds(10);
  for (;;) {
    int done = 0;
    mpi_check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
    if (done) return;
    const auto now = clock::now();
    if (peer_timeout_seconds > 0 && now - start > std::chrono::duration<double>(peer_timeout_seconds)) {
      throw PeerTimeout(fmt::format("{} waited {:.0f} s for the other ranks of its group of {}: a rank has stopped, stalled or "
                                    "taken another path (raise --peer-timeout-s if a step legitimately takes longer)",
                                    what, peer_timeout_seconds, group_size));
    }
    if (now < spin_until) std::this_thread::yield();
    else std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

}  // namespace

void mpi_errors_return(MPI_Comm comm) { mpi_check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"); }

void mpi_peer_timeout_set(double seconds) { peer_timeout_seconds = seconds; }

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
  // MPI_Comm_split blocks and has no non-blocking form: a barrier (with the timeout) first, so a
  // rank that never arrives is reported rather than waited for.
  barrier();
  MPI_Comm group;
  mpi_check(MPI_Comm_split(comm_, color, key, &group), "MPI_Comm_split");
  return MpiCommunicator(group, true);
}

// Every collective is the non-blocking form, waited for with the peer timeout.
void MpiCommunicator::all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  MPI_Request request;
  mpi_check(MPI_Ialltoall(send, mpi_count(bytes_per_rank), MPI_BYTE, recv, mpi_count(bytes_per_rank), MPI_BYTE, comm_, &request),
            "MPI_Alltoall");
  request_wait(request, "MPI_Alltoall", size_);
}

void MpiCommunicator::all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  MPI_Request request;
  mpi_check(MPI_Iallgather(send, mpi_count(bytes_per_rank), MPI_BYTE, recv, mpi_count(bytes_per_rank), MPI_BYTE, comm_, &request),
            "MPI_Allgather");
  request_wait(request, "MPI_Allgather", size_);
}

void MpiCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  MPI_Request request;
  mpi_check(MPI_Ireduce_scatter_block(send, recv, mpi_count(count), MPI_FLOAT, MPI_SUM, comm_, &request), "MPI_Reduce_scatter_block");
  request_wait(request, "MPI_Reduce_scatter_block", size_);
}

void MpiCommunicator::all_reduce(float* data, int64_t count) {
  MPI_Request request;
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_FLOAT, MPI_SUM, comm_, &request), "MPI_Allreduce");
  request_wait(request, "MPI_Allreduce", size_);
}

void MpiCommunicator::all_reduce(double* data, int64_t count) {
  MPI_Request request;
  mpi_check(MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_DOUBLE, MPI_SUM, comm_, &request), "MPI_Allreduce");
  request_wait(request, "MPI_Allreduce", size_);
}

void MpiCommunicator::broadcast(float* data, int64_t count, int root) {
  MPI_Request request;
  mpi_check(MPI_Ibcast(data, mpi_count(count), MPI_FLOAT, root, comm_, &request), "MPI_Bcast");
  request_wait(request, "MPI_Bcast", size_);
}

void MpiCommunicator::barrier() const {
  MPI_Request request;
  mpi_check(MPI_Ibarrier(comm_, &request), "MPI_Barrier");
  request_wait(request, "MPI_Barrier", size_);
}

}  // namespace longseq
