#include "executor/mpi_communicator.hpp"

#include "executor/component_seconds.hpp"

#include <algorithm>
#include <climits>
#include <fmt/format.h>
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

// The world rank of `rank` of `comm`, for messages.
int world_rank_of(MPI_Comm comm, int rank) {
  MPI_Group group, world;
  MPI_Comm_group(comm, &group);
  MPI_Comm_group(MPI_COMM_WORLD, &world);
  int world_rank = rank;
  MPI_Group_translate_ranks(group, 1, &rank, world, &world_rank);
  MPI_Group_free(&group);
  MPI_Group_free(&world);
  return world_rank;
}

// Waits for a non-blocking collective, polling it (collective_wait); a peer that has not joined
// after the peer timeout ends the wait with PeerTimeout, so the job stops with a message instead of
// hanging. `peer` is the rank of `comm` waited for where one is (a ring pass's partner, the other
// rank of a pair), else -1: a collective cannot say which peer never joined, so each waiting rank
// says so and the ranks missing from those messages are the quiet ones.
void request_wait(MPI_Request& request, const char* what, MPI_Comm comm, int peer = -1) {
  const CollectiveState state = collective_wait(
      [&] {
        int done = 0;
        mpi_check(MPI_Test(&request, &done, MPI_STATUS_IGNORE), what);
        return done ? CollectiveState::done : CollectiveState::pending;
      },
      steady_clock_s, CollectivePause(), peer_timeout_s());
  if (state != CollectiveState::timed_out) return;
  int rank = 0, size = 1;
  MPI_Comm_rank(comm, &rank);
  MPI_Comm_size(comm, &size);
  if (peer < 0 && size == 2) peer = 1 - rank;
  const std::string waited_for = peer >= 0 ? fmt::format("rank {} (it went quiet)", world_rank_of(comm, peer))
                                           : fmt::format("the other ranks of its group of {} (the ranks that report no such wait are "
                                                         "the ones that went quiet)", size);
  throw PeerTimeout(fmt::format("{} waited {:.0f} s for {}: a rank has stopped, stalled or taken another path (raise "
                                "--peer-timeout-s if a step legitimately takes longer)", what, peer_timeout_s(), waited_for));
}

}  // namespace

void mpi_errors_return(MPI_Comm comm) { mpi_check(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN), "MPI_Comm_set_errhandler"); }

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

// Every collective is the non-blocking form, started by `start` and waited for with the peer
// timeout.
template <class Start>
void MpiCommunicator::collective(const char* what, Start start) const {
  const ComponentTimer timer(&ComponentSeconds::communication);
  MPI_Request request;
  mpi_check(start(&request), what);
  request_wait(request, what, comm_);
}

void MpiCommunicator::all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  const int count = mpi_count(bytes_per_rank);
  collective("MPI_Alltoall", [&](MPI_Request* request) { return MPI_Ialltoall(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_, request); });
}

void MpiCommunicator::all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  const int count = mpi_count(bytes_per_rank);
  collective("MPI_Allgather", [&](MPI_Request* request) { return MPI_Iallgather(send, count, MPI_BYTE, recv, count, MPI_BYTE, comm_, request); });
}

// Both halves started at once, so every rank of a ring can send to its successor while it
// receives from its predecessor; each is waited for with the peer timeout.
void MpiCommunicator::send_receive_bytes(const void* send, int destination, void* recv, int source, int64_t bytes) {
  const ComponentTimer timer(&ComponentSeconds::communication);
  const int count = mpi_count(bytes);
  constexpr int kRingTag = 17;
  MPI_Request requests[2];
  mpi_check(MPI_Irecv(recv, count, MPI_BYTE, source, kRingTag, comm_, &requests[0]), "MPI_Irecv");
  mpi_check(MPI_Isend(send, count, MPI_BYTE, destination, kRingTag, comm_, &requests[1]), "MPI_Isend");
  request_wait(requests[1], "MPI_Isend of a ring pass", comm_, destination);
  request_wait(requests[0], "MPI_Irecv of a ring pass", comm_, source);
}

// Float sums are taken in rank order (rank 0's value, plus rank 1's, ...), after an all-to-all
// that brings every rank's part of this rank's chunk here: MPI's own reductions pick their order
// by message size and rank count, so a gradient reduced whole (all_reduce, ZeRO-0/1) and in module
// shards (reduce_scatter, ZeRO-2/3) would differ in the last bits. In one order they are the same
// bit for bit, which the tests hold them to; the volume is a ring reduce-scatter's.
void MpiCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  std::vector<float> parts(static_cast<size_t>(count) * static_cast<size_t>(size_));
  all_to_all(send, parts.data(), count);
  std::copy_n(parts.data(), count, recv);
  for (int source = 1; source < size_; ++source) {
    const float* part = parts.data() + static_cast<int64_t>(source) * count;
    for (int64_t i = 0; i < count; ++i) recv[i] += part[i];
  }
}

void MpiCommunicator::all_reduce(float* data, int64_t count) {
  // Reduce-scatter then all-gather (ring all-reduce's two halves), over a padded copy.
  const int64_t chunk = (count + size_ - 1) / size_;
  std::vector<float> padded(static_cast<size_t>(chunk * size_), 0.0f), own(static_cast<size_t>(chunk));
  std::copy_n(data, count, padded.data());
  reduce_scatter(padded.data(), own.data(), chunk);
  all_gather(own.data(), padded.data(), chunk);
  std::copy_n(padded.data(), count, data);
}

void MpiCommunicator::all_reduce(double* data, int64_t count) {
  collective("MPI_Allreduce", [&](MPI_Request* request) {
    return MPI_Iallreduce(MPI_IN_PLACE, data, mpi_count(count), MPI_DOUBLE, MPI_SUM, comm_, request);
  });
}

void MpiCommunicator::broadcast(float* data, int64_t count, int root) {
  collective("MPI_Bcast", [&](MPI_Request* request) { return MPI_Ibcast(data, mpi_count(count), MPI_FLOAT, root, comm_, request); });
}

void MpiCommunicator::barrier() const {
  collective("MPI_Barrier", [&](MPI_Request* request) { return MPI_Ibarrier(comm_, request); });
}

}  // namespace longseq
