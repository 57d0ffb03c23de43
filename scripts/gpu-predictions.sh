#!/usr/bin/env bash
# gpu-predictions.sh [LONGSEQ]: longseq's PREDICTIONS for the GPU check's cases
# (tests/frameworks/gpu_cases.json) on an H100 and an H200, written to
# tests/frameworks/gpu_predictions.json: made here, carried to the GPU machine, where
# tests/frameworks/gpu_measure.py sets each measurement beside its prediction without a build.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
longseq=${1:-$root/build/cli/longseq}
cd "$root"
python3 - "$longseq" <<'PY'
import json, subprocess, sys
longseq = sys.argv[1]
cases = json.load(open("tests/frameworks/gpu_cases.json"))

def flags(case):
    # The plan each stack runs (runtime profiles hf-trainer and fsdp2-accelerate): one GPU, SDPA,
    # transformers' checkpointing (with its offload where the case says), transformers' own loss.
    common = ["--gpus", "1", "--checkpointing", "--no-tiled-loss", "--no-tiled-mlp", "--attention", "sdpa",
              "--checkpoint-offload" if case["checkpoint_offload"] else "--no-checkpoint-offload"]
    if case["stack"] == "fsdp2":
        return ["--framework", "accelerate-fsdp2", "--zero", "3", "--no-offload-optimizer", "--no-offload-params"] + common
    extra = ["--lora", str(case["lora_rank"])] if case["stack"] == "lora" else []
    return ["--framework", "hf-trainer", "--zero", "0"] + common + extra

def plan(case, gpu, seqlen=None):
    args = [longseq, "plan", "--model", case["config"], "--gpu", gpu, "--json"] + flags(case)
    if seqlen: args += ["--seqlen", str(seqlen)]
    report = json.loads(subprocess.run(args, check=True, capture_output=True, text=True).stdout)
    return report

out = {"about": "PREDICTIONS of longseq's cost model for tests/frameworks/gpu_cases.json; regenerate with scripts/gpu-predictions.sh",
       "cards": {}}
for gpu in ("h100-sxm-80gb", "h200-141gb"):
    rows = {}
    for case in cases["cases"]:
        report = plan(case, gpu, case["seqlen"])
        gpu_prediction = report["prediction"]["gpu"]
        items = {item["name"]: item["bytes"] for item in gpu_prediction["items"]}
        rows[case["name"]] = {
            "command": " ".join(["longseq", "plan", "--model", case["config"], "--gpu", gpu, "--seqlen", str(case["seqlen"])] + flags(case)),
            "plan": report["plan"]["summary"],
            "fits": report["prediction"]["fits"],
            "gpu_peak_bytes": gpu_prediction["peak_gib"] * 2**30,
            "gpu_peak_phase": gpu_prediction["peak_phase"] + ", " + gpu_prediction["peak_moment"],
            "runtime_overhead_bytes": sum(b for n, b in items.items() if n in ("cuda_context", "cublas_workspace", "allocator_fragmentation", "nccl_buffers", "unexplained_reserve")),
            "allocator_fragmentation_bytes": items.get("allocator_fragmentation", 0),
            "step_time_s": report.get("time", {}).get("step_s"),
            "items": items,
        }
    bisect = next(c for c in cases["cases"] if c["name"] == cases["bisect"]["case"])
    longest = plan(bisect, gpu)["max_seqlen"]
    out["cards"][gpu] = {"cases": rows, "bisect": {"case": bisect["name"], "max_seqlen": longest["tokens"],
                                                   "to_act_on": longest["to_act_on_tokens"]}}
json.dump(out, open("tests/frameworks/gpu_predictions.json", "w"), indent=1)
print("gpu-predictions: wrote tests/frameworks/gpu_predictions.json")
PY
