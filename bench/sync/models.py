"""Qwen3 parameter shapes as the HF checkpoints name them (no download), and the
rollout layouts the sync benchmark moves them into."""

import math

import shardsync

CONFIGS = {  # hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied
    "qwen3-0.6b": (1024, 3072, 28, 16, 8, 128, 151936, True),  # the main job on GPUs
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936, True),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, False),
    "qwen3-tiny": (64, 192, 2, 4, 2, 16, 1000, False),  # the baselines' CPU check only
}


def tensors(model):
    """(name, shape, style, group): style 'column' splits rows, 'row' columns; group
    names the fused target a tensor lands in (qkv, gate_up) for the fused layout."""
    h, inter, layers, heads, kv, hd, vocab, tied = CONFIGS[model]
    out = [("model.embed_tokens.weight", (vocab, h), "column", None)]
    for l in range(layers):
        p = f"model.layers.{l}."
        out += [
            (p + "input_layernorm.weight", (h,), "replicated", None),
            (p + "self_attn.q_proj.weight", (heads * hd, h), "column", p + "qkv"),
            (p + "self_attn.k_proj.weight", (kv * hd, h), "column", p + "qkv"),
            (p + "self_attn.v_proj.weight", (kv * hd, h), "column", p + "qkv"),
            (p + "self_attn.o_proj.weight", (h, heads * hd), "row", None),
            (p + "self_attn.q_norm.weight", (hd,), "replicated", None),
            (p + "self_attn.k_norm.weight", (hd,), "replicated", None),
            (p + "post_attention_layernorm.weight", (h,), "replicated", None),
            (p + "mlp.gate_proj.weight", (inter, h), "column", p + "gate_up"),
            (p + "mlp.up_proj.weight", (inter, h), "column", p + "gate_up"),
            (p + "mlp.down_proj.weight", (h, inter), "row", None),
        ]
    out.append(("model.norm.weight", (h,), "replicated", None))
    if not tied:
        out.append(("lm_head.weight", (vocab, h), "column", None))
    return out


# The axis each TP style splits (vLLM: column-parallel splits rows, row-parallel columns).
STYLE_AXIS = {"column": 0, "row": 1}


def pieces(shape, style, tp, q, begin, end):
    """The runs of TP rank q's shard that lie in flat elements [begin, end) of the
    parameter, at most three (a partial row, whole rows, a partial row): (flat start,
    rows, row length, row stride, start in q's shard) each."""
    lo, hi = shardsync.tp_shard_box(shape, STYLE_AXIS.get(style), tp, q)
    if STYLE_AXIS.get(style) != 1:  # the shard is one flat range
        inner = math.prod(shape[1:]) if len(shape) > 1 else 1
        first, last = lo[0] * inner, hi[0] * inner
        a, b = max(first, begin), min(last, end)
        return [(a, 1, b - a, 0, a - first)] if a < b else []
    cols, rows = shape[1], shape[0]  # row-split: columns [c0, c1) of every row
    c0, c1 = lo[1], hi[1]
    width = c1 - c0
    whole0 = max(0, -((c0 - begin) // cols))  # first row whose [c0, c1) starts at or after begin
    whole1 = min(rows, (end - c1) // cols + 1) if end >= c1 else 0  # one past the last that ends by end
    runs = []

    def partial(r):
        a, b = max(r * cols + c0, begin), min(r * cols + c1, end)
        if a < b:
            runs.append((a, 1, b - a, cols, r * width + (a - r * cols - c0)))

    first_row, last_row = begin // cols, (end - 1) // cols
    if first_row < whole0 or whole1 <= whole0:
        partial(first_row)
    if whole1 > whole0:
        runs.append((whole0 * cols + c0, whole1 - whole0, width, cols, whole0 * width))
    if last_row >= max(whole1, first_row + 1):
        partial(last_row)
    return runs
