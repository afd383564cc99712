"""Qwen3 parameter shapes as the HF checkpoints name them (no download), and the
rollout layouts the sync benchmark moves them into."""

import math

CONFIGS = {  # hidden, intermediate, layers, heads, kv heads, head dim, vocab, tied
    "qwen3-1.7b": (2048, 6144, 28, 16, 8, 128, 151936, True),
    "qwen3-8b": (4096, 12288, 36, 32, 8, 128, 151936, False),
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


def shard_box(shape, style, tp, tp_rank):
    lo, hi = [0] * len(shape), list(shape)
    axis = {"column": 0, "row": 1}.get(style)
    if axis is not None and tp > 1:
        lo[axis], hi[axis] = tp_rank * shape[axis] // tp, (tp_rank + 1) * shape[axis] // tp
    return lo, hi


def flat_partition(numel, world, rank):
    p = math.ceil(numel / world)
    begin = rank * p
    return begin, begin + max(0, min(numel - begin, p))
