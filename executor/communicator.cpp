#include "executor/communicator.hpp"

#include <algorithm>

namespace longseq {

void SingleRankCommunicator::all_to_all(const float* send, float* recv, int64_t count) {
  if (send != recv) std::copy_n(send, count, recv);
}

void SingleRankCommunicator::all_gather(const float* send, float* recv, int64_t count) {
  if (send != recv) std::copy_n(send, count, recv);
}

void SingleRankCommunicator::reduce_scatter(const float* send, float* recv, int64_t count) {
  if (send != recv) std::copy_n(send, count, recv);
}

}  // namespace longseq
