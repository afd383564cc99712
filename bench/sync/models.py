"""Qwen3 parameter shapes as the HF checkpoints name them (no download), and the
rollout layouts the sync benchmark moves them into."""

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


# The axis each TP style splits (vLLM: column-parallel splits rows, row-parallel columns).
STYLE_AXIS = {"column": 0, "row": 1}
