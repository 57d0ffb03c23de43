#!/usr/bin/env bash
# test.sh: the README's test command — install dependencies, build, run every test.
# Exits non-zero when any test fails. GPU tests report SKIPPED without a GPU, never passed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
scripts/build.sh "$@"
ctest --test-dir build --output-on-failure --parallel "$(nproc)"
