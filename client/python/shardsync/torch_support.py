"""PyTorch CUDA tensors as shardsync buffers (GPU mode). Importing this needs torch.

Ordering: the trainer's writes must be complete before a sync reads them:
``torch.cuda.synchronize()`` before asking for the sync, or, without stopping the GPU,
a ``ready_event()`` given at registration and recorded after the writes (a sync waits
for its last record on the GPU). The rollout reads its arena only after ``sync()`` returns. The arena's memory never moves, so CUDA graphs
captured on it read the new weights after every sync.
"""

from typing import Any, Sequence, Tuple

import torch

import grpc

from shardsync import shardsync_pb2
from shardsync.client import ShardsyncError

__all__ = ["CUDA_IPC_HANDLE_BYTES", "TORCH_DTYPES", "aligned_cuda_bytes", "cuda_buffer", "event_handle", "ready_event",
           "typed_view"]

CUDA_IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)


def _raw_ipc_handle(handle: Any) -> bytes:
    """The cudaIpcMemHandle_t inside torch's shareable handle: older torch gives the 64
    bytes alone; newer ones prefix a version byte and a type byte ('c' for a cudaMalloc
    block, 'e' for an expandable segment, which has no such handle)."""
    handle = bytes(handle)
    if len(handle) == CUDA_IPC_HANDLE_BYTES:
        return handle
    if len(handle) == CUDA_IPC_HANDLE_BYTES + 2 and handle[1] == ord("c"):
        return handle[2:]
    if len(handle) >= 2 and handle[1] == ord("e"):
        raise ShardsyncError(
            grpc.StatusCode.FAILED_PRECONDITION,
            "this tensor lives in an expandable segment, which has no CUDA IPC handle; "
            "set PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False in the trainer and rollout")
    raise ShardsyncError(grpc.StatusCode.INVALID_ARGUMENT, f"unknown torch IPC handle format ({len(handle)} bytes)")


def ready_event() -> torch.cuda.Event:
    """An interprocess CUDA event on the current device for a trainer's registration:
    ``register(..., ready_event=event_handle(event))``, then ``event.record()`` after each
    optimizer step's writes, before asking for the sync."""
    return torch.cuda.Event(interprocess=True)


def event_handle(event: torch.cuda.Event) -> bytes:
    """The cudaIpcEventHandle_t bytes of an interprocess torch CUDA event."""
    return bytes(event.ipc_handle())


TORCH_DTYPES = {
    torch.float32: "float32", torch.bfloat16: "bfloat16", torch.float16: "float16",
    torch.int64: "int64", torch.int32: "int32", torch.int8: "int8", torch.uint8: "uint8",
}
if hasattr(torch, "float8_e4m3fn"):  # torch >= 2.1
    TORCH_DTYPES[torch.float8_e4m3fn] = "float8_e4m3"
_TORCH_DTYPE_OF = {name: dtype for dtype, name in TORCH_DTYPES.items()}


def cuda_buffer(tensor: torch.Tensor) -> Tuple[shardsync_pb2.MemoryHandle, int]:
    """(MemoryHandle, bytes) of a contiguous CUDA tensor: the CUDA IPC handle of its
    caching-allocator segment and the tensor's byte offset inside it."""
    if not tensor.is_cuda or not tensor.is_contiguous():
        raise ValueError("a shardsync buffer is a contiguous CUDA tensor")
    storage = tensor.untyped_storage()
    try:
        shared = storage._share_cuda_()
    except RuntimeError as error:
        raise ShardsyncError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"this tensor's memory cannot be shared through a CUDA IPC handle ({error}): memory mapped with "
            "cuMemCreate has none (PyTorch's expandable segments: set "
            "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False; vLLM's sleep mode and SGLang's memory saver: "
            "start the engine without them)") from None
    device, handle, storage_offset = shared[0], shared[1], shared[3]
    offset = storage_offset + tensor.storage_offset() * tensor.element_size()
    nbytes = tensor.numel() * tensor.element_size()
    return shardsync_pb2.MemoryHandle(cuda_ipc_handle=_raw_ipc_handle(handle), offset_bytes=offset,
                                      device=device), nbytes


def aligned_cuda_bytes(nbytes: int, device: Any, alignment: int) -> torch.Tensor:
    """`nbytes` of uint8 CUDA memory whose first byte is aligned to `alignment` (a view
    into a slightly larger allocation, which it keeps alive)."""
    raw = torch.empty(nbytes + alignment, dtype=torch.uint8, device=device)
    skip = (-raw.data_ptr()) % alignment
    return raw[skip:skip + nbytes]


def typed_view(raw: torch.Tensor, dtype: str, shape: Sequence[int]) -> torch.Tensor:
    """Bytes `raw` seen as a tensor of `shape` and `dtype` (a name of TORCH_DTYPES)."""
    return raw.view(_TORCH_DTYPE_OF[dtype]).view(tuple(shape))
