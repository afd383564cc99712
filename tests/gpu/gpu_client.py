"""A trainer or rollout process for the GPU tests: torch CUDA tensors registered with
the agent of its device through CUDA IPC. Lines on stdin drive it:
  refill SEED   trainer: new source values (synchronized before answering)
  refill_late SEED RECORD
                trainer (--ready-event): new source values, each tensor's queued behind a
                25 ms kernel, then the ready event recorded if RECORD is 1; answers
                without waiting
  finish        trainer: waits for its device work
  check SEED    rollout: every arena element against the values of SEED (float8 ones and
                their scales against float8_reference) -> "ok" / "mismatch N"
  graph         rollout: capture a CUDA graph that sums every arena view into one tensor
  replay SEED   rollout: replay the graph; its sums against SEED's -> "ok" / "mismatch"
  address       rollout: the arena's data pointer
  reregister    register again (after the agent restarted)
  exit
"""

import argparse
import sys

import torch

import model
import shardsync
from float8_reference import reference_float8
from shardsync.torch_support import cuda_buffer, event_handle, ready_event

parser = argparse.ArgumentParser()
parser.add_argument("--socket", required=True)
parser.add_argument("--device", type=int, required=True)
parser.add_argument("--rank", type=int, required=True)
parser.add_argument("--role", choices=["trainer", "rollout"], required=True)
parser.add_argument("--zero", type=int, default=3)
parser.add_argument("--dp", type=int, default=1)             # trainer DP world (ranks 0..dp-1)
parser.add_argument("--tp", type=int, default=1)              # rollout TP size
parser.add_argument("--tp-rank", type=int, default=0)
parser.add_argument("--seed", type=int, default=1)
parser.add_argument("--scale", type=int, default=1)
parser.add_argument("--drop", default="")
parser.add_argument("--ready-event", type=int, default=0)  # trainer: register an IPC event
parser.add_argument("--name", default="")  # rollout: names its client id and arena, for a second one on a GPU
# Both sides: model.values(varied=True); the rollout holds the 2-D tensors but the
# embedding block-quantized in float8 (its float32 scales after each in the arena).
parser.add_argument("--float8", type=int, default=0)
args = parser.parse_args()
SUFFIX = f"-{args.name}" if args.name else ""
torch.cuda.set_device(args.device)
device = torch.device("cuda", args.device)
TENSORS = model.tensors(args.scale)


class Trainer:
    """ZeRO-3: each parameter's flat partition, back to back, 256-byte aligned.
    ZeRO-1/2: the whole bf16 flat on every rank."""

    def __init__(self):
        self.parts, at = [], 0
        for i, (name, shape, _) in enumerate(TENSORS):
            numel = int(torch.Size(shape).numel())
            begin, end = (shardsync.flat_partition(numel, args.dp, args.rank) if args.zero == 3 else (0, numel))
            at = (at + 127) // 128 * 128  # elements of bf16: 256 bytes
            self.parts.append((i, name, shape, begin, end, at))
            at += end - begin
        self.flat = torch.empty(at, dtype=torch.bfloat16, device=device)
        self.refill(args.seed)

    def refill(self, seed):
        for i, name, shape, begin, end, at in self.parts:
            if end > begin:
                self.flat[at:at + end - begin].copy_(model.values(seed, i, shape, args.float8).flatten()[begin:end])
        torch.cuda.synchronize()  # the writes are complete before any sync reads them

    def refill_late(self, seed):
        """The new values copied in on the device, each part behind a ~25 ms kernel; returns
        at once (the values are made on the GPU first: a copy from host memory would wait)."""
        values = [(at, model.values(seed, i, shape, args.float8).flatten()[begin:end].to(device))
                  for i, name, shape, begin, end, at in self.parts if end > begin]
        torch.cuda.synchronize()
        for at, part in values:
            torch.cuda._sleep(50_000_000)
            self.flat[at:at + part.numel()].copy_(part, non_blocking=True)
        self.pending = values  # alive until the copies ran

    def layouts(self):
        return [shardsync.tensor_layout(name, shape, "bfloat16", flat_placements=[(begin, end, "flat", at)])
                for i, name, shape, begin, end, at in self.parts if end > begin and name != args.drop]

    def buffers(self):
        return {"flat": cuda_buffer(self.flat)}


class Rollout:
    def __init__(self):
        self.boxes = {name: shardsync.tp_shard_box(shape, model.STYLE_AXIS.get(style), args.tp, args.tp_rank) for name, shape, style in TENSORS}
        self.float8 = {name for name, shape, _ in TENSORS if args.float8 and model.quantized(name, shape)}
        # "odd" in float8 rows one element longer than its shard: rows that are no multiple
        # of 8 bytes apart (the quantizer's element path, not its vector path).
        self.pad = {"odd": 1} if "odd" in self.float8 else {}
        shards = []
        for name, _, _ in TENSORS:
            shard = [h - l for l, h in zip(*self.boxes[name])]
            if name in self.pad:
                shard[1] += self.pad[name]
            shards.append((name, shard, torch.float8_e4m3fn if name in self.float8 else torch.bfloat16))
            if name in self.float8:
                cols = shard[1] - self.pad.get(name, 0)
                shards.append((name + ".scales", [(shard[0] + 127) // 128, (cols + 127) // 128], torch.float32))
        self.arena = shardsync.WeightArena(shards, device, buffer_name="arena" + SUFFIX)
        self.arena.memory.fill_(0xAB)  # poison
        torch.cuda.synchronize()
        self.graph = None

    def layouts(self):
        layouts = []
        for name, shape, _ in TENSORS:
            placement = self.arena.placement(name, *self.boxes[name])
            if name in self.pad:
                placement += ([self.arena.view(name).shape[1], 1],)
            if name in self.float8:
                layouts.append(shardsync.tensor_layout(name, shape, "float8_e4m3", placements=[placement],
                                                       block_scales=[self.arena.block_scales(name + ".scales")]))
            else:
                layouts.append(shardsync.tensor_layout(name, shape, "bfloat16", placements=[placement]))
        return layouts

    def buffers(self):
        return self.arena.buffers()

    def expected(self, seed, i, name, shape):
        lo, hi = self.boxes[name]
        full = model.values(seed, i, shape, args.float8)
        return full[tuple(slice(l, h) for l, h in zip(lo, hi))].to(device)

    def check(self, seed):
        """The number of elements (and scales) that differ, and where the first float8 ones are."""
        mismatched, first = 0, ""
        for i, (name, shape, _) in enumerate(TENSORS):
            got = self.arena.view(name)
            want = self.expected(seed, i, name, shape)
            if name in self.pad:
                got = got[:, :want.shape[1]]
            if name in self.float8:  # against the PyTorch reference quantizer: bits of both
                values = want
                want, scales = reference_float8(values)
                got_scales = self.arena.view(name + ".scales")
                bad_scales = got_scales.view(torch.int32) != scales.view(torch.int32)
                bad = got.view(torch.uint8) != want.view(torch.uint8)
                mismatched += int(bad_scales.sum().item()) + int(bad.sum().item())
                if not first and bool(bad.any() or bad_scales.any()):
                    at = [int(v) for v in bad.nonzero()[0]] if bool(bad.any()) else None
                    block = [int(v) for v in bad_scales.nonzero()[0]] if bool(bad_scales.any()) else None
                    first = (f" {name}: {int(bad.sum())} elements, {int(bad_scales.sum())} scales differ; first "
                             f"element {at}" + (f" value {values[at[0], at[1]].item()!r} got "
                                                f"{got.view(torch.uint8)[at[0], at[1]].item()} want "
                                                f"{want.view(torch.uint8)[at[0], at[1]].item()} scale "
                                                f"{scales[at[0] // 128, at[1] // 128].item()!r}" if at else "") +
                             (f"; first scale {block} got {got_scales[block[0], block[1]].item()!r} want "
                              f"{scales[block[0], block[1]].item()!r}" if block else ""))
                continue
            mismatched += int((got.view(torch.int16) != want.view(torch.int16)).sum().item())
        return mismatched, first

    def capture(self):
        self.sums = torch.zeros(len(TENSORS), dtype=torch.float32, device=device)
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._sum()  # warm up outside the capture
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self._sum()

    def _sum(self):
        for i, (name, _, _) in enumerate(TENSORS):
            self.sums[i] = self.arena.view(name).float().sum()

    def replay(self, seed):
        self.graph.replay()
        torch.cuda.synchronize()
        want = torch.stack([self.expected(seed, i, name, shape).float().sum() for i, (name, shape, _) in enumerate(TENSORS)])
        return torch.equal(self.sums, want)


side = Trainer() if args.role == "trainer" else Rollout()
agent = shardsync.AgentClient(args.socket)
event = ready_event() if args.ready_event else None


def register():
    try:
        return agent.register(f"{args.role}-{args.rank}{SUFFIX}", "source" if args.role == "trainer" else "target",
                              side.buffers(), side.layouts(), timeout=30,
                              ready_event=event_handle(event) if event else None)
    except shardsync.ShardsyncError as error:
        print("refused", error.message, flush=True)
        sys.exit(3)


registration = register()
print("ready", registration.layout_epoch, flush=True)
for line in sys.stdin:
    command = line.split()
    if not command:
        continue
    if command[0] == "refill":
        side.refill(int(command[1]))
        print("refilled", flush=True)
    elif command[0] == "refill_late":
        side.refill_late(int(command[1]))
        if command[2] == "1":
            event.record()
        print("queued", flush=True)
    elif command[0] == "finish":
        torch.cuda.synchronize()
        print("finished", flush=True)
    elif command[0] == "check":
        torch.cuda.synchronize()
        mismatched, where = side.check(int(command[1]))
        print("ok" if mismatched == 0 else f"mismatch {mismatched}{where}", flush=True)
    elif command[0] == "graph":
        side.capture()
        print("captured", flush=True)
    elif command[0] == "replay":
        print("ok" if side.replay(int(command[1])) else "mismatch", flush=True)
    elif command[0] == "address":
        print("address", side.arena.data_ptr(), flush=True)
    elif command[0] == "reregister":
        registration.close()
        registration = register()
        print("ready", registration.layout_epoch, flush=True)
    elif command[0] == "exit":
        break
registration.close()
