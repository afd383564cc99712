"""Three nodes on one machine (tests/nodes/testbed.py: network namespaces, a bridge,
real TCP under mutual TLS with a certificate per node), eight CPU agents: a ZeRO-3 (or
ZeRO-1/2 fp32-master) trainer over DP ranks 0-3 on nodes a and b, two TP=2 replicas of
the vLLM stand-in on ranks 4-7 of node c. The coordinator runs on a node of its own,
d, and shardsyncctl is called there, so that the links of a, b and c carry only what
their agents send and receive. Every engine is checked against its own loader after every sync that
succeeded; a sync that failed must leave every target the coordinator calls valid
exactly as the last good sync wrote it. Without root (or `ip`, `tc`, `unshare`,
`nsenter`) it says "skipped" and runs nothing."""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import testbed  # noqa: E402

AGENT = os.path.abspath("daemon/agent/shardsync-agent")
COORDINATOR = os.path.abspath("daemon/coordinator/shardsync-coordinator")
CTL = os.path.abspath("client/cli/shardsyncctl")
CLIENT = os.path.abspath("tests/nodes/node_client.py")
DEMO = os.path.abspath("tools/localsync/demo_client")
NODES = {"a": [0, 1], "b": [2, 3], "c": [4, 5, 6, 7], "d": []}  # d: the coordinator
WORLD = 8
ENGINES = [4, 5, 6, 7]  # ranks 0-3 hold the trainer's shards
SYNC_TIMEOUT_MS = 300000  # the coordinator's: only a hang reaches it


def node_of(rank):
    return next(node for node, ranks in NODES.items() if rank in ranks)


class NodeClient:
    """tests/nodes/node_client.py on one node."""

    def __init__(self, bed, node, log):
        env = dict(os.environ, PYTHONPATH=os.path.abspath("client/python"))
        self.process = bed.spawn(node, ["/usr/bin/python3", CLIENT], log, stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env)

    def send(self, op, **args):
        self.process.stdin.write(json.dumps({"op": op, **args}) + "\n")
        self.process.stdin.flush()

    def answer(self):
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError("the node client ended")
        reply = json.loads(line)
        if "error" in reply:
            raise RuntimeError(reply["error"])
        return reply["ok"]

    def call(self, op, **args):
        self.send(op, **args)
        return self.answer()


@unittest.skipIf(testbed.missing(), f"skipped: {testbed.missing()}")
class NodesTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.folder = tempfile.mkdtemp(prefix="ss-nodes-", dir=os.environ.get("TEST_TMPDIR"))
        cls.bed = testbed.TestBed(list(NODES))
        cls.tls = cls.bed.certificates(cls.folder)

    @classmethod
    def tearDownClass(cls):
        cls.bed.close()

    def setUp(self):
        self.cluster = None
        self.clients = {}

    def tearDown(self):
        for client in self.clients.values():
            if client.process.poll() is None:
                client.send("exit")
        for client in self.clients.values():
            try:
                client.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                client.process.kill()
                client.process.wait(timeout=30)
            client.process.stdin.close()
            client.process.stdout.close()
        if self.cluster:
            self.cluster.stop()
        for node in NODES:
            self.bed.heal(node)
            self.bed.clear_rate(node)

    def start(self, kind, seed, relay="auto", agent_flags=()):
        """The daemons and every node's clients, registered and published."""
        from shardsync.testing import Host, LocalCluster
        hosts = [Host(self.bed.enter(node_of(r)), self.bed.address(node_of(r)), self.tls[node_of(r)])
                 for r in range(WORLD)]
        logs = tempfile.mkdtemp(prefix="logs-", dir=self.folder)
        self.cluster = LocalCluster(None, WORLD, logs, agent_bin=AGENT, coordinator_bin=COORDINATOR, hosts=hosts,
                                    coordinator_host=Host(self.bed.enter("d"), self.bed.address("d"), self.tls["d"]),
                                    nodes=[node_of(r) for r in range(WORLD)], relay=relay,
                                    sync_timeout_ms=SYNC_TIMEOUT_MS, agent_flags=list(agent_flags))
        for node in ("a", "b", "c"):
            self.clients[node] = NodeClient(self.bed, node, os.path.join(logs, f"client-{node}.log"))
        for node in ("a", "b"):
            self.clients[node].call(kind, agents={str(r): self.cluster.socket(r) for r in NODES[node]}, dp=4, seed=seed)
        for first in (4, 6):
            self.clients["c"].call("engines", agents={str(r): self.cluster.socket(r) for r in (first, first + 1)},
                                   tp=2, first=first)
        self.wait_published()

    def wait_published(self):
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            code, status = self.ctl("status")
            if code == 0 and len(status["agents"]) == WORLD and all(a["clients"] >= 1 for a in status["agents"]):
                return
            time.sleep(0.1)
        self.fail(f"not every client published within 60 s: {status}")

    def ctl_argv(self, command, *args):
        """shardsyncctl COMMAND ARGS on node d, with its certificate."""
        ca, cert, key = self.tls["d"]
        return self.bed.enter("d") + [CTL, command, "--coordinator", self.cluster.joins, "--tls-ca", ca, "--tls-cert",
                                      cert, "--tls-key", key, *args]

    def ctl(self, command, *args, timeout=120):
        """shardsyncctl COMMAND --json on node d: (exit code, the JSON or stderr)."""
        done = subprocess.run(self.ctl_argv(command, "--json", *args), capture_output=True, text=True,
                              timeout=timeout)
        return done.returncode, (json.loads(done.stdout) if done.returncode == 0 else done.stderr + done.stdout)

    def check_engines(self, kind, seed, ranks=ENGINES):
        self.assertEqual(self.clients["c"].call("check", kind=kind, seed=seed, ranks=list(ranks)), [])

    def test_exact_over_three_nodes_with_and_without_relay_bytes_on_the_wire_as_planned(self):
        for kind, relay in (("zero3", "always"), ("masters", "never")):
            with self.subTest(kind=kind, relay=relay):
                self.start(kind, 1, relay=relay)
                code, response = self.ctl("sync", "--verify")
                self.assertEqual(code, 0, response)
                self.check_engines(kind, 1)
                for node in ("a", "b"):
                    self.clients[node].call("refill", seed=2)
                code, plan = self.ctl("explain")
                self.assertEqual(code, 0, plan)
                # Per node link: planned bytes in (c) and out (a, b); what crossed it in the sync.
                planned = {("c", 0): 0, ("a", 1): 0, ("b", 1): 0}
                for r in plan["ranks"]:
                    node = node_of(r["rank"])
                    if (node, 0) in planned:
                        planned[(node, 0)] += int(r.get("network_received_bytes", 0))
                    if (node, 1) in planned:
                        planned[(node, 1)] += int(r.get("network_sent_bytes", 0))
                before = {node: self.bed.link_bytes(node) for node in "abc"}
                resent_before = {node: self.bed.retransmitted_segments(node) for node in "abc"}
                code, response = self.ctl("sync")
                self.assertEqual(code, 0, response)
                after = {node: self.bed.link_bytes(node) for node in "abc"}
                # Each segment a node sent again, at most an MTU (9000) and its frame.
                resent = {node: (self.bed.retransmitted_segments(node) - resent_before[node]) * 9018
                          for node in "abc"}
                self.check_engines(kind, 2)
                for (node, direction), bytes_planned in planned.items():
                    moved = after[node][direction] - before[node][direction]
                    way = "into" if direction == 0 else "out of"
                    print(f"{kind}, relay {relay}: {moved} bytes {way} node {node}, {bytes_planned} planned: "
                          f"{moved / bytes_planned:.4f}x; resent at most {resent[node]} bytes out of it")
                    self.assertGreater(bytes_planned, 0)
                    self.assertGreaterEqual(moved, bytes_planned)
                    # 1.005-1.008x on a quiet machine (framing: TLS records, HTTP/2 frames,
                    # TCP/IP headers). Heartbeats and keepalive pings, about one per
                    # connection a second, cross the same links: beside a whole test suite
                    # the sync takes longer and they reached 1.012x. Hence 2%, a bound any
                    # second copy of a piece (1.5x or more here) still breaks, beyond
                    # what TCP resent (a loaded machine drops packets between
                    # namespaces: 1.0201x once, beside a test suite). Bytes into node c
                    # are resent by a and b, out of a and b by themselves.
                    allowance = resent["a"] + resent["b"] if direction == 0 else resent[node]
                    self.assertLessEqual(moved, bytes_planned * 1.02 + allowance, f"{way} node {node}")
                self.tearDown()
                self.setUp()

    def agents_idle(self, deadline):
        """Waits until no agent is inside a sync; the ranks still inside one at `deadline`."""
        import shardsync
        while True:
            busy = [r for r in range(WORLD)
                    if shardsync.AgentClient(self.cluster.socket(r)).status().running_sync_id]
            if not busy or time.monotonic() > deadline:
                return busy
            time.sleep(0.1)

    def check_validity_holds(self, kind, seed, unreachable=()):
        """Every target the coordinator or its own agent calls valid holds the sync of
        `seed` exactly, and each agent says what the coordinator says of it, but for an
        agent of `unreachable`: the coordinator calls every target of a failed sync
        invalid, and one whose Execute was lost on the way (it never wrote) keeps its
        targets valid and cannot say so. Returns the ranks the coordinator calls invalid."""
        import shardsync
        code, status = self.ctl("status")
        self.assertEqual(code, 0, status)
        invalid = set(status.get("invalid_target_ranks", []))
        self.assertLessEqual(invalid, set(ENGINES))
        valid = set()
        for rank in ENGINES:
            own = shardsync.AgentClient(self.cluster.socket(rank)).status().target_valid
            if own:
                valid.add(rank)
            if not (own and rank in invalid and rank in unreachable):
                self.assertEqual(own, rank not in invalid, f"rank {rank}")
        self.check_engines(kind, seed, sorted((set(ENGINES) - invalid) | valid))
        return invalid

    def test_a_link_cut_mid_sync_is_named_by_liveness_and_the_next_sync_after_healing_succeeds(self):
        self.start("zero3", 1, relay="always")
        code, response = self.ctl("sync")
        self.assertEqual(code, 0, response)
        for node in ("a", "b"):
            self.clients[node].call("refill", seed=2)
        self.bed.set_rate("c", 8)  # about 5 s for the 5 MB into node c
        into_c = self.bed.link_bytes("c")[0]
        started = time.monotonic()
        sync = subprocess.Popen(self.ctl_argv("sync"), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        while self.bed.link_bytes("c")[0] - into_c < 1 << 20 and sync.poll() is None:
            time.sleep(0.01)  # until the sync is under way (or, failing the test below, over)
        self.bed.cut("c")
        cut = time.monotonic()
        output = sync.communicate(timeout=SYNC_TIMEOUT_MS / 1000 + 60)[0]
        named = time.monotonic() - cut
        print(f"cut mid-sync: the sync ended {named:.2f} s after the cut: {output.strip()}")
        self.assertEqual(sync.returncode, 4, output)
        self.assertRegex(output, r"rank [4-7]")
        # Named by the connections' liveness (seconds), not by the sync's 300 s deadline.
        self.assertLess(named, SYNC_TIMEOUT_MS / 1000 / 2)
        busy = self.agents_idle(started + SYNC_TIMEOUT_MS / 1000 + 10)
        print(f"every agent left the failed sync {time.monotonic() - cut:.2f} s after the cut")
        self.assertEqual(busy, [])
        invalid = self.check_validity_holds("zero3", 1, unreachable=NODES["c"])
        print(f"targets reported invalid after the cut: ranks {sorted(invalid)}")
        self.bed.heal("c")
        self.bed.clear_rate("c")
        healed = time.monotonic()
        code, response = self.ctl("sync", "--verify")
        print(f"the first sync after healing: exit {code} after {time.monotonic() - healed:.2f} s")
        self.assertEqual(code, 0, response)
        self.check_engines("zero3", 2)

    def test_a_link_down_before_a_sync_is_refused_by_name_and_nothing_is_written(self):
        self.start("zero3", 1)
        code, response = self.ctl("sync")
        self.assertEqual(code, 0, response)
        for node in ("a", "b"):
            self.clients[node].call("refill", seed=2)
        self.bed.cut("c")
        cut = time.monotonic()
        code, response = self.ctl("sync")
        print(f"link down before a sync: exit {code} after {time.monotonic() - cut:.2f} s: {response.strip()}")
        self.assertEqual(code, 3, response)
        self.assertRegex(response, r"rank [4-7]")
        self.assertEqual(self.check_validity_holds("zero3", 1), set())
        # Status names the silent agents, and how long since each was heard from; only a
        # hang exhausts the polls (each ctl call is a process start and a round trip).
        for _ in range(1000):
            code, status = self.ctl("status")
            self.assertEqual(code, 0, status)
            silent = {a["rank"] for a in status["agents"] if not a["reachable"]}
            if silent == set(NODES["c"]):
                break
            time.sleep(0.1)
        print(f"status: node c's agents silent {time.monotonic() - cut:.2f} s after the cut")
        self.assertEqual(silent, set(NODES["c"]))
        # Status is consistent with itself: "silent" means unheard for 3 s or more.
        self.assertTrue(all(a["seconds_since_seen"] >= 3 for a in status["agents"] if a["rank"] in silent))
        self.bed.heal("c")
        code, response = self.ctl("sync", "--verify")
        self.assertEqual(code, 0, response)
        self.check_engines("zero3", 2)

    def test_a_whole_node_lost_and_restarted_rejoins_and_the_next_sync_is_exact(self):
        self.start("zero3", 1)
        code, response = self.ctl("sync")
        self.assertEqual(code, 0, response)
        self.bed.kill_all([self.cluster.agents[r] for r in NODES["c"]])
        for node in ("a", "b"):
            self.clients[node].call("refill", seed=2)
        code, response = self.ctl("sync")
        self.assertEqual(code, 3, response)  # refused: nothing of node c answers
        for rank in NODES["c"]:
            self.cluster.start_agent(rank)
        self.clients["c"].call("reregister")
        self.wait_published()
        code, response = self.ctl("sync", "--verify")
        self.assertEqual(code, 0, response)
        self.check_engines("zero3", 2)

    def test_a_chunk_of_seconds_of_a_slow_link_and_its_delta_arrive_in_pieces(self):
        """Node a's trainer rank into node c's rollout rank over a 20 Mbit/s link: 16 MiB in
        one chunk, 6.7 s of the link, then half of it changed, about 4 s as a delta. As one
        message each the sender heard nothing back for longer than its keepalive allows
        and the sync failed; in pieces both syncs succeed, every target checked."""
        from shardsync.testing import Host, LocalCluster
        nodes = {0: "a", 1: "c"}
        logs = tempfile.mkdtemp(prefix="logs-", dir=self.folder)
        hosts = [Host(self.bed.enter(nodes[r]), self.bed.address(nodes[r]), self.tls[nodes[r]]) for r in (0, 1)]
        self.cluster = LocalCluster(None, 2, logs, agent_bin=AGENT, coordinator_bin=COORDINATOR, hosts=hosts,
                                    coordinator_host=Host(self.bed.enter("d"), self.bed.address("d"), self.tls["d"]),
                                    nodes=[nodes[0], nodes[1]], sync_timeout_ms=SYNC_TIMEOUT_MS,
                                    coordinator_flags=["--delta", "always"])
        spec = os.path.join(logs, "spec.json")
        with open(spec, "w") as f:
            json.dump({"model": {"tensors": [{"name": "w_col", "shape": [1024, 4096], "style": "COLUMN"},
                                             {"name": "w_row", "shape": [4096, 1024], "style": "ROW"}],
                                 "zero_stage": 3, "dp_ranks": [0], "replicas": [{"ranks": [1]}]}}, f)
        demos = {}
        for rank, role in ((0, "source"), (1, "target")):
            log = open(os.path.join(logs, f"{role}.log"), "a")
            self.addCleanup(log.close)
            demos[role] = subprocess.Popen(
                self.bed.enter(nodes[rank]) + [DEMO, "--socket", self.cluster.socket(rank), "--spec", spec,
                                               "--rank", str(rank), "--role", role, "--client-id", role,
                                               "--shm-prefix", f"/nodes-test-{role}"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log, text=True)
            self.addCleanup(demos[role].wait, 30)
            self.addCleanup(demos[role].stdin.close)
            self.assertTrue(demos[role].stdout.readline().startswith("ready"))
        deadline = time.monotonic() + 60
        while True:
            code, status = self.ctl("status")
            if code == 0 and len(status["agents"]) == 2 and all(a["clients"] >= 1 for a in status["agents"]):
                break
            self.assertLess(time.monotonic(), deadline, f"not every client published within 60 s: {status}")
            time.sleep(0.1)
        self.bed.set_rate("c", 20)
        code, first = self.ctl("sync", "--verify")
        self.assertEqual(code, 0, first)
        self.assertEqual(sum(int(r.get("sent_bytes", 0)) for r in first["ranks"]), 16 << 20)
        demos["source"].stdin.write("refill 2 0.5\n")
        demos["source"].stdin.flush()
        self.assertEqual(demos["source"].stdout.readline().strip(), "refilled")
        code, second = self.ctl("sync", "--verify")
        self.assertEqual(code, 0, second)
        wire = sum(int(r.get("wire_bytes", 0)) for r in second["ranks"])
        self.assertGreater(wire, 6 << 20)  # seconds of the link as a delta
        self.assertLess(wire, 16 << 20)
        for demo in demos.values():
            demo.stdin.write("exit\n")
            demo.stdin.flush()

    def test_a_bed_leaves_nothing_behind_also_when_its_user_fails(self):
        with self.assertRaises(RuntimeError):
            with testbed.TestBed(["x", "y"]) as bed:
                made = [bed.namespace("x"), bed.namespace("y")]
                self.assertTrue(set(made) <= set(testbed.namespaces()))
                sleeper = bed.spawn("x", ["sleep", "600"], os.path.join(self.folder, "sleeper.log"))
                holders = [holder.pid for holder in bed._holders.values()]
                raise RuntimeError("the user's code failed")
        self.assertEqual(set(made) & set(testbed.namespaces()), set())
        self.assertIsNotNone(sleeper.poll())
        for pid in holders:
            self.assertFalse(os.path.exists(f"/proc/{pid}"), pid)


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))  # Bazel's timeout: the bed still closes
    why = testbed.missing()
    if why:
        print(f"skipped: {why}")
        sys.exit(0)
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed or result.testsRun == 0 else 0)
