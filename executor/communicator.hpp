// communicator.hpp: the collectives the executor uses, behind a small interface — Open MPI between
// processes on the CPU (mpi_communicator.hpp), NCCL between GPUs later, one rank without either.
//
// Buffer conventions follow MPI's: `count` is per rank. all_to_all sends block r of `send`
// (elements [r*count, (r+1)*count)) to rank r and puts rank r's block in block r of `recv`.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "io/config_error.hpp"

namespace longseq {

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collectives that only move data take any element type (fp32 on the CPU, bf16 activations and
  // weights on the GPU); the implementations move bytes.
  template <typename T>
  void all_to_all(const T* send, T* recv, int64_t count) {
    all_to_all_bytes(send, recv, count * static_cast<int64_t>(sizeof(T)));
  }
  // recv[size * count]: every rank's `send` in rank order.
  template <typename T>
  void all_gather(const T* send, T* recv, int64_t count) {
    all_gather_bytes(send, recv, count * static_cast<int64_t>(sizeof(T)));
  }
  // Point to point, both at once: `send` goes to rank `destination` while `recv` fills from rank
  // `source` (a ring pass: every rank sends to its successor and receives from its predecessor,
  // so no rank waits on another's receive).
  template <typename T>
  void send_receive(const T* send, int destination, T* recv, int source, int64_t count) {
    send_receive_bytes(send, destination, recv, source, count * static_cast<int64_t>(sizeof(T)));
  }
  virtual void all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  virtual void all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) = 0;
  virtual void send_receive_bytes(const void* send, int destination, void* recv, int source, int64_t bytes) = 0;
  // send[size * count] summed across ranks; this rank keeps block `rank()` in recv[count].
  virtual void reduce_scatter(const float* send, float* recv, int64_t count) = 0;
  // Sums in place across ranks.
  virtual void all_reduce(float* data, int64_t count) = 0;
  virtual void all_reduce(double* data, int64_t count) = 0;
  virtual void broadcast(float* data, int64_t count, int root) = 0;
};

// One rank, host memory: every collective is a copy (or nothing).
class SingleRankCommunicator final : public Communicator {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  void all_to_all_bytes(const void* send, void* recv, int64_t bytes_per_rank) override;
  void all_gather_bytes(const void* send, void* recv, int64_t bytes_per_rank) override;
  void send_receive_bytes(const void* send, int destination, void* recv, int source, int64_t bytes) override;
  void reduce_scatter(const float* send, float* recv, int64_t count) override;
  void all_reduce(float*, int64_t) override {}
  void all_reduce(double*, int64_t) override {}
  void broadcast(float*, int64_t, int) override {}
};

// Bad input every rank of a job finds alike, at the same point and before any collective it would
// leave the others waiting in: rank 0 reports it once and every rank ends normally (no abort).
class ConfigErrorOnEveryRank : public ConfigError {
 public:
  using ConfigError::ConfigError;
};

// Ranks started with different settings (an MPMD launch, a per-rank wrapper) would wait forever
// in mismatched collectives or finish with a meaningless result. Thrown on every rank alike.
class RanksDisagree : public ConfigErrorOnEveryRank {
 public:
  using ConfigErrorOnEveryRank::ConfigErrorOnEveryRank;
};

// Before the first collective of a run: every rank's (flag, value) settings, in the same order on
// every rank, are gathered and compared with rank 0's. Returns when all agree; otherwise throws
// RanksDisagree naming the first flag that differs and both values, e.g. "--steps: ranks
// disagree: rank 0 has '2', rank 1 has '3'". Values are compared whole (by a 64-bit hash) and
// shown up to 40 characters.
void ranks_agree(Communicator& world, const std::vector<std::pair<std::string, std::string>>& settings);

// What ranks_agree compares for an input file, so that ranks agree on contents and not only on a
// file's name (a stale plan copy on one node, a different --data text): its size in bytes and a 64-bit
// FNV-1a digest of its bytes. "" for no path, "no such file" / "not readable" when this rank
// cannot read it, and "not a file" for what is not one (a built-in card's name).
std::string file_fingerprint(const std::string& path);

// A collective waits on its peers; a peer that has stopped, stalled or taken another code path
// would hold every rank forever. So every multi-rank communicator (MPI, NCCL) waits at most the
// peer timeout (`longseq run --peer-timeout-s`; seconds, <= 0 waits forever; default 600 s, far
// beyond any imbalance of a step between the ranks of one job) and then throws PeerTimeout.
class PeerTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
void peer_timeout_set(double seconds);
double peer_timeout_s();

// A collective's state: `poll()` answers pending, done or failed; collective_wait ends in done,
// failed or timed_out.
enum class CollectiveState { pending, done, failed, timed_out };
// Polls `poll()` until it is done or failed, calling `pause()` between polls, or until `now_s()` has
// advanced `timeout_s` (> 0; otherwise no limit) past its first reading. Host-only and
// clock-agnostic, so the CPU tests drive it with a fake clock.
template <typename Poll, typename Now, typename Pause>
CollectiveState collective_wait(Poll poll, Now now_s, Pause pause, double timeout_s) {
  const double start_s = now_s();
  for (;;) {
    const CollectiveState state = poll();
    if (state != CollectiveState::pending) return state;
    if (timeout_s > 0 && now_s() - start_s >= timeout_s) return CollectiveState::timed_out;
    pause();
  }
}

// The real clock for collective_wait, and its pause: spin (yield) for the first milliseconds of a
// wait, as blocking collectives do, then sleep between polls so a long wait costs no core.
double steady_clock_s();
class CollectivePause {
 public:
  CollectivePause() : spin_until_s_(steady_clock_s() + 0.010) {}
  void operator()();

 private:
  double spin_until_s_;
};

}  // namespace longseq
