#!/usr/bin/env bash
# gpu-check.sh: the one command for a GPU machine. Builds with CUDA, then
#   1. the GPU test suite (ctest -L gpu: device query, every CUDA kernel against the CPU kernel,
#      the tiny model's training step against the CPU, NCCL against MPI when there are two GPUs);
#   2. a measured-vs-predicted run of the tiny model on the GPU (longseq run --device cuda, with
#      checkpoint offload and tiled MLP/loss) against the native-cuda profile;
#      the same under mpirun -np 1 with ZeRO-3 over NCCL and the optimizer offloaded (MPIRUN_ARGS
#      adds mpirun options), and with the parameters offloaded too and FPDT; FPDT on one GPU;
#   3. a Llama-3.1-8B-shaped decoder layer stack (LAYER_STACK_LAYERS layers, default 4) at a long
#      sequence (LAYER_STACK_SEQLEN, default 128Ki) on one GPU, measured against the prediction;
# and writes all of it to build/gpu-check/report.md (the runs' JSON beside it).
#
# Exit codes: 0 everything passed; 1 a GPU test or run failed; 3 no GPU visible here (nothing was
# measured, and the report says so); 4 built without a CUDA compiler.
set -uo pipefail
cd "$(dirname "$0")/.."
report_dir=build/gpu-check
mkdir -p "$report_dir"
report="$report_dir/report.md"

scripts/build.sh || exit 1
if ! [ -x build/tests/gpu_device_query ]; then
  echo "gpu-check: built without a CUDA compiler (no nvcc found); install the CUDA toolkit" >&2
  exit 4
fi
if ! build/tests/gpu_device_query >/dev/null 2>&1; then
  build/tests/gpu_device_query
  { echo "# GPU check: not run"; echo; echo "No CUDA device was visible on $(hostname) at $(date -u +%FT%TZ); nothing was measured."; } > "$report"
  echo "gpu-check: no GPU visible here; nothing measured (report: $report)" >&2
  exit 3
fi

log="$report_dir/ctest.log"
OMP_NUM_THREADS=1 ctest --test-dir build -L gpu --output-on-failure > "$log" 2>&1
status=$?

# The measured-vs-predicted runs: the text table for this report, run.json beside it (and, where
# gnuplot is installed, `longseq report`'s figure of the loss).
run_measured() {  # name, then longseq run arguments
  local name=$1
  shift
  mkdir -p "$report_dir/$name"
  echo "gpu-check: longseq run --device cuda $*" >&2
  ${MPIRUN:-} build/cli/longseq run --device cuda "$@" --json-out "$report_dir/$name/run.json" --overwrite > "$report_dir/$name/run.txt" 2>&1 ||
    status=1
  if command -v gnuplot >/dev/null && [ -f "$report_dir/$name/run.json" ]; then build/cli/longseq report "$report_dir/$name" >/dev/null; fi
}
run_measured tiny-llama --model tiny-llama --seqlen 8Ki --steps 3 --checkpointing --checkpoint-offload --mlp-tiles 4 --loss-tiles 4
# ZeRO-3 over NCCL (one rank under mpirun) with the optimizer offloaded to the host, as ALST runs.
if command -v mpirun >/dev/null; then
  as_root=""
  [ "$(id -u)" = 0 ] && as_root="--allow-run-as-root"  # Open MPI refuses root without it
  MPIRUN="mpirun -np 1 $as_root ${MPIRUN_ARGS:-}" run_measured tiny-llama-zero3-offload --model tiny-llama --seqlen 8Ki --steps 3 \
    --zero 3 --offload-optimizer --checkpointing --checkpoint-offload
  # ZeRO-3 with the parameters offloaded too, and FPDT's chunked attention with its host pool.
  MPIRUN="mpirun -np 1 $as_root ${MPIRUN_ARGS:-}" run_measured tiny-llama-fpdt-param-offload --model tiny-llama --seqlen 16Ki --steps 3 \
    --zero 3 --offload-optimizer --offload-params --checkpointing --checkpoint-offload --fpdt-chunk 4Ki
fi
run_measured tiny-llama-fpdt --model tiny-llama --seqlen 16Ki --steps 3 --checkpointing --fpdt-chunk 2Ki
run_measured llama-3.1-8b-layer-stack --model llama-3.1-8b --layers "${LAYER_STACK_LAYERS:-4}" --seqlen "${LAYER_STACK_SEQLEN:-128Ki}" \
  --steps 2 --checkpointing --checkpoint-offload --mlp-tiles 8 --loss-tiles 8
{
  echo "# GPU check: MEASURED on $(hostname), $(date -u +%FT%TZ)"
  echo
  echo '```'
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null || build/tests/gpu_device_query
  echo '```'
  echo
  echo "## ctest -L gpu"
  echo
  echo '```'
  cat "$log"
  echo '```'
  for name in tiny-llama tiny-llama-zero3-offload tiny-llama-fpdt-param-offload tiny-llama-fpdt llama-3.1-8b-layer-stack; do
    [ -f "$report_dir/$name/run.txt" ] || continue
    echo
    echo "## longseq run --device cuda: $name (MEASURED on this GPU vs PREDICTED by native-cuda)"
    echo
    echo '```'
    cat "$report_dir/$name/run.txt"
    echo '```'
  done
} > "$report"
cat "$log"
echo "gpu-check: report written to $report"
[ "$status" -eq 0 ] && exit 0 || exit 1
