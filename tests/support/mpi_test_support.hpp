// mpi_test_support.hpp: what the MPI test programs share: the world communicator, the sharded-vs-
// one-rank gradient comparison, and a main() that fails the job when any rank's checks fail.
#pragma once

#include <doctest/doctest.h>
#include <mpi.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "executor/mpi_communicator.hpp"

namespace longseq::testing {

inline MpiCommunicator& world() {
  static MpiCommunicator communicator(MPI_COMM_WORLD);
  return communicator;
}

// Sharding changes only summation order (attention over the same keys, gradients summed across
// ranks): every gradient within 3e-5 of its tensor's largest |gradient|, as for the single-rank
// memory options (test_llama.cpp).
inline void gradients_close(const std::vector<float>& actual, const std::vector<float>& expected) {
  REQUIRE(actual.size() == expected.size());
  double largest = 0, worst = 0;
  for (size_t i = 0; i < actual.size(); ++i) {
    largest = std::max(largest, std::fabs(static_cast<double>(expected[i])));
    worst = std::max(worst, std::fabs(static_cast<double>(actual[i]) - expected[i]));
  }
  CHECK(worst <= 3e-5 * largest);
}

// Every rank runs every check; the program fails when any rank's check fails.
inline int mpi_doctest_main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0;
  {
    doctest::Context context(argc, argv);
    if (world().rank() != 0) context.setOption("no-version", true);
    failed = context.run() != 0 ? 1 : 0;
  }
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  MPI_Finalize();
  return any_failed;
}

}  // namespace longseq::testing
