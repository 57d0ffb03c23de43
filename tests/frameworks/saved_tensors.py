"""What PyTorch's autograd saves for backward in one decoder layer of transformers' own modelling
code, recorded with torch.autograd.graph.saved_tensors_hooks and deduplicated by storage, and the
same layer as longseq's planner lists it (longseq plan --tensors --json)."""
import json
import os
import subprocess

import torch

from tiny_models import build_model


def torch_layer_saved(config: dict, tokens: int, layer: int = 1, gradient_checkpointing: bool = False,
                      lora: dict | None = None, attn_implementation: str = "sdpa", autocast: bool = False):
    """One forward and backward of `config`'s model in bf16 on the CPU; returns what autograd saved
    while decoder layer `layer` ran: a list of (shape, dtype, bytes, producer) per storage, model
    parameters and tensors every layer shares (RoPE's cos/sin) left out, and the shared ones apart.
    `autocast`: under torch.autocast(bfloat16), as the HF Trainer runs a step with bf16=True."""
    model = build_model(config, gradient_checkpointing, lora, attn_implementation)
    states = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    decoder_layers = [m for name, m in model.named_modules() if name.endswith(f"layers.{0}") or name.endswith(f"layers.{layer}")]
    per_layer = {}
    current = [None]
    handles = []
    for index, module in enumerate(decoder_layers):
        handles.append(module.register_forward_pre_hook(lambda m, a, index=index: current.__setitem__(0, index)))
        handles.append(module.register_forward_hook(lambda m, a, o: current.__setitem__(0, None)))

    def pack(t):
        if current[0] is not None and t.untyped_storage().data_ptr() not in states:
            storage = t.untyped_storage()
            per_layer.setdefault(current[0], {}).setdefault(
                storage.data_ptr(), (tuple(t.shape), str(t.dtype).replace("torch.", ""), storage.nbytes(),
                                     type(t.grad_fn).__name__ if t.grad_fn is not None else "leaf"))
        return t

    input_ids = torch.randint(0, config["vocab_size"], (1, tokens))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t), \
            torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=input_ids, labels=input_ids).loss
    loss.backward()
    for handle in handles:
        handle.remove()
    first, compared = per_layer.get(0, {}), per_layer.get(1, {})
    own = [v for k, v in compared.items() if k not in first]
    shared = [v for k, v in compared.items() if k in first]
    return own, shared


def longseq_layer_saved(binary: str, config_path: str, tokens: int, flags: list[str]):
    """The planner's list for the same layer: (name, bytes) in forward order."""
    args = [binary, "plan", "--model", config_path, "--gpus", "1", "--seqlen", str(tokens), "--tensors", "--json", *flags]
    run = subprocess.run(args, capture_output=True, text=True)
    if run.returncode != 0:
        raise RuntimeError(f"{' '.join(args)}: {run.stderr.strip()}")
    return [(row["name"], int(row["bytes"])) for row in json.loads(run.stdout)["tensors"]["layer_saved"]]
