#!/usr/bin/env bash
# frameworks-check.sh [PYTEST ARGS...]: the frameworks' own code as the judge of longseq's planner
# and exports (tests/frameworks, pytest). The pinned frameworks (tests/frameworks/requirements.txt:
# PyPI's torch, a CUDA build of several GB that runs on the CPU, transformers, PEFT, TRL,
# Accelerate, DeepSpeed, torchtitan) are installed once into a virtual environment cached under
# ${LONGSEQ_CACHE:-~/.cache/longseq}, named by the requirements' digest, and reused while they do
# not change. Needs build/cli/longseq (scripts/build.sh) or LONGSEQ_BINARY. Exit: pytest's.
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
cd "$root/tests/frameworks"
exec "$venv/bin/python" -m pytest -q -p no:cacheprovider "$@"
