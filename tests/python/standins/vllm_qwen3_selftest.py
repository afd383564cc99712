"""Self-test of the vLLM Qwen3 / Qwen3-MoE stand-in (vllm_qwen3.py).

Loads random full checkpoints into every rank at several tensor-parallel sizes and compares
parameters with expectations written here from the layout facts alone (never from the
stand-in's own helpers): rank r's qkv rows are its q heads, then the k and v rows of kv
head group r // replicas; gate_up is gate block r then up block r; o_proj/down_proj take a
block of columns; the vocabulary is padded to a multiple of 64 and split in equal blocks,
rows past the real vocabulary zero; experts are tensor-split or, under expert
parallelism, handed out in contiguous blocks (the remainder to the first ranks).

Run: /usr/bin/python3 tests/python/standins/vllm_qwen3_selftest.py
Prints "N passed, M failed" and exits non-zero on any failure.
"""

import os
import sys
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import vllm_qwen3 as standin  # noqa: E402

PASSED, FAILED = [], []


def check(label, condition, detail=""):
    (PASSED if condition else FAILED).append(label)
    if not condition:
        print(f"FAIL {label} {detail}")


def case(label, fn):
    try:
        fn()
    except Exception:  # a crash is one failure, the other cases still run
        FAILED.append(label)
        print(f"FAIL {label}: raised")
        traceback.print_exc()


def same(a, b):
    return a.shape == b.shape and torch.equal(a.to(torch.float64), b.to(torch.float64))


def random_checkpoint(config, seed):
    gen = torch.Generator().manual_seed(seed)
    return {name: torch.randn(*shape, generator=gen, dtype=torch.float64) + 3.0  # never 0 or NaN
            for name, shape in standin.checkpoint_shapes(config).items()}


def load_rank(config, ckpt, rank, tp, ep=False, dtype=torch.float64, nan_probe=True):
    """One rank's stand-in loaded with `ckpt`. With nan_probe, every parameter's .data is
    first swapped for a NaN tensor (as shardsync's probe swaps it) so unwritten elements
    show."""
    model = standin.Qwen3ForCausalLM(config, tp_rank=rank, tp_size=tp, enable_expert_parallel=ep, dtype=dtype)
    if nan_probe:
        for _, p in model.named_parameters():
            p.data = torch.full(tuple(p.shape), float("nan"), dtype=torch.float64)
    model.load_weights(iter(list(ckpt.items())))
    return model, dict(model.named_parameters())


DENSE = dict(vocab_size=150, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=2, head_dim=8)
MOE = dict(DENSE, num_experts=4, moe_intermediate_size=16)
VOCAB_PADDED = 192  # 150 rounded up to a multiple of 64


def check_attention(tag, cfg, ckpt, params, r, tp):
    nh, nkv, hd = cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim
    q_heads = nh // tp                      # q heads per rank
    kv_heads = max(1, nkv // tp)            # kv heads per rank
    replicas = max(1, tp // nkv)            # ranks sharing one kv head
    kv_first = (r // replicas) * kv_heads   # first kv head of this rank
    for layer in range(cfg.num_hidden_layers):
        p, c = f"model.layers.{layer}.self_attn.", f"model.layers.{layer}.self_attn."
        qkv = params[p + "qkv_proj.weight"]
        check(f"{tag} L{layer} qkv shape", tuple(qkv.shape) == ((q_heads + 2 * kv_heads) * hd, cfg.hidden_size))
        q_rows = q_heads * hd
        kv_rows = kv_heads * hd
        check(f"{tag} L{layer} qkv q rows",
              same(qkv[:q_rows], ckpt[c + "q_proj.weight"][r * q_rows:(r + 1) * q_rows]))
        check(f"{tag} L{layer} qkv k rows (kv head {kv_first})",
              same(qkv[q_rows:q_rows + kv_rows], ckpt[c + "k_proj.weight"][kv_first * hd:kv_first * hd + kv_rows]))
        check(f"{tag} L{layer} qkv v rows",
              same(qkv[q_rows + kv_rows:], ckpt[c + "v_proj.weight"][kv_first * hd:kv_first * hd + kv_rows]))
        o_cols = nh * hd // tp
        check(f"{tag} L{layer} o_proj columns",
              same(params[p + "o_proj.weight"], ckpt[c + "o_proj.weight"][:, r * o_cols:(r + 1) * o_cols]))
        for norm in ("q_norm", "k_norm"):
            check(f"{tag} L{layer} {norm} whole", same(params[p + norm + ".weight"], ckpt[c + norm + ".weight"]))
        for norm in ("input_layernorm", "post_attention_layernorm"):
            name = f"model.layers.{layer}.{norm}.weight"
            check(f"{tag} L{layer} {norm} whole", same(params[name], ckpt[name]))


def check_vocab(tag, ckpt_tensor, param, r, tp, vocab):
    rows = VOCAB_PADDED // tp
    start = r * rows
    real = max(0, min(start + rows, vocab) - start)
    check(f"{tag} shape", tuple(param.shape) == (rows, ckpt_tensor.shape[1]))
    check(f"{tag} real rows [{start}, {start + real})", same(param[:real], ckpt_tensor[start:start + real]))
    check(f"{tag} {rows - real} pad rows zero", bool((param[real:] == 0).all()))


def check_no_nan(tag, params):
    holes = [n for n, p in params.items() if torch.isnan(p.data).any()]
    check(f"{tag} every element written", not holes, str(holes))


def dense_cases():
    for tied in (False, True):
        cfg = standin.Qwen3Config(**DENSE, tie_word_embeddings=tied)
        ckpt = random_checkpoint(cfg, seed=1 + tied)
        if tied:  # a tied checkpoint that still carries lm_head.weight: it must be skipped
            ckpt["lm_head.weight"] = torch.full((cfg.vocab_size, cfg.hidden_size), -7.0, dtype=torch.float64)
        for tp in (1, 2, 4):
            for r in range(tp):
                tag = f"dense tied={tied} tp{tp} r{r}"

                def run(cfg=cfg, ckpt=ckpt, tp=tp, r=r, tag=tag, tied=tied):
                    model, params = load_rank(cfg, ckpt, r, tp)
                    check_no_nan(tag, params)
                    check_attention(tag, cfg, ckpt, params, r, tp)
                    inter = cfg.intermediate_size // tp
                    for layer in range(cfg.num_hidden_layers):
                        c = f"model.layers.{layer}.mlp."
                        gu = params[c + "gate_up_proj.weight"]
                        check(f"{tag} L{layer} gate_up shape", tuple(gu.shape) == (2 * inter, cfg.hidden_size))
                        check(f"{tag} L{layer} gate rows", same(gu[:inter], ckpt[c + "gate_proj.weight"][r * inter:(r + 1) * inter]))
                        check(f"{tag} L{layer} up rows", same(gu[inter:], ckpt[c + "up_proj.weight"][r * inter:(r + 1) * inter]))
                        check(f"{tag} L{layer} down columns",
                              same(params[c + "down_proj.weight"], ckpt[c + "down_proj.weight"][:, r * inter:(r + 1) * inter]))
                    check_vocab(f"{tag} embed", ckpt["model.embed_tokens.weight"],
                                params["model.embed_tokens.weight"], r, tp, cfg.vocab_size)
                    check(f"{tag} norm whole", same(params["model.norm.weight"], ckpt["model.norm.weight"]))
                    if tied:
                        check(f"{tag} no lm_head parameter", "lm_head.weight" not in params)
                        check(f"{tag} lm_head is the embedding", model.lm_head is model.model.embed_tokens)
                    else:
                        check_vocab(f"{tag} lm_head", ckpt["lm_head.weight"], params["lm_head.weight"], r, tp, cfg.vocab_size)
                    if tp == 4:
                        qkv = model.model.layers[0].self_attn.qkv_proj
                        check(f"{tag} kv replicas attr", qkv.num_kv_head_replicas == 2 and qkv.num_kv_heads == 1)
                        w = params["model.layers.0.self_attn.qkv_proj.weight"]
                        check(f"{tag} param attrs", w.output_dim == 0 and w.input_dim == 1 and w.tp_rank == r and w.tp_size == 4)
                case(tag, run)


def moe_cases():
    runs = [(4, tp, False) for tp in (1, 2, 4)] + [(4, 2, True), (5, 2, True)]
    for experts, tp, ep in runs:
        cfg = standin.Qwen3Config(**dict(MOE, num_experts=experts))
        ckpt = random_checkpoint(cfg, seed=10 + experts + tp)
        # Design: under EP, rank r holds a contiguous block; sizes base(+1 for the first
        # `remainder` ranks).
        base, rem = divmod(experts, tp)
        for r in range(tp):
            tag = f"moe E{experts} tp{tp}{' ep' if ep else ''} r{r}"
            if ep:
                local = list(range(r * base + min(r, rem), r * base + min(r, rem) + base + (1 if r < rem else 0)))
                moe_tp, moe_rank = 1, 0
            else:
                local = list(range(experts))
                moe_tp, moe_rank = tp, r
            inter = cfg.moe_intermediate_size // moe_tp

            def run(cfg=cfg, ckpt=ckpt, tp=tp, r=r, ep=ep, tag=tag, local=local, inter=inter, moe_rank=moe_rank):
                model, params = load_rank(cfg, ckpt, r, tp, ep=ep)
                check_no_nan(tag, params)
                check_attention(tag, cfg, ckpt, params, r, tp)
                for layer in range(cfg.num_hidden_layers):
                    p = f"model.layers.{layer}.mlp."
                    w13, w2 = params[p + "experts.w13_weight"], params[p + "experts.w2_weight"]
                    check(f"{tag} L{layer} w13 shape", tuple(w13.shape) == (len(local), 2 * inter, cfg.hidden_size))
                    check(f"{tag} L{layer} w2 shape", tuple(w2.shape) == (len(local), cfg.hidden_size, inter))
                    rows = slice(moe_rank * inter, (moe_rank + 1) * inter)
                    for j, g in enumerate(local):
                        e = f"{p}experts.{g}."
                        check(f"{tag} L{layer} w13[{j}] gate of expert {g}", same(w13[j, :inter], ckpt[e + "gate_proj.weight"][rows]))
                        check(f"{tag} L{layer} w13[{j}] up of expert {g}", same(w13[j, inter:], ckpt[e + "up_proj.weight"][rows]))
                        check(f"{tag} L{layer} w2[{j}] down of expert {g}", same(w2[j], ckpt[e + "down_proj.weight"][:, rows]))
                    check(f"{tag} L{layer} router whole", same(params[p + "gate.weight"], ckpt[p + "gate.weight"]))
                    fm = model.model.layers[layer].mlp.experts
                    if ep:
                        expect = [local.index(g) if g in local else -1 for g in range(cfg.num_experts)]
                        check(f"{tag} L{layer} expert_map", fm.expert_map is not None and fm.expert_map.tolist() == expect,
                              str(None if fm.expert_map is None else fm.expert_map.tolist()))
                        check(f"{tag} L{layer} moe tp 1", fm.tp_size == 1 and fm.ep_size == tp and fm.ep_rank == r)
                    else:
                        check(f"{tag} L{layer} no expert_map", fm.expert_map is None and fm.tp_size == tp and fm.tp_rank == r)
                check_vocab(f"{tag} embed", ckpt["model.embed_tokens.weight"], params["model.embed_tokens.weight"],
                            r, tp, cfg.vocab_size)
                check_vocab(f"{tag} lm_head", ckpt["lm_head.weight"], params["lm_head.weight"], r, tp, cfg.vocab_size)
            case(tag, run)


def expect_raise(label, fn, kinds=(AssertionError, ValueError, KeyError, RuntimeError)):
    try:
        fn()
    except kinds:
        PASSED.append(label)
        return
    except Exception as exc:  # noqa: BLE001
        FAILED.append(label)
        print(f"FAIL {label}: unexpected {type(exc).__name__}: {exc}")
        return
    FAILED.append(label)
    print(f"FAIL {label}: did not raise")


def other_cases():
    dense = standin.Qwen3Config(**DENSE)
    moe = standin.Qwen3Config(**MOE)

    def shapes():
        s = standin.checkpoint_shapes(dense)
        check("checkpoint_shapes dense q/k/o/gate/down",
              s["model.layers.0.self_attn.q_proj.weight"] == (32, 32) and s["model.layers.1.self_attn.k_proj.weight"] == (16, 32)
              and s["model.layers.0.self_attn.o_proj.weight"] == (32, 32) and s["model.layers.0.mlp.gate_proj.weight"] == (48, 32)
              and s["model.layers.0.mlp.down_proj.weight"] == (32, 48) and s["model.layers.0.self_attn.q_norm.weight"] == (8,))
        check("checkpoint_shapes dense count", len(s) == 1 + 2 * 11 + 1 + 1)
        check("checkpoint_shapes order", list(s)[0] == "model.embed_tokens.weight" and list(s)[-1] == "lm_head.weight")
        st = standin.checkpoint_shapes(standin.Qwen3Config(**DENSE, tie_word_embeddings=True))
        check("checkpoint_shapes tied has no lm_head", "lm_head.weight" not in st and len(st) == len(s) - 1)
        sm = standin.checkpoint_shapes(moe)
        check("checkpoint_shapes moe", sm["model.layers.0.mlp.gate.weight"] == (4, 32)
              and sm["model.layers.1.mlp.experts.3.up_proj.weight"] == (16, 32)
              and sm["model.layers.1.mlp.experts.3.down_proj.weight"] == (32, 16)
              and "model.layers.0.mlp.gate_proj.weight" not in sm and len(sm) == 1 + 2 * (8 + 1 + 12) + 2)
        check("checkpoint_shapes deterministic", list(s) == list(standin.checkpoint_shapes(dense)))
    case("checkpoint_shapes", shapes)

    def bf16():
        ckpt = random_checkpoint(dense, seed=5)
        model, params = load_rank(dense, ckpt, 1, 2, dtype=torch.bfloat16, nan_probe=False)
        w = params["model.layers.0.mlp.down_proj.weight"]
        check("bf16 dtype", w.dtype == torch.bfloat16 and params["model.norm.weight"].dtype == torch.bfloat16)
        check("bf16 values", same(w, ckpt["model.layers.0.mlp.down_proj.weight"][:, 24:48].to(torch.bfloat16)))
        loaded = model.load_weights(ckpt.items())
        check("load_weights returns vLLM param names", "model.layers.0.self_attn.qkv_proj.weight" in loaded
              and "lm_head.weight" in loaded and "model.layers.0.self_attn.q_proj.weight" not in loaded)
    case("bf16", bf16)

    def swap_without_nan():
        # shardsync's probe: swap .data for float64 zeros, then load; pad rows end zero, the
        # original storage is untouched.
        model = standin.Qwen3ForCausalLM(dense, tp_rank=3, tp_size=4)
        original = model.model.embed_tokens.weight.data
        marker = original.clone()
        model.model.embed_tokens.weight.data = torch.full((48, 32), 9.0, dtype=torch.float64)
        model.load_weights([("model.embed_tokens.weight", torch.ones(150, 32, dtype=torch.float64))])
        w = model.model.embed_tokens.weight
        check("swap: rows 144..149 written", bool((w[:6] == 1).all()))
        check("swap: pad rows refilled with 0", bool((w[6:] == 0).all()))
        check("swap: original storage untouched",
              torch.equal(original.view(torch.int16), marker.view(torch.int16)))
    case("swap", swap_without_nan)

    def bad(name, shape, cfg=dense, tp=2, ep=False):
        model = standin.Qwen3ForCausalLM(cfg, tp_rank=1, tp_size=tp, enable_expert_parallel=ep, dtype=torch.float64)
        model.load_weights([(name, torch.zeros(*shape, dtype=torch.float64))])

    expect_raise("raise: q_proj too few rows", lambda: bad("model.layers.0.self_attn.q_proj.weight", (24, 32)))
    expect_raise("raise: q_proj wrong hidden", lambda: bad("model.layers.0.self_attn.q_proj.weight", (32, 31)))
    expect_raise("raise: k_proj wrong hidden", lambda: bad("model.layers.0.self_attn.k_proj.weight", (16, 33)))
    expect_raise("raise: o_proj wrong rows", lambda: bad("model.layers.0.self_attn.o_proj.weight", (31, 32)))
    expect_raise("raise: gate_proj wrong hidden", lambda: bad("model.layers.0.mlp.gate_proj.weight", (48, 30)))
    expect_raise("raise: down_proj wrong rows", lambda: bad("model.layers.0.mlp.down_proj.weight", (30, 48)))
    expect_raise("raise: embed wrong vocab", lambda: bad("model.embed_tokens.weight", (151, 32)))
    expect_raise("raise: lm_head wrong hidden", lambda: bad("lm_head.weight", (150, 31)))
    expect_raise("raise: norm wrong size", lambda: bad("model.norm.weight", (31,)))
    expect_raise("raise: q_norm wrong size", lambda: bad("model.layers.0.self_attn.q_norm.weight", (16,)))
    expect_raise("raise: unknown name", lambda: bad("model.layers.0.mlp.nonexistent.weight", (3,)))
    expect_raise("raise: unknown top-level name", lambda: bad("something.weight", (3,)))
    expect_raise("raise: router wrong size", lambda: bad("model.layers.0.mlp.gate.weight", (5, 32), cfg=moe))
    expect_raise("raise: expert up wrong hidden", lambda: bad("model.layers.0.mlp.experts.2.up_proj.weight", (16, 31), cfg=moe))
    expect_raise("raise: expert down wrong rows (ep)",
                 lambda: bad("model.layers.0.mlp.experts.2.down_proj.weight", (31, 16), cfg=moe, ep=True))
    expect_raise("raise: tp 8 > 4 experts", lambda: standin.Qwen3ForCausalLM(
        standin.Qwen3Config(**dict(MOE, num_attention_heads=8, num_key_value_heads=8)), tp_rank=0, tp_size=8))
    expect_raise("raise: heads not divisible", lambda: standin.Qwen3ForCausalLM(dense, tp_rank=0, tp_size=3))

    def ep_nonlocal_skipped():
        # Under EP an expert of another rank is ignored, not an error.
        model = standin.Qwen3ForCausalLM(moe, tp_rank=1, tp_size=2, enable_expert_parallel=True, dtype=torch.float64)
        w = model.model.layers[0].mlp.experts.w13_weight
        w.data = torch.zeros(tuple(w.shape), dtype=torch.float64)
        model.load_weights([("model.layers.0.mlp.experts.0.gate_proj.weight", torch.ones(16, 32, dtype=torch.float64))])
        check("ep: non-local expert leaves w13 untouched", bool((w == 0).all()))
        model.load_weights([("model.layers.0.mlp.experts.3.gate_proj.weight", torch.ones(16, 32, dtype=torch.float64))])
        check("ep: local expert 3 -> w13[1] first half", bool((w[1, :16] == 1).all()) and bool((w[1, 16:] == 0).all())
              and bool((w[0] == 0).all()))
    case("ep non-local", ep_nonlocal_skipped)

    def tensor_count():
        # Parameter inventory (vLLM names) for one MoE rank.
        model = standin.Qwen3ForCausalLM(moe, tp_rank=0, tp_size=2)
        names = [n for n, _ in model.named_parameters()]
        expect = ["model.embed_tokens.weight"]
        for i in range(2):
            expect += [f"model.layers.{i}.self_attn.{x}.weight" for x in ("qkv_proj", "o_proj", "q_norm", "k_norm")]
            expect += [f"model.layers.{i}.mlp.experts.w13_weight", f"model.layers.{i}.mlp.experts.w2_weight",
                       f"model.layers.{i}.mlp.gate.weight",
                       f"model.layers.{i}.input_layernorm.weight", f"model.layers.{i}.post_attention_layernorm.weight"]
        expect += ["model.norm.weight", "lm_head.weight"]
        check("moe parameter names", names == expect, str(names))
        check("weight_loader attrs", all(hasattr(p, "weight_loader") for n, p in model.named_parameters()
                                          if "norm" not in n) and not hasattr(model.model.norm.weight, "weight_loader"))
    case("inventory", tensor_count)


def main():
    dense_cases()
    moe_cases()
    other_cases()
    print(f"{len(PASSED)} passed, {len(FAILED)} failed")
    return 1 if FAILED else 0


if __name__ == "__main__":
    sys.exit(main())
