#!/usr/bin/env bash
# rank_files_differ.sh LONGSEQ WORK: two ranks (an MPMD launch, each in a folder of its own as on
# two nodes) given the same command line whose files differ underneath it must stop before the
# first collective, naming what differs (reliability issue, item 7):
# - --model m (a folder): the config.json inside differs (it stopped on MPI_ERR_TRUNCATE);
# - --plan plan.json, the same file on both, naming r/config.json whose rope_theta differs (it
#   trained with exit 0).
set -euo pipefail
longseq=$(realpath "$1") work=$2
rm -rf "$work" && mkdir -p "$work"
config() {  # a tiny Llama config.json with RoPE base $1
  printf '{"architectures": ["LlamaForCausalLM"], "_name_or_path": "tiny", "hidden_size": 64, "intermediate_size": 176, '
  printf '"num_attention_heads": 4, "num_hidden_layers": 2, "num_key_value_heads": 2, "vocab_size": 256, "rope_theta": %s}\n' "$1"
}
for rank in 0 1; do
  mkdir -p "$work/rank-$rank/m" "$work/rank-$rank/r"
  config $((10000 + rank)) > "$work/rank-$rank/m/config.json"
  config $((10000 + rank)) > "$work/rank-$rank/r/config.json"
done
# One plan file, copied to both folders: it names r/config.json relative to the launch folder.
(cd "$work/rank-0" && "$longseq" plan --model r/config.json --ranks 2 --budget-mib 16 --plan-out plan.json > /dev/null 2>&1)
cp "$work/rank-0/plan.json" "$work/rank-1/plan.json"
mpmd() {
  timeout 60 mpirun --allow-run-as-root --oversubscribe -np 1 -wdir "$work/rank-0" "$longseq" run "$@" : \
    -np 1 -wdir "$work/rank-1" "$longseq" run "$@" 2>&1 || true
}
status=0
out=$(mpmd --model m --seqlen 256 --steps 1)
if ! grep -q "\-\-model (the file's contents): ranks disagree: rank 0 has '[0-9]* B, digest" <<< "$out"; then
  echo "FAIL: --model m (a folder whose config.json differs) was not stopped by name:"; echo "$out" | tail -5; status=1
fi
out=$(mpmd --plan plan.json)
if ! grep -q "the model the plan file names (its contents): ranks disagree" <<< "$out"; then
  echo "FAIL: a plan file naming a config.json that differs was not stopped by name:"; echo "$out" | tail -5; status=1
fi
[ $status -eq 0 ] && echo "rank_files_differ: both stopped before training, naming the file"
exit $status
