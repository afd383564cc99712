"""A framework's own tensors as shardsync buffers, no copy: CUDA tensors through their
CUDA IPC handle (a GPU agent), CPU tensors through POSIX shared memory (a CPU agent)."""

from typing import Tuple
import os

import grpc
import torch
import torch.multiprocessing

from shardsync import shardsync_pb2
from shardsync.client import ShardsyncError

__all__ = ["tensor_buffer"]


def tensor_buffer(tensor: torch.Tensor) -> Tuple[shardsync_pb2.MemoryHandle, int]:
    """(MemoryHandle, bytes) of `tensor`'s own elements. A CUDA tensor is shared through
    its allocation's IPC handle. A CPU tensor's storage is moved into shared memory first,
    in place (every view of it follows; do this before an optimizer or engine caches raw
    pointers), and named so that the agent can map it."""
    if not tensor.is_contiguous():
        raise ValueError("a shardsync buffer is a contiguous tensor")
    if tensor.is_cuda:
        from shardsync.torch_support import cuda_buffer
        return cuda_buffer(tensor)
    if torch.multiprocessing.get_sharing_strategy() != "file_system":
        # Only this strategy gives shared memory a name another process can open.
        torch.multiprocessing.set_sharing_strategy("file_system")
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    if not storage.is_shared():
        storage.share_memory_()
    name = storage._share_filename_cpu_()[1].decode()
    storage_bytes = storage.nbytes() if callable(getattr(storage, "nbytes", None)) else storage.size() * tensor.element_size()
    # torch's shared memory starts with a header (a reference count) before the data.
    header = os.path.getsize("/dev/shm" + name) - storage_bytes
    if header < 0:
        raise ShardsyncError(grpc.StatusCode.INTERNAL, f"shared memory {name} is smaller than its storage")
    offset = header + tensor.storage_offset() * tensor.element_size()
    return shardsync_pb2.MemoryHandle(shm_name=name, offset_bytes=offset, device=-1), tensor.numel() * tensor.element_size()
