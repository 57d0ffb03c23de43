#!/usr/bin/env bash
# sweep_all.sh LONGSEQ SCENARIOS_DIR OUT: `longseq sweep` every scenario file; fails on the first
# that fails or writes no rows.
set -euo pipefail
longseq=$1 scenarios=$2 out=$3
rm -rf "$out"
count=0
for scenario in "$scenarios"/*.yaml; do
  name=$(basename "$scenario" .yaml)
  "$longseq" sweep "$scenario" -o "$out/$name" -q
  rows=$(($(wc -l < "$out/$name/results.csv") - 1))
  [ "$rows" -gt 0 ] || { echo "FAIL: $name wrote no rows"; exit 1; }
  count=$((count + 1))
done
echo "$count scenarios swept"
[ "$count" -ge 8 ]
