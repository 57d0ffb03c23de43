#!/usr/bin/python3
"""Writes tests/data/tiny_llama_golden.bin: the loss and every parameter gradient of the
tiny-llama card (models/cards/tiny-llama.yaml) on one packed sequence, computed in float64 by
PyTorch autograd from an implementation written here independently of longseq's kernels.

Run with Debian's python3 and python3-torch (not a pyenv python):  /usr/bin/python3 make_tiny_llama_golden.py
CI only reads the committed file. Weights, tokens, labels and positions come from closed-form
formulas that tests/executor/test_llama.cpp reproduces, so only the results are stored.

File: b"LSGOLD01", int64 T, int64 parameter count, float64 loss, then the gradients as float32
in longseq's flat layout (embedding; per layer attention_norm, q, k, v, o, mlp_norm, gate, up,
down; final_norm; lm_head).
"""
import math
import struct
import sys

import torch

torch.set_default_dtype(torch.float64)
LAYERS, C, NQ, NKV, HD, F, V = 4, 64, 4, 2, 16, 176, 256  # tiny-llama
T, THETA, EPS = 64, 500000.0, 1e-5
DOCUMENTS = [40, 24]  # two packed samples


def parameter(count, offset, norm):
    """Same formula as the C++ test: norms near 1, matrices small, from the flat index."""
    index = torch.arange(offset, offset + count, dtype=torch.float64)
    if norm:
        return (1.0 + 0.1 * torch.sin(0.37 * index)).requires_grad_()
    return (0.08 * torch.sin(1.3 * index + 0.1)).requires_grad_()


shapes = [("embedding", (V, C), False)]
for layer in range(LAYERS):
    shapes += [(f"{layer}.attention_norm", (C,), True), (f"{layer}.q", (NQ * HD, C), False),
               (f"{layer}.k", (NKV * HD, C), False), (f"{layer}.v", (NKV * HD, C), False),
               (f"{layer}.o", (C, NQ * HD), False), (f"{layer}.mlp_norm", (C,), True),
               (f"{layer}.gate", (F, C), False), (f"{layer}.up", (F, C), False), (f"{layer}.down", (C, F), False)]
shapes += [("final_norm", (C,), True), ("lm_head", (V, C), False)]
params, offset = {}, 0
for name, shape, norm in shapes:
    count = math.prod(shape)
    params[name] = parameter(count, offset, norm)
    offset += count
view = {name: params[name].view(shape) for name, shape, _ in shapes}

tokens = torch.tensor([(37 * i + 11) % V for i in range(T)])
positions = torch.cat([torch.arange(n) for n in DOCUMENTS])
labels = []
for i in range(T):
    last_of_document = i == T - 1 or positions[i + 1].item() == 0
    labels.append(-100 if last_of_document or i % 7 == 3 else tokens[i + 1].item())
labels = torch.tensor(labels)


def rmsnorm(x, weight):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * weight


def rope(x):  # x [T, heads, HD], HF rotate_half convention
    inverse_frequency = THETA ** (-torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    angles = positions[:, None].double() * inverse_frequency[None, :]
    cos = torch.cat([angles.cos(), angles.cos()], -1)[:, None, :]
    sin = torch.cat([angles.sin(), angles.sin()], -1)[:, None, :]
    x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


i_index, j_index = torch.arange(T)[:, None], torch.arange(T)[None, :]
visible = (j_index <= i_index) & (j_index >= i_index - positions[:, None])
x = view["embedding"][tokens]
for layer in range(LAYERS):
    w = {key: view[f"{layer}.{key}"] for key in ["attention_norm", "q", "k", "v", "o", "mlp_norm", "gate", "up", "down"]}
    h = rmsnorm(x, w["attention_norm"])
    q = rope((h @ w["q"].T).view(T, NQ, HD))
    k = rope((h @ w["k"].T).view(T, NKV, HD))
    v = (h @ w["v"].T).view(T, NKV, HD)
    heads = []
    for head in range(NQ):
        group = head // (NQ // NKV)
        scores = (q[:, head] @ k[:, group].T) / math.sqrt(HD)
        scores = scores.masked_fill(~visible, float("-inf"))
        heads.append(torch.softmax(scores, -1) @ v[:, group])
    residual = x + torch.cat(heads, -1) @ w["o"].T
    h2 = rmsnorm(residual, w["mlp_norm"])
    x = residual + (torch.nn.functional.silu(h2 @ w["gate"].T) * (h2 @ w["up"].T)) @ w["down"].T
logits = rmsnorm(x, view["final_norm"]) @ view["lm_head"].T
loss = torch.nn.functional.cross_entropy(logits, labels, ignore_index=-100)
loss.backward()

output = sys.argv[1] if len(sys.argv) > 1 else "../data/tiny_llama_golden.bin"
with open(output, "wb") as stream:
    stream.write(b"LSGOLD01")
    stream.write(struct.pack("<qqd", T, offset, loss.item()))
    for name, _, _ in shapes:
        stream.write(params[name].grad.to(torch.float32).numpy().tobytes())
print(f"loss {loss.item():.12f}, {offset} gradients -> {output}")
