#include "executor/nccl_communicator.hpp"

#include <cuda_runtime.h>
#include <nccl.h>

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
}

NcclCommunicator::~NcclCommunicator() {
  if (comm_) ncclCommDestroy(static_cast<ncclComm_t>(comm_));
  if (stream_) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
}

void NcclCommunicator::wait() { cuda_check(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)), "collective"); }

void NcclCommunicator::all_to_all(const float* send, float* recv, int64_t count) {
  auto comm = static_cast<ncclComm_t>(comm_);
  auto stream = static_cast<cudaStream_t>(stream_);
  nccl_check(ncclGroupStart(), "ncclGroupStart");
  for (int peer = 0; peer < size_; ++peer) {
    nccl_check(ncclSend(send + peer * count, elements(count), ncclFloat, peer, comm, stream), "ncclSend");
    nccl_check(ncclRecv(recv + peer * count, elements(count), ncclFloat, peer, comm, stream), "ncclRecv");
  }
  nccl_check(ncclGroupEnd(), "ncclGroupEnd");
  wait();
}

void NcclCommunicator::all_gather(const float* send, float* recv, int64_t count) {
  nccl_check(ncclAllGather(send, recv, elements(count), ncclFloat, static_cast<ncclComm_t>(comm_), static_cast<cudaStream_t>(stream_)),
             "ncclAllGather");
  wait();
}

void NcclCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  nccl_check(ncclReduceScatter(send, recv, elements(count), ncclFloat, ncclSum, static_cast<ncclComm_t>(comm_),
                               static_cast<cudaStream_t>(stream_)),
             "ncclReduceScatter");
  wait();
}

void NcclCommunicator::all_reduce(float* data, int64_t count) {
  nccl_check(ncclAllReduce(data, data, elements(count), ncclFloat, ncclSum, static_cast<ncclComm_t>(comm_),
                           static_cast<cudaStream_t>(stream_)),
             "ncclAllReduce");
  wait();
}

void NcclCommunicator::all_reduce(double* data, int64_t count) {
  nccl_check(ncclAllReduce(data, data, elements(count), ncclDouble, ncclSum, static_cast<ncclComm_t>(comm_),
                           static_cast<cudaStream_t>(stream_)),
             "ncclAllReduce");
  wait();
}

void NcclCommunicator::broadcast(float* data, int64_t count, int root) {
  nccl_check(ncclBroadcast(data, data, elements(count), ncclFloat, root, static_cast<ncclComm_t>(comm_), static_cast<cudaStream_t>(stream_)),
             "ncclBroadcast");
  wait();
}

}  // namespace longseq
