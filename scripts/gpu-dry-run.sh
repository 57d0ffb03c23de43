#!/usr/bin/env bash
# gpu-dry-run.sh OUT: proves here, before any GPU, that the GPU check will run on the bare GPU
# image (scripts/gpu-check.sh --dry-run calls it after scripts/gpu-bundle.sh):
#   1. the bundle (gpu-bundle/) in a minimal Debian root (debootstrap --variant=minbase: no -dev
#      package, no Open MPI, no compiler), this machine's CUDA toolkit bind-mounted read-only as the
#      GPU image has one, no network (unshare -n): no binary may miss a library, longseq must plan and
#      train on the CPU, and the GPU programs must say there is no GPU, not fail to load;
#   2. the GPU check's harness (tests/frameworks/gpu_measure.py) on the CPU at a tiny size, in the
#      frameworks check's environment: its code paths, every stack.
# Needs root (chroot, bind mounts) and, once, Debian's mirror (the root is cached under
# ${LONGSEQ_CACHE:-~/.cache/longseq}). Exit 0 when both pass.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
out=${1:-$root/build/gpu-check}
mkdir -p "$out"
log="$out/dry-run.log"
: > "$log"
cache="${LONGSEQ_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/longseq}"
rootfs="$cache/rootfs-bookworm-minbase"
bundle="$root/gpu-bundle"
[ -x "$bundle/bin/longseq" ] || { echo "gpu-dry-run: no bundle at $bundle (scripts/gpu-bundle.sh)" >&2; exit 1; }
if [ "$(id -u)" != 0 ]; then  # chroot and bind mounts need root: as scripts/setup.sh, through sudo
  command -v sudo >/dev/null || { echo "gpu-dry-run: needs root (chroot, bind mounts) and there is no sudo" >&2; exit 1; }
  exec sudo --preserve-env=LONGSEQ_CACHE,XDG_CACHE_HOME,HOME "$0" "$out"
fi
if [ ! -f "$rootfs/.complete" ]; then
  command -v debootstrap >/dev/null || { echo "gpu-dry-run: debootstrap is missing (scripts/setup.sh installs it)" >&2; exit 1; }
  echo "gpu-dry-run: making a minimal Debian root in $rootfs (once)"
  rm -rf "$rootfs"
  mkdir -p "$cache"
  debootstrap --variant=minbase bookworm "$rootfs" http://deb.debian.org/debian >> "$log" 2>&1
  touch "$rootfs/.complete"
fi
cuda=$(readlink -f /usr/local/cuda)
mounts=()
cleanup() { for ((i=${#mounts[@]}-1; i>=0; i--)); do umount "${mounts[$i]}" 2>/dev/null || true; done; }
trap cleanup EXIT
bind_ro() {  # source, target inside the root
  mkdir -p "$rootfs$2"
  mount --bind "$1" "$rootfs$2"
  mounts+=("$rootfs$2")
  mount -o remount,bind,ro "$rootfs$2"
}
bind_ro "$bundle" /bundle
[ -d "$cuda" ] && bind_ro "$cuda" /usr/local/cuda
mkdir -p "$rootfs/proc"
mount -t proc proc "$rootfs/proc"
mounts+=("$rootfs/proc")
echo "gpu-dry-run: the bundle in a minimal Debian root, no network ($(du -sh "$bundle" | cut -f1))" | tee -a "$log"
set +e
unshare -n chroot "$rootfs" /usr/bin/env -i PATH=/usr/bin:/bin LD_LIBRARY_PATH=/usr/local/cuda/lib64:/usr/local/cuda/targets/x86_64-linux/lib \
  HOME=/tmp /bin/bash -c '
    status=0
    for binary in /bundle/bin/*; do
      missing=$(ldd "$binary" | grep "not found")
      if [ -n "$missing" ]; then echo "FAIL: $binary misses: $missing"; status=1; else echo "ok: $(basename "$binary") loads every library"; fi
    done
    cd /tmp
    /bundle/bin/longseq plan --model llama-3.1-8b --gpus 8 > plan.txt 2>&1 && grep -q "maximum sequence length" plan.txt \
      && echo "ok: longseq plans" || { echo "FAIL: longseq plan"; cat plan.txt; status=1; }
    /bundle/bin/longseq run --model tiny-llama --seqlen 256 --steps 1 > run.txt 2>&1 && grep -q "MEASURED" run.txt \
      && echo "ok: longseq trains on the CPU" || { echo "FAIL: longseq run"; tail -5 run.txt; status=1; }
    for gpu_program in gpu_device_query gpu_kernels gpu_llama; do
      [ -x /bundle/bin/$gpu_program ] || continue
      /bundle/bin/$gpu_program > gpu.txt 2>&1
      code=$?
      if grep -qi "no cuda\|no gpu\|not available\|no device\|skipp" gpu.txt; then echo "ok: $gpu_program runs and says there is no GPU (exit $code)"
      else echo "FAIL: $gpu_program (exit $code):"; tail -5 gpu.txt; status=1; fi
    done
    exit $status' 2>&1 | tee -a "$log"
bundle_status=${PIPESTATUS[0]}
set -e
echo "gpu-dry-run: the harness on the CPU (tests/frameworks/gpu_measure.py --device cpu)" | tee -a "$log"
digest=$(sha256sum "$root/tests/frameworks/requirements.txt" | cut -c1-16)
venv_python="$cache/frameworks-venv-$digest/bin/python"
[ -x "$venv_python" ] || { echo "gpu-dry-run: no frameworks environment (scripts/frameworks-check.sh makes it)" >&2; exit 1; }
rm -rf "$out/dry-run-harness"
harness_status=0
PYTHONUNBUFFERED=1 "$venv_python" "$root/tests/frameworks/gpu_measure.py" --device cpu --out "$out/dry-run-harness" >> "$log" 2>&1 || harness_status=1
if ! python3 - "$out/dry-run-harness/results.jsonl" <<'PY' | tee -a "$log"; then harness_status=1; fi
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if '"case"' in line]
failed = [r["case"] + ": " + r.get("error", "?") for r in rows if not r.get("fits")]
print(f"gpu-dry-run: harness ran {len(rows)} cases on the CPU, {len(failed)} failed" + "".join("\n  " + f for f in failed))
sys.exit(1 if failed or not rows else 0)
PY
echo "gpu-dry-run: bundle $([ "$bundle_status" = 0 ] && echo passed || echo FAILED), harness $([ "$harness_status" = 0 ] && echo passed || echo FAILED) (log: $log)"
[ "$bundle_status" = 0 ] && [ "$harness_status" = 0 ]
