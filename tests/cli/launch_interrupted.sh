#!/usr/bin/env bash
# launch_interrupted.sh LONGSEQ SCENARIO WORK: SIGTERM to `longseq launch` stops its mpirun and
# ranks and leaves no run.json; killing launch outright (SIGKILL) also takes its job down.
set -uo pipefail
longseq=$1 scenario=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
ranks_alive() { pgrep -f -- "run $scenario" > /dev/null; }
for signal in TERM KILL; do
  out="$work/$signal"
  "$longseq" launch "$scenario" --ranks 2 --output "$out" --mpirun-arg=--allow-run-as-root --mpirun-arg=--oversubscribe > "$work/$signal.log" 2>&1 &
  launch=$!
  for _ in $(seq 1 100); do ranks_alive && break; sleep 0.1; done
  ranks_alive || { echo "FAIL: the ranks never started"; cat "$work/$signal.log"; exit 1; }
  sleep 0.5
  kill -"$signal" "$launch"
  wait "$launch" 2> /dev/null
  for _ in $(seq 1 100); do ranks_alive || break; sleep 0.1; done
  if ranks_alive; then pkill -9 -f -- "run $scenario"; echo "FAIL: ranks outlived launch after SIG$signal"; exit 1; fi
  [ ! -e "$out/run.json" ] || { echo "FAIL: run.json left after SIG$signal ($(stat -c %s "$out/run.json") bytes)"; exit 1; }
  echo "SIG$signal: job stopped, no run.json"
done
