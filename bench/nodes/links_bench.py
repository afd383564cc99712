"""The cost model against real links: syncs between nodes of the test bed
(tests/nodes/testbed.py: network namespaces, veth links shaped by tbf, mutual TLS), each
timed against the floor its link gives: the bytes that must cross the busiest node link
(shardsyncctl explain's planned network bytes, per node) over that link's rate.

Cases, each at every --rates value (Mbit/s, both directions of every node's link):
  node-to-node  a ZeRO-3 trainer rank on node a into a TP=1 rollout rank on node c
  two-level     ZeRO-3 over ranks on nodes a and b into two TP=1 replicas on node c,
                relayed: each element crosses into c once, then between c's agents

Prints a table: planned bytes, the floor, the median of --syncs timed syncs (the
coordinator's whole-sync seconds, after one warm-up sync), and their ratio. Needs root.

With --delta-changed F1,F2,...: instead, delta sync against full, side by side. For
each case, rate and fraction, a cluster with --delta off and one with --delta always
each run --syncs syncs after a warm-up, the trainer changing a fraction F of its
elements before each (demo_client "refill SEED F": the same F of the elements take a
new seed's values at every step, the rest keep the first seed's).
Prints the bytes that crossed into the rollout's node (its link's counters), the wire
bytes the agents reported, the 16-bit words that changed, and the median sync time.

    bazel run -c opt //bench/nodes:links_bench -- --rates 100,400,1000
    bazel run -c opt //bench/nodes:links_bench -- --rates 200 --cases node-to-node --delta-changed 0.005,0.05
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "nodes"))
import testbed  # noqa: E402

from shardsync.testing import Host, LocalCluster  # noqa: E402

AGENT = os.path.abspath("daemon/agent/shardsync-agent")
COORDINATOR = os.path.abspath("daemon/coordinator/shardsync-coordinator")
CTL = os.path.abspath("client/cli/shardsyncctl")
DEMO = os.path.abspath("tools/localsync/demo_client")

CASES = {
    # name: ({rank: node}, dp ranks, replicas)
    "node-to-node": ({0: "a", 1: "c"}, [0], [[1]]),
    "two-level": ({0: "a", 1: "b", 2: "c", 3: "c"}, [0, 1], [[2], [3]]),
}


def spec(rows, dp, replicas):
    """A layout spec: two bfloat16 tensors of `rows` x 4096 (COLUMN and ROW), ZeRO-3 over `dp`."""
    tensors = [{"name": "w_col", "shape": [rows, 4096], "style": "COLUMN"},
               {"name": "w_row", "shape": [4096, rows], "style": "ROW"}]
    return {"model": {"tensors": tensors, "zero_stage": 3, "dp_ranks": dp,
                      "replicas": [{"ranks": r} for r in replicas]}}


class Case:
    def __init__(self, bed, tls, folder, name, rows, staging_bytes, delta="off"):
        nodes, dp, replicas = CASES[name]
        self.bed, self.tls, self.nodes = bed, tls, nodes
        self.logs = tempfile.mkdtemp(prefix=f"{name}-", dir=folder)
        hosts = [Host(bed.enter(nodes[r]), bed.address(nodes[r]), tls[nodes[r]]) for r in sorted(nodes)]
        self.cluster = LocalCluster(None, len(nodes), self.logs, agent_bin=AGENT, coordinator_bin=COORDINATOR,
                                    hosts=hosts, coordinator_host=Host(bed.enter("a"), bed.address("a"), tls["a"]),
                                    nodes=[nodes[r] for r in sorted(nodes)], relay="always",
                                    staging_bytes=staging_bytes, sync_timeout_ms=600000,
                                    coordinator_flags=["--delta", delta])
        path = os.path.join(self.logs, "spec.json")
        with open(path, "w") as f:
            json.dump(spec(rows, dp, replicas), f)
        self.clients, self.sources = [], []
        targets = {r for replica in replicas for r in replica}
        for rank in sorted(nodes):
            for role in (["source"] if rank in dp else []) + (["target"] if rank in targets else []):
                client_id = f"{role}-{rank}"
                with open(os.path.join(self.logs, f"{client_id}.log"), "a") as log:
                    process = subprocess.Popen(
                        bed.enter(nodes[rank]) + [DEMO, "--socket", self.cluster.socket(rank), "--spec", path,
                                                  "--rank", str(rank), "--role", role, "--client-id", client_id,
                                                  "--shm-prefix", f"/bench-{client_id}"],
                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
                line = process.stdout.readline()
                if not line.startswith("ready"):
                    raise RuntimeError(f"{client_id}: {line.strip()}")
                self.clients.append(process)
                if role == "source":
                    self.sources.append(process)

    def refill(self, seed, changed):
        """Every trainer rewrites its sources: the fraction `changed` of elements take
        seed `seed`'s values, the rest the first seed's."""
        for process in self.sources:
            process.stdin.write(f"refill {seed} {changed}\n")
            process.stdin.flush()
        for process in self.sources:
            line = process.stdout.readline()
            if not line.startswith("refilled"):
                raise RuntimeError(f"a trainer answered {line.strip()!r} to refill")

    def ctl(self, *args):
        ca, cert, key = self.tls["a"]
        done = subprocess.run(self.bed.enter("a") + [CTL, *args, "--coordinator", self.cluster.joins, "--tls-ca", ca,
                                                     "--tls-cert", cert, "--tls-key", key, "--json"],
                              capture_output=True, text=True, timeout=900)
        if done.returncode != 0:
            raise RuntimeError(f"shardsyncctl {' '.join(args)}: {done.stderr}")
        return json.loads(done.stdout)

    def floor_seconds(self, mbit):
        """(bytes over the busiest node link, seconds at `mbit`): per node, the planned bytes
        into it and out of it, each direction at the link's rate."""
        plan = self.ctl("explain")
        into, out = {}, {}
        for r in plan["ranks"]:
            node = self.nodes[r["rank"]]
            into[node] = into.get(node, 0) + int(r.get("network_received_bytes", 0))
            out[node] = out.get(node, 0) + int(r.get("network_sent_bytes", 0))
        busiest = max(list(into.values()) + list(out.values()))
        return busiest, busiest * 8 / (mbit * 1e6)

    def close(self):
        for process in self.clients:
            process.stdin.write("exit\n")
            process.stdin.flush()
        for process in self.clients:
            process.wait(timeout=30)
            process.stdin.close()
            process.stdout.close()
        self.cluster.stop()


def delta_table(bed, tls, folder, args):
    """Delta sync against full on shaped links (--delta-changed)."""
    print(f"{'case':<14} {'Mbit/s':>7} {'F':>6} {'words changed':>13} {'delta':>6} {'link bytes into c':>18} "
          f"{'wire bytes':>11} {'sync s (median)':>16}")
    for name in args.cases.split(","):
        for mbit in [float(r) for r in args.rates.split(",")]:
            for node in ("a", "b", "c"):
                bed.set_rate(node, mbit)
            for changed in [float(f) for f in args.delta_changed.split(",")]:
                for delta in ("off", "always"):
                    case = Case(bed, tls, folder, name, args.rows, args.staging_bytes, delta)
                    try:
                        case.ctl("sync")  # warm-up: plans, connects, the snapshots of delta sync
                        times, into_c, wire, words, elements = [], [], [], [], []
                        for k in range(args.syncs):
                            case.refill(100 + k, changed)
                            before = bed.link_bytes("c")[0]
                            result = case.ctl("sync")
                            into_c.append(bed.link_bytes("c")[0] - before)
                            times.append(result["seconds"])
                            ranks = result["ranks"]
                            wire.append(sum(int(r.get("wire_bytes", 0)) for r in ranks))
                            words.append(sum(int(r.get("changed_words", 0)) for r in ranks))
                            elements.append(sum(int(r.get("sent_bytes", 0)) for r in ranks) // 2)
                    finally:
                        case.close()
                    changed_words = f"{100 * statistics.median(words) / max(1, statistics.median(elements)):.2f}%"
                    print(f"{name:<14} {mbit:>7.0f} {changed:>6g} {changed_words if delta != 'off' else '':>13} "
                          f"{delta:>6} {int(statistics.median(into_c)):>18} {int(statistics.median(wire)):>11} "
                          f"{statistics.median(times):>16.3f}", flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="100,400,1000", help="link rates, Mbit/s")
    parser.add_argument("--rows", type=int, default=4096, help="rows of each of the two 4096-wide tensors")
    parser.add_argument("--syncs", type=int, default=3, help="timed syncs per case")
    parser.add_argument("--staging-bytes", type=int, default=None, help="the coordinator's --staging-bytes")
    parser.add_argument("--cases", default=",".join(CASES))
    parser.add_argument("--delta-changed", default="", help="fractions: delta sync against full instead")
    args = parser.parse_args()
    why = testbed.missing()
    if why:
        sys.exit(f"links_bench: {why}")
    folder = tempfile.mkdtemp(prefix="ss-links-bench-")
    with testbed.TestBed(["a", "b", "c"]) as bed:
        tls = bed.certificates(folder)
        if args.delta_changed:
            delta_table(bed, tls, folder, args)
            print(f"logs: {folder}")
            return
        print(f"{'case':<14} {'Mbit/s':>7} {'bytes':>12} {'floor s':>9} {'sync s (median, min-max)':>26} "
              f"{'x floor':>8}")
        for name in args.cases.split(","):
            for mbit in [float(r) for r in args.rates.split(",")]:
                for node in ("a", "b", "c"):
                    bed.set_rate(node, mbit)
                case = Case(bed, tls, folder, name, args.rows, args.staging_bytes)
                try:
                    busiest, floor = case.floor_seconds(mbit)
                    case.ctl("sync")  # warm-up: plans, connects
                    times = [case.ctl("sync")["seconds"] for _ in range(args.syncs)]
                finally:
                    case.close()
                median = statistics.median(times)
                print(f"{name:<14} {mbit:>7.0f} {busiest:>12} {floor:>9.3f} "
                      f"{median:>10.3f} ({min(times):.3f}-{max(times):.3f}) {median / floor:>8.3f}", flush=True)
    print(f"logs: {folder}")


if __name__ == "__main__":
    main()
