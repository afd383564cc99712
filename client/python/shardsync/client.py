"""gRPC calls to the agent (unix socket) and the coordinator (TCP)."""

import threading
import time

import grpc

from shardsync import native as native_library
from shardsync import shardsync_pb2, shardsync_pb2_grpc


class ShardsyncError(RuntimeError):
    """A call the agent or the coordinator refused or failed; `code` is the gRPC code."""

    def __init__(self, code, message):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


def _call(method, request, timeout):
    try:
        return method(request, timeout=timeout)
    except grpc.RpcError as error:
        raise ShardsyncError(error.code(), error.details()) from None


def _read(path):
    with open(path, "rb") as f:
        return f.read()


class Registration:
    """Buffers and layouts the agent holds while this object is open. `close()` (or the
    process exiting) ends the call; `close()` returns once the agent has dropped them, so
    the same client id may register again at once."""

    def __init__(self, call, event, agent, client_id):
        self._call = call
        self._agent = agent
        self._client_id = client_id
        self.rank = event.rank
        self.layout_epoch = event.layout_epoch
        # Drain the stream so a server-side end is noticed; nothing else arrives.
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self):
        try:
            for _ in self._call:
                pass
        except grpc.RpcError:
            pass

    def close(self, timeout=5.0):
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

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


class AgentClient:
    """The agent on this process's device, reached through its unix socket."""

    def __init__(self, socket_path):
        self._channel = grpc.insecure_channel("unix:" + socket_path)
        self._stub = shardsync_pb2_grpc.AgentStub(self._channel)

    def register(self, client_id, role, buffers, tensors, timeout=10.0, ready_event=None):
        """Registers `buffers` ({name: SharedBuffer or (handle, bytes)}) and `tensors`
        (TensorLayout messages) as SOURCE or TARGET ("source"/"target"). Returns once
        the agent opened and checked everything; raises ShardsyncError if it refused.
        `ready_event` (a source on a GPU agent): the bytes of an interprocess CUDA event's
        handle (torch_support.event_handle) the client records after its writes; every
        sync waits for its last record on the GPU instead of the client synchronizing."""
        request = shardsync_pb2.RegisterRequest(
            client_id=client_id,
            role=shardsync_pb2.SOURCE if role == "source" else shardsync_pb2.TARGET,
            tensors=tensors,
            ready_event=ready_event or b"",
        )
        for name, buffer in buffers.items():
            handle, nbytes = buffer.handle() if hasattr(buffer, "handle") else buffer
            request.buffers.add(name=name, bytes=nbytes, handle=handle)
        call = self._stub.Register(request)
        first = {}

        def wait_first():
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

    def status(self, timeout=5.0):
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

    def __init__(self, address, *, tls=None, insecure=False, server_name=None, native=None):
        if (tls is None) == (not insecure):
            raise ValueError("give exactly one of tls=(ca, cert, key) and insecure=True")
        pems = tuple(_read(path) for path in tls) if tls else None
        if native:
            path = native_library.PACKAGED if native is True else native
            self._native = native_library.NativeChannel(path, address, pems, server_name)
        else:
            self._native = None
            if insecure:
                self._channel = grpc.insecure_channel(address)
            else:
                ca, cert, key = pems
                credentials = grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)
                options = [("grpc.ssl_target_name_override", server_name)] if server_name else []
                self._channel = grpc.secure_channel(address, credentials, options=options)
            self._stub = shardsync_pb2_grpc.CoordinatorStub(self._channel)
        self._last = None

    def _unary(self, method, request, response_type, timeout):
        if self._native:
            return self._native.call(f"/shardsync.v1.Coordinator/{method}", request, response_type, timeout,
                                     ShardsyncError)
        return _call(getattr(self._stub, method), request, timeout)

    def sync(self, timeout=60.0, verify=False, target_ranks=()):
        """Runs one sync on every agent and returns its SyncResponse (stats per rank).
        With verify, every target placement's checksum is compared with its sources'.
        With target_ranks, only the targets on those ranks are written (a rank whose
        inference engine restarted); every other target keeps its bytes."""
        request = shardsync_pb2.SyncRequest(timeout_ms=int(timeout * 1000), verify=verify,
                                            target_ranks=list(target_ranks))
        self._last = self._unary("Sync", request, shardsync_pb2.SyncResponse, timeout + 10)
        return self._last

    def stats(self):
        """The SyncResponse of this client's last successful sync (None before one):
        per rank bytes sent, received and copied locally, rounds, chunks, staging, seconds."""
        return self._last

    def explain(self, link_gbps=0.0, memory_gbps=0.0, network_gbps=0.0, timeout=30.0):
        """The plan's bytes per rank and its floor at these speeds (GB/s; 0: the
        coordinator's cost model); ExplainResponse."""
        request = shardsync_pb2.ExplainRequest(link_gbps=link_gbps, memory_gbps=memory_gbps,
                                               network_gbps=network_gbps)
        return self._unary("Explain", request, shardsync_pb2.ExplainResponse, timeout)

    def status(self, timeout=5.0):
        return self._unary("Status", shardsync_pb2.CoordinatorStatusRequest(), shardsync_pb2.CoordinatorStatus,
                           timeout)
