"""GPU tests: real agents on CUDA devices, NCCL between them, trainer and rollout
processes sharing torch CUDA tensors by IPC. Run by tests/gpu/run on a GPU machine.

  1 GPU : ZeRO-3 partitions into a TP1 arena on the same GPU; every element equal; a
          CUDA graph captured on the arena before the sync reads the new weights after
          it; the arena keeps its address. A trainer's ready event: the sync waits for
          writes still in flight (and reads early without the record: the control).
          The main job (tools/localsync/gpu_sync.py, scripts/quickstart's GPU path).
          Host memory registered with the GPU agent is refused by name.
  2 GPUs: ZeRO-1, 2 and 3 over 2 ranks into TP2 and into TP1 x 2; every element equal
          after two syncs with changed sources; under ZeRO-1/2 no byte crosses GPUs; a
          missing shard makes the sync refused and no target changes; an agent killed
          during a sync fails it within its deadline naming the rank, and a restarted
          agent syncs again. The two GPUs as two nodes: the relay's second stage.
  Agent 0 serving as the coordinator (--serve-coordinator, no coordinator process): the
  same checks, on 1 GPU and on 2.
  2 and 4 agents sharing GPU 0 (the direct path: each sender writes its peers' targets
          through CUDA IPC, no staging, no NCCL): the 2- and 4-GPU layouts above, every
          element equal after two syncs, every link direct; ZeRO-1/2 move nothing between
          agents; a missing shard refuses everywhere with no target changed; an agent
          SIGKILLed after its copies, before it tells its peers, fails the sync naming it,
          and the next sync after its restart is exact; --direct never is refused.
  Float8 rollouts (1 agent, and 4 sharing GPU 0): ZeRO-3 bfloat16 sources into float8
          block-quantized targets (TP1, two TP2 replicas, TP4), quantized by the agents in
          groups of a small scratch; every float8 element and block scale equal to a
          PyTorch reference quantizer's, after two syncs.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import traceback

import torch

import shardsync
from shardsync.testing import LocalCluster

parser = argparse.ArgumentParser()
parser.add_argument("--bin", required=True)   # folder with shardsync-agent, shardsync-coordinator
parser.add_argument("--out", default="")      # where to write results.json and logs
parser.add_argument("--only", default="")     # run only the cases whose name contains this
args = parser.parse_args()
HERE = os.path.dirname(os.path.abspath(__file__))
GPUS = torch.cuda.device_count()
OUT = args.out or tempfile.mkdtemp(prefix="ss-gpu-")
os.makedirs(OUT, exist_ok=True)  # results.json goes here even when no case runs
RESULTS = []


class Cluster(LocalCluster):
    """A coordinator process (or agent 0 serving as it, serving="agent0") and an agent on
    every GPU, with this suite's deadlines; logs in OUT/name; clients by role and rank."""

    def __init__(self, name, world, staging=128 << 20, sync_timeout_ms=20000, serving="process", **options):
        super().__init__(args.bin, world, os.path.join(OUT, name), cuda=True, serving=serving, staging_bytes=staging,
                         sync_timeout_ms=sync_timeout_ms, rpc_deadline_ms=5000, **options)
        self.options = options
        self.clients = []

    def client(self, role, rank, **flags):
        argv = [sys.executable, os.path.join(HERE, "gpu_client.py"), "--socket", self.socket(rank), "--device",
                str(self.device(rank)), "--rank", str(rank), "--role", role]
        for key, value in flags.items():
            argv += [f"--{key.replace('_', '-')}", str(value)]
        process = self.spawn(argv, f"{role}{rank}", stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.clients.append(process)
        return process

    def stop(self):
        super().stop(self.clients)


def ask(process, line):
    process.stdin.write(line + "\n")
    process.stdin.flush()
    return process.stdout.readline().strip()


def ready(process):
    line = process.stdout.readline().strip()
    assert line.startswith("ready"), f"client did not register: {line!r}"


def sync(cluster, timeout=60, verify=False, links=False):
    """One sync through the native library packaged in dist/python (shardsync.native)."""
    client = shardsync.CoordinatorClient(cluster.coordinator, insecure=True, native=True)
    return client.sync(timeout=timeout, verify=verify, links=links)


def case(name):
    def wrap(fn):
        def run():
            started = time.time()
            try:
                detail = fn() or ""
                RESULTS.append({"case": name, "result": "passed", "seconds": round(time.time() - started, 2), "detail": detail})
                print(f"PASSED {name} {detail}", flush=True)
            except Exception as error:  # a failed case must not stop the others
                RESULTS.append({"case": name, "result": "failed", "error": repr(error), "trace": traceback.format_exc()})
                print(f"FAILED {name}: {error!r}", flush=True)
        run.name = name
        return run
    return wrap


@case("1 GPU: ZeRO-3 into a TP1 arena on the same GPU; a CUDA graph reads the new weights; the arena stays put; --verify")
def one_gpu():
    cluster = Cluster("one-gpu", 1)
    try:
        trainer = cluster.client("trainer", 0, zero=3, dp=1, seed=1)
        rollout = cluster.client("rollout", 0, tp=1, seed=1)
        ready(trainer)
        ready(rollout)
        address = ask(rollout, "address")
        assert ask(rollout, "graph") == "captured"
        response = sync(cluster)
        assert ask(rollout, "check 1") == "ok"
        assert ask(rollout, "replay 1") == "ok", "the graph did not see the first sync's weights"
        assert ask(trainer, "refill 2") == "refilled"
        second = sync(cluster)
        assert second.one_call, "the second sync made a Prepare call: the agent holds the schedule"
        assert ask(rollout, "check 2") == "ok"
        assert ask(rollout, "replay 2") == "ok", "the graph did not see the second sync's weights"
        assert ask(rollout, "address") == address
        verified = sync(cluster, verify=True)  # checksums hashed on the GPU
        assert verified.verified_placements > 0, "verify compared nothing"
        assert ask(rollout, "check 2") == "ok"
        r = verified.ranks[0]
        return (f"{response.ranks[0].local_bytes} bytes local in {response.ranks[0].seconds:.4f} s "
                f"(local copies {response.ranks[0].local_seconds:.4f} s); --verify: {verified.verified_placements} "
                f"placements equal, checksums {r.verify_seconds:.4f} s")
    finally:
        cluster.stop()


@case("1 GPU: a trainer that records a ready event instead of synchronizing: the sync waits for its writes")
def ready_event_case():
    cluster = Cluster("ready-event", 1)
    try:
        trainer = cluster.client("trainer", 0, zero=3, dp=1, seed=1, ready_event=1)
        rollout = cluster.client("rollout", 0, tp=1, seed=1)
        ready(trainer)
        ready(rollout)
        sync(cluster)
        assert ask(rollout, "check 1") == "ok"
        # The control: writes spread over ~0.45 s of GPU time and the event not recorded,
        # so the sync waits for the last record (done) and reads before they all land.
        assert ask(trainer, "refill_late 2 0") == "queued"
        started = time.perf_counter()
        sync(cluster)
        early_took = time.perf_counter() - started
        early = ask(rollout, "check 2")
        assert early.startswith("mismatch"), (f"the control read the new values ({early}, its sync took "
                                              f"{early_took * 1e3:.0f} ms): the test could not tell")
        assert ask(trainer, "finish") == "finished"
        # Recorded after the writes: the sync waits for them on the GPU.
        assert ask(trainer, "refill_late 3 1") == "queued"
        started = time.perf_counter()
        waited = sync(cluster)
        took = time.perf_counter() - started
        assert ask(rollout, "check 3") == "ok"
        return (f"without a record the sync read early ({early}, in {early_took * 1e3:.0f} ms); with it every element is the new value; "
                f"that sync took {took * 1e3:.0f} ms behind the trainer's ~0.45 s of writes (agent {waited.ranks[0].seconds * 1e3:.0f} ms)")
    finally:
        cluster.stop()


@case("the main job on GPUs (scripts/quickstart where a GPU is): Qwen3-0.6B shapes, two syncs, every element verified")
def main_job():
    repo = os.path.dirname(os.path.dirname(HERE))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(repo, "bench", "sync"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, os.path.join(repo, "tools", "localsync", "gpu_sync.py"), "--bin", args.bin],
                          capture_output=True, text=True, timeout=600, env=env)
    last = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert done.returncode == 0 and last.startswith("{"), f"exit {done.returncode}: {last or done.stderr[-300:]}"
    result = json.loads(last)
    assert result["status"] == "ok" and result["mismatched"] == 0 and result["syncs"] == 2, result
    return f"{result['gpus']} GPU(s), {result['tensors']} tensors, {result['bytes']} bytes per sync, last sync {result['seconds'] * 1e3:.2f} ms"


def engine_case(transport, slow_link_us, slow_unpack_us):
    """The engine's double-buffered rounds on one GPU (tests/gpu/engine_check.cc): ranks joined
    by peer copies ("copy"), or every stream sent to itself over the agent's NCCL transport
    ("nccl-self"); every other layout over two nodes, relayed (a second stage reading targets
    the first wrote, behind the device's fence)."""
    @case(f"1 GPU: double-buffered rounds over {transport}, random layouts, each transfer held {slow_link_us} us, "
          f"each unpack {slow_unpack_us} us")
    def run():
        done = subprocess.run([os.path.join(args.bin, "engine_check"), "--seeds", "150", "--transport", transport,
                               "--slow-link-us", str(slow_link_us), "--slow-unpack-us", str(slow_unpack_us)],
                              capture_output=True, text=True, timeout=600)
        assert done.stdout.strip(), f"engine_check printed nothing: {done.stderr[-300:]}"
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert done.returncode == 0 and result["failed"] == 0, f"{result['failed']} layouts wrong: {result['first_error']}"
        assert result["rounds"] > 150, f"only {result['rounds']} rounds: the check did not exercise the rounds"
        assert result["relayed"] >= 10, f"only {result['relayed']} relayed layouts: the relay stage was not exercised"
        agreed = ""
        if transport == "nccl-self":
            assert result["agreement"] == "ok", f"the NCCL agreement: {result['agreement']}"
            agreed = f"; 200 agreements each answered as voted, {result['agree_median_us']:.0f} us each"
        return (f"{result['seeds']} layouts ({result['relayed']} relayed), {result['rounds']} rounds, "
                f"every element right{agreed}")
    return run


def two_checked_syncs(cluster, world, zero, rollouts, seed):
    """Registers trainers (ZeRO-`zero` over `world` ranks) and `rollouts` (rank, tp,
    tp_rank), then syncs twice, new source values before the second, checking every
    target element after each. From the second sync on, one Execute call per agent; under
    ZeRO-1/2 nothing moves between agents. Returns both responses."""
    trainers = [cluster.client("trainer", r, zero=zero, dp=world, seed=seed) for r in range(world)]
    clients = [cluster.client("rollout", r, tp=tp, tp_rank=k, seed=seed) for r, tp, k in rollouts]
    for p in trainers + clients:
        ready(p)
    first = sync(cluster)
    for r in clients:
        assert ask(r, "check %d" % seed) == "ok"
    for t in trainers:
        assert ask(t, "refill %d" % (seed + 100)) == "refilled"
    second = sync(cluster, links=True)
    assert second.one_call, "the second sync made a Prepare call"
    for r in clients:
        assert ask(r, "check %d" % (seed + 100)) == "ok"
    sent = sum(r.sent_bytes for r in second.ranks)
    if zero < 3:
        assert sent == 0, f"{sent} bytes moved between agents under ZeRO-{zero}"
    return first, second


def layout_case(world, zero, name, rollouts, serving="process", direct="never"):
    """ZeRO-`zero` over `world` GPUs into the rollout `rollouts`: (rank, tp, tp_rank) each;
    the coordinator in its own process, or served by agent 0 (`serving="agent0"`); links
    staged through NCCL, or direct between GPUs with peer access (`direct="auto"`)."""
    served = ", agent 0 serving the coordinator" if serving == "agent0" else ""
    path = ", direct path (peer access)" if direct != "never" else ""
    @case(f"{world} GPUs: ZeRO-{zero} over {world} ranks into {name}{served}{path}, two syncs, then one with --verify")
    def run():
        cluster = Cluster(f"zero{zero}-{name}-{serving}-{direct}", world, serving=serving, direct=direct)
        try:
            _, second = two_checked_syncs(cluster, world, zero, rollouts, seed=10 * world + zero)
            sent = sum(r.sent_bytes for r in second.ranks)
            moved = sum(r.received_bytes + r.local_bytes for r in second.ranks)
            # Where a sync's time goes: the client's wall time (the native call and grpcio's),
            # the coordinator's, the agents'.
            walls, coordinator, agents = {"native": [], "grpcio": []}, [], []
            for kind in walls:
                client = shardsync.CoordinatorClient(cluster.coordinator, insecure=True, native=kind == "native")
                client.sync(timeout=60)  # its channel, warmed up
                for _ in range(10):
                    started = time.perf_counter()
                    response = client.sync(timeout=60)
                    walls[kind].append(time.perf_counter() - started)
                    coordinator.append(response.seconds)
                    agents.append(max(r.seconds for r in response.ranks))
            verified = sync(cluster, verify=True)  # checksums hashed on the GPU
            assert verified.verified_placements > 0, "verify compared nothing"
            checksums = max(r.verify_seconds for r in verified.ranks)
            median = lambda values: sorted(values)[len(values) // 2] * 1e3  # noqa: E731
            return (f"second sync {second.seconds * 1e3:.2f} ms, {moved} bytes written, {sent} over NVLink; "
                    f"10 syncs each, medians: client {median(walls['native']):.2f} ms native, {median(walls['grpcio']):.2f} ms "
                    f"grpcio, coordinator {median(coordinator):.2f} ms, "
                    f"slowest agent {median(agents):.2f} ms; "
                    f"verified {verified.verified_placements} placements, sync with verify {verified.seconds * 1e3:.1f} ms "
                    f"(checksums {checksums * 1e3:.1f} ms)")
        finally:
            cluster.stop()
    return run


# The rollout layouts: (rank, tp, tp_rank) of every rollout process.
TWO_GPU_LAYOUTS = {"TP2": [(0, 2, 0), (1, 2, 1)], "TP1 x 2": [(0, 1, 0), (1, 1, 0)]}
FOUR_GPU_LAYOUTS = {
    "two TP2 replicas": [(0, 2, 0), (1, 2, 1), (2, 2, 0), (3, 2, 1)],
    "TP4 (uneven shards)": [(r, 4, r) for r in range(4)],
    "TP1 on every rank": [(r, 1, 0) for r in range(4)],
    "one TP2 replica on ranks 2-3": [(2, 2, 0), (3, 2, 1)],
}


def missing_shard_case(world, shared=False):
    """A missing shard over `world` GPUs, or `world` agents sharing GPU 0 (`shared`)."""
    where = f"{world} agents on GPU 0" if shared else f"{world} GPUs"
    @case(f"{where}: a missing shard refuses the sync everywhere, naming the rank, and no target changes")
    def run():
        cluster = (Cluster(f"shared-missing{world}", world, devices=[0] * world) if shared
                   else Cluster(f"missing{world}", world, direct="never"))
        try:
            trainers = [cluster.client("trainer", r, zero=3, dp=world, seed=5, drop="layers.1.up" if r == 1 else "")
                        for r in range(world)]
            rollouts = [cluster.client("rollout", r, tp=world, tp_rank=r, seed=5) for r in range(world)]
            for p in trainers + rollouts:
                ready(p)
            refusal = None
            try:
                sync(cluster)
            except shardsync.ShardsyncError as error:
                refusal = error
            assert refusal is not None, "the sync was not refused"
            assert refusal.code.name == "FAILED_PRECONDITION", refusal
            assert "no byte moved" in refusal.message and "by none of rank 1" in refusal.message, refusal.message
            for r in rollouts:
                # Still the poison: every element differs from the values it would have got.
                assert ask(r, "check 5").startswith("mismatch"), "a target changed although the sync was refused"
            return "refused: " + refusal.message[:160]
        finally:
            cluster.stop()
    return run


def sync_in_background(cluster, timeout):
    """A sync on its own thread; (thread, outcome): outcome gets "error" (None when it
    succeeded) and "seconds" once the thread ends."""
    outcome = {}

    def run_sync():
        started = time.time()
        try:
            sync(cluster, timeout=timeout)
            outcome["error"] = None
        except shardsync.ShardsyncError as error:
            outcome["error"] = error
        outcome["seconds"] = time.time() - started

    worker = threading.Thread(target=run_sync)
    worker.start()
    return worker, outcome


def restart_and_sync(cluster, rank, clients):
    """Starts rank's agent again, registers its `clients` again, and syncs (retrying
    while the agent rejoins, for at most 30 s)."""
    cluster.start_agent(rank)
    for p in clients:
        assert ask(p, "reregister").startswith("ready")
    deadline = time.time() + 30
    while True:
        try:
            return sync(cluster)
        except shardsync.ShardsyncError:
            if time.time() > deadline:
                raise
            time.sleep(0.5)


@case("2 GPUs: partial targets: a sync for rank 1 alone writes rank 1's TP2 shard and leaves rank 0's as it was")
def partial_targets():
    cluster = Cluster("partial", 2, direct="never")
    try:
        trainers = [cluster.client("trainer", r, zero=3, dp=2, seed=21) for r in range(2)]
        rollouts = [cluster.client("rollout", r, tp=2, tp_rank=r, seed=21) for r in range(2)]
        for p in trainers + rollouts:
            ready(p)
        sync(cluster)
        for r in rollouts:
            assert ask(r, "check 21") == "ok"
        for t in trainers:
            assert ask(t, "refill 121") == "refilled"
        client = shardsync.CoordinatorClient(cluster.coordinator, insecure=True, native=True)
        partial = client.sync(timeout=60, target_ranks=[1])
        assert list(partial.target_ranks) == [1], partial.target_ranks
        assert ask(rollouts[1], "check 121") == "ok", "rank 1 did not get the new values"
        assert ask(rollouts[0], "check 21") == "ok", "rank 0's target changed in a sync for rank 1 alone"
        rank0 = next(r for r in partial.ranks if r.rank == 0)
        assert rank0.received_bytes == 0 and rank0.local_bytes == 0, f"rank 0 wrote: {rank0}"
        assert rank0.sent_bytes > 0, "rank 0's half of the source did not go to rank 1"
        full = client.sync(timeout=60)  # the full plan again: rank 0 catches up
        for r in rollouts:
            assert ask(r, "check 121") == "ok"
        return (f"partial sync {partial.seconds * 1e3:.2f} ms (rank 0 sent {rank0.sent_bytes} bytes, wrote none), "
                f"then the full one {full.seconds * 1e3:.2f} ms")
    finally:
        cluster.stop()


@case("2 GPUs as two nodes (--node): the trainer on GPU 0, two rollout replicas on GPU 1, relayed: the model crosses "
      "NCCL once, the second replica copies the first on GPU 1 in a second stage; exact twice, verified")
def relay_two_nodes():
    cluster = Cluster("relay", 2, nodes=["node-a", "node-b"], relay="always")
    try:
        trainer = cluster.client("trainer", 0, zero=3, dp=1, seed=41)
        rollouts = [cluster.client("rollout", 1, tp=1, seed=41, name=name) for name in ("a", "b")]
        for p in [trainer] + rollouts:
            ready(p)
        first = sync(cluster)
        assert first.stages == 2, f"the plan did not relay: {first.stages} stage(s)"
        for r in rollouts:
            assert ask(r, "check 41") == "ok"
        assert ask(trainer, "refill 141") == "refilled"
        second = sync(cluster)
        assert second.one_call, "the second sync made a Prepare call"
        for r in rollouts:
            assert ask(r, "check 141") == "ok"
        rank1 = next(r for r in second.ranks if r.rank == 1)
        model_bytes = second.network_bytes
        # One copy over NCCL, the other a local copy of the first on GPU 1.
        assert rank1.received_bytes == model_bytes and rank1.local_bytes == model_bytes, rank1
        verified = sync(cluster, verify=True)
        assert verified.verified_placements > 0, "verify compared nothing"
        return (f"second sync {second.seconds * 1e3:.2f} ms: {model_bytes} bytes over NCCL once, "
                f"{rank1.local_bytes} copied on GPU 1; verified {verified.verified_placements} placements")
    finally:
        cluster.stop()


@case("2 GPUs: an agent killed during a sync fails it within the deadline, naming it; restarted, it syncs again")
def agent_killed():
    # A tiny staging budget makes the sync long (many rounds) so the kill lands inside it.
    cluster = Cluster("killed", 2, staging=32 << 10, sync_timeout_ms=10000, direct="never")
    try:
        trainers = [cluster.client("trainer", r, zero=3, dp=2, seed=7, scale=64) for r in range(2)]
        rollouts = [cluster.client("rollout", r, tp=1, seed=7, scale=64) for r in range(2)]
        for p in trainers + rollouts:
            ready(p)
        sync(cluster)  # builds the communicator and checks that the layout works
        worker, outcome = sync_in_background(cluster, 120)
        time.sleep(0.15)
        cluster.agents[1].kill()
        worker.join(180)
        assert not worker.is_alive(), "the sync hung"
        error = outcome["error"]
        assert error is not None, "the sync finished before the kill; make it longer"
        assert "rank 1" in error.message, error.message
        # The coordinator's 10 s deadline ends it, not the client's 120 s.
        assert outcome["seconds"] < 60, f"took {outcome['seconds']:.1f} s"
        restart_and_sync(cluster, 1, (trainers[1], rollouts[1]))
        for r in rollouts:
            assert ask(r, "check 7") == "ok"
        return f"failed after {outcome['seconds']:.2f} s: {error.message[:160]}"
    finally:
        cluster.stop()


def shared_layout_case(world, zero, name, rollouts):
    """ZeRO-`zero` over `world` agents that all run on GPU 0, into `rollouts` (rank, tp,
    tp_rank): the direct path, with real daemons, clients and CUDA IPC."""
    @case(f"{world} agents on GPU 0 (direct path): ZeRO-{zero} over {world} ranks into {name}, two syncs, then --verify")
    def run():
        cluster = Cluster(f"shared{world}-zero{zero}-{name}", world, devices=[0] * world)
        try:
            first, second = two_checked_syncs(cluster, world, zero, rollouts, seed=10 * world + zero + 5)
            sent = sum(r.sent_bytes for r in second.ranks)
            for r in list(first.ranks) + list(second.ranks):
                assert r.direct_sent_bytes == r.sent_bytes and r.peak_staging_bytes == 0 and r.rounds == 0, r
            assert (len(second.links) > 0) == (sent > 0), second.links
            assert all(link.path == shardsync.shardsync_pb2.DIRECT for link in second.links), second.links
            verified = sync(cluster, verify=True)
            assert verified.verified_placements > 0, "verify compared nothing"
            moved = sum(r.received_bytes + r.local_bytes for r in second.ranks)
            return (f"second sync {second.seconds * 1e3:.2f} ms, {moved} bytes written, {sent} of them by peers "
                    f"directly ({len(second.links)} direct links, no staging); verified {verified.verified_placements} "
                    f"placements")
        finally:
            cluster.stop()
    return run


def float8_case(world, name, rollouts):
    """ZeRO-3 bfloat16 sources over `world` agents on GPU 0 into `rollouts` (rank, tp,
    tp_rank) holding every 2-D tensor but the embedding block-quantized in float8: the
    agents quantize on the GPU, in groups of an 8 MiB scratch; each rollout checks every
    float8 element and scale against float8_reference.py (PyTorch)."""
    where = "1 agent" if world == 1 else f"{world} agents on GPU 0 (direct path)"
    @case(f"float8: {where}: ZeRO-3 bfloat16 over {world} ranks into {name} float8 block targets, two syncs, "
          "every element and scale as PyTorch's quantizer makes them; --verify, then a third sync")
    def run():
        cluster = Cluster(f"float8-{world}-{name}", world, devices=[0] * world, scratch_bytes=8 << 20)
        try:
            trainers = [cluster.client("trainer", r, zero=3, dp=world, seed=31, float8=1) for r in range(world)]
            clients = [cluster.client("rollout", r, tp=tp, tp_rank=k, seed=31, float8=1) for r, tp, k in rollouts]
            for p in trainers + clients:
                ready(p)
            sync(cluster)
            for r in clients:
                answer = ask(r, "check 31")
                assert answer == "ok", answer
            for t in trainers:
                assert ask(t, "refill 32") == "refilled"
            second = sync(cluster)
            for r in clients:
                answer = ask(r, "check 32")
                assert answer == "ok", answer
            assert second.stages > 2, f"{second.stages} stages: the 8 MiB scratch made no groups"
            quantized = sum(r.quantized_bytes for r in second.ranks)
            scratch = max(r.scratch_bytes for r in second.ranks)
            assert 0 < scratch <= 8 << 20, scratch
            verified = sync(cluster, verify=True)
            assert verified.verified_placements > 0 and verified.unverified_quantized_placements > 0, verified
            for t in trainers:  # a sync after --verify, whose buffers the agents grew, is exact too
                assert ask(t, "refill 33") == "refilled"
            sync(cluster)
            for r in clients:
                answer = ask(r, "check 33")
                assert answer == "ok", answer
            return (f"second sync {second.seconds * 1e3:.2f} ms, {second.stages} stages, {quantized} float8 elements "
                    f"quantized, scratch {scratch} bytes per agent at most; verify compared "
                    f"{verified.verified_placements} bfloat16 placements, left {verified.unverified_quantized_placements} "
                    f"float8 ones")
        finally:
            cluster.stop()
    return run


@case("4 agents on GPU 0: an agent SIGKILLed after its direct copies, before it tells its peers, fails the sync "
      "within the deadline naming it; targets invalid; restarted, the next sync is exact")
def shared_agent_killed():
    # Every agent stalls its second sync where it would say its stage-0 copies are done
    # (round -2; the flag reaches them all); rank 1 is killed there.
    cluster = Cluster("shared-killed", 4, devices=[0] * 4, sync_timeout_ms=10000,
                      agent_flags=["--fault-stall-at-round", "-2", "--fault-stall-sync", "2"])
    try:
        trainers = [cluster.client("trainer", r, zero=3, dp=4, seed=8) for r in range(4)]
        rollouts = [cluster.client("rollout", r, tp=1, seed=8) for r in range(4)]
        for p in trainers + rollouts:
            ready(p)
        sync(cluster)
        for t in trainers:
            assert ask(t, "refill 9") == "refilled"
        worker, outcome = sync_in_background(cluster, 120)
        log = os.path.join(cluster.logs, "agent1.log")
        deadline = time.time() + 20
        while time.time() < deadline and "stalls at round -2" not in open(log).read():
            time.sleep(0.01)
        assert "stalls at round -2" in open(log).read(), "rank 1 never stalled"
        cluster.agents[1].kill()
        killed = time.time()
        worker.join(180)
        assert not worker.is_alive(), "the sync hung"
        error = outcome["error"]
        assert error is not None, "the sync finished although rank 1 was killed"
        assert "rank 1" in error.message, error.message
        # The sync's deadline ends it, not the client's 120 s.
        assert time.time() - killed < 60, f"took {time.time() - killed:.1f} s after the kill"
        status = shardsync.CoordinatorClient(cluster.coordinator, insecure=True).status()
        assert not status.targets_valid, "the targets are called valid after a failed sync"
        cluster.agents[1].wait(10)
        # The restarted agent stalls nowhere: the fault is for the 2nd sync of the old process
        # only, and the new one has not had two.
        restart_and_sync(cluster, 1, (trainers[1], rollouts[1]))
        for r in rollouts:
            assert ask(r, "check 9") == "ok"
        return f"failed {outcome['seconds']:.2f} s after it began: {error.message[:160]}"
    finally:
        cluster.stop()


@case("2 agents on GPU 0 with --direct never: refused at once, saying NCCL cannot hold two ranks on one device")
def shared_never_refused():
    cluster = Cluster("shared-never", 2, devices=[0, 0], direct="never")
    try:
        trainers = [cluster.client("trainer", r, zero=3, dp=2, seed=4) for r in range(2)]
        rollouts = [cluster.client("rollout", r, tp=2, tp_rank=r, seed=4) for r in range(2)]
        for p in trainers + rollouts:
            ready(p)
        try:
            sync(cluster)
            raise AssertionError("the sync was not refused")
        except shardsync.ShardsyncError as error:
            refusal = error
        assert refusal.code.name == "FAILED_PRECONDITION" and "share CUDA device" in refusal.message, refusal
        return refusal.message[:160]
    finally:
        cluster.stop()


@case("host memory registered with a GPU agent is refused, naming what it takes and --device cpu")
def host_memory_refused():
    cluster = Cluster("host-memory", 1)
    try:
        host = shardsync.SharedBuffer(64)
        layout = shardsync.tensor_layout("w", [16], "float32", flat_placements=[(0, 16, "host", 0)])
        try:
            shardsync.AgentClient(cluster.socket(0)).register("host-trainer", "source", {"host": host}, [layout])
        except shardsync.ShardsyncError as error:
            assert "host memory is not taken by this agent (it takes cuda-ipc)" in error.message, error.message
            assert "an agent of --device cpu" in error.message, error.message
            return error.message[:160]
        finally:
            host.close()
        raise AssertionError("the GPU agent took host memory")
    finally:
        cluster.stop()


def main():
    print(f"GPUs: {GPUS} x {torch.cuda.get_device_name(0) if GPUS else '-'}; torch {torch.__version__}", flush=True)
    cases = [one_gpu, ready_event_case, main_job, host_memory_refused]
    cases += [layout_case(1, z, "TP1", [(0, 1, 0)]) for z in (1, 3)]
    cases += [layout_case(1, 3, "TP1", [(0, 1, 0)], serving="agent0")]
    cases += [engine_case(t, link, unpack) for t in ("copy", "nccl-self") for link, unpack in ((0, 0), (300, 0), (0, 300))]
    cases += [shared_layout_case(2, z, name, layout) for z in (1, 2, 3) for name, layout in TWO_GPU_LAYOUTS.items()]
    cases += [shared_layout_case(4, z, name, layout) for z in (1, 2, 3) for name, layout in FOUR_GPU_LAYOUTS.items()]
    cases += [missing_shard_case(4, shared=True), shared_agent_killed, shared_never_refused]
    cases += [float8_case(1, "TP1", [(0, 1, 0)])]
    cases += [float8_case(4, name, FOUR_GPU_LAYOUTS[name]) for name in ("two TP2 replicas", "TP4 (uneven shards)")]
    if GPUS >= 2:
        cases += [layout_case(2, z, name, layout) for z in (1, 2, 3) for name, layout in TWO_GPU_LAYOUTS.items()]
        cases += [layout_case(2, 3, "TP2", TWO_GPU_LAYOUTS["TP2"], serving="agent0")]
        cases += [layout_case(2, z, "TP2", TWO_GPU_LAYOUTS["TP2"], direct="auto") for z in (1, 3)]
        cases += [missing_shard_case(2), partial_targets, relay_two_nodes, agent_killed]
    if GPUS >= 4:
        cases += [layout_case(4, z, name, layout) for z in (1, 2, 3) for name, layout in FOUR_GPU_LAYOUTS.items()]
        cases += [missing_shard_case(4)]
    for run in cases:
        if args.only in run.name:
            run()
    passed = sum(r["result"] == "passed" for r in RESULTS)
    failed = len(RESULTS) - passed
    with open(os.path.join(OUT, "results.json"), "w") as f:
        json.dump({"gpus": GPUS, "device": torch.cuda.get_device_name(0), "results": RESULTS}, f, indent=1)
    print(f"{passed} passed, {failed} failed", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
