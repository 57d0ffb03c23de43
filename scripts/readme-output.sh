#!/usr/bin/env bash
# readme-output.sh: the README's tool output, made by the tool. A block written as
#
#   <!-- output: plan --model llama-3.1-8b --gpus 8 | lines 1-12 -->
#   ```
#   ...
#   ```
#
# holds `$ longseq ARGS` and the lines of its standard output (all of them, or the range given),
# run from the repository root. Timings ("in 31.2 ms") vary from run to run and are compared as
# "in N ms".
#
#   scripts/readme-output.sh LONGSEQ README            rewrite every such block (the README in place)
#   scripts/readme-output.sh --check LONGSEQ README    exit 1, showing the difference, when a block
#                                                      is not what the tool prints now (a CTest)
set -euo pipefail
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
[ $# -eq 2 ] || { sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 2; }
longseq=$1 readme=$2
root="$(cd "$(dirname "$0")/.." && pwd)"
fresh=$(mktemp) && trap 'rm -f "$fresh" "$fresh".*' EXIT
mask() { sed -E 's/in [0-9]+(\.[0-9]+)? ms/in N ms/g' "$1"; }

in_block=0 skipping=0 blocks=0
while IFS= read -r line || [ -n "$line" ]; do
  if [ "$skipping" = 1 ]; then  # the old block's body, up to its closing fence
    if [ "$line" = '```' ]; then skipping=0; fi
    continue
  fi
  printf '%s\n' "$line" >> "$fresh"
  if [[ "$line" =~ ^\<!--\ output:\ (.*)\ --\>$ ]]; then
    spec=${BASH_REMATCH[1]} range=""
    if [[ "$spec" =~ ^(.*)\ \|\ lines\ ([0-9]+)-([0-9]+)$ ]]; then
      spec=${BASH_REMATCH[1]} range="${BASH_REMATCH[2]},${BASH_REMATCH[3]}p"
    fi
    in_block=1
    continue
  fi
  if [ "$in_block" = 1 ] && [ "$line" = '```' ]; then
    in_block=0 skipping=1 blocks=$((blocks + 1))
    read -r -a words <<< "$spec"
    echo "\$ longseq $spec" >> "$fresh"
    output=$(cd "$root" && "$longseq" "${words[@]}" 2>/dev/null) || { echo "readme-output.sh: longseq $spec failed" >&2; exit 1; }
    if [ -n "$range" ]; then sed -n "$range" <<< "$output" >> "$fresh"; else printf '%s\n' "$output" >> "$fresh"; fi
    echo '```' >> "$fresh"
  fi
done < "$readme"
if [ "$check" = 1 ]; then
  mask "$readme" > "$fresh.old"
  mask "$fresh" > "$fresh.new"
  if ! diff -u "$fresh.old" "$fresh.new"; then
    echo "readme-output.sh: $readme is not what the tool prints now; run scripts/readme-output.sh $longseq $readme" >&2
    exit 1
  fi
  echo "readme-output.sh: $blocks block(s) of $readme are what the tool prints"
else
  cp "$fresh" "$readme"
  echo "readme-output.sh: rewrote $blocks block(s) of $readme"
fi
