"""The PyTorch baselines of the sync benchmark, one process per GPU (NCCL), and the
link and memory speeds the floor uses, measured in the same run:

- gather: DeepSpeed's GatheredParameters + slice, one all_gather per parameter;
- bucketed gather: one all_gather per 512 MiB bucket of partitions, then the slices;
- bucketed point-to-point: each rank sends every peer exactly the elements of its
  ZeRO-3 partitions that the peer's TP shard holds (at most three strided pieces per
  parameter and peer, `models.pieces`), in 256 MiB buckets with batched isend/irecv,
  and copies its own elements locally.

Every baseline's arena is compared bit for bit with the gather's. Without GPUs (a
development check) the same code runs on the CPU with gloo, on the small model:
  cd bench/sync && PYTHONPATH=../../dist/python python3 -c "import baselines;
  print(baselines.measure({'t': ('qwen3-tiny', 2, None)}, 1, world=4))"
"""

import math
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import models
import shardsync

GPU = torch.cuda.is_available()


def synchronize():
    if GPU:
        torch.cuda.synchronize()


def timed(fn, repeats):
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        synchronize()
        dist.barrier()
        start = time.perf_counter()
        fn()
        synchronize()
        dist.barrier()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def wire(tensor):
    """What goes over the network: the bf16 bits as float16 (gloo has no bfloat16)."""
    return tensor if GPU else tensor.view(torch.float16)


def all_gather_flat(out, part):
    """out = every rank's `part`, back to back (gloo has no all_gather_into_tensor)."""
    if GPU:
        dist.all_gather_into_tensor(out, part)
    else:
        dist.all_gather(list(wire(out).chunk(dist.get_world_size())), wire(part))


def peak_reset():
    """Starts counting peak memory from now; returns what is allocated now."""
    if not GPU:
        return 0
    torch.cuda.reset_peak_memory_stats()
    return torch.cuda.memory_allocated()


def peak_bytes(base):
    return torch.cuda.max_memory_allocated() - base if GPU else 0


def worker(rank, world, init, cases, repeats, results):
    if GPU:
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl", init_method=init, rank=rank, world_size=world,
                                device_id=torch.device("cuda", rank))
    else:
        dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    device = "cuda" if GPU else "cpu"
    out = {}
    if GPU and world > 1:  # link: 1 GiB each way at once with the next rank, as rounds run
        a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        link = timed(lambda: [w.wait() for w in dist.batch_isend_irecv(
            [dist.P2POp(dist.isend, a, (rank + 1) % world), dist.P2POp(dist.irecv, b, (rank - 1) % world)])], repeats)
        out["link_gbps"] = (1 << 30) / link / 1e9
        a = b = None
    if GPU:  # memory: an on-GPU copy
        big = torch.empty(4 << 30, dtype=torch.uint8, device=device)
        big2 = torch.empty_like(big)
        copy = timed(lambda: big2.copy_(big), repeats)
        out["memory_gbps"] = 2 * (4 << 30) / copy / 1e9
        big = big2 = None
    for name, (model, tp, targets) in cases.items():
        targets = targets or list(range(world))  # consecutive groups of tp: the replicas
        tp_of = {q: i % tp for i, q in enumerate(targets)}  # a target rank's TP rank
        tensors = models.tensors(model)
        # DeepSpeed ZeRO-3: each parameter's partition padded to p = ceil(n / world).
        parts, at = [], 0
        for pname, shape, style, _ in tensors:
            p = math.ceil(math.prod(shape) / world)
            parts.append((pname, shape, style, p, at))
            at += p
        flat = torch.randn(at, device=device).to(torch.bfloat16)
        tp_rank = tp_of.get(rank)  # None: this rank holds no rollout weights

        def shard_shape(shape, style, q):
            lo, hi = shardsync.tp_shard_box(shape, models.STYLE_AXIS.get(style), tp, q)
            return [h - l for l, h in zip(lo, hi)]

        arena = {pname: torch.empty(shard_shape(shape, style, tp_rank), dtype=torch.bfloat16, device=device)
                 for pname, shape, style, _, _ in parts} if tp_rank is not None else {}

        def place(pname, shape, style, full):
            if tp_rank is None:
                return
            lo, hi = shardsync.tp_shard_box(shape, models.STYLE_AXIS.get(style), tp, tp_rank)
            arena[pname].copy_(full.view(shape)[tuple(slice(l, h) for l, h in zip(lo, hi))])

        def gather_each():
            for pname, shape, style, p, off in parts:
                full = torch.empty(p * world, dtype=torch.bfloat16, device=device)
                all_gather_flat(full, flat[off:off + p])
                place(pname, shape, style, full[:math.prod(shape)])

        def gather_buckets(bucket_bytes=512 << 20):
            start = 0
            while start < len(parts):
                end, size = start, 0
                while end < len(parts) and (size == 0 or (size + parts[end][3]) * 2 * world <= bucket_bytes):
                    size += parts[end][3]
                    end += 1
                off0 = parts[start][4]
                gathered = torch.empty(world, size, dtype=torch.bfloat16, device=device)
                all_gather_flat(gathered.view(-1), flat[off0:off0 + size])
                for pname, shape, style, p, off in parts[start:end]:
                    full = gathered[:, off - off0:off - off0 + p].reshape(-1)[:math.prod(shape)]
                    place(pname, shape, style, full)
                start = end

        # Point to point: per parameter and peer, views of what to send (from this rank's
        # partition) and where received elements go (in this rank's shard), made once.
        def run_view(tensor, start, length, rows):
            if rows is None:
                return tensor[start:start + length]
            n, stride = rows
            return tensor.as_strided((n, length), (stride, 1), tensor.storage_offset() + start)

        buckets, bucket, size = [], [], 0
        for entry in parts:
            bucket.append(entry)
            size += entry[3] * 2
            if size >= 256 << 20:
                buckets.append(bucket)
                bucket, size = [], 0
        if bucket:
            buckets.append(bucket)
        plans = []
        for bucket in buckets:
            sends = {q: [] for q in range(world) if q != rank}
            receives = {s: [] for s in range(world) if s != rank}
            local = []
            for pname, shape, style, p, off in bucket:
                n = math.prod(shape)
                mine = flat[off:off + p]
                if tp_rank is not None:
                    shard_flat = arena[pname].view(-1)
                    shard_cols = shard_shape(shape, style, tp_rank)[-1] if len(shape) > 1 else 1
                for q, q_tp in tp_of.items():
                    runs = models.pieces(shape, style, tp, q_tp, rank * p, min((rank + 1) * p, n))
                    if q == rank:
                        for start, rows, length, stride, dst in runs:
                            local.append((run_view(mine, start - rank * p, length, (rows, stride) if rows > 1 else None),
                                          run_view(shard_flat, dst, length, (rows, shard_cols) if rows > 1 else None)))
                    else:
                        for start, rows, length, stride, dst in runs:
                            sends[q].append(run_view(mine, start - rank * p, length, (rows, stride) if rows > 1 else None))
                if tp_rank is None:
                    continue  # nothing to receive here
                for s in range(world):
                    if s == rank:
                        continue
                    runs = models.pieces(shape, style, tp, tp_rank, s * p, min((s + 1) * p, n))
                    for start, rows, length, stride, dst in runs:
                        receives[s].append(run_view(shard_flat, dst, length, (rows, shard_cols) if rows > 1 else None))
            plans.append((sends, receives, local))

        def p2p_buckets():
            for sends, receives, local in plans:
                ops, unpack = [], []
                for q, views_q in sends.items():
                    if views_q:
                        ops.append(dist.P2POp(dist.isend, wire(torch.cat([v.reshape(-1) for v in views_q])), q))
                for s, views_s in receives.items():
                    if views_s:
                        buffer = torch.empty(sum(v.numel() for v in views_s), dtype=torch.bfloat16, device=device)
                        ops.append(dist.P2POp(dist.irecv, wire(buffer), s))
                        unpack.append((buffer, views_s))
                requests = dist.batch_isend_irecv(ops) if ops else []
                for src, dst in local:  # beside the transfers
                    dst.copy_(src)
                for r in requests:
                    r.wait()
                for buffer, views_s in unpack:
                    at = 0
                    for v in views_s:
                        v.copy_(buffer[at:at + v.numel()].view(v.shape))
                        at += v.numel()

        entry = {}
        for label, fn in (("gather", gather_each), ("bucketed_gather", gather_buckets), ("bucketed_p2p", p2p_buckets)):
            for t in arena.values():
                t.fill_(float("nan"))
            base = peak_reset()  # the arena and earlier results are not the baseline's
            entry[label] = timed(fn, repeats)
            entry[label + "_peak_bytes"] = peak_bytes(base)
            synchronize()
            result = {k: v.clone() for k, v in arena.items()}
            if label == "gather":
                reference = result
            else:  # bit for bit the gather's result
                same = all(torch.equal(result[k].view(torch.int16), reference[k].view(torch.int16)) for k in arena)
                entry[label + "_check"] = "ok" if same else "MISMATCH"
        out[name] = entry
        flat = arena = plans = reference = None  # free the memory before the next case
        if GPU:
            torch.cuda.empty_cache()
    results[rank] = out
    dist.destroy_process_group()


def measure(cases, repeats, world=2):
    """cases: name -> (model, tp, target ranks or None for all). Returns every rank's results."""
    manager = mp.Manager()
    results = manager.dict()
    init = f"file://{tempfile.mktemp(prefix='ss-bench-')}"
    mp.spawn(worker, args=(world, init, cases, repeats, results), nprocs=world, join=True)
    return dict(results)
