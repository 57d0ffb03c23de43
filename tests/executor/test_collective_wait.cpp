// The communicators' peer timeout (communicator.hpp collective_wait), driven here with a fake clock.
// The MPI tests stop a real rank (tests/CMakeLists.txt, mpi.run.*); NCCL's use of it is compiled,
// not run on a GPU.
#include <doctest/doctest.h>

#include <string>

#include "executor/communicator.hpp"

using namespace longseq;

TEST_CASE("a collective's wait: done or failed as polled, timed out once the deadline passes") {
  double clock_s = 100;  // any start: the deadline counts from the first reading
  int polls = 0, pauses = 0;
  auto now = [&] { return clock_s; };
  auto pause = [&] {
    ++pauses;
    clock_s += 1.0;  // each pause lets a second pass
  };
  // Finished at the first poll: no pause.
  CHECK(collective_wait([&] { ++polls; return CollectiveState::done; }, now, pause, 5.0) == CollectiveState::done);
  CHECK(polls == 1);
  CHECK(pauses == 0);
  // Pending three times, then done: three pauses, within the deadline.
  polls = 0;
  CHECK(collective_wait([&] { return ++polls < 4 ? CollectiveState::pending : CollectiveState::done; }, now, pause, 5.0) ==
        CollectiveState::done);
  CHECK(pauses == 3);
  // A failure ends the wait at once.
  pauses = 0;
  CHECK(collective_wait([&] { return CollectiveState::failed; }, now, pause, 5.0) == CollectiveState::failed);
  CHECK(pauses == 0);
  // Never finishing: polled at 0, 1, ..., 5 s past the start, paused five times, then timed out.
  polls = 0;
  CHECK(collective_wait([&] { ++polls; return CollectiveState::pending; }, now, pause, 5.0) == CollectiveState::timed_out);
  CHECK(polls == 6);
  CHECK(pauses == 5);
}

TEST_CASE("a peer timeout of 0 waits as long as the collective takes, and --peer-timeout-s sets it for every communicator") {
  double clock_s = 0;
  int polls = 0;
  CHECK(collective_wait([&] { return ++polls < 1000 ? CollectiveState::pending : CollectiveState::done; }, [&] { return clock_s; },
                        [&] { clock_s += 3600; }, 0.0) == CollectiveState::done);
  CHECK(polls == 1000);  // 999 hours of pauses, no timeout
  const double before = peer_timeout_s();
  CHECK(before == 600);  // the default, as `longseq run --peer-timeout-s` documents it
  peer_timeout_set(3);
  CHECK(peer_timeout_s() == 3);
  peer_timeout_set(before);
}
