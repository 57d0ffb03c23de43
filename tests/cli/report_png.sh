#!/usr/bin/env bash
# report_png.sh LONGSEQ SCENARIO OUT: sweep a scenario, report it, and check the figures are real
# PNG (and SVG) files shown by report.md. Exits 77 (CTest: skipped, not passed) without gnuplot.
set -euo pipefail
longseq=$1 scenario=$2 out=$3
if ! command -v gnuplot >/dev/null 2>&1; then
  echo "SKIPPED: gnuplot is not installed (scripts/setup.sh installs gnuplot-nox)"
  exit 77
fi
rm -rf "$out"
"$longseq" sweep "$scenario" -o "$out" -q
"$longseq" report "$out"
for figure in max_seqlen_vs_gpus memory_breakdown predicted_vs_published; do
  magic=$(head -c 4 "$out/figures/$figure.png" | od -An -tx1 | tr -d ' \n')
  [ "$magic" = "89504e47" ] || { echo "FAIL: $figure.png is not a PNG ($magic)"; exit 1; }
  [ -s "$out/figures/$figure.svg" ] || { echo "FAIL: $figure.svg is missing"; exit 1; }
done
grep -q "figures/max_seqlen_vs_gpus.png" "$out/report.md" || { echo "FAIL: report.md does not show the scaling figure"; exit 1; }
echo "report with 3 figures in $out"
