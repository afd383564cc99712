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


def values(seed, index, shape, varied=False):
    """The deterministic bf16 values of tensor `index` for `seed`, on the CPU. `varied`
    (2-D tensors): each 128 x 128 block scaled by its own power of two from 2^-130 (bf16
    subnormals) to 2^20, about one block in six all zeros, one element in ten zero."""
    generator = torch.Generator().manual_seed(seed * 100003 + index)
    out = torch.randn(shape, generator=generator)
    if varied and len(shape) == 2:
        blocks = ((shape[0] + 127) // 128, (shape[1] + 127) // 128)
        exponents = torch.randint(-130, 21, blocks, generator=generator).float()
        exponents[torch.rand(blocks, generator=generator) < 1 / 6] = float("-inf")  # 2^-inf: all zero
        factor = torch.exp2(exponents).repeat_interleave(128, 0).repeat_interleave(128, 1)[:shape[0], :shape[1]]
        out = out * factor * (torch.rand(shape, generator=generator) >= 0.1)
    return out.to(torch.bfloat16)


def quantized(name, shape):
    """Whether the float8 rollout holds this tensor block-quantized (vLLM's linear layers)."""
    return len(shape) == 2 and name != "embed"


# The axis each TP style splits (vLLM: column-parallel splits rows, row-parallel columns).
STYLE_AXIS = {"column": 0, "row": 1}
