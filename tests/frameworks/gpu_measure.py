#!/usr/bin/env python3
"""The GPU check's first part (issue 39): the stacks users run, measured on the GPU beside longseq's
PREDICTION for the same plan on that card (tests/frameworks/gpu_predictions.json, made by
scripts/gpu-predictions.sh where longseq is built; nothing is built here).

Stacks (tests/frameworks/gpu_cases.json):
  hf-trainer  the plain HF Trainer's step: a bf16 model from its config.json (random weights, no hub),
              SDPA, transformers' gradient checkpointing (its offload where the case says), torch's
              fused AdamW, transformers' own loss, under bf16 autocast as Trainer(bf16=True) runs it
  lora        the same with PEFT's LoRA on every linear (fp32 adapters)
  fsdp2       Accelerate's FSDP2 on one process (its fp32 upcast of the trained parameters, bf16
              compute, FSDP's activation checkpointing)
Per case: torch.cuda.max_memory_allocated (tensors), max_memory_reserved (the caching allocator's
segments), the device's used memory (mem_get_info) after the step, and the second step's time. Then,
while time is left, a bisection (to 1,024 tokens) for the longest length one case trains, beside
the predicted maximum. Every result is written to OUT/results.jsonl as soon as it exists, and
OUT/report.md at the end, so a command cut off still returns what it measured.

usage: gpu_measure.py --out DIR [--device cuda|cpu] [--budget-s SECONDS] [--only NAME ...]
  --device cpu runs every stack on the CPU at a tiny size (the dry run: the harness's code paths).
"""
import argparse
import gc
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback

ROOT = pathlib.Path(__file__).resolve().parents[2]
GIB = 2 ** 30


def versions(device):
    import torch
    import transformers
    found = {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
             "cuda": torch.version.cuda, "device": device}
    for name in ("peft", "accelerate", "trl"):
        try:
            found[name] = __import__(name).__version__
        except ImportError:
            found[name] = None
    if device == "cuda":
        found["gpu"] = torch.cuda.get_device_name(0)
        found["gpu_memory_gib"] = round(torch.cuda.get_device_properties(0).total_memory / GIB, 2)
        try:
            found["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                             capture_output=True, text=True, timeout=30).stdout.strip()
        except Exception:  # no nvidia-smi: the rest still stands
            found["driver"] = None
        found["sdpa_backends"] = {"flash": torch.backends.cuda.flash_sdp_enabled(), "cudnn": torch.backends.cuda.cudnn_sdp_enabled(),
                                  "efficient": torch.backends.cuda.mem_efficient_sdp_enabled()}
    return found


def card_of(gpu_name):
    name = gpu_name.upper()
    if "H200" in name:
        return "h200-141gb"
    if "H100" in name:
        return "h100-sxm-80gb"
    return None


def tiny(config):
    """The same architecture at a size the CPU runs in a second (the dry run)."""
    small = dict(config, hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                 num_hidden_layers=2, vocab_size=256, max_position_embeddings=8192)
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        small[key] = None
    return small


def build_model(config, device):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM
    hf_config = AutoConfig.for_model(**{k: v for k, v in config.items() if k not in ("architectures", "torch_dtype")})
    hf_config.architectures = config["architectures"]
    hf_config.use_cache = False
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(hf_config, dtype=torch.bfloat16, attn_implementation="sdpa")
    return model


def checkpointing_enable(model, offload):
    kwargs = {"use_reentrant": False}
    if offload:
        kwargs["offload"] = True  # transformers >= 5.17 (Reference §11 F5.7)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


class Stack:
    """A model, its optimizer and one training step of `tokens` tokens."""

    def __init__(self, case, config, device):
        import torch
        self.device = device
        self.vocab = config["vocab_size"]
        self.autocast = torch.autocast(device_type=device, dtype=torch.bfloat16)
        if case["stack"] == "fsdp2":
            self._fsdp2(case, config)
            return
        self.model = build_model(config, device)
        self.model.train()
        if case["stack"] == "lora":
            from peft import LoraConfig, get_peft_model
            self.model.enable_input_require_grads()  # the Trainer's step for PEFT with checkpointing
            self.model = get_peft_model(self.model, LoraConfig(r=case["lora_rank"], lora_alpha=case["lora_rank"], lora_dropout=0.0,
                                                               target_modules="all-linear", task_type="CAUSAL_LM"))
        checkpointing_enable(self.model, case["checkpoint_offload"])
        trained = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trained, lr=1e-5, fused=device == "cuda")
        self.accelerator = None

    def _fsdp2(self, case, config):
        import torch
        from accelerate import Accelerator
        from accelerate.utils import FullyShardedDataParallelPlugin
        for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": "29513"}.items():
            os.environ.setdefault(key, value)
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap", reshard_after_forward=True,
                                                activation_checkpointing=True, state_dict_type="SHARDED_STATE_DICT")
        self.accelerator = Accelerator(mixed_precision="bf16", fsdp_plugin=plugin, cpu=self.device == "cpu")
        model = build_model(config, self.device)
        model.train()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)

    def step(self, tokens):
        import torch
        ids = torch.randint(0, self.vocab, (1, tokens), device=self.device)
        if self.accelerator is not None:
            with self.accelerator.autocast():
                loss = self.model(input_ids=ids, labels=ids).loss
            self.accelerator.backward(loss)
        else:
            with self.autocast:
                loss = self.model(input_ids=ids, labels=ids).loss
            loss.backward()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(loss.detach())


def synchronize(device):
    import torch
    if device == "cuda":
        torch.cuda.synchronize()


def release(device):
    import torch
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()


def measure_case(case, device, prediction):
    """Builds the case's stack, runs two steps, returns the measurement beside the prediction."""
    import torch
    config = json.load(open(ROOT / case["config"]))
    tokens = case["seqlen"]
    if device == "cpu":
        config, tokens = tiny(config), 256
    release(device)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    row = {"case": case["name"], "stack": case["stack"], "tokens": tokens, "prediction": prediction}
    started = time.perf_counter()
    stack = None
    try:
        stack = Stack(case, config, device)
        stack.step(tokens)  # the first step makes AdamW's moments
        synchronize(device)
        timed = time.perf_counter()
        row["loss"] = stack.step(tokens)
        synchronize(device)
        row["step_s"] = time.perf_counter() - timed
        row["fits"] = True
    except torch.OutOfMemoryError as error:
        row["fits"] = False
        row["error"] = f"out of memory: {str(error).splitlines()[0][:300]}"
    except Exception as error:  # the case's own failure is its result; the check goes on
        row["fits"] = None
        row["error"] = f"{type(error).__name__}: {error}"[:500]
        row["traceback"] = traceback.format_exc()[-2000:]
    if device == "cuda":
        row["max_allocated_bytes"] = torch.cuda.max_memory_allocated()
        row["max_reserved_bytes"] = torch.cuda.max_memory_reserved()
        free, total = torch.cuda.mem_get_info()
        row["device_used_bytes"] = total - free  # after the step: the reserved pool, the context, cuBLAS
        row["device_total_bytes"] = total
    row["wall_s"] = time.perf_counter() - started
    del stack
    if device == "cpu" and row.get("fits") and case["stack"] == "fsdp2":
        import torch.distributed as dist
        if dist.is_initialized():
            dist.destroy_process_group()
    release(device)
    return row


def bisect_case(case, device, predicted_max, granule, deadline, log):
    """The longest multiple of `granule` tokens one step of `case` trains, searched from the
    prediction outwards; stops at `deadline` with the bracket it has."""
    import torch
    config = json.load(open(ROOT / case["config"]))
    stack = Stack(case, config, device)
    stack.step(granule)  # AdamW's moments exist before any probe
    fits, fails = 0, None
    probe = max(granule, predicted_max // granule * granule)
    while time.time() < deadline:
        try:
            stack.step(probe)
            synchronize(device)
            ok = True
        except torch.OutOfMemoryError:
            ok = False
            stack.optimizer.zero_grad(set_to_none=True)
        release(device)
        log({"bisect_probe": probe, "fits": ok})
        if ok:
            fits = probe
        else:
            fails = probe
        if fails is None:
            probe = probe + max(granule, probe // 4 // granule * granule)
        elif fits == 0:
            probe = max(granule, probe * 3 // 4 // granule * granule)
            if probe >= fails:
                break
        else:
            if fails - fits <= granule:
                break
            probe = (fits + fails) // 2 // granule * granule
    return {"longest_fitting_tokens": fits, "shortest_failing_tokens": fails}


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--budget-s", type=float, default=480, help="no case or probe starts after this many seconds")
    parser.add_argument("--only", nargs="*", help="case names (default: all)")
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    deadline = time.time() + args.budget_s
    results = open(out / "results.jsonl", "a")

    def log(record):
        results.write(json.dumps(record) + "\n")
        results.flush()
        os.fsync(results.fileno())
        print(json.dumps(record)[:400], flush=True)

    import torch
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        log({"error": "no CUDA device visible: nothing measured"})
        return 3
    found = versions(device)
    log({"versions": found, "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "host": platform.node()})
    cases = json.load(open(ROOT / "tests/frameworks/gpu_cases.json"))
    predictions = json.load(open(ROOT / "tests/frameworks/gpu_predictions.json"))
    card = card_of(found.get("gpu", "")) if device == "cuda" else "h100-sxm-80gb"
    card_predictions = predictions["cards"].get(card, {}) if card else {}
    rows = []
    for case in cases["cases"]:
        if args.only and case["name"] not in args.only:
            continue
        if time.time() > deadline:
            log({"case": case["name"], "skipped": "time budget spent"})
            continue
        row = measure_case(case, device, card_predictions.get("cases", {}).get(case["name"]))
        rows.append(row)
        log(row)
    bisect = cases["bisect"]
    bisect_row = None
    if device == "cuda" and card_predictions and time.time() < deadline and (not args.only or bisect["case"] in args.only):
        case = next(c for c in cases["cases"] if c["name"] == bisect["case"])
        predicted = card_predictions["bisect"]["max_seqlen"]
        try:
            bisect_row = {"bisect": case["name"], "predicted_max_seqlen": predicted,
                          **bisect_case(case, device, predicted, bisect["granule"], deadline, log)}
        except Exception as error:
            bisect_row = {"bisect": case["name"], "error": f"{type(error).__name__}: {error}"[:500]}
        log(bisect_row)
    report_write(out / "report.md", found, card, rows, bisect_row)
    return 0


def gib(value):
    return f"{value / GIB:.2f}" if isinstance(value, (int, float)) else "-"


def report_write(path, found, card, rows, bisect_row):
    lines = [f"# GPU check: the stacks users run, MEASURED beside longseq's PREDICTION ({card})", "",
             f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {found.get('gpu', found['device'])} "
             f"(driver {found.get('driver')}, CUDA {found.get('cuda')}), torch {found['torch']}, transformers {found['transformers']}, "
             f"peft {found.get('peft')}, accelerate {found.get('accelerate')}. Predictions: tests/frameworks/gpu_predictions.json.", "",
             "| case | plan | tokens | allocated GiB (predicted tensors) | reserved GiB | device used GiB (predicted peak) | step s (predicted) | note |",
             "|---|---|---|---|---|---|---|---|"]
    for row in rows:
        p = row.get("prediction") or {}
        tensors = p.get("gpu_peak_bytes", 0) - p.get("runtime_overhead_bytes", 0) if p else None
        predicted_step = p.get("step_time_s")
        lines.append(f"| {row['case']} | {p.get('plan', '-')} | {row['tokens']} | {gib(row.get('max_allocated_bytes'))} ({gib(tensors)}) | "
                     f"{gib(row.get('max_reserved_bytes'))} | {gib(row.get('device_used_bytes'))} ({gib(p.get('gpu_peak_bytes'))}) | "
                     f"{row.get('step_s', float('nan')):.2f} ({predicted_step if predicted_step is None else round(predicted_step, 2)}) | "
                     f"{'fits' if row.get('fits') else row.get('error', '')[:120]} |")
    if bisect_row:
        lines += ["", f"Longest length one step of {bisect_row.get('bisect')} trains: {bisect_row}"]
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
