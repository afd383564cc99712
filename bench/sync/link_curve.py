"""The link between two GPUs as a sync's rounds use it: 1 GiB each way at once, cut
into chunks of one size and queued back to back, for chunk sizes from 1 MiB to 1 GiB.
Two ways side by side: NCCL send/recv (one batched group per chunk, two processes, as
the agents' NcclTransport does) and the copy engine's peer copies (cudaMemcpyPeerAsync
through torch, one process per direction). Every byte is checked at the end. Prints one line per size and
writes OUT/link_curve.json.
  python3 bench/sync/link_curve.py OUT [--repeats 5]
"""

import argparse
import json
import os
import statistics
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TOTAL = 1 << 30
SIZES = [1 << 20, 4 << 20, 16 << 20, 32 << 20, 64 << 20, 128 << 20, 256 << 20, 1 << 30]


def median_seconds(fn, repeats, sync):
    times = []
    for _ in range(repeats + 1):  # the first is a warm-up
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def nccl_worker(rank, init, repeats, results):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=init, rank=rank, world_size=2, device_id=torch.device("cuda", rank))
    def data(seed):
        generator = torch.Generator(device="cuda").manual_seed(seed)
        return torch.randint(0, 255, (TOTAL,), dtype=torch.uint8, device="cuda", generator=generator)

    send = data(rank)
    receive = torch.empty_like(send)
    peer = 1 - rank

    def barrier_sync():
        torch.cuda.synchronize()
        dist.barrier()

    out = {}
    for size in SIZES:
        def rounds():
            works = []
            for at in range(0, TOTAL, size):
                works += dist.batch_isend_irecv([dist.P2POp(dist.irecv, receive[at:at + size], peer),
                                                 dist.P2POp(dist.isend, send[at:at + size], peer)])
            for w in works:
                w.wait()
        out[size] = TOTAL / median_seconds(rounds, repeats, barrier_sync) / 1e9
    assert torch.equal(receive, data(peer)), f"rank {rank} did not receive its peer's bytes"
    if rank == 0:
        results.update({str(k): v for k, v in out.items()})
    dist.destroy_process_group()


def copy_worker(d, barrier, repeats, results):
    """Pushes GPU d's bytes into a buffer on the other GPU with peer copies, on this
    process's own streams, while the other process pushes the other way."""
    other = 1 - d
    torch.cuda.set_device(d)
    generator = torch.Generator(device=f"cuda:{d}").manual_seed(d)
    source = torch.randint(0, 255, (TOTAL,), dtype=torch.uint8, device=f"cuda:{d}", generator=generator)
    target = torch.empty(TOTAL, dtype=torch.uint8, device=f"cuda:{other}")

    def sync():
        torch.cuda.synchronize(d)
        torch.cuda.synchronize(other)
        barrier.wait()

    out = {}
    for size in SIZES:
        def rounds():
            for at in range(0, TOTAL, size):
                target[at:at + size].copy_(source[at:at + size], non_blocking=True)
        out[size] = TOTAL / median_seconds(rounds, repeats, sync) / 1e9
    assert torch.equal(target.cpu(), source.cpu()), "a peer copy lost bytes"
    results[d] = out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    if torch.cuda.device_count() < 2:
        print("link curve: skipped: fewer than 2 GPUs")
        return 0
    os.makedirs(args.out, exist_ok=True)
    manager = mp.Manager()
    with tempfile.TemporaryDirectory() as tmp:
        results = manager.dict()
        mp.spawn(nccl_worker, args=(f"file://{tmp}/init", args.repeats, results), nprocs=2)
        nccl = {int(k): v for k, v in results.items()}
    results = manager.dict()
    mp.spawn(copy_worker, args=(manager.Barrier(2), args.repeats, results), nprocs=2)
    copies = {s: min(results[0][s], results[1][s]) for s in SIZES}  # each way, both at once
    rows = [{"chunk_bytes": s, "nccl_gbps": nccl[s], "copy_engine_gbps": copies[s]} for s in SIZES]
    print("chunk MiB | NCCL send/recv GB/s each way | copy engine GB/s each way")
    for r in rows:
        print(f"{r['chunk_bytes'] >> 20:9d} | {r['nccl_gbps']:28.1f} | {r['copy_engine_gbps']:25.1f}")
    with open(os.path.join(args.out, "link_curve.json"), "w") as f:
        json.dump({"device": torch.cuda.get_device_name(0), "total_bytes_each_way": TOTAL, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
