#include "executor/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace longseq {

namespace {
void nccl_check(ncclResult_t result, const char* what) {
  if (result != ncclSuccess) throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(result));
}
void cuda_check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) throw std::runtime_error(std::string("CUDA ") + what + ": " + cudaGetErrorString(status));
}
size_t elements(int64_t count) {
  if (count < 0) throw std::length_error("NCCL collective of a negative element count");
  return static_cast<size_t>(count);
}
}  // namespace

NcclCommunicator::NcclCommunicator(MPI_Comm bootstrap, int device) {
  MPI_Comm_rank(bootstrap, &rank_);
  MPI_Comm_size(bootstrap, &size_);
  cuda_check(cudaSetDevice(device), "cudaSetDevice");
  ncclUniqueId id;
  if (rank_ == 0) nccl_check(ncclGetUniqueId(&id), "ncclGetUniqueId");
  if (MPI_Bcast(&id, sizeof id, MPI_BYTE, 0, bootstrap) != MPI_SUCCESS) throw std::runtime_error("MPI_Bcast of the NCCL id failed");
  ncclComm_t comm = nullptr;
  nccl_check(ncclCommInitRank(&comm, size_, id, rank_), "ncclCommInitRank");
  comm_ = comm;
  cudaStream_t stream = nullptr;
  cuda_check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
  stream_ = stream;
  cudaEvent_t event = nullptr;
  cuda_check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate");
  compute_done_ = event;
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (compute_done_) cudaEventDestroy(static_cast<cudaEvent_t>(compute_done_));
}

// The communicator's stream is non-blocking, so it does not order itself after the kernels on the
// default stream by itself: without this a collective could read a buffer still being written.
void NcclCommunicator::after_compute() {
  auto event = static_cast<cudaEvent_t>(compute_done_);
  cuda_check(cudaEventRecord(event, cudaStreamLegacy), "cudaEventRecord");
  cuda_check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream_), event, 0), "cudaStreamWaitEvent");
}

// The collective is waited for with the peer timeout (collective_wait, communicator.hpp): a peer
// that never joins would otherwise hold this rank in cudaStreamSynchronize forever. Past it the
// communicator is aborted (ncclCommAbort stops its kernels) and the rank fails with PeerTimeout.
void NcclCommunicator::wait(const char* what) {
  auto stream = static_cast<cudaStream_t>(stream_);
  auto comm = static_cast<ncclComm_t>(comm_);
  cudaError_t stream_status = cudaSuccess;
  ncclResult_t nccl_status = ncclSuccess;
  const CollectiveState state = collective_wait(
      [&] {
        stream_status = cudaStreamQuery(stream);
        if (stream_status == cudaSuccess) return CollectiveState::done;
        if (stream_status != cudaErrorNotReady) return CollectiveState::failed;
        const ncclResult_t query = ncclCommGetAsyncError(comm, &nccl_status);
        if (query != ncclSuccess) nccl_status = query;
        if (nccl_status != ncclSuccess) return CollectiveState::failed;
        return CollectiveState::pending;
      },
      steady_clock_s, CollectivePause(), peer_timeout_s());
  if (state == CollectiveState::done) return;
  if (state == CollectiveState::timed_out || nccl_status != ncclSuccess) {
    ncclCommAbort(comm);
    comm_ = nullptr;
  }
  if (state == CollectiveState::timed_out)
    throw PeerTimeout(fmt::format("NCCL {} waited {:.0f} s for {}: a rank has stopped, stalled or taken another path, so the "
                                  "communicator was aborted (raise --peer-timeout-s if a step legitimately takes longer)",
                                  what, peer_timeout_s(),
                                  size_ == 2 ? fmt::format("rank {} of its pair (it went quiet)", 1 - rank_)
                                             : fmt::format("the other ranks of its group of {} (the ranks that report no such wait "
                                                           "are the ones that went quiet)", size_)));
  if (nccl_status != ncclSuccess) throw std::runtime_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(nccl_status));
  cuda_check(stream_status, what);
}

// Movement collectives go as ncclUint8: bf16 activations and weights cross the wire at 2 bytes
// an element (the bf16 payloads DeepSpeed's Ulysses and ZeRO-3 send), fp32 at 4.
void NcclCommunicator::all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  after_compute();
  const auto* send_bytes = static_cast<const unsigned char*>(send);
  auto* recv_bytes = static_cast<unsigned char*>(recv);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int peer = 0; peer < size_; ++peer) {
    nccl_check(ncclSend(send_bytes + peer * bytes_per_rank, elements(bytes_per_rank), ncclUint8, peer, comm, stream), "ncclSend");
    nccl_check(ncclRecv(recv_bytes + peer * bytes_per_rank, elements(bytes_per_rank), ncclUint8, peer, comm, stream), "ncclRecv");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  wait("all-to-all");
}

// A ring pass: NCCL's grouped send and receive, so neither waits for the other.
void NcclCommunicator::send_receive_bytes(const void* send, int destination, void* recv, int source, int64_t bytes) {
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  after_compute();
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  nccl_check(ncclSend(send, elements(bytes), ncclUint8, destination, comm, stream), "ncclSend");
  nccl_check(ncclRecv(recv, elements(bytes), ncclUint8, source, comm, stream), "ncclRecv");
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  wait("send/receive");
}

void NcclCommunicator::all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  after_compute();
  nccl_check(ncclAllGather(send, recv, elements(bytes_per_rank), ncclUint8, static_cast<ncclComm_t>(comm_),
                           static_cast<cudaStream_t>(stream_)),
             "ncclAllGather");
  wait("all-gather");
}

void NcclCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  after_compute();
  nccl_check(ncclReduceScatter(send, recv, elements(count), ncclFloat, ncclSum, static_cast<ncclComm_t>(comm_),
                               static_cast<cudaStream_t>(stream_)),
             "ncclReduceScatter");
  wait("reduce-scatter");
}

void NcclCommunicator::all_reduce(float* data, int64_t count) {
  after_compute();
  nccl_check(ncclAllReduce(data, data, elements(count), ncclFloat, ncclSum, static_cast<ncclComm_t>(comm_),
                           static_cast<cudaStream_t>(stream_)),
             "ncclAllReduce");
  wait("all-reduce");
}

// Scalars the step sums (token counts, loss sums) are host doubles: staged through the device.
void NcclCommunicator::all_reduce(double* data, int64_t count) {
  cudaPointerAttributes attributes{};
  const bool on_device = cudaPointerGetAttributes(&attributes, data) == cudaSuccess && attributes.type == cudaMemoryTypeDevice;
  double* device_data = data;
  const size_t bytes = elements(count) * sizeof(double);
  if (!on_device) {
    cuda_check(cudaMalloc(&device_data, bytes), "cudaMalloc");
    cuda_check(cudaMemcpy(device_data, data, bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
  }
  after_compute();
  nccl_check(ncclAllReduce(device_data, device_data, elements(count), ncclDouble, ncclSum, static_cast<ncclComm_t>(comm_),
                           static_cast<cudaStream_t>(stream_)),
             "ncclAllReduce");
  wait("all-reduce");
  if (!on_device) {
    cuda_check(cudaMemcpy(data, device_data, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy");
    cuda_check(cudaFree(device_data), "cudaFree");
  }
}

void NcclCommunicator::broadcast(float* data, int64_t count, int root) {
  after_compute();
  nccl_check(ncclBroadcast(data, data, elements(count), ncclFloat, root, static_cast<ncclComm_t>(comm_), static_cast<cudaStream_t>(stream_)),
             "ncclBroadcast");
  wait("broadcast");
}

}  // namespace longseq
