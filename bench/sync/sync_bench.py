"""Sync benchmark on the GPU machine: in one run, the floor (link and memory speeds
measured now, bytes from shardsync's own plan), PyTorch baselines (baselines.py:
gather every parameter then slice, bucketed gather, bucketed point-to-point), and
shardsync through its daemons and clients (CUDA IPC, NCCL): median of the timed syncs
after a warm-up, checked element by element afterwards. The Python client calls the
coordinator through the native library (shardsync.native), and grpcio beside it.
  python3 bench/sync/sync_bench.py --bin dist/bin --out DIR [--cases NAME,...] [--syncs N]
With --shared-gpu, every agent of the world runs on GPU 0 (the direct path: senders
write their peers' targets through CUDA IPC); the floor is then the GPU's memory, which
all of them share: every byte read and written, over the copy speed measured now. One
agent syncing the same model on the same GPU (local copies) is measured beside it. The
staged path and the PyTorch baselines need a process per GPU (NCCL cannot hold two ranks
on one device): they run without --shared-gpu, on as many GPUs as agents.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch

import baselines
import shardsync
from shardsync.testing import SERVINGS, LocalCluster

HERE = os.path.dirname(os.path.abspath(__file__))
# name: (model, zero stage, tp, fused, target ranks: consecutive groups of tp are the
# replicas; None: every rank). Sources are ZeRO-1/3 over every GPU of the world.
CASES = {
    1: {
        "qwen3-1.7b tp1": ("qwen3-1.7b", 3, 1, False, None),
        "qwen3-8b tp1": ("qwen3-8b", 3, 1, False, None),
    },
    2: {
        "qwen3-1.7b tp2": ("qwen3-1.7b", 3, 2, False, None),
        "qwen3-1.7b tp1x2": ("qwen3-1.7b", 3, 1, False, None),
        "qwen3-1.7b zero1 tp2": ("qwen3-1.7b", 1, 2, False, None),
        "qwen3-8b tp2": ("qwen3-8b", 3, 2, False, None),
        "qwen3-8b tp1x2": ("qwen3-8b", 3, 1, False, None),
        "qwen3-8b fused tp2": ("qwen3-8b", 3, 2, True, None),
    },
    4: {  # the layouts of DeepSpeed PR #9045's table
        "qwen3-1.7b tp2x2": ("qwen3-1.7b", 3, 2, False, None),
        "qwen3-1.7b tp4": ("qwen3-1.7b", 3, 4, False, None),
        "qwen3-1.7b tp1x4": ("qwen3-1.7b", 3, 1, False, None),
        "qwen3-1.7b tp2 on ranks 2-3": ("qwen3-1.7b", 3, 2, False, [2, 3]),
        "qwen3-8b tp4": ("qwen3-8b", 3, 4, False, None),
        "qwen3-8b tp2x2": ("qwen3-8b", 3, 2, False, None),
    },
}


def ask(p, line):
    p.stdin.write(line + "\n")
    p.stdin.flush()
    return p.stdout.readline().strip()


def python_syncs(coordinator, syncs):
    """`syncs` timed syncs from the Python client; each sync's time and where it went."""
    times, phases, one_calls, ranks = [], [], [], None
    for _ in range(syncs):
        start = time.perf_counter()
        response = coordinator.sync(timeout=120)
        times.append(time.perf_counter() - start)
        ranks = response.ranks
        one_calls.append(response.one_call)  # no Prepare fan-out
        # Where the time went: the coordinator's whole sync, its Prepare and Execute
        # fan-outs, the slowest agent's Execute call and its engine, the slowest
        # agent's checks, agreement and wait for the direct path's completion, and the
        # most a coordinator's call to an agent took beyond that agent's Execute.
        phases.append({"coordinator": response.seconds, "prepare": response.prepare_seconds,
                       "execute": response.execute_seconds,
                       "agent_execute": max(r.execute_seconds for r in response.ranks),
                       "agent_engine": max(r.seconds for r in response.ranks),
                       "agent_checks": max(r.check_seconds for r in response.ranks),
                       "agent_agree": max(r.agree_seconds for r in response.ranks),
                       "agent_direct_wait": max(r.direct_wait_seconds for r in response.ranks),
                       "call_overhead": max(r.call_seconds - r.execute_seconds for r in response.ranks)})
    return times, phases, one_calls, ranks


def shardsync_case(world, name, bin_dir, out, syncs, staging, link_gbps, memory_gbps, serving, calls, shared=False,
                   direct="auto", float8=False):
    model, zero, tp, fused, targets = CASES[world][name]
    targets = targets or list(range(world))
    logs = os.path.join(out, ("shared-" if shared else "") + ("float8-" if float8 else "") + name.replace(" ", "_"),
                        serving)
    os.makedirs(logs, exist_ok=True)
    cluster = LocalCluster(bin_dir, world, logs, cuda=True, serving=serving, staging_bytes=staging,
                           sync_timeout_ms=120000, agent_flags=["--max-staging-bytes", str(1 << 30)],
                           devices=[0] * world if shared else None, direct=direct)
    try:
        clients, rollouts = [], []
        for role, ranks in (("trainer", range(world)), ("rollout", targets)):
            for r in ranks:
                argv = [sys.executable, os.path.join(HERE, "client.py"), "--socket", cluster.socket(r),
                        "--rank", str(r), "--device", str(cluster.device(r)), "--world", str(world), "--role", role,
                        "--model", model, "--zero",
                        str(zero), "--tp", str(tp), "--tp-rank", str(targets.index(r) % tp if r in targets else 0),
                        "--seed", "3"] + (["--fused"] if fused else []) + (["--float8"] if float8 else [])
                clients.append(cluster.spawn(argv, f"{role}{r}", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
                if role == "rollout":
                    rollouts.append(clients[-1])
        for c in clients:
            line = c.stdout.readline().strip()
            assert line == "ready", f"a client did not register: {line!r}"
        # The first client gives the case's figures; the others time the same syncs after it.
        by_client = {c: shardsync.CoordinatorClient(cluster.coordinator, insecure=True, native=c == "native")
                     for c in calls}
        coordinator = by_client[calls[0]]
        first = coordinator.sync(timeout=120)  # warm-up: plans, builds the communicator
        times, phases, one_calls, ranks = python_syncs(coordinator, syncs)
        clients_compared = {}
        for c in calls[1:]:
            by_client[c].sync(timeout=120)  # this client's channel, warmed up
            other = python_syncs(by_client[c], syncs)[0]
            clients_compared[c] = {"seconds": statistics.median(other), "all_seconds": other}
        verified = coordinator.sync(timeout=120, verify=True)  # the cost of --verify, once
        explain = coordinator.explain(link_gbps=link_gbps, memory_gbps=memory_gbps, links=True)
        # Peak extra memory of the clients during the syncs, before the checks allocate.
        memory = [int(ask(c, "memory").split()[1]) for c in clients]
        checks = [ask(c, "check 3") for c in rollouts]
        for c in clients:
            c.stdin.write("exit\n")
            c.stdin.flush()
        for c in clients:
            c.wait(timeout=60)
        return {
            "seconds": statistics.median(times), "all_seconds": times, "plan_seconds": first.plan_seconds,
            "floor_seconds": explain.floor_seconds, "checks": checks,
            "sent_bytes": [r.sent_bytes for r in ranks], "received_bytes": [r.received_bytes for r in ranks],
            "local_bytes": [r.local_bytes for r in ranks], "rounds": [r.rounds for r in ranks],
            "agent_peak_staging_bytes": [r.peak_staging_bytes for r in ranks], "client_peak_extra_bytes": memory,
            "direct_sent_bytes": [r.direct_sent_bytes for r in ranks],
            "links": [{"from": link.from_rank, "to": link.to_rank, "bytes": link.bytes,
                       "path": shardsync.shardsync_pb2.LinkPath.Name(link.path)} for link in explain.links],
            "agent_seconds": [r.seconds for r in ranks], "agent_local_seconds": [r.local_seconds for r in ranks],
            "phases_median": {k: statistics.median(p[k] for p in phases) for k in phases[0]},
            "one_call": all(one_calls),
            "verify_sync_seconds": verified.seconds, "verify_seconds": [r.verify_seconds for r in verified.ranks],
            "verified_placements": verified.verified_placements, "clients_compared": clients_compared,
            "quantized_bytes": [r.quantized_bytes for r in ranks], "scratch_bytes": [r.scratch_bytes for r in ranks],
            "stages": first.stages,
        }
    finally:
        cluster.stop()


# Agents sharing GPU 0: the cases of CASES[world] that fit one H200 with their sources.
SHARED_CASES = {
    2: ["qwen3-1.7b tp2", "qwen3-1.7b tp1x2", "qwen3-8b tp2", "qwen3-8b tp1x2"],
    4: ["qwen3-1.7b tp4", "qwen3-1.7b tp2x2", "qwen3-1.7b tp1x4", "qwen3-8b tp4", "qwen3-8b tp2x2"],
}


def shared_main(args, clients, serving):
    """--shared-gpu: `world` agents on GPU 0 against the memory floor, and one agent
    syncing the same model on the same GPU, in one run; the coordinator where `serving` says."""
    world = args.world
    cases = [c for c in args.cases.split(",") if c] or SHARED_CASES[world]
    unknown = [c for c in cases if c not in CASES[world]]
    if unknown:
        raise SystemExit(f"no such case for {world} agents: {unknown}; there are {list(CASES[world])}")
    started = time.time()
    models_used = sorted({CASES[world][name][0] for name in cases})
    one_agent = {f"{m} tp1": None for m in models_used}
    base = baselines.measure({name: (CASES[1][name][0], 1, None) for name in one_agent}, args.syncs, 1)
    memory = base[0]["memory_gbps"]
    print(f"measured: on-GPU copy {memory:.0f} GB/s (read + write); {world} agents share GPU 0", flush=True)

    def floor(result):  # one memory for every agent: each byte read once and written once
        return sum(2 * l + s + r for l, s, r in zip(result["local_bytes"], result["sent_bytes"],
                                                     result["received_bytes"])) / (memory * 1e9)

    for name in one_agent:
        one_agent[name] = shardsync_case(1, name, args.bin, args.out, args.syncs, args.staging_bytes, 360.0, memory,
                                         serving, clients)
        r = one_agent[name]
        print(f"one agent, {name}: {r['seconds'] * 1e3:.2f} ms (floor {floor(r) * 1e3:.2f} ms, "
              f"x{r['seconds'] / floor(r):.2f}); checks {r['checks']}", flush=True)
    rows = []
    for name in cases:
        result = shardsync_case(world, name, args.bin, args.out, args.syncs, args.staging_bytes, memory, memory,
                                serving, clients, shared=True)
        reference = one_agent[f"{CASES[world][name][0]} tp1"]
        row = {"case": name, **result, "memory_floor_seconds": floor(result),
               "one_agent_seconds": reference["seconds"], "one_agent_floor_seconds": floor(reference)}
        rows.append(row)
        print(f"{world} agents on GPU 0, {name}: shardsync {row['seconds'] * 1e3:.2f} ms (memory floor "
              f"{row['memory_floor_seconds'] * 1e3:.2f} ms, x{row['seconds'] / row['memory_floor_seconds']:.2f}); "
              f"agents' copies {row['phases_median']['agent_engine'] * 1e3:.2f} ms "
              f"(x{row['phases_median']['agent_engine'] / row['memory_floor_seconds']:.2f}); one agent, same model: "
              f"x{reference['seconds'] / floor(reference):.2f}; direct bytes {sum(row['direct_sent_bytes'])} of "
              f"{sum(row['sent_bytes'])} sent; peak staging {max(row['agent_peak_staging_bytes'])}; with --verify "
              f"{row['verify_sync_seconds'] * 1e3:.2f} ms; checks {row['checks']}; medians (ms): " +
              ", ".join(f"{k} {v * 1e3:.2f}" for k, v in row["phases_median"].items()), flush=True)
    with open(os.path.join(args.out, "sync_bench_shared.json"), "w") as f:
        json.dump({"agents": world, "gpus": 1, "memory_gbps": memory, "syncs": args.syncs, "serving": serving,
                   "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
                   "one_agent": one_agent, "rows": rows, "wall_seconds": time.time() - started}, f, indent=1)


FLOAT8_CASES = {1: ["qwen3-8b tp1"], 4: ["qwen3-8b tp2x2", "qwen3-8b tp4"]}


def float8_main(args, clients, serving):
    """--float8: each case synced into bfloat16 targets and into float8 block-quantized
    ones (the layers' linear weights), in one run; one agent, or every agent on GPU 0.
    The memory floor counts every byte the agents read and write: the copies (bfloat16
    on the wire and into scratch) and, for float8, the quantize pass (2 bytes read, 1
    written per element)."""
    world = args.world
    cases = [c for c in args.cases.split(",") if c] or FLOAT8_CASES.get(world, [])
    unknown = [c for c in cases if c not in CASES[world]]
    if unknown or not cases:
        raise SystemExit(f"no float8 case {unknown} for {world} agents; there are {FLOAT8_CASES}")
    started = time.time()
    models_used = sorted({CASES[world][name][0] for name in cases})
    base = baselines.measure({f"{m} tp1": (m, 1, None) for m in models_used}, args.syncs, 1)
    memory = base[0]["memory_gbps"]
    print(f"measured: on-GPU copy {memory:.0f} GB/s (read + write); {world} agent(s) on GPU 0", flush=True)

    def floor(result):
        moved = sum(2 * l + s + r for l, s, r in zip(result["local_bytes"], result["sent_bytes"], result["received_bytes"]))
        return (moved + 3 * sum(result["quantized_bytes"])) / (memory * 1e9)

    rows = []
    for name in cases:
        row = {"case": name}
        for kind in ("bfloat16", "float8"):
            result = shardsync_case(world, name, args.bin, args.out, args.syncs, args.staging_bytes, memory, memory,
                                    serving, clients, shared=world > 1, float8=kind == "float8")
            row[kind] = {**result, "memory_floor_seconds": floor(result)}
        rows.append(row)
        b, f = row["bfloat16"], row["float8"]
        print(f"{world} agent(s) on GPU 0, {name}: bfloat16 targets {b['seconds'] * 1e3:.2f} ms "
              f"(x{b['seconds'] / b['memory_floor_seconds']:.2f} of its floor), float8 targets {f['seconds'] * 1e3:.2f} ms "
              f"(x{f['seconds'] / f['memory_floor_seconds']:.2f}; {f['stages']} stages, scratch "
              f"{max(f['scratch_bytes'])} bytes per agent); float8 / bfloat16 x{f['seconds'] / b['seconds']:.2f}; "
              f"checks {b['checks']} {f['checks']}", flush=True)
    with open(os.path.join(args.out, "sync_bench_float8.json"), "w") as f:
        json.dump({"agents": world, "gpus": 1, "memory_gbps": memory, "syncs": args.syncs, "serving": serving,
                   "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
                   "wall_seconds": time.time() - started}, f, indent=1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--world", type=int, default=2, choices=sorted(CASES), help="GPUs used")
    parser.add_argument("--cases", default="", help="comma-separated; default: every case of --world")
    parser.add_argument("--syncs", type=int, default=5)
    parser.add_argument("--direct", default="auto", choices=["auto", "never", "always"],
                        help="the coordinator's --direct: auto links GPUs with peer access directly; never stages "
                             "every link through NCCL")
    parser.add_argument("--shared-gpu", action="store_true",
                        help="every agent of --world on GPU 0 (the direct path), against the memory floor")
    parser.add_argument("--float8", action="store_true",
                        help="each case into bfloat16 and into float8 block-quantized targets, one agent (--world 1) "
                             "or every agent on GPU 0")
    parser.add_argument("--staging-bytes", type=int, default=128 << 20)
    parser.add_argument("--serving", default="process",
                        help="where the coordinator runs (shardsync.testing), comma-separated to measure "
                             "each in turn: process (its own daemon), agent0 (agent 0 serves it; the client calls over "
                             "TCP) or agent0-unix (over agent 0's unix socket); the first gives the row's figures")
    parser.add_argument("--clients", default="native,grpcio",
                        help="how the Python client calls the coordinator, comma-separated: native (the C++ library, "
                             "shardsync.native) or grpcio; the first gives the row's figures, the others time the same "
                             "syncs after it")
    args = parser.parse_args()
    clients = args.clients.split(",")
    if any(c not in ("native", "grpcio") for c in clients):
        parser.error("--clients takes native and grpcio")
    servings = args.serving.split(",")
    if any(s not in SERVINGS for s in servings):
        parser.error(f"--serving takes {', '.join(SERVINGS)}")
    os.makedirs(args.out, exist_ok=True)
    if args.float8:
        return float8_main(args, clients, servings[0])
    if args.shared_gpu:
        return shared_main(args, clients, servings[0])
    world = args.world
    cases = [c for c in args.cases.split(",") if c] or list(CASES[world])
    unknown = [c for c in cases if c not in CASES[world]]
    if unknown:
        parser.error(f"no such case for {world} GPUs: {unknown}; there are {list(CASES[world])}")
    started = time.time()
    base = baselines.measure({name: (CASES[world][name][0], CASES[world][name][2], CASES[world][name][4])
                              for name in cases}, args.syncs, world)
    ranks = range(world)
    # One GPU has no link: its floor counts local copies only (Explain's default link).
    link = min(base[r]["link_gbps"] for r in ranks) if world > 1 else 360.0
    memory = min(base[r]["memory_gbps"] for r in ranks)
    measured_link = f"link {link:.1f} GB/s each way at once" if world > 1 else "no link (one GPU; the floor is copies)"
    print(f"measured: {measured_link}, on-GPU copy {memory:.0f} GB/s (read + write)", flush=True)
    rows = []
    for name in cases:
        by_serving = {serving: shardsync_case(world, name, args.bin, args.out, args.syncs, args.staging_bytes, link,
                                              memory, serving, clients, direct=args.direct) for serving in servings}
        result = by_serving[servings[0]]
        gather = max(base[r][name]["gather"] for r in ranks)
        bucketed = max(base[r][name]["bucketed_gather"] for r in ranks)
        p2p = max(base[r][name]["bucketed_p2p"] for r in ranks)
        # Not the floor, beside it: the link's bytes are read from and written to the same
        # memory as the copies', so no rank finishes before its memory moved all of them.
        memory_bound = max((2 * local + sent + received) / (memory * 1e9) for local, sent, received
                           in zip(result["local_bytes"], result["sent_bytes"], result["received_bytes"]))
        row = {"case": name, **result, "memory_bound_seconds": memory_bound, "gather_seconds": gather,
               "bucketed_gather_seconds": bucketed, "bucketed_p2p_seconds": p2p,
               "gather_peak_bytes": max(base[r][name]["gather_peak_bytes"] for r in ranks),
               "bucketed_gather_peak_bytes": max(base[r][name]["bucketed_gather_peak_bytes"] for r in ranks),
               "bucketed_p2p_peak_bytes": max(base[r][name]["bucketed_p2p_peak_bytes"] for r in ranks),
               "baseline_checks": sorted({base[r][name][k] for r in ranks
                                          for k in ("bucketed_gather_check", "bucketed_p2p_check")})}
        row["serving"] = servings[0]
        row["client"] = clients[0]
        row["by_serving"] = {serving: {k: r[k] for k in ("seconds", "all_seconds", "phases_median", "one_call", "checks",
                                                               "clients_compared")}
                             for serving, r in by_serving.items()}
        rows.append(row)
        for serving, r in by_serving.items():
            print(f"{name}, coordinator in {serving}: shardsync {r['seconds'] * 1e3:.2f} ms "
                  f"(x{r['seconds'] / row['floor_seconds']:.2f}); checks {r['checks']}; medians (ms): " +
                  ", ".join(f"{k} {v * 1e3:.2f}" for k, v in r["phases_median"].items()), flush=True)
            if r["clients_compared"]:
                print(f"{name}, coordinator in {serving}, the same syncs by client (ms): {clients[0]} {r['seconds'] * 1e3:.2f}, " +
                      ", ".join(f"{k} {v['seconds'] * 1e3:.2f}" for k, v in r["clients_compared"].items()), flush=True)
        print(f"{name}: shardsync {row['seconds'] * 1e3:.2f} ms (floor {row['floor_seconds'] * 1e3:.2f} ms, "
              f"x{row['seconds'] / row['floor_seconds']:.2f}; all bytes through memory {memory_bound * 1e3:.2f} ms); gather {gather * 1e3:.2f} ms; bucketed gather "
              f"{bucketed * 1e3:.2f} ms; bucketed p2p {p2p * 1e3:.2f} ms (baselines {row['baseline_checks']}); agents {max(row['agent_seconds']) * 1e3:.2f} ms of which local copies "
              f"{max(row['agent_local_seconds']) * 1e3:.2f} ms; with --verify {row['verify_sync_seconds'] * 1e3:.2f} ms; "
              f"checks {row['checks']}; medians (ms): " +
              ", ".join(f"{k} {v * 1e3:.2f}" for k, v in row["phases_median"].items()), flush=True)
    with open(os.path.join(args.out, "sync_bench.json"), "w") as f:
        json.dump({"world": world, "link_gbps": link, "memory_gbps": memory, "staging_bytes": args.staging_bytes, "syncs": args.syncs,
                   "device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
                   "wall_seconds": time.time() - started}, f, indent=1)


if __name__ == "__main__":
    main()
