"""The coordinator's unary calls through libshardsync_native.so (client/native): a C++
gRPC call instead of grpcio's (docs/benchmarks.md compares the two); the messages stay
Python's."""

from typing import Any, Callable, Optional, Tuple
import ctypes
import os

import grpc

__all__ = ["PACKAGED", "POLL_SECONDS", "NativeChannel", "load"]

# Where scripts/build-portable puts the library and the gRPC libraries it needs.
PACKAGED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "native", "libshardsync_native.so")

# How long a call polls for its answer before it sleeps (common/polling.h).
POLL_SECONDS = 0.05

_CODES = {code.value[0]: code for code in grpc.StatusCode}
_MESSAGE_BYTES = 4096


def load(path: str) -> ctypes.CDLL:
    """The library at `path`; a clear error if it is not there or will not load."""
    if not os.path.exists(path):
        raise FileNotFoundError(f"no shardsync native library at {path} (scripts/build-portable puts one in "
                                f"dist/python/shardsync/native; bazel build //client/native:libshardsync_native.so)")
    library = ctypes.CDLL(path)  # ctypes releases the GIL during each call
    library.shardsync_channel_open.restype = ctypes.c_void_p
    library.shardsync_channel_open.argtypes = [ctypes.c_char_p] * 5 + [ctypes.c_char_p, ctypes.c_size_t]
    library.shardsync_unary_call.restype = ctypes.c_int
    library.shardsync_unary_call.argtypes = [
        ctypes.c_void_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_double, ctypes.c_double,
        ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_size_t), ctypes.c_char_p, ctypes.c_size_t]
    library.shardsync_free.argtypes = [ctypes.c_void_p]
    library.shardsync_channel_close.argtypes = [ctypes.c_void_p]
    return library


class NativeChannel:
    """One channel of the native library; `call` raises `error_type(code, message)` as
    the grpcio path raises ShardsyncError."""

    def __init__(self, path: str, address: str, tls_pems: Optional[Tuple[bytes, bytes, bytes]] = None,
                 server_name: Optional[str] = None) -> None:
        self._channel = None
        self._library = load(path)
        ca, cert, key = tls_pems or (None, None, None)
        error = ctypes.create_string_buffer(_MESSAGE_BYTES)
        self._channel = self._library.shardsync_channel_open(
            address.encode(), ca, cert, key, server_name.encode() if server_name else None, error, _MESSAGE_BYTES)
        if not self._channel:
            raise ValueError(f"shardsync native channel to {address}: {error.value.decode()}")

    def call(self, method: str, request: Any, response_type: Any, timeout: float,
             error_type: Callable[[grpc.StatusCode, str], Exception], poll: float = POLL_SECONDS) -> Any:
        """The answer, waited for up to `timeout` seconds, polled for its first `poll`."""
        payload = request.SerializeToString()
        response = ctypes.c_void_p()
        size = ctypes.c_size_t()
        message = ctypes.create_string_buffer(_MESSAGE_BYTES)
        code = self._library.shardsync_unary_call(self._channel, method.encode(), payload, len(payload), timeout,
                                                  poll, ctypes.byref(response), ctypes.byref(size), message,
                                                  _MESSAGE_BYTES)
        if code != 0:
            raise error_type(_CODES.get(code, grpc.StatusCode.UNKNOWN), message.value.decode(errors="replace"))
        try:
            return response_type.FromString(ctypes.string_at(response, size.value))
        finally:
            self._library.shardsync_free(response)

    def close(self) -> None:
        if self._channel:
            self._library.shardsync_channel_close(self._channel)
            self._channel = None

    def __del__(self) -> None:
        self.close()
