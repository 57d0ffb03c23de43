#!/usr/bin/env bash
# stdout_write_errors.sh LONGSEQ: an answer that never reached standard output is not a success:
# `models`, `plan --json` and `hardware` to a full disk (/dev/full) or a closed stdout exit 74 with
# a one-line reason, never 0 with nothing written.
set -uo pipefail
longseq=$1
failures=0
expect_74() {  # description, then the command (run by bash -c so the redirection applies)
  local what=$1 command=$2 status
  err=$(bash -c "$command" 2>&1 >/dev/null)
  status=$?
  if [ "$status" -ne 74 ] || ! grep -q "longseq: error: cannot write standard output" <<< "$err"; then
    echo "FAIL: $what: exit $status, stderr: $err"; failures=$((failures + 1))
  else
    echo "ok: $what: exit 74: $err"
  fi
}
[ -e /dev/full ] || { echo "SKIPPED: no /dev/full here"; exit 77; }
expect_74 "models > /dev/full" "'$longseq' models > /dev/full"
expect_74 "plan --json > /dev/full" "'$longseq' plan --model llama-3.1-8b --gpus 8 --json > /dev/full"
expect_74 "hardware with stdout closed" "'$longseq' hardware >&-"
"$longseq" models > /dev/null || { echo "FAIL: models to /dev/null"; failures=$((failures + 1)); }
exit $failures
