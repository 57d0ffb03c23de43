#!/usr/bin/env bash
# gpu-bundle.sh [--cpu-only] [DIR]: longseq and its GPU tests for the project's GPU machine (Hopper, sm_90; CUDA
# 13's libraries and PyTorch installed; no Debian -dev packages, no Open MPI, no registry), as one
# folder that needs nothing else: DIR/bin (longseq, gpu_device_query, gpu_kernels, gpu_llama) and
# DIR/lib (every shared library they load that is neither the C library nor CUDA's), found through
# RPATH $ORIGIN/../lib; libstdc++ and libgcc linked in. Single-process (no MPI: the machine has one
# GPU). DIR defaults to gpu-bundle/ in the repository (git-ignored; `device run` carries it), and
# must stay under the 64 MiB a call may carry. No path of this machine is written into it.
# --cpu-only: longseq alone without the CUDA path (minutes, not the CUDA build's half hour): CI's
# variant of the dry run, which proves the packaging (no MPI, the libraries carried, no network).
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
cuda=ON
if [ "${1:-}" = "--cpu-only" ]; then
  cuda=OFF
  shift
fi
out="${1:-$root/gpu-bundle}"
build="$root/build-gpu-bundle"
[ "$cuda" = OFF ] && build="$root/build-gpu-bundle-cpu"
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
cuda_flags=(-DLONGSEQ_ENABLE_CUDA=OFF -DBUILD_TESTING=OFF)
binaries=(longseq)
if [ "$cuda" = ON ]; then
  nvcc=$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)
  [ -x "$nvcc" ] || { echo "gpu-bundle: no nvcc (the CUDA toolkit) here" >&2; exit 4; }
  cuda_flags=(-DCMAKE_CUDA_COMPILER="$nvcc" -DLONGSEQ_CUDA_ARCHITECTURES=90)
  binaries=(longseq gpu_device_query gpu_kernels gpu_llama)
fi
cmake -S "$root" -B "$build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release "${cuda_flags[@]}" \
  -DLONGSEQ_ENABLE_MPI=OFF -DLONGSEQ_NATIVE_ARCH=OFF -DLONGSEQ_BUNDLE=ON > /dev/null
cmake --build "$build" --parallel "$(nproc)" --target "${binaries[@]}"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
cp "$build/cli/longseq" "$out/bin/"
for test in "${binaries[@]:1}"; do cp "$build/tests/$test" "$out/bin/"; done
# The libraries the image lacks: all that ldd resolves but the C library's and CUDA's own (the
# image has CUDA 13's runtime and cuBLAS; the driver's libcuda comes with the machine).
for library in $(ldd "$out"/bin/* | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | sort -u); do
  case "$(basename "$library")" in
    libc.so.*|libm.so.*|libdl.so.*|libpthread.so.*|librt.so.*|ld-linux*|libcuda.so.*|libcudart.so.*|libcublas.so.*|libcublasLt.so.*) ;;
    *) cp -L "$library" "$out/lib/" ;;
  esac
done
strip --strip-unneeded "$out"/bin/* "$out"/lib/* 2>/dev/null || true
# Nothing of this machine's file system may be written into what travels (an RPATH, a build path).
for file in "$out"/bin/* "$out"/lib/*; do
  if readelf -d "$file" 2>/dev/null | grep -E "R(UN)?PATH" | grep -v '\$ORIGIN' >/dev/null; then
    echo "gpu-bundle: $file has an RPATH outside the bundle" >&2
    exit 1
  fi
done
size_kib=$(du -sk "$out" | cut -f1)
echo "gpu-bundle: $out ($((size_kib / 1024)) MiB): $(ls "$out/bin" | tr '\n' ' ')+ $(ls "$out/lib" | tr '\n' ' ')"
if [ "$size_kib" -gt $((48 * 1024)) ]; then
  echo "gpu-bundle: over 48 MiB, which leaves too little of the 64 MiB a device call carries for the rest of the tree" >&2
  exit 1
fi
