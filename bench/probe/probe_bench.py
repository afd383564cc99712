"""What learning an engine's placements costs (``loader_targets``): the probe of one
tensor-parallel rank of the vLLM stand-in (tests/python/standins, vLLM's loaders) with
Qwen3 shapes, each case in a process of its own. Prints per case the rank's elements,
the peak resident memory the probe added and its time, then the time of registering
again after every parameter's memory moved (the probe reused), and a JSON line per case.
With --one-pass each case runs also with every parameter probed at once (loader_targets'
by_layer=False), right after the probe layer by layer.

    bazel run //bench/probe:probe_bench -- --model qwen3-0.6b --tp 1 4 [--layers N] [--probe-dir DIR] [--one-pass]
"""

import argparse
import json
import math
import resource
import subprocess
import sys
import time
from typing import Optional

MODELS = {  # Hugging Face config.json of each model: the shapes only
    "qwen3-0.6b": dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-1.7b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=28,
                       num_attention_heads=16, num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "qwen3-30b-a3b": dict(vocab_size=151936, hidden_size=2048, intermediate_size=6144, num_hidden_layers=48,
                          num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_experts=128,
                          moe_intermediate_size=768),
}


def one_case(model: str, layers: int, tp: int, probe_dir: Optional[str], by_layer: bool) -> dict:
    """Probes rank 0 of `model` (its first `layers` layers) at `tp`, in this process."""
    from standins import vllm_qwen3
    from shardsync.integrations import loader_targets
    config = vllm_qwen3.Qwen3Config(**{**MODELS[model], "num_hidden_layers": layers})
    engine = vllm_qwen3.Qwen3ForCausalLM(config, tp_rank=0, tp_size=tp)
    shapes = vllm_qwen3.checkpoint_shapes(config)
    elements = sum(p.numel() for p in engine.parameters())
    largest = max(math.prod(shape) for shape in shapes.values())
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    start = time.perf_counter()
    options = {"probe_dir": probe_dir} if probe_dir else {}  # also runs a client from before probe_dir
    if not by_layer:
        options["by_layer"] = False
    _, layouts = loader_targets(engine, engine.load_weights, shapes, **options)
    seconds = time.perf_counter() - start
    added = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    for param in engine.parameters():  # as an engine's sleep and wake, or offload and reload
        param.data = param.data.clone()
    start = time.perf_counter()
    again = loader_targets(engine, engine.load_weights, shapes, **options)[1]
    again_seconds = time.perf_counter() - start
    assert again == layouts, "registering again gave other layouts"
    return {"model": model, "layers": layers, "tp": tp, "probe_dir": probe_dir, "by_layer": by_layer,
            "elements": elements, "largest_tensor": largest,
            "added_bytes": added, "bytes_per_element": added / elements, "seconds": seconds,
            "again_seconds": again_seconds,
            "placements": sum(len(layout.placements) for layout in layouts)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), default="qwen3-0.6b")
    parser.add_argument("--layers", type=int, default=None, help="the model's first N layers (default: all)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 4])
    parser.add_argument("--probe-dir", help="keep the probes in files of this folder (loader_targets' probe_dir)")
    parser.add_argument("--one-pass", action="store_true",
                        help="each case also with every parameter probed at once (by_layer=False)")
    parser.add_argument("--case", nargs=3, metavar=("MODEL", "LAYERS", "TP"), help=argparse.SUPPRESS)
    parser.add_argument("--case-one-pass", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.case:
        print(json.dumps(one_case(args.case[0], int(args.case[1]), int(args.case[2]), args.probe_dir,
                                  not args.case_one_pass)))
        return 0
    layers = args.layers or MODELS[args.model]["num_hidden_layers"]
    print(f"{'case':<36} {'elements':>10} {'added memory':>13} {'per element':>11} {'seconds':>8} {'again':>6}")
    for tp in args.tp:
        for one_pass in [False, True] if args.one_pass else [False]:
            name = f"{args.model} x{layers} tp{tp} rank 0, {'one pass' if one_pass else 'by layer'}"
            command = [sys.executable, __file__, "--case", args.model, str(layers), str(tp)]
            command += ["--probe-dir", args.probe_dir] if args.probe_dir else []
            out = subprocess.run(command + (["--case-one-pass"] if one_pass else []), capture_output=True, text=True)
            if out.returncode != 0:  # a signal is -N: the kernel's OOM killer sends 9
                why = f"killed by signal {-out.returncode}" if out.returncode < 0 else f"exit {out.returncode}"
                print(f"{name}: {why}\n{out.stderr}", file=sys.stderr)
                return 1
            case = json.loads(out.stdout)
            print(f"{name:<36} {case['elements'] / 1e6:>9.1f}M {case['added_bytes'] / 2**20:>9.0f} MiB "
                  f"{case['bytes_per_element']:>9.1f} B {case['seconds']:>8.2f} {case['again_seconds']:>6.2f}")
            print(json.dumps(case))
    return 0


if __name__ == "__main__":
    sys.exit(main())
