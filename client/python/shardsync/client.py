"""gRPC calls to the agent (unix socket) and the coordinator (TCP)."""

import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterable, Mapping, Optional, Protocol, Sequence, Tuple, Union

import grpc

from shardsync import native as native_library
from shardsync import shardsync_pb2, shardsync_pb2_grpc

__all__ = ["AgentClient", "BufferLike", "CoordinatorClient", "DescriptorBuffer", "Registration", "ShardsyncError"]

# An agent serving the unix socket PATH takes passed memory on PATH + this (the agent's
# DescriptorSocketPath).
_DESCRIPTOR_SOCKET_SUFFIX = ".fds"
# The largest answer taken from a daemon, as the C++ client and the native library bound
# it (common/client_messages.h): Explain and Status answers of a large world. gRPC's own
# default takes 4 MiB. What is sent is the agent's to bound (--max-message-bytes).
_MESSAGE_OPTIONS = [("grpc.max_receive_message_length", 64 << 20)]


class BufferLike(Protocol):
    """A registered buffer: SharedBuffer, torch_support's CUDA buffers."""

    def handle(self) -> Tuple[Any, int]:
        """(MemoryHandle message, bytes)."""


@dataclass(frozen=True)
class DescriptorBuffer:
    """Host memory passed to the agent as a file descriptor (a memfd, a torch storage
    shared by descriptor), which the agent maps without any name: nothing is left behind
    in /dev/shm whatever ends the processes. `fd` stays the caller's and open at least
    until ``register`` returns; the buffer is `nbytes` from `offset_bytes` of it."""
    fd: int
    nbytes: int
    offset_bytes: int = 0


class ShardsyncError(RuntimeError):
    """A call the agent or the coordinator refused or failed; `code` is the gRPC code."""

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def _call(method: Callable[..., Any], request: Any, timeout: float) -> Any:
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as error:
        raise ShardsyncError(error.code(), error.details()) from None


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class Registration:
    """Buffers and layouts the agent holds while this object is open. `close()` (or the
    process exiting) ends the call; `close()` returns once the agent has dropped them, so
    the same client id may register again at once."""

    def __init__(self, call: Any, event: shardsync_pb2.RegisterEvent, agent: "AgentClient", client_id: str) -> None:
        self._call = call
        self._agent = agent
        self._client_id = client_id
        self.rank: int = event.rank
        self.layout_epoch: int = event.layout_epoch
        # Drain the stream so a server-side end is noticed; nothing else arrives.
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass

    def close(self, timeout: float = 5.0) -> None:
        """Ends the registration and waits, `timeout` seconds in all, until the agent no
        longer lists this client; an agent that is gone holds nothing. Raises
        ShardsyncError if the agent still lists it at the deadline."""
        deadline = time.monotonic() + timeout
        self._call.cancel()
        self._reader.join(timeout=timeout)
        while True:
            try:
                clients = self._agent.status(timeout=max(deadline - time.monotonic(), 0.1)).clients
            except ShardsyncError as error:
                if error.code == grpc.StatusCode.UNAVAILABLE:
                    return  # the agent is gone, and its registrations with it
                raise
            if all(c.client_id != self._client_id for c in clients):
                return
            if time.monotonic() > deadline:
                raise ShardsyncError(grpc.StatusCode.DEADLINE_EXCEEDED,
                                     f"the agent still holds client '{self._client_id}' {timeout} s after close()")
            time.sleep(0.005)  # the agent notices a cancelled call within tens of milliseconds

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class AgentClient:
    """The agent on this process's device, reached through its unix socket."""

    def __init__(self, socket_path: str) -> None:
        self._socket_path = socket_path
        self._channel = grpc.insecure_channel("unix:" + socket_path, options=_MESSAGE_OPTIONS)
        self._stub = shardsync_pb2_grpc.AgentStub(self._channel)

    def _put_descriptor(self, connection: Optional[socket.socket], fd: int,
                        timeout: float) -> Tuple[socket.socket, str]:
        """Passes `fd` on the agent's descriptor socket (connecting first if `connection`
        is None): the connection and the token the agent answered."""
        path = self._socket_path + _DESCRIPTOR_SOCKET_SUFFIX
        try:
            if connection is None:
                connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                connection.settimeout(timeout)
                connection.connect(path)
            socket.send_fds(connection, [b"P"], [fd])
            answer, received, _, _ = socket.recv_fds(connection, 1024, 1)
        except OSError as error:
            raise ShardsyncError(grpc.StatusCode.UNAVAILABLE, f"descriptor socket {path}: {error}") from None
        for extra in received:
            os.close(extra)
        if answer[:1] != b"T":
            raise ShardsyncError(grpc.StatusCode.FAILED_PRECONDITION,
                                 f"descriptor socket {path}: " + answer[1:].decode(errors="replace"))
        return connection, answer[1:].decode()

    def register(self, client_id: str, role: str,
                 buffers: Mapping[str, Union[BufferLike, DescriptorBuffer, Tuple[Any, int]]],
                 tensors: Sequence[Any], timeout: float = 10.0, ready_event: Optional[bytes] = None) -> Registration:
        """Registers `buffers` ({name: SharedBuffer, DescriptorBuffer or (handle, bytes)}) and `tensors`
        (TensorLayout messages) as SOURCE or TARGET ("source"/"target"). Returns once
        the agent opened and checked everything; raises ShardsyncError if it refused.
        `ready_event` (a source on a GPU agent): the bytes of an interprocess CUDA event's
        handle (torch_support.event_handle) the client records after its writes; every
        sync waits for its last record on the GPU instead of the client synchronizing."""
        roles = {"source": shardsync_pb2.SOURCE, "target": shardsync_pb2.TARGET}
        if role not in roles:
            raise ValueError(f"client '{client_id}': role {role!r} is neither 'source' nor 'target'")
        request = shardsync_pb2.RegisterRequest(
            client_id=client_id,
            role=roles[role],
            tensors=tensors,
            ready_event=ready_event or b"",
        )
        # Descriptors wait on the agent for this registration while `passing` stays open.
        passing: Optional[socket.socket] = None
        try:
            for name, buffer in buffers.items():
                if isinstance(buffer, DescriptorBuffer):
                    passing, token = self._put_descriptor(passing, buffer.fd, timeout)
                    handle = shardsync_pb2.MemoryHandle(descriptor_token=token, offset_bytes=buffer.offset_bytes,
                                                        device=-1)
                    nbytes = buffer.nbytes
                else:
                    handle, nbytes = buffer if isinstance(buffer, tuple) else buffer.handle()
                request.buffers.add(name=name, bytes=nbytes, handle=handle)
            return self._register(request, client_id, timeout)
        finally:
            if passing is not None:
                passing.close()

    def _register(self, request: Any, client_id: str, timeout: float) -> "Registration":
        call = self._stub.Register(request)
        first: Dict[str, Any] = {}

        def wait_first() -> None:
            try:
                first["event"] = next(call)
            except grpc.RpcError as error:
                first["error"] = ShardsyncError(error.code(), error.details())
            except StopIteration:
                first["error"] = ShardsyncError(grpc.StatusCode.UNKNOWN, "the agent ended the registration")

        waiter = threading.Thread(target=wait_first, daemon=True)
        waiter.start()
        waiter.join(timeout)
        if waiter.is_alive():
            call.cancel()
            raise ShardsyncError(grpc.StatusCode.DEADLINE_EXCEEDED, "the agent did not answer the registration")
        if "error" in first:
            raise first["error"]
        return Registration(call, first["event"], self, client_id)

    def status(self, timeout: float = 5.0) -> shardsync_pb2.AgentStatus:
        return _call(self._stub.Status, shardsync_pb2.AgentStatusRequest(), timeout)


class CoordinatorClient:
    """The coordinator: syncs, explains and status.

    Give `tls=(ca_file, cert_file, key_file)` (PEM) for a coordinator run with
    --tls-*, or `insecure=True` for one run with --insecure; exactly one of them.
    `server_name`: as --tls-server-name, the name the coordinator's certificate carries.
    `address`: host:port, or "unix:PATH" for the unix socket of an agent that serves the
    coordinator (shardsync-agent --serve-coordinator), with insecure=True: no TLS there.
    `native`: make the calls through the C++ library (shardsync.native) instead of grpcio,
    the faster call for a trainer's sync(): True for the copy packaged beside this module,
    or the library's path. It must be there: nothing falls back to grpcio."""

    def __init__(self, address: str, *, tls: Optional[Tuple[str, str, str]] = None, insecure: bool = False,
                 server_name: Optional[str] = None, native: Union[None, bool, str] = None) -> None:
        if (tls is None) == (not insecure):
            raise ValueError("give exactly one of tls=(ca, cert, key) and insecure=True")
        pems = (_read(tls[0]), _read(tls[1]), _read(tls[2])) if tls else None
        self._native: Optional[native_library.NativeChannel] = None
        if native:
            path = native_library.PACKAGED if native is True else native
            self._native = native_library.NativeChannel(path, address, pems, server_name)
        else:
            if pems is None:
                self._channel = grpc.insecure_channel(address, options=_MESSAGE_OPTIONS)
            else:
                ca, cert, key = pems
                credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
                options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
                self._channel = grpc.secure_channel(address, credentials, options=options + _MESSAGE_OPTIONS)
            self._stub = shardsync_pb2_grpc.CoordinatorStub(self._channel)
        self._last: Optional[shardsync_pb2.SyncResponse] = None

    def _unary(self, method: str, request: Any, response_type: Any, timeout: float,
               poll: float = native_library.POLL_SECONDS) -> Any:
        if self._native:
            return self._native.call(f"/shardsync.v1.Coordinator/{method}", request, response_type, timeout,
                                     ShardsyncError, poll)
        return _call(getattr(self._stub, method), request, timeout)

    def sync(self, timeout: float = 60.0, verify: bool = False,
             target_ranks: Iterable[int] = (), links: bool = False) -> shardsync_pb2.SyncResponse:
        """Runs one sync on every agent and returns its SyncResponse (stats per rank).
        With verify, every target placement's checksum is compared with its sources'.
        With target_ranks, only the targets on those ranks are written (a rank whose
        inference engine restarted); every other target keeps its bytes. With links,
        the response has every link's bytes too (up to ranks x ranks of them)."""
        request = shardsync_pb2.SyncRequest(timeout_ms=int(timeout * 1000), verify=verify,
                                            target_ranks=list(target_ranks), links=links)
        # Beside agents that copy on their host's cores, the native wait sleeps at once.
        poll = 0.0 if self._last is not None and self._last.host_copies else native_library.POLL_SECONDS
        self._last = self._unary("Sync", request, shardsync_pb2.SyncResponse, timeout + 10, poll)
        return self._last

    def stats(self) -> Optional[shardsync_pb2.SyncResponse]:
        """The SyncResponse of this client's last successful sync (None before one):
        per rank bytes sent, received and copied locally, rounds, chunks, staging, seconds."""
        return self._last

    def explain(self, link_gbps: float = 0.0, memory_gbps: float = 0.0, network_gbps: float = 0.0,
                timeout: float = 30.0, links: bool = False) -> shardsync_pb2.ExplainResponse:
        """The plan's bytes per rank and its floor at these speeds (GB/s; 0: the
        coordinator's cost model); ExplainResponse. With `links`, every link's bytes
        too (up to ranks x ranks of them)."""
        request = shardsync_pb2.ExplainRequest(link_gbps=link_gbps, memory_gbps=memory_gbps,
                                               network_gbps=network_gbps, links=links)
        return self._unary("Explain", request, shardsync_pb2.ExplainResponse, timeout)

    def status(self, timeout: float = 5.0) -> shardsync_pb2.CoordinatorStatus:
        return self._unary("Status", shardsync_pb2.CoordinatorStatusRequest(), shardsync_pb2.CoordinatorStatus,
                           timeout)
