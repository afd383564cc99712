"""Nodes on one machine: each node a Linux network, mount and UTS namespace of its own
(its own addresses, links, host name and a private /dev/shm), joined by veth pairs to a
bridge in a namespace of its own. Only namespaces and addresses (198.18.0.0/15) this bed
made are touched, never the host's interfaces. Needs root, `ip`, `tc`, `unshare`,
`nsenter` and `openssl` (for the nodes' certificates); `missing()` says what is not there.

    with TestBed(["a", "b"]) as bed:
        bed.spawn("a", ["/bin/true"], "log.txt")
        bed.set_rate("b", 100)      # Mbit/s both ways on b's link
        bed.cut("b"); bed.heal("b")
        bed.link_bytes("b")         # (bytes into b, bytes out of b) on its link

Everything it made (processes, namespaces, the tmpfs of each node) is removed by
close(), on every exit path of a `with` and at the process's exit; its own processes
die with it; and a bed whose process was killed is removed, processes and all, by the
next bed made on the machine. Processes others started inside its nodes (`enter`) are
killed with its namespaces.
"""

import atexit
import ctypes
import itertools
import os
import shutil
import signal
import subprocess
import time
from typing import Dict, List, Optional, Sequence, Tuple

__all__ = ["TestBed", "missing"]

TOOLS = ("ip", "tc", "unshare", "nsenter", "openssl")
PREFIX = "ssbed"  # every namespace a bed makes: ssbed<pid>-<bed>-<name>


def missing() -> Optional[str]:
    """Why a bed cannot be made here, or None."""
    if os.geteuid() != 0:
        return "not root"
    absent = [tool for tool in TOOLS if shutil.which(tool) is None]
    return f"missing {', '.join(absent)}" if absent else None


def _run(*argv: str) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
    return done.stdout


def namespaces() -> List[str]:
    """The namespaces of every bed on this machine (`ip netns`)."""
    listed = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, timeout=30).stdout
    return [line.split()[0] for line in listed.splitlines() if line.startswith(PREFIX)]


def remove_orphans() -> None:
    """Removes the namespaces of beds whose process is gone, and every process in them."""
    for name in namespaces():
        pid = name[len(PREFIX):].split("-")[0]
        if pid.isdigit() and not os.path.exists(f"/proc/{pid}"):
            _remove_namespace(name)


def _remove_namespace(name: str) -> None:
    """SIGKILLs every process in network namespace `name`, then deletes it."""
    listed = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True, timeout=30)
    for inside in listed.stdout.split():
        try:
            os.kill(int(inside), signal.SIGKILL)
        except ProcessLookupError:
            pass
    subprocess.run(["ip", "netns", "delete", name], capture_output=True, timeout=30)


def _die_with_parent() -> None:
    """In a child before exec: SIGKILL it when the bed's process dies."""
    PR_SET_PDEATHSIG = 1
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


class TestBed:
    """Nodes `names`, node i at 198.18.0.(10 + i)."""

    _made_here = itertools.count()  # beds of this process, each with namespaces of its own

    def __init__(self, names: Sequence[str]) -> None:
        remove_orphans()
        self.names = list(names)
        self._id = f"{PREFIX}{os.getpid()}-{next(TestBed._made_here)}"
        self._bridge = f"{self._id}-br"
        self._holders: Dict[str, subprocess.Popen] = {}
        self._processes: List[subprocess.Popen] = []
        self._made: List[str] = []
        atexit.register(self.close)
        try:
            self._make()
        except BaseException:
            self.close()
            raise

    def _make(self) -> None:
        self._add_namespace(self._bridge)
        _run("ip", "-n", self._bridge, "link", "add", "br0", "type", "bridge")
        _run("ip", "-n", self._bridge, "link", "set", "br0", "up")
        for i, name in enumerate(self.names):
            ns = self.namespace(name)
            self._add_namespace(ns)
            # Made inside the node's namespace, its peer inside the bridge's: never the host's.
            _run("ip", "-n", ns, "link", "add", "eth0", "mtu", "9000", "type", "veth", "peer", "name", self._port(name),
                 "mtu", "9000", "netns", self._bridge)
            _run("ip", "-n", self._bridge, "link", "set", self._port(name), "master", "br0")
            _run("ip", "-n", self._bridge, "link", "set", self._port(name), "up")
            # IPv4 of the bed's range only: no IPv6 link-local chatter on the counted links.
            _run("ip", "netns", "exec", ns, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1")
            _run("ip", "netns", "exec", self._bridge, "sysctl", "-q", "-w", "net.ipv6.conf.all.disable_ipv6=1",
                 "net.ipv6.conf.default.disable_ipv6=1")
            _run("ip", "-n", ns, "addr", "add", f"{self.address(name)}/24", "dev", "eth0")
            _run("ip", "-n", ns, "link", "set", "eth0", "up")
            _run("ip", "-n", ns, "link", "set", "lo", "up")
            # A process holding the node's mount and UTS namespaces: a private /dev/shm and
            # the node's host name; every process of the node enters them.
            holder = subprocess.Popen(
                ["ip", "netns", "exec", ns, "unshare", "--mount", "--uts", "--propagation", "private", "--", "sh", "-c",
                 f"mount -t tmpfs -o size=1g tmpfs /dev/shm && hostname {name} && echo ready && exec sleep 86400"],
                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_die_with_parent)
            self._holders[name] = holder
            if holder.stdout.readline().strip() != "ready":
                raise RuntimeError(f"node {name}: {holder.stderr.read().strip()}")

    def _add_namespace(self, ns: str) -> None:
        _run("ip", "netns", "add", ns)
        self._made.append(ns)

    def namespace(self, name: str) -> str:
        return f"{self._id}-{name}"

    def _port(self, name: str) -> str:
        return f"p{self.names.index(name)}"  # the bridge's end of the node's link

    def address(self, name: str) -> str:
        return f"198.18.0.{10 + self.names.index(name)}"

    def certificates(self, folder: str) -> Dict[str, Tuple[str, str, str]]:
        """A CA and, per node, a certificate naming the node's address, made with openssl
        in `folder`: {node: (ca, cert, key)} PEM paths."""
        quiet = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "timeout": 60}
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        ca = os.path.join(folder, "ca")
        subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", ca + ".key", "-out", ca + ".pem", "-days", "1",
                        "-subj", "/CN=bed-ca"], **quiet)
        out = {}
        for name in self.names:
            base = os.path.join(folder, name)
            subprocess.run(["openssl", "req", *ec, "-keyout", base + ".key", "-out", base + ".csr", "-subj",
                            f"/CN={name}"], **quiet)
            with open(base + ".ext", "w") as f:
                f.write(f"subjectAltName=IP:{self.address(name)}\n")
            subprocess.run(["openssl", "x509", "-req", "-in", base + ".csr", "-CA", ca + ".pem", "-CAkey",
                            ca + ".key", "-CAcreateserial", "-out", base + ".pem", "-days", "1", "-extfile",
                            base + ".ext"], **quiet)
            out[name] = (ca + ".pem", base + ".pem", base + ".key")
        return out

    def enter(self, name: str) -> List[str]:
        """The argv prefix that runs a command on node `name`."""
        pid = str(self._holders[name].pid)
        # The holder is `ip netns exec`, which became `unshare`, which became `sh`, then `sleep`.
        return ["nsenter", "--target", pid, "--net", "--mount", "--uts", "--"]

    def spawn(self, name: str, argv: Sequence[str], log: str, **kwargs) -> subprocess.Popen:
        """Starts `argv` on node `name`, its stderr (and stdout unless given) into `log`;
        the bed kills it on close()."""
        with open(log, "a") as out:  # the child keeps its own descriptor
            process = subprocess.Popen(self.enter(name) + list(argv), stdout=kwargs.pop("stdout", out), stderr=out,
                                       preexec_fn=_die_with_parent, **kwargs)
        self._processes.append(process)
        return process

    def set_rate(self, name: str, mbit: float) -> None:
        """Shapes node `name`'s link to `mbit` Mbit/s in each direction (token buckets on
        both ends of its veth pair)."""
        burst = max(int(mbit * 1e6 / 8 / 100), 256 * 1024)  # 10 ms of the rate, at least 4 packets
        for ns, dev in ((self.namespace(name), "eth0"), (self._bridge, self._port(name))):
            _run("ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev, "root", "tbf", "rate", f"{mbit}mbit",
                 "burst", str(burst), "latency", "1s")

    def clear_rate(self, name: str) -> None:
        for ns, dev in ((self.namespace(name), "eth0"), (self._bridge, self._port(name))):
            subprocess.run(["ip", "netns", "exec", ns, "tc", "qdisc", "del", "dev", dev, "root"], capture_output=True,
                           timeout=30)

    def cut(self, name: str) -> None:
        """Partitions node `name`: its link goes down at the bridge."""
        _run("ip", "-n", self._bridge, "link", "set", self._port(name), "down")

    def heal(self, name: str) -> None:
        _run("ip", "-n", self._bridge, "link", "set", self._port(name), "up")

    def link_bytes(self, name: str) -> Tuple[int, int]:
        """(bytes into node `name`, bytes out of it) that crossed its link so far, read at
        the bridge's end."""
        stats = f"/sys/class/net/{self._port(name)}/statistics"
        out = _run("ip", "netns", "exec", self._bridge, "cat", f"{stats}/tx_bytes", f"{stats}/rx_bytes").split()
        return int(out[0]), int(out[1])

    def retransmitted_segments(self, name: str) -> int:
        """TCP segments node `name` sent again so far (its namespace's RetransSegs): a
        loaded machine drops packets between namespaces, and each resend crosses the
        link once more."""
        lines = [line.split() for line in _run("ip", "netns", "exec", self.namespace(name), "cat",
                                               "/proc/net/snmp").splitlines() if line.startswith("Tcp:")]
        return int(lines[1][lines[0].index("RetransSegs")])

    def kill_all(self, processes: Sequence[subprocess.Popen]) -> None:
        """SIGKILLs `processes` and waits for them."""
        for process in processes:
            if process.poll() is None:
                process.kill()
        for process in processes:
            process.wait(timeout=30)

    def close(self) -> None:
        """Stops every process it spawned (SIGTERM, then SIGKILL after 10 s), kills what
        is left in its namespaces and removes them; each node's /dev/shm goes with its
        last process."""
        for process in self._processes:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for process in self._processes:
            try:
                process.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=30)
        self.kill_all(list(self._holders.values()))
        for holder in self._holders.values():
            holder.stdout.close()
            holder.stderr.close()
        for ns in reversed(self._made):
            _remove_namespace(ns)
        self._made, self._processes, self._holders = [], [], {}

    def __enter__(self) -> "TestBed":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
