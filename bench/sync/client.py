"""A trainer or rollout process of the sync benchmark and of the main job on GPUs (torch,
one GPU). Commands on stdin: "check SEED" -> "ok" / "mismatch N" (rollout); "refill SEED"
-> "refilled" (trainer: the values of SEED, written and synchronized); "memory" -> bytes
allocated now and the peak; "exit"."""

import argparse
import math
import sys

import torch

import models
import shardsync
from shardsync.torch_support import cuda_buffer

parser = argparse.ArgumentParser()
parser.add_argument("--socket", required=True)
parser.add_argument("--rank", type=int, required=True)
parser.add_argument("--device", type=int, default=None)  # the CUDA device (default: the rank's)
parser.add_argument("--world", type=int, required=True)
parser.add_argument("--role", choices=["trainer", "rollout"], required=True)
parser.add_argument("--model", required=True)
parser.add_argument("--zero", type=int, default=3)
parser.add_argument("--tp", type=int, default=1)
parser.add_argument("--tp-rank", type=int, default=0)  # rollout: this rank's place in its TP group
parser.add_argument("--fused", action="store_true")
parser.add_argument("--seed", type=int, default=1)
# Rollout: the layers' linear weights block-quantized in float8, their float32 scales
# after each in the arena (not with --fused).
parser.add_argument("--float8", action="store_true")
args = parser.parse_args()
if args.float8 and args.fused:
    parser.error("--float8 takes the unfused layout")
if args.float8:  # the checks' oracle, tests/gpu/float8_reference.py (bench/sync/run puts it on the path)
    from float8_reference import reference_float8
torch.cuda.set_device(args.rank if args.device is None else args.device)
device = torch.device("cuda", torch.cuda.current_device())
TENSORS = models.tensors(args.model)


def values(seed, index, shape):
    generator = torch.Generator(device=device).manual_seed(seed * 100003 + index)
    return torch.randn(shape, generator=generator, device=device, dtype=torch.float32).to(torch.bfloat16)


if args.role == "trainer":
    parts, at = [], 0
    for i, (name, shape, _, _) in enumerate(TENSORS):
        numel = math.prod(shape)
        begin, end = shardsync.flat_partition(numel, args.world, args.rank) if args.zero == 3 else (0, numel)
        parts.append((i, name, shape, begin, end, at))
        at += end - begin
    flat = torch.empty(at, dtype=torch.bfloat16, device=device)

    def fill(seed):
        for i, name, shape, begin, end, offset in parts:
            if end > begin:
                flat[offset:offset + end - begin].copy_(values(seed, i, shape).flatten()[begin:end])
        torch.cuda.synchronize()  # written before the sync reads them

    fill(args.seed)
    layouts = [shardsync.tensor_layout(name, shape, "bfloat16", flat_placements=[(begin, end, "flat", offset)])
               for i, name, shape, begin, end, offset in parts if end > begin]
    buffers = {"flat": cuda_buffer(flat)}
else:
    tp_rank = args.tp_rank
    boxes = {name: shardsync.tp_shard_box(shape, models.STYLE_AXIS.get(style), args.tp, tp_rank) for name, shape, style, _ in TENSORS}
    # The arena holds one view per tensor, or per fused group with its members' shards
    # stacked by rows in order. place[name] = (view key, first row in that view).
    place, shards = {}, {}
    for name, shape, style, group in TENSORS:
        lo, hi = boxes[name]
        extent = [h - l for l, h in zip(lo, hi)]
        key = group if args.fused and group else name
        if key in shards:
            place[name] = (key, shards[key][0])
            shards[key][0] += extent[0]
        else:
            place[name] = (key, 0)
            shards[key] = extent
    float8 = {name for name, shape, _, _ in TENSORS if args.float8 and ".layers." in name and len(shape) == 2}
    views = []
    for key, extent in shards.items():
        views.append((key, tuple(extent), torch.float8_e4m3fn if key in float8 else torch.bfloat16))
        if key in float8:
            views.append((key + ".scales", ((extent[0] + 127) // 128, (extent[1] + 127) // 128), torch.float32))
    arena = shardsync.WeightArena(views, device)
    arena.memory.fill_(0xAB)
    layouts = []
    for name, shape, style, group in TENSORS:
        key, row = place[name]
        lo, hi = boxes[name]
        if name in float8:
            layouts.append(shardsync.tensor_layout(name, shape, "float8_e4m3", placements=[arena.placement(name, lo, hi)],
                                                   block_scales=[arena.block_scales(name + ".scales")]))
            continue
        row_elements = math.prod(hi[k] - lo[k] for k in range(1, len(shape)))
        base = arena.offsets[key][0] // 2 + row * row_elements
        layouts.append(shardsync.tensor_layout(name, shape, "bfloat16", placements=[(lo, hi, "arena", base)]))
    buffers = arena.buffers()
    torch.cuda.synchronize()


def check(seed):
    mismatched = 0
    for i, (name, shape, _, _) in enumerate(TENSORS):
        key, row = place[name]
        lo, hi = boxes[name]
        got = arena.view(key)[row:row + hi[0] - lo[0]]
        want = values(seed, i, shape)[tuple(slice(l, h) for l, h in zip(lo, hi))]
        if name in float8:  # against the PyTorch reference quantizer (tests/gpu/float8_reference.py)
            want, scales = reference_float8(want)
            mismatched += int((arena.view(name + ".scales").view(torch.int32) != scales.view(torch.int32)).sum().item())
            mismatched += int((got.view(torch.uint8) != want.view(torch.uint8)).sum().item())
            continue
        mismatched += int((got.reshape(want.shape).view(torch.int16) != want.view(torch.int16)).sum().item())
    return mismatched


registration = shardsync.AgentClient(args.socket).register(
    f"{args.role}-{args.rank}", "source" if args.role == "trainer" else "target", buffers, layouts, timeout=120)
print("ready", flush=True)
torch.cuda.reset_peak_memory_stats()
base_memory = torch.cuda.memory_allocated()
for line in sys.stdin:
    command = line.split()
    if command and command[0] == "check":
        torch.cuda.synchronize()
        n = check(int(command[1]))
        print("ok" if n == 0 else f"mismatch {n}", flush=True)
    elif command and command[0] == "refill" and args.role == "trainer":
        fill(int(command[1]))
        print("refilled", flush=True)
    elif command and command[0] == "memory":
        print("memory", torch.cuda.max_memory_allocated() - base_memory, flush=True)
    elif command and command[0] == "exit":
        break
registration.close()
