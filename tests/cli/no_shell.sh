#!/usr/bin/env bash
# no_shell.sh LONGSEQ SCENARIO WORK: text from the user never reaches a shell or a gnuplot
# command line: a results directory named 'x$(touch ...)' and a scenario whose title holds
# backquotes are reported without running either. Exits 77 (skipped) without gnuplot.
set -euo pipefail
longseq=$1 scenario=$2 work=$3
command -v gnuplot > /dev/null || { echo "SKIPPED: gnuplot is not installed"; exit 77; }
rm -rf "$work" && mkdir -p "$work"
cd "$work"
sed 's/^reproduces:.*/reproduces: "title `touch pwned-by-title` $(touch pwned-by-dollar)"/' "$scenario" > evil.yaml
grep -q pwned-by-title evil.yaml || { echo "FAIL: the scenario has no reproduces: line to alter"; exit 1; }
dir='x$(touch pwned-by-dirname)`touch pwned-by-backquote`'
"$longseq" sweep evil.yaml -o "$dir" -q
"$longseq" report "$dir" > /dev/null
ls "$dir/figures/"*.png > /dev/null
if ls pwned-* "$dir"/pwned-* "$dir"/figures/pwned-* 2> /dev/null; then echo "FAIL: a command ran"; exit 1; fi
echo "report drawn; no command from the directory name or the title ran"
