#!/usr/bin/env bash
# slurm_launch_test.sh: brings up a real single-node Slurm on this machine (munged, slurmctld and
# slurmd on localhost with a minimal slurm.conf in a temporary directory), submits a tiny 2-rank
# run scenario through `longseq launch --slurm --wait`, checks that its per-step losses equal a
# one-rank local run (to 4 decimals), and stops everything it started.
# Exit 77 (CTest: SKIPPED, never passed) when Slurm cannot be brought up here, saying why.
# Usage: slurm_launch_test.sh LONGSEQ_BINARY SCENARIO
set -uo pipefail
longseq=$1
scenario=$2
skip() { echo "SKIPPED: $*"; exit 77; }

for tool in munged slurmctld slurmd sbatch sinfo mpirun cmake; do
  command -v "$tool" >/dev/null || skip "$tool not installed (scripts/setup.sh installs slurm-wlm, munge and openmpi-bin)"
done
[ "$(id -u)" -eq 0 ] || skip "starting slurmd needs root"

# A previous run's daemons (still exiting) would hold the ports: wait for them.
for _ in $(seq 20); do pgrep -f -- "-f /tmp/longseq-slurm\." >/dev/null || break; sleep 0.5; done
work=$(mktemp -d /tmp/longseq-slurm.XXXXXX)
started_munge=0
# Daemons of this test are found by their unique arguments (the temporary directory's path).
# They are stopped and waited for, so the next run finds its ports free.
stop() {
  pkill -f -- "$1" 2>/dev/null
  for _ in $(seq 30); do pgrep -f -- "$1" >/dev/null || return 0; sleep 0.5; done
  pkill -9 -f -- "$1" 2>/dev/null
}
cleanup() {
  stop "slurmd -f $work/slurm.conf"
  stop "slurmctld -f $work/slurm.conf"
  [ "$started_munge" -eq 1 ] && stop "--pid-file=$work/munged.pid"
  rm -rf "$work"
}
trap cleanup EXIT

# munge: Slurm's authentication. Use a running munged, or start one with its own socket.
if ! munge -n >/dev/null 2>&1; then
  [ -f /etc/munge/munge.key ] || skip "no /etc/munge/munge.key"
  mkdir -p /run/munge && chown munge:munge /run/munge 2>/dev/null
  if ! runuser -u munge -- munged --pid-file="$work/munged.pid" >/dev/null 2>&1 && ! munged --force --pid-file="$work/munged.pid" >/dev/null 2>&1; then
    skip "munged would not start"
  fi
  started_munge=1
  munge -n >/dev/null 2>&1 || skip "munge does not authenticate after starting munged"
fi

node=$(hostname -s)
mkdir -p "$work/state" "$work/spool"
cat > "$work/slurm.conf" <<CONF
ClusterName=longseq-test
SlurmctldHost=$node(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
SlurmctldPort=16817
SlurmdPort=16818
StateSaveLocation=$work/state
SlurmdSpoolDir=$work/spool
SlurmctldPidFile=$work/slurmctld.pid
SlurmdPidFile=$work/slurmd.pid
SlurmctldLogFile=$work/slurmctld.log
SlurmdLogFile=$work/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/builtin
MpiDefault=none
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
NodeName=$node NodeAddr=127.0.0.1 CPUs=$(nproc --all) State=UNKNOWN
PartitionName=longseq Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
export SLURM_CONF="$work/slurm.conf"
slurmctld -f "$SLURM_CONF" || skip "slurmctld would not start: $(tail -3 "$work/slurmctld.log" 2>/dev/null)"
slurmd -f "$SLURM_CONF" || skip "slurmd would not start: $(tail -3 "$work/slurmd.log" 2>/dev/null)"
for _ in $(seq 60); do
  state=$(sinfo -h -N -o %t 2>/dev/null | head -1)
  [ "$state" = "idle" ] && break
  sleep 1
done
[ "$state" = "idle" ] || skip "the Slurm node did not come up (state '${state:-none}'): $(tail -3 "$work/slurmctld.log" 2>/dev/null)"
echo "Slurm up: node $node idle"

OMP_NUM_THREADS=1 "$longseq" run "$scenario" --json > "$work/local.json" || { echo "FAILED: the local run failed"; exit 1; }
OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
  timeout 120 "$longseq" launch "$scenario" --slurm --wait --ranks 2 --time 00:05:00 --output "$work/job" \
  --mpirun-arg=--allow-run-as-root --mpirun-arg=--oversubscribe
status=$?
if [ "$status" -ne 0 ]; then
  echo "FAILED: longseq launch --slurm exited $status"
  squeue 2>&1 | head -5
  for log in "$work"/job/slurm-*.out "$work/slurmctld.log" "$work/slurmd.log"; do
    [ -f "$log" ] && { echo "--- $log"; tail -15 "$log"; }
  done
  exit 1
fi
cmake -DLOCAL="$work/local.json" -DLAUNCHED="$work/job/run.json" -DRANKS=2 -P "$(dirname "$0")/../cli/losses_match.cmake" ||
  { echo "FAILED: the Slurm job's losses differ from the one-rank run"; exit 1; }
echo "PASSED: the Slurm job's losses equal the one-rank run"
