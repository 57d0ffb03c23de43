#include "executor/communicator.hpp"

#include <algorithm>
#include <cstring>

namespace longseq {

void SingleRankCommunicator::all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes_per_rank));
}

void SingleRankCommunicator::all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) {
  if (send != recv) std::memcpy(recv, send, static_cast<size_t>(bytes_per_rank));
}

void SingleRankCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  if (send != recv) std::copy_n(send, count, recv);
}

}  // namespace longseq
