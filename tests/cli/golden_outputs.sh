#!/usr/bin/env bash
# golden_outputs.sh check|write LONGSEQ: runs every command of tests/data/golden/commands.txt from the
# repository root and compares its output (stdout, then stderr) with tests/data/golden/NAME.out, or
# rewrites those files. Lines that time the work ("in 6.1 ms") are left out: they vary run to run.
# Keeps the exports and validate's tables unchanged through a refactor (issue 43).
set -uo pipefail
mode=$1 longseq=$(realpath "$2")
root="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$root"
status=0
while IFS='|' read -r name arguments; do
  name=$(echo "$name" | xargs)
  [ -z "$name" ] || [[ "$name" == \#* ]] && continue
  read -r -a words <<< "$arguments"
  stdout=$("$longseq" "${words[@]}" 2> /tmp/golden-stderr.$$)
  output=$( { printf '%s\n' "$stdout"; sed 's/^/stderr: /' /tmp/golden-stderr.$$; } | grep -v " ms; objective\|elapsed_ms\| in [0-9.]* ms")
  expected="tests/data/golden/$name.out"
  if [ "$mode" = write ]; then
    printf '%s\n' "$output" > "$expected"
  elif ! diff -u "$expected" <(printf '%s\n' "$output") > /tmp/golden-diff.$$ 2>&1; then
    echo "golden: $name differs from $expected:"
    head -40 /tmp/golden-diff.$$
    status=1
  fi
done < tests/data/golden/commands.txt
rm -f /tmp/golden-diff.$$ /tmp/golden-stderr.$$
[ "$mode" = write ] && echo "golden: rewrote tests/data/golden/*.out"
exit $status
