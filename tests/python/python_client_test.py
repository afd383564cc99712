"""The Python client against real daemons: a coordinator and 2 agents, a trainer
registering ZeRO-3 partitions from shared memory, a rollout registering a WeightArena
with TP=2 shards. Every arena byte is checked after every sync. The coordinator's calls
go through grpcio and through the C++ library (native=), plaintext and with mutual TLS."""

import ctypes
import math
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest

import numpy

import shardsync
from shardsync.testing import LocalCluster

AGENT = "daemon/agent/shardsync-agent"
COORDINATOR = "daemon/coordinator/shardsync-coordinator"
NATIVE = True  # the copy //client/python:shardsync puts where shardsync.native looks
MODEL = [("w", (6, 10), "bfloat16"), ("b", (7,), "bfloat16"), ("e", (3, 4, 5), "float32")]
WORLD = 2


def private_dir(prefix):
    """A new folder under Bazel's $TEST_TMPDIR (outside Bazel, the system's temporary
    folder). LocalCluster keeps the unix sockets in a short folder of its own."""
    return tempfile.mkdtemp(prefix=prefix, dir=os.environ.get("TEST_TMPDIR"))


def start_cluster(agent0_serves=False, tls=None, server_name=None, nodes=(), relay=None):
    """A coordinator and WORLD CPU agents; with agent0_serves, no coordinator process: agent
    0 is the coordinator too, and clients sync over its unix socket (as a trainer beside it)."""
    logs = private_dir("ss-py-")
    return LocalCluster(None, WORLD, logs, agent_bin=AGENT, coordinator_bin=COORDINATOR, staging_bytes=4096,
                        serving="agent0-unix" if agent0_serves else "process", tls=tls, server_name=server_name,
                        nodes=nodes, relay=relay)


def make_certificates(folder, san):
    """A CA and a certificate it signs naming `san` (openssl's subjectAltName syntax):
    (ca, cert, key) PEM paths."""
    base = os.path.join(folder, "job")
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    quiet = {"check": True, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    subprocess.run(["openssl", "req", "-x509", *ec, "-keyout", base + "-ca.key", "-out", base + "-ca.pem", "-days", "1",
                    "-subj", "/CN=ca"], **quiet)
    subprocess.run(["openssl", "req", *ec, "-keyout", base + ".key", "-out", base + ".csr", "-subj", "/CN=job"], **quiet)
    with open(base + ".ext", "w") as f:
        f.write(f"subjectAltName={san}\n")
    subprocess.run(["openssl", "x509", "-req", "-in", base + ".csr", "-CA", base + "-ca.pem", "-CAkey", base + "-ca.key",
                    "-CAcreateserial", "-out", base + ".pem", "-days", "1", "-extfile", base + ".ext"], **quiet)
    return base + "-ca.pem", base + ".pem", base + ".key"


def shardsync_pb2_handle(token):
    """A MemoryHandle naming descriptor token `token` (host memory)."""
    return shardsync.shardsync_pb2.MemoryHandle(descriptor_token=token, device=-1)


def shard_box(name, shape, rank):
    """The rollout's TP=2 layout: w column-parallel (rows), b replicated, e split on axis 1."""
    return shardsync.tp_shard_box(shape, {"w": 0, "e": 1}.get(name), 2, rank)


def box_bytes(values, shape, lo, hi, element):
    """The row-major bytes of box [lo, hi) of a tensor given as its row-major bytes."""
    out = bytearray()
    strides = [math.prod(shape[k + 1:]) for k in range(len(shape))]
    index = list(lo)
    while True:
        flat = sum(index[k] * strides[k] for k in range(len(shape) - 1)) + lo[-1]
        out += values[flat * element:(flat + hi[-1] - lo[-1]) * element]
        k = len(shape) - 2
        while k >= 0:
            index[k] += 1
            if index[k] < hi[k]:
                break
            index[k] = lo[k]
            k -= 1
        if k < 0:
            return bytes(out)


def float8_values():
    """The value of every non-negative finite FLOAT8_E4M3 code 0..0x7e, from its bit
    fields: 4 exponent bits (bias 7), 3 mantissa bits."""
    codes = numpy.arange(0x7f)
    exponent, mantissa = codes >> 3, codes & 7
    return numpy.where(exponent == 0, mantissa * 2.0 ** -9, (1 + mantissa / 8) * 2.0 ** (exponent - 7))


def reference_float8(values):
    """The block rule, in numpy: per 128 x 128 block scale = amax / 448 in float32 (1 for
    an all-zero block); each value / scale goes to the nearest code, a tie to the even
    one, beyond 448 to 448. Returns (uint8 codes, float32 scales)."""
    rows, cols = values.shape
    scales = numpy.ones(((rows + 127) // 128, (cols + 127) // 128), dtype=numpy.float32)
    codes = numpy.zeros(values.shape, dtype=numpy.uint8)
    table = float8_values()
    for i in range(scales.shape[0]):
        for j in range(scales.shape[1]):
            block = values[128 * i:128 * i + 128, 128 * j:128 * j + 128]
            amax = numpy.abs(block).max()
            if amax > 0:
                scales[i, j] = amax / numpy.float32(448)
            scaled = (block / scales[i, j]).astype(numpy.float32)
            distance = numpy.abs(table[None, :] - numpy.abs(scaled).astype(numpy.float64).reshape(-1, 1))
            nearest = distance == distance.min(axis=1, keepdims=True)
            nearest &= (numpy.arange(0x7f) % 2 == 0) | (nearest.sum(axis=1, keepdims=True) == 1)
            code = nearest.argmax(axis=1).astype(numpy.uint8).reshape(block.shape)
            codes[128 * i:128 * i + 128, 128 * j:128 * j + 128] = code | numpy.where(numpy.signbit(scaled), 0x80, 0)
    return codes, scales


class PythonClientTest(unittest.TestCase):
    def setUp(self):
        self.cluster = start_cluster()
        self.registrations, self.buffers = [], []
        self.model = MODEL

    def tearDown(self):
        for r in self.registrations:
            r.close()
        for b in self.buffers:
            b.close()
        self.cluster.stop()

    @staticmethod
    def partitions(rank, model=MODEL):
        """(name, dtype, byte offset in the flat, flat begin, flat end) of each partition,
        256-byte aligned, as an allocator would place them."""
        out, at = [], 0
        for name, shape, dtype in model:
            begin, end = shardsync.flat_partition(math.prod(shape), WORLD, rank)
            at = (at + 255) // 256 * 256
            out.append((name, dtype, at, begin, end))
            at += (end - begin) * shardsync.DTYPE_BYTES[dtype]
        return out, at

    @classmethod
    def fill_partitions(cls, flat, rank, values, model=MODEL):
        for name, dtype, at, begin, end in cls.partitions(rank, model)[0]:
            element = shardsync.DTYPE_BYTES[dtype]
            flat.buf[at:at + (end - begin) * element] = values[name][begin * element:end * element]

    def register_trainer(self, rank, values):
        parts, size = self.partitions(rank, self.model)
        flat = shardsync.SharedBuffer(size)
        self.buffers.append(flat)
        self.fill_partitions(flat, rank, values, self.model)
        layouts = [shardsync.zero3_partition(name, shape, dtype, WORLD, rank, "flat", at // shardsync.DTYPE_BYTES[dtype])
                   for (name, shape, dtype), (_, _, at, _, _) in zip(self.model, parts)]
        agent = shardsync.AgentClient(self.cluster.socket(rank))
        self.registrations.append(agent.register(f"trainer-{rank}", "source", {"flat": flat}, layouts))
        return flat

    def register_rollout(self, rank):
        shards = []
        for name, shape, dtype in self.model:
            lo, hi = shard_box(name, shape, rank)
            shards.append((name, [h - l for l, h in zip(lo, hi)], dtype))
        arena = shardsync.WeightArena(shards)
        self.buffers.append(arena.memory)
        arena.memory.buf[:] = b"\xab" * arena.memory.nbytes  # poison
        layouts = [shardsync.tensor_layout(name, shape, dtype, placements=[arena.placement(name, *shard_box(name, shape, rank))])
                   for name, shape, dtype in self.model]
        agent = shardsync.AgentClient(self.cluster.socket(rank))
        self.registrations.append(agent.register(f"rollout-{rank}", "target", arena.buffers(), layouts))
        return arena

    def check(self, arenas, values, ranks=None):
        for rank, arena in enumerate(arenas):
            if ranks is not None and rank not in ranks:
                continue
            for name, shape, dtype in self.model:
                lo, hi = shard_box(name, shape, rank)
                expected = box_bytes(values[name], shape, lo, hi, shardsync.DTYPE_BYTES[dtype])
                self.assertEqual(bytes(arena.view(name)), expected, f"{name} on rank {rank}")
                start = arena.offsets[name][0]
                self.assertEqual(start % 256, 0)

    def agent_memfds(self, rank, name):
        """How many descriptors of memfds named `name` agent `rank`'s process holds."""
        folder = f"/proc/{self.cluster.agents[rank].pid}/fd"
        held = 0
        for fd in os.listdir(folder):
            try:
                held += os.readlink(f"{folder}/{fd}").startswith(f"/memfd:{name} ")
            except FileNotFoundError:  # closed meanwhile
                pass
        return held

    def test_memory_passed_as_descriptors_syncs_exactly_and_nothing_outlives_it(self):
        """Trainer flats and rollout arenas in memfds (no name anywhere), passed on the
        agents' descriptor sockets: exact after two syncs over the direct path (rank 0
        writes rank 1's arena through descriptors it fetched from agent 1); a token named
        by another process, or never put, is refused; once the registrations and the
        peers' mappings are gone (the next sync's preparation drops a peer's) no agent
        holds a descriptor of them."""
        import mmap
        rng = random.Random(11)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        memfds, maps = [], []

        def memfd(nbytes):
            fd = os.memfd_create("shardsync-test")
            os.ftruncate(fd, nbytes)
            memfds.append(fd)
            maps.append(mmap.mmap(fd, nbytes))
            return fd, maps[-1]

        flats, arenas, arena_maps = [], [], []
        for rank in range(WORLD):
            parts, size = self.partitions(rank)
            fd, flat = memfd(size)
            flats.append(flat)
            for name, dtype, at, begin, end in parts:
                element = shardsync.DTYPE_BYTES[dtype]
                flat[at:at + (end - begin) * element] = values[name][begin * element:end * element]
            layouts = [shardsync.zero3_partition(name, shape, dtype, WORLD, rank, "flat",
                                                 at // shardsync.DTYPE_BYTES[dtype])
                       for (name, shape, dtype), (_, _, at, _, _) in zip(MODEL, parts)]
            agent = shardsync.AgentClient(self.cluster.socket(rank))
            self.registrations.append(agent.register(f"trainer-{rank}", "source",
                                                     {"flat": shardsync.DescriptorBuffer(fd, size)}, layouts))
        for rank in range(WORLD):
            shards = []
            for name, shape, dtype in MODEL:
                lo, hi = shard_box(name, shape, rank)
                shards.append((name, [h - l for l, h in zip(lo, hi)], dtype))
            arena = shardsync.WeightArena(shards)  # its offsets; its memory is only the checked copy
            self.buffers.append(arena.memory)
            fd, arena_map = memfd(arena.memory.nbytes + 64)
            arena_map[:] = b"\xab" * len(arena_map)  # poison
            layouts = [shardsync.tensor_layout(name, shape, dtype,
                                               placements=[arena.placement(name, *shard_box(name, shape, rank))])
                       for name, shape, dtype in MODEL]
            agent = shardsync.AgentClient(self.cluster.socket(rank))
            buffer = shardsync.DescriptorBuffer(fd, arena.memory.nbytes, offset_bytes=64)
            self.registrations.append(agent.register(f"rollout-{rank}", "target", {arena.buffer_name: buffer},
                                                     layouts))
            arenas.append(arena)
            arena_maps.append(arena_map)

        def check():
            for arena, arena_map in zip(arenas, arena_maps):
                arena.memory.buf[:] = arena_map[64:64 + arena.memory.nbytes]
            self.check(arenas, values)
            self.assertTrue(all(b == 0xab for m in arena_maps for b in m[:64]), "nothing before the arena written")

        coordinator = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True)
        response = coordinator.sync(timeout=20, verify=True)
        self.assertTrue(any(rank.direct_sent_bytes > 0 for rank in response.ranks), "the direct path wrote a peer's arena")
        check()
        values = {name: rng.randbytes(len(v)) for name, v in values.items()}
        for rank, flat in enumerate(flats):
            for name, dtype, at, begin, end in self.partitions(rank)[0]:
                element = shardsync.DTYPE_BYTES[dtype]
                flat[at:at + (end - begin) * element] = values[name][begin * element:end * element]
        coordinator.sync(timeout=20, verify=True)
        check()

        # A token is claimed only by the process that put it, and only once.
        put = subprocess.Popen(
            [sys.executable, "-c", "import os, socket; s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET); "
             f"s.connect({self.cluster.socket(0)!r} + '.fds'); fd = os.memfd_create('x'); os.ftruncate(fd, 64); "
             "socket.send_fds(s, [b'P'], [fd]); print(s.recv(100).decode(), flush=True); input()"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        token = put.stdout.readline().strip()
        self.assertTrue(token.startswith("T"), token)
        agent0 = shardsync.AgentClient(self.cluster.socket(0))
        stolen = shardsync_pb2_handle(token[1:])
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            agent0.register("thief", "target", {"stolen": (stolen, 64)}, [])
        self.assertEqual(refused.exception.code.name, "PERMISSION_DENIED")
        self.assertIn("were put by pid", refused.exception.message)
        put.stdin.close()
        put.stdout.close()
        put.wait(timeout=60)
        # The agent drops them once it sees the putter's connection close: until then
        # a claim is still refused as the putter's.
        deadline = time.monotonic() + 30  # only a hang exceeds it
        while True:
            with self.assertRaises(shardsync.ShardsyncError) as unknown:
                agent0.register("thief", "target", {"stolen": (stolen, 64)}, [])
            if unknown.exception.code.name != "PERMISSION_DENIED" or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        self.assertEqual(unknown.exception.code.name, "NOT_FOUND")

        # Each agent: the mappings of its flat, of its arena and of the peer's arena it
        # writes, one descriptor each (the one passed is closed once mapped).
        self.assertEqual([self.agent_memfds(rank, "shardsync-test") for rank in range(WORLD)], [3, 3])
        for r in self.registrations:
            r.close()
        self.registrations = []
        self.register_trainer(0, values)
        self.register_trainer(1, values)
        self.register_rollout(0)
        self.register_rollout(1)
        coordinator.sync(timeout=20)  # prepared anew: the peers drop their mappings of the old arenas
        deadline = time.monotonic() + 60  # only a hang exceeds it
        while any(self.agent_memfds(rank, "shardsync-test") for rank in range(WORLD)) and time.monotonic() < deadline:
            time.sleep(0.05)
        self.assertEqual([self.agent_memfds(rank, "shardsync-test") for rank in range(WORLD)], [0, 0])
        for m in maps:
            m.close()
        for fd in memfds:
            os.close(fd)

    def test_zero3_partitions_into_a_tp2_weight_arena_sync_exactly_twice(self):
        rng = random.Random(5)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        flats = [self.register_trainer(rank, values) for rank in range(WORLD)]
        arenas = [self.register_rollout(rank) for rank in range(WORLD)]
        address = ctypes.addressof(ctypes.c_char.from_buffer(arenas[0].memory.buf))
        coordinator = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True)

        response = coordinator.sync(timeout=20)
        self.assertEqual(len(response.ranks), WORLD)
        self.assertEqual(coordinator.stats(), response)
        self.check(arenas, values)

        values = {name: rng.randbytes(len(v)) for name, v in values.items()}
        for rank, flat in enumerate(flats):
            self.fill_partitions(flat, rank, values)
        response = coordinator.sync(timeout=20)
        self.assertEqual(response.plan_seconds, 0.0)  # the cached plan
        self.check(arenas, values)
        self.assertEqual(ctypes.addressof(ctypes.c_char.from_buffer(arenas[0].memory.buf)), address)

        # Partial targets: only rank 1's arena takes the next values; rank 0 keeps its own.
        old_values, values = values, {name: rng.randbytes(len(v)) for name, v in values.items()}
        for rank, flat in enumerate(flats):
            self.fill_partitions(flat, rank, values)
        response = coordinator.sync(timeout=20, target_ranks=[1])
        self.assertEqual(list(response.target_ranks), [1])
        self.check(arenas, values, ranks=[1])
        self.check(arenas, old_values, ranks=[0])

        status = coordinator.status()
        self.assertEqual(len(status.agents), WORLD)
        self.assertTrue(status.last_sync_ok)

    def test_float8_block_targets_registered_on_every_rank_quantize_as_the_rule_says(self):
        shape = (300, 260)  # ZeRO-3 and the TP2 row split cut 128 x 128 blocks
        rng = numpy.random.default_rng(11)
        full = (rng.standard_normal(shape) * numpy.exp2(rng.integers(-130, 20, shape))).astype(numpy.float32)
        full[:128, 128:256] = 0  # an all-zero block
        bits = (full.view(numpy.uint32) >> 16).astype(numpy.uint16)  # bfloat16, truncated: any will do
        full = (bits.astype(numpy.uint32) << 16).view(numpy.float32)
        values = bits.tobytes()
        for rank in range(WORLD):
            begin, end = shardsync.flat_partition(math.prod(shape), WORLD, rank)
            flat = shardsync.SharedBuffer(2 * (end - begin))
            self.buffers.append(flat)
            flat.buf[:] = values[2 * begin:2 * end]
            agent = shardsync.AgentClient(self.cluster.socket(rank))
            layout = shardsync.zero3_partition("q", shape, "bfloat16", WORLD, rank, "flat", 0)
            self.registrations.append(agent.register(f"trainer-{rank}", "source", {"flat": flat}, [layout]))
        arenas = []
        for rank in range(WORLD):
            lo, hi = shardsync.tp_shard_box(shape, 0, WORLD, rank)
            rows, cols = hi[0] - lo[0], hi[1] - lo[1]
            arena = shardsync.WeightArena([("q", (rows, cols), "float8_e4m3"),
                                           ("q.scales", ((rows + 127) // 128, (cols + 127) // 128), "float32")])
            self.buffers.append(arena.memory)
            arena.memory.buf[:] = b"\xab" * arena.memory.nbytes  # poison
            layout = shardsync.tensor_layout("q", shape, "float8_e4m3", placements=[arena.placement("q", lo, hi)],
                                             block_scales=[arena.block_scales("q.scales")])
            agent = shardsync.AgentClient(self.cluster.socket(rank))
            self.registrations.append(agent.register(f"rollout-{rank}", "target", arena.buffers(), [layout]))
            arenas.append((arena, lo, hi))
        response = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True).sync(timeout=20)
        self.assertEqual(sum(r.quantized_bytes for r in response.ranks), math.prod(shape))
        for rank, (arena, lo, hi) in enumerate(arenas):
            want, want_scales = reference_float8(full[lo[0]:hi[0], lo[1]:hi[1]])
            self.assertEqual(bytes(arena.view("q")), want.tobytes(), f"rank {rank}")
            self.assertEqual(bytes(arena.view("q.scales")), want_scales.tobytes(), f"rank {rank}")

    def test_agents_on_two_nodes_say_so_sync_exactly_and_explain_the_bytes_between_them(self):
        self.cluster.stop()
        self.cluster = start_cluster(nodes=["node-a", "node-b"], relay="always")
        rng = random.Random(9)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        for rank in range(WORLD):
            self.register_trainer(rank, values)
        arenas = [self.register_rollout(rank) for rank in range(WORLD)]
        coordinator = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True)
        self.assertEqual(sorted(a.node for a in coordinator.status().agents), ["node-a", "node-b"])
        response = coordinator.sync(timeout=20)
        self.check(arenas, values)
        # Each rank's TP shard is half on the other node; one replica: nothing to relay.
        self.assertEqual(response.stages, 1)
        explain = coordinator.explain(network_gbps=25)
        self.assertEqual(explain.network_gbps, 25)
        self.assertEqual(explain.network_bytes, response.network_bytes)
        self.assertEqual(explain.network_bytes, sum(r.sent_bytes for r in explain.ranks))
        self.assertGreater(explain.network_bytes, 0)
        self.assertEqual(len(explain.links), 0)  # only when asked
        linked = coordinator.explain(network_gbps=25, links=True)
        self.assertGreater(len(linked.links), 0)
        self.assertEqual(sum(link.bytes for link in linked.links), explain.network_bytes)
        # Agents on two nodes: every link staged, as each rank's bytes say.
        self.assertTrue(all(link.path == shardsync.shardsync_pb2.STAGED for link in linked.links))
        self.assertEqual([r.staged_sent_bytes for r in explain.ranks], [r.sent_bytes for r in explain.ranks])

    def test_agent_0_serving_the_coordinator_syncs_over_its_unix_socket_exactly(self):
        self.cluster.stop()
        self.cluster = start_cluster(agent0_serves=True)
        rng = random.Random(7)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        flats = [self.register_trainer(rank, values) for rank in range(WORLD)]
        arenas = [self.register_rollout(rank) for rank in range(WORLD)]
        self.assertTrue(self.cluster.coordinator.startswith("unix:"))
        for native in (None, NATIVE):  # grpcio, then the C++ call
            coordinator = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True, native=native)
            for _ in range(2):
                values = {name: rng.randbytes(len(v)) for name, v in values.items()}
                for rank, flat in enumerate(flats):
                    self.fill_partitions(flat, rank, values)
                coordinator.sync(timeout=20)
                self.check(arenas, values)
            self.assertEqual(len(coordinator.status().agents), WORLD)

    def test_the_native_client_syncs_exactly_and_answers_as_grpcio_does(self):
        rng = random.Random(8)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        flats = [self.register_trainer(rank, values) for rank in range(WORLD)]
        arenas = [self.register_rollout(rank) for rank in range(WORLD)]
        native = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True, native=NATIVE)
        response = native.sync(timeout=20)
        self.assertEqual(len(response.ranks), WORLD)
        self.assertEqual(native.stats(), response)
        self.assertTrue(response.host_copies)  # CPU agents: the next sync's wait sleeps at once
        self.assertEqual(len(response.links), 0)  # only when asked
        self.check(arenas, values)
        values = {name: rng.randbytes(len(v)) for name, v in values.items()}
        for rank, flat in enumerate(flats):
            self.fill_partitions(flat, rank, values)
        linked = native.sync(timeout=20, links=True)
        self.assertEqual(linked.plan_seconds, 0.0)  # the cached plan
        self.assertEqual(sum(link.bytes for link in linked.links), sum(r.sent_bytes for r in linked.ranks))
        self.assertGreater(len(linked.links), 0)
        self.check(arenas, values)
        # Explain and Status decode to the same messages as through grpcio.
        grpcio = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True)
        self.assertEqual(native.explain(link_gbps=10, memory_gbps=20).floor_seconds,
                         grpcio.explain(link_gbps=10, memory_gbps=20).floor_seconds)
        self.assertEqual(len(native.status().agents), WORLD)
        # One channel, calls from several threads at once (a trainer's threads share it).
        answers = []

        def ask_status():
            answers.extend(len(native.status().agents) for _ in range(20))

        threads = [threading.Thread(target=ask_status) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
        self.assertEqual(answers, [WORLD] * 80)
        # A refusal keeps its code and message, and the stats of the last sync that ran.
        last = native.stats()
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            native.sync(timeout=20, target_ranks=[7])
        self.assertEqual(refused.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("target rank 7 is outside a world of 2", refused.exception.message)
        self.assertEqual(native.stats(), last)

    def test_both_clients_take_an_answer_larger_than_grpcs_default_4_mib(self):
        from concurrent import futures
        import grpc
        from shardsync import shardsync_pb2, shardsync_pb2_grpc

        large = "x" * (5 << 20)  # a large world's Status or Explain answer

        class Coordinator(shardsync_pb2_grpc.CoordinatorServicer):
            def Status(self, request, context):
                return shardsync_pb2.CoordinatorStatus(last_sync_error=large)

        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        shardsync_pb2_grpc.add_CoordinatorServicer_to_server(Coordinator(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        try:
            for native in (None, NATIVE):
                with self.subTest(native=native):
                    client = shardsync.CoordinatorClient(f"127.0.0.1:{port}", insecure=True, native=native)
                    self.assertEqual(len(client.status(timeout=20).last_sync_error), len(large))
        finally:
            server.stop(None)

    def test_the_native_client_fails_clearly_without_its_library_or_its_server(self):
        with self.assertRaises(FileNotFoundError) as missing:
            shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True, native="/nonexistent/lib.so")
        self.assertIn("/nonexistent/lib.so", str(missing.exception))
        nobody = shardsync.CoordinatorClient("unix:/nonexistent/socket", insecure=True, native=NATIVE)
        with self.assertRaises(shardsync.ShardsyncError) as unreachable:
            nobody.status(timeout=1)
        self.assertIn(unreachable.exception.code.name, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
        with self.assertRaises(ValueError):
            shardsync.CoordinatorClient("", insecure=True, native=NATIVE)

    def test_under_mutual_tls_the_native_client_needs_the_certificate(self):
        self.cluster.stop()
        certs = private_dir("ss-py-tls-")
        tls = make_certificates(certs, "DNS:shardsync.test")
        self.cluster = start_cluster(tls=tls, server_name="shardsync.test")
        rng = random.Random(9)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        for rank in range(WORLD):
            self.register_trainer(rank, values)
        arenas = [self.register_rollout(rank) for rank in range(WORLD)]
        native = shardsync.CoordinatorClient(self.cluster.coordinator, tls=tls, server_name="shardsync.test",
                                             native=NATIVE)
        native.sync(timeout=20)
        self.check(arenas, values)
        plaintext = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True, native=NATIVE)
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            plaintext.status(timeout=2)
        self.assertIn(refused.exception.code.name, ("UNAVAILABLE", "DEADLINE_EXCEEDED"))
        # The certificate names shardsync.test, not the address dialed.
        unnamed = shardsync.CoordinatorClient(self.cluster.coordinator, tls=tls, native=NATIVE)
        with self.assertRaises(shardsync.ShardsyncError):
            unnamed.status(timeout=2)
        shutil.rmtree(certs)

    def test_a_closed_registration_is_dropped_and_a_sync_that_needed_it_is_refused(self):
        rng = random.Random(6)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        for rank in range(WORLD):
            self.register_trainer(rank, values)
        for rank in range(WORLD):
            self.register_rollout(rank)
        self.registrations[1].close()  # the trainer on rank 1 goes away; close() waits for the drop
        agent = shardsync.AgentClient(self.cluster.socket(1))
        self.assertFalse(any(c.role == shardsync.shardsync_pb2.SOURCE for c in agent.status().clients))
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True).sync(timeout=20)
        self.assertEqual(refused.exception.code.name, "FAILED_PRECONDITION")
        self.assertIn("no byte moved", refused.exception.message)
        self.assertIn("rank 1", refused.exception.message)

    def test_a_client_that_shrinks_its_registered_memory_is_refused_and_the_agent_lives(self):
        rng = random.Random(8)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]) for name, shape, dtype in MODEL}
        flats = [self.register_trainer(rank, values) for rank in range(WORLD)]
        for rank in range(WORLD):
            self.register_rollout(rank)
        coordinator = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True)
        coordinator.sync(timeout=20)
        os.truncate("/dev/shm/" + flats[1]._shm.name, 0)  # under the agent's mapping: touching it would SIGBUS
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            coordinator.sync(timeout=20)
        self.assertEqual(refused.exception.code.name, "FAILED_PRECONDITION")
        self.assertIn("'flat'", refused.exception.message)
        self.assertIn("shrunk to 0 bytes", refused.exception.message)
        self.assertEqual(shardsync.AgentClient(self.cluster.socket(1)).status().rank, 1)  # alive
        self.assertIsNone(self.cluster.agents[1].poll())

    def test_delta_sync_between_nodes_moves_only_changed_words_exactly(self):
        self.cluster.stop()
        self.cluster = LocalCluster(None, WORLD, private_dir("ss-py-"), agent_bin=AGENT, coordinator_bin=COORDINATOR,
                                    staging_bytes=1 << 16, nodes=["node-a", "node-b"],
                                    coordinator_flags=["--delta", "always"])
        self.model = [("w", (256, 512), "bfloat16"), ("e", (3, 64, 50), "float32")]
        rng = random.Random(31)
        values = {name: bytearray(rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype]))
                  for name, shape, dtype in self.model}
        trainers = [self.register_trainer(rank, values) for rank in range(WORLD)]
        arenas = [self.register_rollout(rank) for rank in range(WORLD)]
        coordinator = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True)

        def sync(changed):
            for name, shape, dtype in self.model:
                element = shardsync.DTYPE_BYTES[dtype]
                for k in range(0, len(values[name]), element):
                    if rng.random() < changed:
                        values[name][k:k + element] = rng.randbytes(element)
            for rank, flat in enumerate(trainers):
                self.fill_partitions(flat, rank, values, self.model)
            response = coordinator.sync(timeout=60)
            self.check(arenas, values)
            staged = sum(r.staged_sent_bytes for r in response.ranks)
            return response, staged, sum(r.wire_bytes for r in response.ranks)

        first, staged, wire = sync(0)
        self.assertGreater(staged, 0)
        self.assertEqual(wire, staged)  # nothing to diff against yet
        self.assertEqual(sum(r.delta_chunks for r in first.ranks), 0)
        for changed in (0.01, 0.0, 0.5, 1.0, 0.001):
            response, staged, wire = sync(changed)
            print(f"delta: {changed:.3f} of the elements changed: {wire} bytes on the wire for {staged}",
                  file=sys.stderr)
            if changed <= 0.01:
                self.assertLess(wire, staged * 0.1, f"{changed} changed")
                self.assertGreater(sum(r.delta_chunks for r in response.ranks), 0)
            self.assertLessEqual(wire, staged)  # a delta that would not be smaller goes whole
        # A rollout that registers fresh memory holds no sync's bytes: it gets them whole.
        gone = next(r for r in self.registrations if r._client_id == "rollout-1")
        gone.close()
        self.registrations.remove(gone)
        arenas[1] = self.register_rollout(1)
        response, staged, wire = sync(0.01)
        into_rank_1 = [r for r in response.ranks if r.rank == 0][0]
        self.assertEqual(into_rank_1.wire_bytes, into_rank_1.staged_sent_bytes)
        self.assertEqual(into_rank_1.delta_chunks, 0)

    def truncation_loop(self, syncs):
        """`syncs` syncs, each with a buffer (a trainer's flat or a rollout's arena, in
        turn) truncated at a random moment around it. Every sync moves every byte exactly
        or fails naming the buffer; the truncated client then registers fresh memory."""
        self.model = [("w", (256, 512), "bfloat16"), ("e", (3, 64, 50), "float32")]
        rng = random.Random(12)
        values = {name: rng.randbytes(math.prod(shape) * shardsync.DTYPE_BYTES[dtype])
                  for name, shape, dtype in self.model}
        trainers = {rank: self.register_trainer(rank, values) for rank in range(WORLD)}
        arenas = [self.register_rollout(rank) for rank in range(WORLD)]
        coordinator = shardsync.CoordinatorClient(self.cluster.coordinator, insecure=True)
        start = time.monotonic()
        coordinator.sync(timeout=60)
        took = time.monotonic() - start
        failed, in_use = 0, 0
        for attempt in range(syncs):
            rank, source = attempt % WORLD, attempt % 4 < 2
            memory = trainers[rank] if source else arenas[rank].memory
            name = "flat" if source else arenas[rank].buffer_name
            truncate = threading.Timer(rng.uniform(0, took),
                                       lambda m=memory: os.truncate("/dev/shm/" + m._shm.name, 0))
            truncate.start()
            try:
                start = time.monotonic()
                coordinator.sync(timeout=60)
                took = min(took, time.monotonic() - start)  # what a sync after a registration takes
                truncate.join()
                # A target truncated after its sync lost its bytes by its own client's hand.
                self.check(arenas, values, ranks=[r for r in range(WORLD) if source or r != rank])
            except shardsync.ShardsyncError as error:
                truncate.join()
                failed += 1
                in_use += "while in use" in error.message
                self.assertIn(f"'{name}'", error.message, f"sync {attempt}")
                self.assertRegex(error.message, "shrunk|holds 0 bytes", f"sync {attempt}")
            for k, agent in self.cluster.agents.items():
                self.assertIsNone(agent.poll(), f"agent {k} died in sync {attempt}")
            # Fresh memory for the truncated client (its old pages are gone for it too).
            client = f"trainer-{rank}" if source else f"rollout-{rank}"
            gone = next(r for r in self.registrations if r._client_id == client)
            gone.close()
            self.registrations.remove(gone)
            self.buffers.remove(memory)
            memory.close()
            if source:
                trainers[rank] = self.register_trainer(rank, values)
            else:
                arenas[rank] = self.register_rollout(rank)
        coordinator.sync(timeout=60)
        self.check(arenas, values)
        print(f"{syncs} syncs of {took * 1e3:.0f} ms: {syncs - failed} exact, {failed} refused naming the buffer"
              f" ({in_use} of them touched it)", file=sys.stderr)
        self.assertGreater(failed, 0)  # some truncations came before a sync's end

    def test_memory_truncated_during_syncs_never_kills_an_agent_on_one_node(self):
        self.truncation_loop(50)

    def test_memory_truncated_during_syncs_never_kills_an_agent_between_nodes(self):
        self.cluster.stop()
        self.cluster = start_cluster(nodes=["node-a", "node-b"])
        self.truncation_loop(50)

    def test_only_the_allowed_uids_register_sources_and_targets(self):
        self.cluster.stop()
        logs = private_dir("ss-py-")
        me = os.geteuid()
        self.cluster = LocalCluster(None, WORLD, logs, agent_bin=AGENT, coordinator_bin=COORDINATOR,
                                    agent_flags=["--source-uids", str(me + 1), "--target-uids", f"{me + 2},{me}"])
        arena = shardsync.WeightArena([("w", (4, 4), "bfloat16")])
        self.buffers.append(arena.memory)
        layout = shardsync.tensor_layout("w", (4, 4), "bfloat16", placements=[arena.placement("w", (0, 0), (4, 4))])
        agent = shardsync.AgentClient(self.cluster.socket(0))
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            agent.register("trainer-0", "source", arena.buffers(), [layout])
        self.assertEqual(refused.exception.code.name, "PERMISSION_DENIED")
        self.assertIn(f"(uid {me}, pid {os.getpid()}) may not register sources", refused.exception.message)
        self.assertIn("--source-uids", refused.exception.message)
        self.registrations.append(agent.register("rollout-0", "target", arena.buffers(), [layout]))

    def test_the_same_client_registers_again_right_after_close(self):
        arena = shardsync.WeightArena([("w", (4, 4), "bfloat16")])
        self.buffers.append(arena.memory)
        layout = shardsync.tensor_layout("w", (4, 4), "bfloat16", placements=[arena.placement("w", (0, 0), (4, 4))])
        agent = shardsync.AgentClient(self.cluster.socket(0))
        for attempt in range(10):
            registration = agent.register("rollout-0", "target", arena.buffers(), [layout])
            registration.close()
            self.assertNotIn("rollout-0", [c.client_id for c in agent.status().clients], f"attempt {attempt}")

    def test_a_registration_outside_its_buffer_is_refused_with_the_tensor_named(self):
        small = shardsync.SharedBuffer(8)
        self.buffers.append(small)
        layout = shardsync.tensor_layout("w", (6, 10), "bfloat16", flat_placements=[(0, 60, "flat", 0)])
        agent = shardsync.AgentClient(self.cluster.socket(0))
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            agent.register("trainer-0", "source", {"flat": small}, [layout])
        self.assertEqual(refused.exception.code.name, "INVALID_ARGUMENT")
        self.assertIn("tensor 'w'", refused.exception.message)
        self.assertEqual(refused.exception.message.count("trainer-0"), 1, refused.exception.message)  # named once

    def test_a_role_neither_source_nor_target_is_refused_before_any_call(self):
        agent = shardsync.AgentClient(self.cluster.socket(0))
        layout = shardsync.tensor_layout("w", (6, 10), "bfloat16", flat_placements=[(0, 60, "flat", 0)])
        for role in ("Source", "targets", "", None):
            with self.assertRaisesRegex(ValueError, "is neither 'source' nor 'target'"):
                agent.register("trainer-0", role, {"flat": (shardsync.shardsync_pb2.MemoryHandle(), 120)}, [layout])
        self.assertFalse(any(c.client_id == "trainer-0" for c in agent.status().clients))

    def test_two_clients_arenas_with_default_names_register_on_one_agent(self):
        agent = shardsync.AgentClient(self.cluster.socket(0))
        arenas = [shardsync.WeightArena([("w", (4, 4), "bfloat16")]) for _ in range(2)]
        self.buffers += [arena.memory for arena in arenas]
        self.assertNotEqual(arenas[0].buffer_name, arenas[1].buffer_name)
        for i, arena in enumerate(arenas):
            layout = shardsync.tensor_layout("w", (4, 4), "bfloat16", placements=[arena.placement("w", (0, 0), (4, 4))])
            self.registrations.append(agent.register(f"rollout-{i}", "target", arena.buffers(), [layout]))

    def test_a_buffer_name_another_client_holds_is_refused_naming_that_client(self):
        agent = shardsync.AgentClient(self.cluster.socket(0))
        arenas = [shardsync.WeightArena([("w", (4, 4), "bfloat16")], buffer_name="weights") for _ in range(2)]
        self.buffers += [arena.memory for arena in arenas]
        layout = shardsync.tensor_layout("w", (4, 4), "bfloat16", placements=[arenas[0].placement("w", (0, 0), (4, 4))])
        self.registrations.append(agent.register("rollout-0", "target", arenas[0].buffers(), [layout]))
        with self.assertRaises(shardsync.ShardsyncError) as refused:
            agent.register("rollout-1", "target", arenas[1].buffers(), [layout])
        self.assertEqual(refused.exception.code.name, "ALREADY_EXISTS")
        self.assertIn("buffer 'weights' is already registered on rank 0 by client 'rollout-0'", refused.exception.message)

    def test_a_shared_buffer_is_unlinked_on_close_even_while_views_live(self):
        buffer = shardsync.SharedBuffer(64)
        path = "/dev/shm" + buffer.handle()[0].shm_name
        view = numpy.frombuffer(buffer.buf, dtype=numpy.uint8)
        with self.assertRaisesRegex(BufferError, "is unlinked, but views of it are alive"):
            buffer.close()
        self.assertFalse(os.path.exists(path))
        del view
        buffer.close()  # now unmapped
        with self.assertRaises(ValueError):
            buffer.buf[0]

    def test_a_stopped_local_cluster_leaves_no_folder(self):
        folder = self.cluster.dir
        self.assertTrue(os.path.isdir(folder))
        self.cluster.stop()
        self.assertFalse(os.path.exists(folder))
        self.cluster = start_cluster()  # for tearDown


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print(f"{result.testsRun - failed} passed, {failed} failed")
    sys.exit(1 if failed or result.testsRun == 0 else 0)
