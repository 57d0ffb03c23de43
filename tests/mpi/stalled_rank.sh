#!/usr/bin/env bash
# stalled_rank.sh LONGSEQ: a rank that stops (SIGSTOP) mid-run must not hang the job: the other
# rank's collective gives up after --peer-timeout-s and the job ends with a message naming the
# wait. Fails if the job is still running 20 s after the stop (the bound: timeout 3 s + abort).
set -uo pipefail
longseq=$1
log=$(mktemp)
trap 'rm -f "$log"; [ -n "${job:-}" ] && kill -9 "$job" 2>/dev/null' EXIT
mpirun --allow-run-as-root --oversubscribe -np 2 "$longseq" run --steps 100000 --seqlen 1Ki --peer-timeout-s 3 > "$log" 2>&1 &
job=$!
# Rank 1: the longseq process whose environment says OMPI_COMM_WORLD_RANK=1.
rank1=""
for _ in $(seq 1 100); do
  for pid in $(pgrep -f -- "--peer-timeout-s 3" || true); do
    if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx "OMPI_COMM_WORLD_RANK=1"; then rank1=$pid; fi
  done
  [ -n "$rank1" ] && grep -q "^ *1 " "$log" && break  # the first step has finished: collectives are running
  sleep 0.2
done
[ -n "$rank1" ] || { echo "FAIL: rank 1 never started"; cat "$log"; exit 1; }
kill -STOP "$rank1"
stopped_at=$(date +%s)
while kill -0 "$job" 2>/dev/null; do
  if [ $(( $(date +%s) - stopped_at )) -gt 20 ]; then
    kill -CONT "$rank1"
    echo "FAIL: the job still runs 20 s after rank 1 stopped"
    cat "$log"
    exit 1
  fi
  sleep 0.2
done
wait "$job"
status=$?
elapsed=$(( $(date +%s) - stopped_at ))
cat "$log"
[ "$status" -ne 0 ] || { echo "FAIL: the job exited 0"; exit 1; }
grep -q "error on rank 0 of 2: MPI_.* waited 3 s for rank 1 (it went quiet)" "$log" || { echo "FAIL: no message naming the wait"; exit 1; }
echo "the job ended ${elapsed} s after rank 1 stopped (exit $status)"
