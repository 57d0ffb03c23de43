#!/usr/bin/env bash
# setup.sh: installs longseq's build dependencies from Debian packages (run as root, or with sudo).
# Idempotent: packages already present are left as they are.
set -euo pipefail

packages=(
  build-essential cmake ninja-build pkg-config
  libeigen3-dev libyaml-cpp-dev libfmt-dev nlohmann-json3-dev libcli11-dev doctest-dev
  libopenmpi-dev openmpi-bin
  slurmctld slurmd slurm-client munge
  gnuplot-nox
  # python3-dev: the frameworks check's DeepSpeed builds its CPU ops (shm comm, CPU Adam) against Python.h
  python3 python3-yaml python3-venv python3-dev
  debootstrap
  clang libclang-rt-dev
)

missing=()
for package in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" || missing+=("$package")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#packages[@]} Debian packages already installed"
  exit 0
fi

sudo_cmd=()
[ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
echo "setup: installing ${missing[*]}"
"${sudo_cmd[@]}" apt-get update -qq
DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends "${missing[@]}"
# The CUDA toolkit (nvcc, cuBLAS, NCCL) is optional and not installed here: where it exists in
# /usr/local/cuda, the build picks it up; without it the CPU build and tests are complete.
