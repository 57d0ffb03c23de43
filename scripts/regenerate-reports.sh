#!/usr/bin/env bash
# regenerate-reports.sh [LONGSEQ]: every shipped planning scenario (scenarios/*.yaml without a run:
# section) swept and reported into reports/scenarios/NAME/ (results.{csv,json,md}, report.md and
# the figures as PNG and SVG). All PREDICTIONS; the published points are the scenarios' own.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
longseq=${1:-$root/build/cli/longseq}
cd "$root"
for scenario in scenarios/*.yaml; do
  name=$(basename "$scenario" .yaml)
  out="reports/scenarios/$name"
  "$longseq" sweep "$scenario" -o "$out" -q
  "$longseq" report "$out" > /dev/null
  echo "regenerate-reports.sh: $out/report.md"
done
