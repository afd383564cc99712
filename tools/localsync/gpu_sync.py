"""The main job on a machine with GPUs (scripts/quickstart runs it where a GPU is):
a coordinator and one agent per GPU, a trainer (ZeRO-3 over every GPU) and a rollout
(one TP replica over every GPU) torch process per GPU sharing their tensors by CUDA IPC,
a Qwen3-0.6B-shaped model with random values. Syncs, writes new values into the
trainers, syncs again, checks every target element after each sync, prints each sync's
stats per rank, and ends with one JSON line like the CPU job's.
  python3 tools/localsync/gpu_sync.py --bin dist/bin [--model qwen3-0.6b] [--gpus N] [--syncs N]
(PYTHONPATH: dist/python and bench/sync, for the models the clients share)
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import torch

import models  # bench/sync
import shardsync
from shardsync.testing import LocalCluster

# The torch trainer and rollout processes are the sync benchmark's (bench/sync/client.py).
CLIENT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "sync", "client.py")


def ask(process, line):
    """One command to a client process, its one-line answer."""
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True, help="the folder of shardsync-agent and shardsync-coordinator")
    parser.add_argument("--model", default="qwen3-0.6b", choices=sorted(models.CONFIGS))
    parser.add_argument("--gpus", type=int, default=torch.cuda.device_count())
    parser.add_argument("--syncs", type=int, default=2)
    args = parser.parse_args()
    if not 1 <= args.gpus <= torch.cuda.device_count() or args.syncs < 1:
        parser.error(f"--gpus must be 1..{torch.cuda.device_count()} and --syncs at least 1")
    world = args.gpus
    logs = tempfile.mkdtemp(prefix="shardsync-gpu-job-")
    print(f"gpu_sync: {args.model}, ZeRO-3 over {world} GPU(s) into one TP={world} replica "
          f"({torch.cuda.get_device_name(0)}); logs in {logs}", file=sys.stderr, flush=True)
    cluster = LocalCluster(args.bin, world, logs, cuda=True)
    clients = []
    try:
        for role in ("trainer", "rollout"):
            for r in range(world):
                argv = [sys.executable, CLIENT, "--socket", cluster.socket(r),
                        "--rank", str(r), "--world", str(world), "--role", role, "--model", args.model,
                        "--zero", "3", "--tp", str(world), "--tp-rank", str(r), "--seed", "1"]
                clients.append(cluster.spawn(argv, f"{role}{r}", stdin=subprocess.PIPE,
                                             stdout=subprocess.PIPE, text=True))
        for c in clients:
            line = c.stdout.readline().strip()
            if line != "ready":
                return fail(f"a client did not register: {line!r} (logs in {logs})")
        trainers, rollouts = clients[:world], clients[world:]
        # The C++ call (shardsync.native), as a trainer should sync.
        coordinator = shardsync.CoordinatorClient(cluster.coordinator, insecure=True, native=True)
        mismatched, response = 0, None
        for seed in range(1, args.syncs + 1):
            if seed > 1:
                for t in trainers:
                    if ask(t, f"refill {seed}") != "refilled":
                        return fail(f"a trainer did not write new values (logs in {logs})")
            response = coordinator.sync(timeout=120)
            print_table(response)
            wrong = 0
            for r in rollouts:
                answer = ask(r, f"check {seed}")
                wrong += 0 if answer == "ok" else int(answer.split()[1])
            print(f"verified: {wrong} of the targets' elements differ from the sources\n", flush=True)
            mismatched += wrong
        moved = sum(r.received_bytes + r.local_bytes for r in response.ranks)
        print(json.dumps({"status": "ok" if mismatched == 0 else "mismatch", "gpus": world,
                          "tensors": len(models.tensors(args.model)), "bytes": moved, "seconds": response.seconds,
                          "syncs": args.syncs, "mismatched": mismatched}), flush=True)
        return 0 if mismatched == 0 else 1
    except shardsync.ShardsyncError as error:
        return fail(f"{error} (logs in {logs})")
    finally:
        for c in clients:
            if c.poll() is None:
                c.stdin.write("exit\n")
                c.stdin.flush()
        for c in clients:
            c.wait(timeout=60)
        cluster.stop()


def print_table(response):
    print(f"sync {response.sync_id}: {response.seconds * 1e3:.2f} ms (planning {response.plan_seconds * 1e3:.2f} ms; "
          f"{'one call per agent' if response.one_call else 'Prepare, then Execute'})")
    print(f"{'rank':<6}{'sent MiB':>12}{'received MiB':>14}{'local MiB':>12}{'rounds':>8}{'agent ms':>10}")
    for r in response.ranks:
        print(f"{r.rank:<6}{r.sent_bytes / 2**20:>12.1f}{r.received_bytes / 2**20:>14.1f}{r.local_bytes / 2**20:>12.1f}"
              f"{r.rounds:>8}{r.seconds * 1e3:>10.2f}")


def fail(why):
    print(json.dumps({"status": "failed", "error": why}), flush=True)
    return 1


if __name__ == "__main__":
    sys.exit(main())
