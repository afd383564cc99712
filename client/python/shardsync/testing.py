"""A testing helper, not part of the client API: shardsync's daemons on this machine,
for the Python and GPU tests, the benchmarks and the main job on GPUs: a coordinator and
one agent per rank, plaintext (--insecure) unless given TLS files, each process's output
in a log folder. With serving="agent0" there is no coordinator process: agent 0 serves
as the coordinator and clients call it over TCP; with "agent0-unix" over its unix socket.

tools/localsync (C++) does the same for the C++ end-to-end tests and the CPU main job,
under Bazel; this one runs where only dist/ and Python are (the GPU machines).

    cluster = LocalCluster("dist/bin", world=2, logs="/tmp/logs", cuda=True)
    shardsync.CoordinatorClient(cluster.coordinator, insecure=True).sync()
    cluster.stop()
"""

import os
import shutil
import signal
import subprocess
import tempfile
import time
from typing import List, NamedTuple, Optional, Sequence, Tuple

__all__ = ["SERVINGS", "Host", "LocalCluster", "wait_port"]

SERVINGS = ("process", "agent0", "agent0-unix")


def wait_port(path, timeout=30):
    """The port a daemon wrote to its --port-file."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            with open(path) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except FileNotFoundError:
            pass
        time.sleep(0.01)
    raise RuntimeError(f"no port in {path}")


class Host(NamedTuple):
    """Where a daemon runs: `enter` prefixes its command (e.g. nsenter into a network
    namespace), it listens on, and is reached at, `address`, and `tls` (ca, cert, key),
    where given, are its TLS files instead of the cluster's."""
    enter: Sequence[str] = ()
    address: str = "127.0.0.1"
    tls: Optional[Tuple[str, str, str]] = None


class LocalCluster:
    """`bin_dir` holds shardsync-agent and shardsync-coordinator (or give their paths).
    Agent r runs on CUDA device r with `cuda` (`devices[r]` where given: several agents
    may share one device over the direct path), else on the CPU. `staging_bytes`,
    `sync_timeout_ms`, `relay`, `direct` and `scratch_bytes` go to the coordinator, `rpc_deadline_ms` to every daemon,
    `agent_flags` (e.g. ["--max-staging-bytes", "1073741824"]) to every agent; unset,
    the daemons' defaults. `tls=(ca, cert, key)` (PEM files; `server_name` as
    --tls-server-name): every daemon runs with mutual TLS instead of --insecure.
    `hosts[r]` is where agent r runs and `coordinator_host` the coordinator's (default
    here, on 127.0.0.1); `coordinator_flags` go to the coordinator too.
    ``start_agent(rank)`` starts a killed agent again."""

    def __init__(self, bin_dir, world, logs, *, cuda=False, serving="process", staging_bytes=None,
                 sync_timeout_ms=None, rpc_deadline_ms=None, agent_flags=(), agent_bin=None, coordinator_bin=None,
                 tls=None, server_name=None, nodes=(), relay=None, devices=None, direct=None, scratch_bytes=None,
                 hosts=(), coordinator_host=Host(), coordinator_flags=()):
        if serving not in SERVINGS:
            raise ValueError(f"serving must be one of {SERVINGS}")
        self.dir = tempfile.mkdtemp(prefix="shardsync-local-", dir="/tmp")  # sockets and port files
        self.logs, self.world, self.cuda, self.serving = logs, world, cuda, serving
        os.makedirs(logs, exist_ok=True)
        self.agent_bin = agent_bin or os.path.join(bin_dir, "shardsync-agent")
        optional = [("--staging-bytes", staging_bytes), ("--sync-timeout-ms", sync_timeout_ms), ("--relay", relay),
                    ("--direct", direct), ("--scratch-bytes", scratch_bytes)]
        self.coordinator_flags = ["--world", str(world)] + [x for flag, value in optional if value is not None
                                                            for x in (flag, str(value))] + list(coordinator_flags)
        self.tls, self.server_name = tls, server_name
        self.common_flags = ["--rpc-deadline-ms", str(rpc_deadline_ms)] if rpc_deadline_ms else []
        self.agent_flags = list(agent_flags)
        self.nodes = list(nodes)  # each rank's --node; none: every agent on this host's
        self.devices = list(devices) if devices is not None else list(range(world))
        self.hosts = list(hosts) or [Host()] * world
        self.processes, self.agents = [], {}
        self.coordinator_process = None
        self.joins = None  # where agents join: the coordinator's TCP address
        if serving == "process":
            self.coordinator_process = self.spawn(
                list(coordinator_host.enter) + [coordinator_bin or os.path.join(bin_dir, "shardsync-coordinator"),
                                                "--listen", f"{coordinator_host.address}:0", "--port-file",
                                                f"{self.dir}/c.port"] + self.security(coordinator_host) +
                self.common_flags + self.coordinator_flags,
                "coordinator")
            self.joins = f"{coordinator_host.address}:{wait_port(f'{self.dir}/c.port')}"
        for rank in range(world):
            port = self.start_agent(rank)
            if rank == 0 and serving != "process":
                self.joins = f"{self.hosts[0].address}:{port}"
        # Where clients sync.
        self.coordinator = f"unix:{self.socket(0)}" if serving == "agent0-unix" else self.joins

    def security(self, host: Host) -> List[str]:
        """The TLS flags of a daemon on `host`, or --insecure."""
        tls = host.tls or self.tls
        if not tls:
            return ["--insecure"]
        flags = [x for flag, path in zip(("--tls-ca", "--tls-cert", "--tls-key"), tls) for x in (flag, path)]
        return flags + (["--tls-server-name", self.server_name] if self.server_name else [])

    def device(self, rank):
        """The CUDA device of rank's agent (with `cuda`)."""
        return self.devices[rank]

    def socket(self, rank):
        return f"{self.dir}/a{rank}.sock"

    def spawn(self, argv, name, **kwargs):
        """Starts a process whose stderr (and stdout unless given) go to LOGS/name.log."""
        with open(os.path.join(self.logs, f"{name}.log"), "a") as log:  # the child keeps its own descriptor
            process = subprocess.Popen(argv, stdout=kwargs.pop("stdout", log), stderr=log, **kwargs)
        self.processes.append(process)
        return process

    def start_agent(self, rank):
        """Starts (or, after it died, starts again) the agent of `rank`; its TCP port."""
        port_file = f"{self.dir}/a{rank}.port"
        if os.path.exists(port_file):
            os.unlink(port_file)
        serves = rank == 0 and self.serving != "process"
        where = ["--serve-coordinator"] + self.coordinator_flags if serves else ["--coordinator", self.joins]
        device = ["--device", str(self.devices[rank])] if self.cuda else []
        node = ["--node", self.nodes[rank]] if rank < len(self.nodes) else []
        host = self.hosts[rank]
        self.agents[rank] = self.spawn(list(host.enter) + [self.agent_bin, "--rank", str(rank), "--socket",
                                                           self.socket(rank), "--listen", f"{host.address}:0",
                                                           "--port-file", port_file] + self.security(host) +
                                       self.common_flags + device + node + self.agent_flags + where, f"agent{rank}")
        return wait_port(port_file)

    def stop(self, clients=()):
        """Asks `clients` (processes reading commands on stdin) to exit, then stops every
        daemon (a process that does not end in time is killed) and removes the folder of
        sockets and port files; the logs stay."""
        for p in clients:
            if p.poll() is None and p.stdin:
                p.stdin.write("exit\n")
                p.stdin.flush()
        daemons = list(self.agents.values()) + ([self.coordinator_process] if self.coordinator_process else [])
        for p in daemons:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for p in list(clients) + daemons:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(self.dir, ignore_errors=True)
