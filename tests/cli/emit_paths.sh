#!/usr/bin/env bash
# emit_paths.sh LONGSEQ WORK: exports name each other by absolute path and the launch line names
# the file written, so a launch from another folder finds them (issue 25.7): the Accelerate YAML's
# deepspeed_config_file and Megatron's --deepspeed_config are the written JSON's absolute path.
set -uo pipefail
longseq=$1 work=$2
rm -rf "$work" && mkdir -p "$work/sub" && cd "$work/sub" || exit 1
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
"$longseq" plan --model llama-3.1-8b --gpus 8 --emit accelerate --emit-out ../acc.yaml 2> notes.txt > /dev/null || fail "accelerate export"
named=$(grep -o 'deepspeed_config_file: .*' "$work/acc.yaml" | sed 's/deepspeed_config_file: //')
[ "$named" = "$work/acc.deepspeed.json" ] || fail "deepspeed_config_file is '$named', expected $work/acc.deepspeed.json"
[ -f "$named" ] || fail "the named JSON does not exist"
grep -q -- "--config_file $work/acc.yaml --mixed_precision bf16" notes.txt || fail "launch line: $(grep launch notes.txt)"
"$longseq" plan --model gpt-13b --gpus 16 --emit megatron-deepspeed --emit-out ../ds.sh 2> /dev/null > /dev/null || fail "megatron export"
grep -q -- "--deepspeed_config $work/ds.deepspeed.json" "$work/ds.sh" || fail "megatron names: $(grep -o -- '--deepspeed_config [^ ]*' "$work/ds.sh")"
[ "$failures" -eq 0 ] && echo "the files name each other by absolute path"
exit $failures
