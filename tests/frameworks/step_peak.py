"""The live memory of one training step of transformers' own modelling code on the CPU, measured
by a dispatch-mode tracker of storages (what PyTorch's torch.distributed._tools.mem_tracker.MemTracker
does, without its module hooks: those register a gradient hook on every parameter, which PyTorch
refuses on a LoRA model's frozen ones; test_step_peak.py holds the two equal where both run),
against the planner's prediction for the same model, length and stack (longseq plan --json)."""
import json
import subprocess
import weakref

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map_only

from tiny_models import build_model


class LiveStorages(TorchDispatchMode):
    """Bytes of the storages alive: those handed to track() and every one an op returns, each
    counted once, until PyTorch frees it; `peak` is the most at once after any op.

    Being a dispatch mode, it changes one thing it counts: with any dispatch mode on, PyTorch treats
    every tensor as a subclass (ATen/TensorSubclassLikeUtils.h isTensorSubclassLike) and autograd's
    formulas take their out-of-place branches; index_backward (a gather's backward) writes a new
    tensor where a real run fills its zeros in place, one output-sized tensor more at that moment.
    AllocatorPeak counts a real run (test_step_peak.py holds the difference to that one tensor)."""

    def __init__(self, *tensors):
        super().__init__()
        self._alive = {}
        self.current = self.peak = 0
        for tensor in tensors:
            self.track(tensor)
        self.peak = self.current

    def track(self, tensor):
        storage = tensor.untyped_storage()
        key = id(storage)
        if key in self._alive or storage.nbytes() == 0:
            return
        self._alive[key] = (storage.nbytes(), weakref.ref(storage, lambda _ref, key=key: self._free(key)))
        self.current += storage.nbytes()

    def _free(self, key):
        self.current -= self._alive.pop(key)[0]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        tree_map_only(torch.Tensor, self.track, out)
        self.peak = max(self.peak, self.current)
        return out


class AllocatorPeak:
    """The live-memory peak of a real run, with no dispatch mode: the CPU allocator's own count of
    what it holds (torch.profiler with profile_memory: each allocation's and free's running total,
    counted from the profiler's start) over the bytes of `tensors` allocated before it. It also
    counts the scratch a kernel frees before it returns (the CPU's attention backward buffers),
    which the planner prices for a GPU's kernels, so the step's cases use LiveStorages."""

    def __init__(self, *tensors):
        storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
        self.before = sum(storages.values())
        self.peak = self.before

    def __enter__(self):
        from torch.profiler import ProfilerActivity, profile
        self._profile = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profile.__enter__()
        return self

    def __exit__(self, *exc):
        import os
        import tempfile
        self._profile.__exit__(*exc)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, "trace.json")
            self._profile.export_chrome_trace(path)
            with open(path) as trace:
                events = json.load(trace)["traceEvents"]
        totals = [e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]"]
        self.peak = self.before + max([0, *totals])
        return False


def measured_step_peaks(config: dict, tokens: int, gradient_checkpointing: bool = False, lora: dict | None = None,
                        fake: bool = False):
    """Two steps in the HF Trainer's order (forward with labels, backward, clip_grad_norm_, fused
    AdamW, zero_grad(set_to_none=True); Trainer._inner_training_loop, its default optim
    adamw_torch_fused) on a bf16 model with SDPA, the batch as TRL's collator gives it (input_ids,
    labels, attention_mask). The first step makes AdamW's states; the second is measured: the peak
    of its forward and backward, and of its optimizer step, in bytes.

    `fake`: under FakeTensorMode (torch._subclasses.fake_tensor; torchtitan's memory estimator runs
    so), at real sizes: every op runs its fake kernel, nothing is allocated or computed, and the
    tracker counts the storages as it does real ones. transformers takes fake tensors for tracing
    (utils/import_utils.py is_tracing) and, unable to read the positions, treats the batch as packed
    (masking_utils.find_packed_sequence_indices), building the dense S x S mask a real run skips
    (and repeating K/V for SDPA): the harness says it is one sequence, as a real run finds, and
    passes no all-ones attention_mask for the same reason."""
    import contextlib
    from unittest import mock
    with contextlib.ExitStack() as stack:
        if fake:
            from torch._subclasses.fake_tensor import FakeTensorMode
            from transformers import masking_utils
            stack.enter_context(mock.patch.object(masking_utils, "find_packed_sequence_indices", lambda position_ids: None))
            stack.enter_context(FakeTensorMode())
        return _measured_step_peaks(config, tokens, gradient_checkpointing, lora, with_attention_mask=not fake)


def _measured_step_peaks(config: dict, tokens: int, gradient_checkpointing: bool, lora: dict | None, with_attention_mask: bool):
    model = build_model(config, gradient_checkpointing, lora)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4, fused=True)

    def forward_backward(batch):
        # PEFT's fp32 adapters on a bf16 model run under autocast, as the Trainer's bf16=True does.
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=lora is not None):
            loss = model(**batch).loss
        loss.backward()

    def optimizer_step():
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        model.zero_grad(set_to_none=True)

    def batch():
        input_ids = torch.randint(0, config["vocab_size"], (1, tokens))
        batch = {"input_ids": input_ids, "labels": input_ids.clone()}
        if with_attention_mask:
            batch["attention_mask"] = torch.ones_like(input_ids)
        return batch

    def optimizer_tensors():
        return [t for state in optimizer.state.values() for t in state.values() if torch.is_tensor(t)]

    forward_backward(batch())
    optimizer_step()
    # The second step, in two windows: forward and backward, then the optimizer step.
    states = list(model.parameters()) + list(model.buffers()) + optimizer_tensors()
    inputs = batch()
    with LiveStorages(*states, *inputs.values()) as passes:
        forward_backward(inputs)
    gradients = [p.grad for p in model.parameters() if p.grad is not None]
    with LiveStorages(*states, *gradients, *inputs.values()) as update:
        del gradients
        optimizer_step()
    return {"forward_and_backward": passes.peak, "optimizer_step": update.peak}


def predicted_step_peaks(binary: str, config_path: str, tokens: int, flags: list[str]):
    """The planner's prediction without what only a GPU run holds (runtime_overheads: the CUDA
    context, cuBLAS's workspace, the caching allocator's fragmentation): per phase, in bytes."""
    args = [binary, "plan", "--model", config_path, "--gpus", "1", "--seqlen", str(tokens), "--json", *flags]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {run.stderr.strip()}")
    gpu = json.loads(run.stdout)["prediction"]["gpu"]
    overheads = sum(item["bytes"] for item in gpu["items"] if item["category"] == "runtime_overheads")
    return {phase["phase"]: phase["gib"] * 2**30 - overheads for phase in gpu["phases"]}
