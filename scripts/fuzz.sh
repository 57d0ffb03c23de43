#!/usr/bin/env bash
# fuzz.sh: libFuzzer on every parser of longseq's inputs (tests/fuzz).
#
#   scripts/fuzz.sh run [SECONDS] [TARGET...]   build the harnesses with clang (ASan+UBSan) into
#                                               build-fuzz and fuzz each for SECONDS (default 600)
#                                               or 1M executions, seeded from the project's files;
#                                               crashing inputs land in build-fuzz/crashes/TARGET
#   scripts/fuzz.sh replay TARGET BINARY        run BINARY (a harness linked with replay_main) over
#                                               TARGET's seeds and tests/fuzz/regressions/TARGET
#                                               (what CTest's fuzz.replay.* tests do)
#
# A crash found by `run` becomes a regression case by copying its input into
# tests/fuzz/regressions/TARGET/ once it is fixed.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
targets=(seqlen yaml_cards scenario hf_config points_csv run_json sweep_json plan_file launch_script export run_scenario)

# The project's own files that seed each target (one place for the replay and the fuzzer).
seeds_of() {
  case "$1" in
    seqlen) echo "$root/tests/fuzz/seeds/seqlen" ;;
    yaml_cards) echo "$root/models/cards $root/tests/data/cards $root/planner/profiles $root/scenarios/hardware $root/tests/data/bad/list-key.yaml $root/tests/data/bad/tiny-vocab-8.yaml" ;;
    scenario) echo "$root/scenarios $root/tests/data/scenarios $root/tests/data/bad/scenario-list-key.yaml $root/tests/data/bad/scenario-bad-value.yaml" ;;
    hf_config) echo "$root/tests/data/hf $(ls "$root"/tests/data/bad/*.config.json | tr '\n' ' ')" ;;
    points_csv) echo "$root/tests/data/published_points.csv" ;;
    run_json) echo "$root/tests/data/bad/run-huge-number $root/tests/data/bad/run-wrong-type $root/tests/data/run_not_a_result $root/tests/fuzz/seeds/run_json" ;;
    plan_file) echo "$root/tests/data/plans" ;;
    launch_script) echo "$root/tests/fuzz/seeds/launch_script" ;;
    export) echo "$root/tests/fuzz/seeds/export" ;;
    run_scenario) echo "$root/scenarios/executor $root/tests/data/scenarios" ;;
    sweep_json) echo "$root/tests/data/bad/results-huge-number $root/tests/data/bad/results-missing-key $root/tests/fuzz/seeds/sweep_json" ;;
    *) echo "fuzz.sh: unknown target '$1' (targets: ${targets[*]})" >&2; exit 2 ;;
  esac
}

case "${1:-}" in
  replay)
    target=$2 binary=$3
    regressions="$root/tests/fuzz/regressions/$target"
    # shellcheck disable=SC2046
    exec "$binary" $(seeds_of "$target") $([ -d "$regressions" ] && echo "$regressions")
    ;;
  run)
    seconds=${2:-600}
    shift $(( $# >= 2 ? 2 : 1 ))
    [ $# -gt 0 ] && targets=("$@")
    command -v clang++ > /dev/null || { echo "fuzz.sh: clang++ is needed (scripts/setup.sh installs clang)" >&2; exit 2; }
    flags="-fsanitize=address,undefined,fuzzer-no-link -fno-sanitize-recover=all -fno-omit-frame-pointer"
    generator=(); command -v ninja > /dev/null && generator=(-G Ninja)
    cmake -S "$root" -B "$root/build-fuzz" "${generator[@]}" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
      -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS="$flags" -DLONGSEQ_ENABLE_CUDA=OFF -DLONGSEQ_FUZZ=ON > /dev/null
    cmake --build "$root/build-fuzz" --parallel "$(nproc)" --target $(printf 'fuzz_%s ' "${targets[@]}")
    summary=""
    status=0
    for target in "${targets[@]}"; do
      corpus="$root/build-fuzz/corpus/$target" crashes="$root/build-fuzz/crashes/$target"
      mkdir -p "$corpus" "$crashes"
      # libFuzzer takes files from directories only: stage every seed file into one, each under a
      # name of its own (seeds of the same name in different folders, run.json above all, would
      # otherwise overwrite each other and leave one).
      seed_dir="$root/build-fuzz/seeds/$target"
      rm -rf "$seed_dir" && mkdir -p "$seed_dir"
      seed_count=0
      for seed in $(seeds_of "$target") "$root/tests/fuzz/regressions/$target"; do
        [ -e "$seed" ] || continue
        while IFS= read -r -d '' file; do
          seed_count=$((seed_count + 1))
          cp "$file" "$seed_dir/$seed_count-$(basename "$file")"
        done < <(find "$seed" -type f -print0)
      done
      echo "== fuzz_$target: $seed_count seed files"
      log="$root/build-fuzz/$target.log"
      echo "== fuzz_$target: ${seconds} s or 1M executions"
      if "$root/build-fuzz/tests/fuzz/fuzz_$target" "$corpus" "$seed_dir" -max_total_time="$seconds" -runs=1000000 -timeout=10 \
           -rss_limit_mb=2048 -artifact_prefix="$crashes/" -print_final_stats=1 > "$log" 2>&1; then
        result="0 crashes"
      else
        result="FAILED (see $log and $crashes)"
        status=1
      fi
      runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
      elapsed=$(grep -o 'Done [0-9]* runs in [0-9]* second' "$log" | grep -o 'in [0-9]*' | grep -o '[0-9]*' || echo "$seconds")
      coverage=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
      summary+=$(printf '%-12s %10s executions in %5s s, coverage %6s edges: %s' "$target" "$runs" "$elapsed" "$coverage" "$result")$'\n'
    done
    printf '\n%s' "$summary"
    exit $status
    ;;
  *)
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
