// component_seconds.hpp: where a step's wall time goes on this process, split as the time model
// splits it (planner/time_model.hpp StepTime): matmuls, attention kernels, collectives, copies
// between the device and the host pool, the optimizer. The CPU kernels and the MPI collectives add
// to it as they run; the rest of a step (norms, element-wise work, the loss) is what remains.
// (On the GPU the calls are asynchronous, so only the CPU's split is measured this way.)
#pragma once

#include <chrono>

namespace longseq {

struct ComponentSeconds {
  double matmul = 0, attention = 0, communication = 0, host_copies = 0, optimizer = 0;
  ComponentSeconds operator-(const ComponentSeconds& earlier) const {
    return {matmul - earlier.matmul, attention - earlier.attention, communication - earlier.communication,
            host_copies - earlier.host_copies, optimizer - earlier.optimizer};
  }
  double sum() const { return matmul + attention + communication + host_copies + optimizer; }
};

// The process's running totals since it started (one training thread calls into them).
ComponentSeconds& component_seconds();

// Adds the lifetime of the scope to one component.
class ComponentTimer {
 public:
  explicit ComponentTimer(double ComponentSeconds::*component)
      : component_(component), start_(std::chrono::steady_clock::now()) {}
  ~ComponentTimer() { component_seconds().*component_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count(); }
  ComponentTimer(const ComponentTimer&) = delete;
  ComponentTimer& operator=(const ComponentTimer&) = delete;

 private:
  double ComponentSeconds::*component_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace longseq
