#!/usr/bin/env bash
# frameworks-check.sh [PYTEST ARGS...]: the frameworks' own code as the judge of longseq's planner
# and exports (tests/frameworks, pytest). The pinned frameworks (tests/frameworks/requirements.txt:
# PyPI's torch, a CUDA build of several GB that runs on the CPU, transformers, PEFT, TRL,
# Accelerate, DeepSpeed, torchtitan) are installed once into a virtual environment cached under
# ${LONGSEQ_CACHE:-~/.cache/longseq}, named by the requirements' digest, and reused while they do
# not change; then the exports' checks again with the floor releases they state (requirements-floor.txt,
# requirements-floor-fsdp2.txt;
# LONGSEQ_FRAMEWORKS_FLOOR=0 skips it). Needs build/cli/longseq (scripts/build.sh) or LONGSEQ_BINARY.
# Exit: non-zero when any pytest run fails.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
requirements="$root/tests/frameworks/requirements.txt"
digest=$(sha256sum "$requirements" | cut -c1-16)
cache="${LONGSEQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longseq}"
venv="$cache/frameworks-venv-$digest"
python="${PYTHON:-python3}"
if [ ! -x "$venv/bin/python" ] || [ ! -f "$venv/.complete" ]; then
  echo "frameworks-check: installing the pinned frameworks into $venv (once; several GB from PyPI)"
  rm -rf "$venv"
  mkdir -p "$cache"
  "$python" -m venv "$venv"
  "$venv/bin/pip" install --quiet --disable-pip-version-check -r "$requirements"
  touch "$venv/.complete"  # an interrupted install is redone, never reused half-made
else
  echo "frameworks-check: reusing $venv"
fi
"$venv/bin/python" -c "import torch, transformers, peft, trl, accelerate, deepspeed; print('frameworks-check: torch', torch.__version__, \
'transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'accelerate', accelerate.__version__, \
'deepspeed', deepspeed.__version__)" 2>/dev/null
export LONGSEQ_BINARY="${LONGSEQ_BINARY:-$root/build/cli/longseq}"
# Megatron-LM's argument parser for --emit megatron-core (test_megatron_export.py): megatron-core's
# wheel, which ships megatron/training, in a folder of its own (requirements-megatron.txt says why
# without its dependencies and its Python requirement), named by its digest, installed once.
megatron_requirements="$root/tests/frameworks/requirements-megatron.txt"
megatron="$cache/frameworks-megatron-$(cat "$requirements" "$megatron_requirements" | sha256sum | cut -c1-16)"
if [ ! -f "$megatron/.complete" ]; then
  echo "frameworks-check: installing Megatron-LM's parser (megatron-core) into $megatron (once)"
  rm -rf "$megatron"
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --ignore-requires-python --target "$megatron" \
    -r "$megatron_requirements"
  touch "$megatron/.complete"
fi
export LONGSEQ_MEGATRON_PATH="$megatron"
cd "$root/tests/frameworks"
# DeepSpeed builds its CPU ops on first use under TORCH_EXTENSIONS_DIR: one folder for each
# environment (the newest and the floor releases build different sources), kept in the cache. A build
# killed half-way leaves its lock file, and every later build waits on it for ever: none of this
# script's builds runs while it starts, so a lock there is stale.
extensions_dir() {
  export TORCH_EXTENSIONS_DIR="$cache/torch-extensions/$1"
  mkdir -p "$TORCH_EXTENSIONS_DIR"
  find "$TORCH_EXTENSIONS_DIR" -name lock -type f -delete
}
status=0
extensions_dir "$(basename "$venv")"
"$venv/bin/python" -m pytest -q -p no:cacheprovider "$@" || status=$?
# The floor stages (the whole suite only, not a selection): the exports' reads and two-step runs
# again with the floor releases they state laid over the environment, each set installed once
# without dependencies into a folder named by its digest. requirements-floor.txt holds the HF
# Trainer, DeepSpeed and Accelerate/DeepSpeed exports' floors; requirements-floor-fsdp2.txt the
# Accelerate FSDP2 export's (TRL >= 1.9, Accelerate >= 1.12); requirements-floor-transformers4.txt
# transformers 4's, for the plans whose exports state one (HF Trainer: 4.56.1).
floor_stage() {  # floor_stage REQUIREMENTS PYTEST-SELECTION
  local floor_requirements="$root/tests/frameworks/$1"
  local floor="$cache/frameworks-floor-$(cat "$requirements" "$floor_requirements" | sha256sum | cut -c1-16)"
  if [ ! -f "$floor/.complete" ]; then
    echo "frameworks-check: installing the floor releases of $1 into $floor (once)"
    rm -rf "$floor"
    "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --target "$floor" -r "$floor_requirements"
    touch "$floor/.complete"
  fi
  PYTHONPATH="$floor" "$venv/bin/python" -c "import transformers, peft, trl, accelerate; print('frameworks-check floor ($1): \
transformers', transformers.__version__, 'peft', peft.__version__, 'trl', trl.__version__, 'accelerate', accelerate.__version__)" 2>/dev/null
  extensions_dir "$(basename "$floor")"
  PYTHONPATH="$floor" "$venv/bin/python" -m pytest -q -p no:cacheprovider test_exports.py -k "$2" || status=$?
}
if [ $# -eq 0 ] && [ "${LONGSEQ_FRAMEWORKS_FLOOR:-1}" != 0 ]; then
  floor_stage requirements-floor.txt "not fsdp2"
  floor_stage requirements-floor-fsdp2.txt "fsdp2"
  # transformers 4: the exports that state a transformers 4 floor (HF Trainer, Accelerate's DeepSpeed
  # export; the plans that state transformers 5 skip, naming it) and ArcticTraining's recipe.
  # DeepSpeed 0.18.2's own reads and runs are the stage above's.
  floor_stage requirements-floor-transformers4.txt "hf_trainer or accelerate_deepspeed or arctic"
fi
exit $status
