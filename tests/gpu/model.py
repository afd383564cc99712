"""The model the GPU tests move: Qwen3-shaped, small, and the layouts both sides hold."""

import torch

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM, LAYERS, VOCAB = 1024, 3072, 16, 8, 64, 2, 2048


def tensors(scale=1):
    """(name, shape, style): style 'column' splits rows, 'row' splits columns."""
    # "odd" has 1030 rows: TP4 shards of 258, 258, 257, 257 (uneven), TP2 of 515.
    out = [("embed", (VOCAB * scale, HIDDEN), "column"), ("odd", (1030, HIDDEN), "column")]
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


# The axis each TP style splits (vLLM: column-parallel splits rows, row-parallel columns).
STYLE_AXIS = {"column": 0, "row": 1}
