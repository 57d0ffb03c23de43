#!/usr/bin/env bash
# sanitize.sh: builds the CPU suite with clang under AddressSanitizer and UndefinedBehaviorSanitizer
# into build-asan and runs every test there (CI runs this after the README's test command). The
# build is also CI's proof of the CPU-only, portable configuration (LONGSEQ_ENABLE_CUDA=OFF,
# LONGSEQ_NATIVE_ARCH=OFF): the suite passes without the CUDA path or -march=native. Any
# sanitizer report from longseq's code fails a test: UBSan does not recover, ASan aborts, and
# LeakSanitizer ignores only Open MPI's own libraries (tests/sanitizers/lsan.supp).
set -euo pipefail
cd "$(dirname "$0")/.."
command -v clang++ > /dev/null || { echo "sanitize.sh: clang++ is needed (scripts/setup.sh installs clang)" >&2; exit 2; }
flags="-fsanitize=address,undefined -fno-sanitize-recover=all -fno-omit-frame-pointer"
generator=(); command -v ninja > /dev/null && generator=(-G Ninja)
cmake -S . -B build-asan "${generator[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DLONGSEQ_ENABLE_CUDA=OFF -DLONGSEQ_NATIVE_ARCH=OFF
cmake --build build-asan --parallel "$(nproc)"
# Open MPI dlcloses its components at MPI_Finalize, leaving their shutdown leaks in "<unknown
# module>"; a preloaded no-op dlclose keeps them mapped so lsan.supp can name them, and the slow
# unwinder follows their frames (they have no frame pointers).
cc -shared -fPIC -o build-asan/no_dlclose.so tests/sanitizers/no_dlclose.c
export LD_PRELOAD="$PWD/build-asan/no_dlclose.so"
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1:strict_string_checks=1:fast_unwind_on_malloc=0"
# use_tls=0: clang 14's LeakSanitizer crashes scanning the dynamic TLS of dlopen'ed modules (libomp's,
# Open MPI's) in some 8-rank runs on this image ("Tracer caught signal 11" on a DTLS range of
# 0x5028-0x40000612a). longseq's code keeps nothing in thread-local storage (no thread_local), so
# not scanning TLS roots can only misreport what libraries keep there (glibc's dlerror buffer,
# suppressed by name in lsan.supp).
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitizers/lsan.supp:print_suppressions=0:use_tls=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
ctest --test-dir build-asan --output-on-failure --parallel "$(nproc)"
