#!/usr/bin/env bash
# gpu-check.sh [--dry-run] [--out DIR] [--budget-s SECONDS]: the one prepared check for the
# project's GPU machine (a bare CUDA image: nvcc, CUDA 13's libraries, PyTorch, transformers, PEFT,
# Accelerate; no Debian -dev packages, no Open MPI, no registry). Nothing is built there: it runs
#   0. the versions: GPU, driver, CUDA, PyTorch, transformers (first, so a cut-off run says where);
#   1. the frameworks users run, measured beside longseq's prediction for the same plan on that card
#      (tests/frameworks/gpu_measure.py over tests/frameworks/gpu_cases.json, predictions carried in
#      tests/frameworks/gpu_predictions.json), then a bisection for one case's longest length;
#   2. longseq's executor from the bundle made here (scripts/gpu-bundle.sh, carried as gpu-bundle/):
#      the device query, every CUDA kernel against the CPU kernel, the tiny model's GPU step against
#      the CPU, `longseq run --device cuda` for the tiny model (checkpoint offload, tiled MLP and loss;
#      FPDT) and a Llama-3.1-8B-shaped layer stack at 128Ki tokens, each MEASURED beside the
#      native-cuda PREDICTION.
# Everything goes to DIR (default $OUT, else build/gpu-check) as it happens, in at most seven
# files: versions.txt, frameworks.jsonl, frameworks.md, executor.log, executor.jsonl, report.md.
# Part 1 stops starting cases after --budget-s (default 300) so part 2 runs in the same command.
#
# --dry-run [--cpu-only] (here, before any GPU): makes the bundle (--cpu-only: without the CUDA
# path, CI's variant), runs it in a minimal Debian root made with
# debootstrap (no -dev packages, this machine's CUDA toolkit bind-mounted read-only as the GPU image
# has one, no network), fails if any binary misses a library or any step needs the network; then
# runs part 1's harness on the CPU at a tiny size (its code paths, not its numbers).
#
# Exit: 0 all ran; 1 something failed (the report says what); 3 no GPU visible (nothing measured).
set -uo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cd "$root"
dry_run=0
cpu_only=()
out="${OUT:-$root/build/gpu-check}"
budget=300
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) dry_run=1 ;;
    --cpu-only) cpu_only=(--cpu-only) ;;
    --out) out=$2; shift ;;
    --budget-s) budget=$2; shift ;;
    *) echo "gpu-check: unknown argument '$1' (--dry-run, --out DIR, --budget-s S)" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$out"
bin="$root/gpu-bundle/bin"
python="${PYTHON:-python3}"

if [ "$dry_run" = 1 ]; then
  scripts/gpu-bundle.sh "${cpu_only[@]}" || exit 1
  exec scripts/gpu-dry-run.sh "$out"
fi

# The image's CUDA libraries (cuBLAS, the runtime) where the loader may not look, and PyTorch's
# own copies as a fallback.
for dir in /usr/local/cuda/lib64 /usr/local/cuda/targets/x86_64-linux/lib \
  $("$python" -c "import nvidia.cublas, os; print(os.path.join(os.path.dirname(nvidia.cublas.__file__), 'lib'))" 2>/dev/null); do
  [ -d "$dir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir"
done
status=0
{
  echo "gpu-check: $(date -u +%FT%TZ) on $(hostname)"
  [ -x "$bin/longseq" ] && { ldd "$bin"/* | grep "not found" || echo "bundle: every library found"; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 || echo "nvidia-smi: not found"
  nvcc --version 2>&1 | tail -1 || true
  "$python" -c "import torch, transformers; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'transformers', transformers.__version__)" 2>&1
} | tee "$out/versions.txt"

# Part 1: the frameworks users run (no build needed).
PYTHONUNBUFFERED=1 "$python" tests/frameworks/gpu_measure.py --out "$out/frameworks-run" --budget-s "$budget" 2>&1 | grep -v "Warning\|warn(" || status=1
[ -f "$out/frameworks-run/results.jsonl" ] && mv "$out/frameworks-run/results.jsonl" "$out/frameworks.jsonl"
[ -f "$out/frameworks-run/report.md" ] && mv "$out/frameworks-run/report.md" "$out/frameworks.md"
rmdir "$out/frameworks-run" 2>/dev/null

# Part 2: longseq's executor from the bundle (scripts/gpu-bundle.sh here; carried as gpu-bundle/).
log="$out/executor.log"
json="$out/executor.jsonl"
: > "$log"
: > "$json"
if [ ! -x "$bin/longseq" ]; then
  echo "gpu-check: no gpu-bundle/bin/longseq: make it with scripts/gpu-bundle.sh and carry gpu-bundle" | tee -a "$log"
  status=1
elif ! "$bin/gpu_device_query" >> "$log" 2>&1; then
  echo "gpu-check: no CUDA device visible to longseq; the executor was not run" | tee -a "$log"
  status=3
else
  for test in gpu_kernels gpu_llama; do
    echo "== $test" >> "$log"
    OMP_NUM_THREADS=4 timeout 240 "$bin/$test" >> "$log" 2>&1 || { echo "gpu-check: $test FAILED" | tee -a "$log"; status=1; }
  done
  run_measured() {  # name, then longseq run arguments: MEASURED on this GPU beside the native-cuda PREDICTION
    local name=$1
    shift
    echo "== longseq run --device cuda $* ($name)" >> "$log"
    if timeout 240 "$bin/longseq" run --device cuda "$@" --json-out "$out/$name.json" --overwrite >> "$log" 2>&1; then
      { printf '{"name": "%s", "run": ' "$name"; cat "$out/$name.json"; echo "}"; } | tr -d '\n' >> "$json"
      echo >> "$json"
    else
      echo "gpu-check: $name FAILED" | tee -a "$log"
      status=1
    fi
    rm -f "$out/$name.json"
  }
  run_measured tiny-llama --model tiny-llama --seqlen 8Ki --steps 3 --checkpointing --checkpoint-offload --mlp-tiles 4 --loss-tiles 4
  run_measured tiny-llama-fpdt --model tiny-llama --seqlen 16Ki --steps 3 --checkpointing --fpdt-chunk 2Ki
  run_measured llama-3.1-8b-layer-stack --model llama-3.1-8b --layers "${LAYER_STACK_LAYERS:-4}" --seqlen "${LAYER_STACK_SEQLEN:-128Ki}" \
    --steps 2 --checkpointing --checkpoint-offload --mlp-tiles 8 --loss-tiles 8
fi

{
  echo "# GPU check: MEASURED on $(hostname), $(date -u +%FT%TZ)"
  echo
  echo '```'
  cat "$out/versions.txt"
  echo '```'
  echo
  [ -f "$out/frameworks.md" ] && cat "$out/frameworks.md"
  echo
  echo "## longseq's executor (the bundle), MEASURED beside the native-cuda PREDICTION"
  echo
  echo '```'
  cat "$log"
  echo '```'
} > "$out/report.md"
echo "gpu-check: report written to $out/report.md (exit $status)"
exit "$status"
