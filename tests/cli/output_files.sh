#!/usr/bin/env bash
# output_files.sh LONGSEQ WORK: each single-file output flag (--emit-out, the DeepSpeed JSON beside
# it, --plan-out, --json-out) against an existing file, a FIFO, a symlink, a user's FILE.partial
# and the input config file: refused without --overwrite (before any work, the file unchanged),
# written through a FIFO without replacing it, and never writing over the file it reads.
set -uo pipefail
longseq=$1 work=$2
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
refused() {  # expected message, then the command
  local expect=$1; shift
  if "$@" > out.txt 2> err.txt; then fail "accepted: $*"; return; fi
  grep -q -- "$expect" err.txt || fail "$*: stderr: $(cat err.txt)"
}
plan=(plan --model tiny-llama --gpus 1)
for flag in --emit-out --plan-out; do
  extra=(); [ "$flag" = --emit-out ] && extra=(--emit accelerate)
  echo "mine" > existing
  refused "existing exists; give --overwrite" "$longseq" "${plan[@]}" "${extra[@]}" "$flag" existing
  [ "$(cat existing)" = mine ] || fail "$flag replaced existing"
  "$longseq" "${plan[@]}" "${extra[@]}" "$flag" existing --overwrite 2> /dev/null > /dev/null || fail "$flag --overwrite"
  [ "$(cat existing)" != mine ] || fail "$flag --overwrite wrote nothing"
  echo "target" > real && ln -sf real link
  refused "link exists; give --overwrite" "$longseq" "${plan[@]}" "${extra[@]}" "$flag" link
  echo "precious" > victim && ln -sf victim fresh.partial
  "$longseq" "${plan[@]}" "${extra[@]}" "$flag" fresh 2> /dev/null > /dev/null || fail "$flag to a new file"
  [ "$(cat victim)" = precious ] && [ -L fresh.partial ] || fail "$flag wrote through fresh.partial"
  rm -f fresh fresh.deepspeed.json fresh.partial
  mkfifo pipe && (cat pipe > from-pipe &) && sleep 0.2
  "$longseq" "${plan[@]}" "${extra[@]}" "$flag" pipe 2> /dev/null > /dev/null || fail "$flag to a FIFO"
  sleep 0.3
  [ -p pipe ] && [ -s from-pipe ] || fail "$flag: the FIFO was replaced or got nothing"
  rm -f pipe from-pipe
done
# The DeepSpeed JSON beside the named file is checked too: it is refused before anything is written.
echo "mine" > ds.deepspeed.json
refused "ds.deepspeed.json exists; give --overwrite" "$longseq" "${plan[@]}" --emit accelerate --emit-out ds.yaml
[ ! -e ds.yaml ] && [ "$(cat ds.deepspeed.json)" = mine ] || fail "a half-written export"
# The input config.json itself, even with --overwrite.
cp "$(dirname "$0")/../data/hf/llama-3.1-8b.config.json" config.json 2> /dev/null || echo '{}' > config.json
refused "which this command reads" "$longseq" plan --model config.json --gpus 8 --emit deepspeed --emit-out config.json --overwrite
# A maximum whose band reaches 0 (Qwen3-30B-A3B on 8 H100s under ArcticTraining: it may not run at
# any length): no file, unless the point estimate is asked for by name, and then with a warning.
refused "band reaches 0" "$longseq" plan --model qwen3-30b-a3b --gpus 8 --emit arctic-training --emit-out band.yml
[ ! -e band.yml ] || fail "an export written from a band reaching 0"
"$longseq" plan --model qwen3-30b-a3b --gpus 8 --emit arctic-training --emit-length point --emit-out band.yml > /dev/null 2> err.txt ||
  fail "--emit-length point refused"
[ -s band.yml ] && grep -q "WARNING: the maximum's band reaches 0" err.txt || fail "--emit-length point: no file or no warning"
# run --json-out: refused before training.
echo "mine" > run.json
refused "run.json exists; give --overwrite" "$longseq" run --seqlen 64 --steps 1 --json-out run.json
[ "$(cat run.json)" = mine ] || fail "--json-out replaced run.json"
[ -z "$(ls -A | grep -E '\.longseq-|\.partial-' || true)" ] || fail "temporaries left: $(ls -A)"
[ "$failures" -eq 0 ] && echo "every output flag refused what it did not write"
exit $failures
