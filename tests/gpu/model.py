"""The model the GPU tests move: Qwen3-shaped, small, and the layouts both sides hold."""

import math

import torch

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 1024, 3072, 16, 8, 64, 2, 2048


def tensors(scale=1):
    """(name, shape, style): style 'column' splits rows, 'row' splits columns."""
    out = [("embed", (VOCAB * scale, HIDDEN), "column")]
    for layer in range(LAYERS):
        p = f"layers.{layer}."
        out += [
            (p + "norm", (HIDDEN,), "replicated"),
            (p + "q", (HEADS * HEAD_DIM, HIDDEN), "column"),
            (p + "k", (KV_HEADS * HEAD_DIM, HIDDEN), "column"),
            (p + "v", (KV_HEADS * HEAD_DIM, HIDDEN), "column"),
            (p + "o", (HIDDEN, HEADS * HEAD_DIM), "row"),
            (p + "gate", (INTERMEDIATE, HIDDEN), "column"),
            (p + "up", (INTERMEDIATE, HIDDEN), "column"),
            (p + "down", (HIDDEN, INTERMEDIATE), "row"),
        ]
    return out


def values(seed, index, shape):
    """The deterministic bf16 values of tensor `index` for `seed`, on the CPU."""
    generator = torch.Generator().manual_seed(seed * 100003 + index)
    return torch.randn(shape, generator=generator).to(torch.bfloat16)


def shard_box(shape, style, tp, tp_rank):
    lo, hi = [0] * len(shape), list(shape)
    axis = {"column": 0, "row": 1}.get(style)
    if axis is not None and axis < len(shape) and tp > 1:
        lo[axis], hi[axis] = tp_rank * shape[axis] // tp, (tp_rank + 1) * shape[axis] // tp
    return lo, hi


def flat_partition(numel, world, rank):
    p = math.ceil(numel / world)
    begin = rank * p
    return begin, begin + max(0, min(numel - begin, p))
