"""A framework's own tensors as shardsync buffers, no copy: CUDA tensors through their
CUDA IPC handle (a GPU agent), CPU tensors through shared memory (a CPU agent): passed as
a file descriptor under torch's default sharing strategy, by name under "file_system"."""

from typing import Tuple, Union
import os

import grpc
import torch
import torch.multiprocessing

from shardsync import shardsync_pb2
from shardsync.client import DescriptorBuffer, ShardsyncError

__all__ = ["tensor_buffer"]


def tensor_buffer(tensor: torch.Tensor) -> Union[Tuple[shardsync_pb2.MemoryHandle, int], DescriptorBuffer]:
    """`tensor`'s own elements as a buffer for ``AgentClient.register``. A CUDA tensor is
    shared through its allocation's IPC handle: (MemoryHandle, bytes). A CPU tensor's
    storage is moved into shared memory first, in place (every view of it follows; do
    this before an optimizer or engine caches raw pointers): with torch's sharing
    strategy "file_descriptor" (its default on Linux) the storage's descriptor is passed
    (a DescriptorBuffer, open while the storage lives), with "file_system" the agent
    opens it by name (a storage shared earlier under the other strategy moves, in place
    again). The strategy is the process's own and is never changed here."""
    if not tensor.is_contiguous():
        raise ValueError("a shardsync buffer is a contiguous tensor")
    if tensor.is_cuda:
        from shardsync.torch_support import cuda_buffer
        return cuda_buffer(tensor)
    if tensor.device.type != "cpu":
        raise ValueError(f"a shardsync buffer is a CUDA or CPU tensor, not one on '{tensor.device}'")
    storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
    storage_bytes = storage.nbytes() if callable(getattr(storage, "nbytes", None)) else storage.size() * tensor.element_size()
    nbytes = tensor.numel() * tensor.element_size()
    by_name = torch.multiprocessing.get_sharing_strategy() == "file_system"
    if not storage.is_shared():
        storage.share_memory_()
    if by_name:
        name = storage._share_filename_cpu_()[1].decode()
        object_bytes = os.path.getsize("/dev/shm" + name)
    else:
        fd = storage._share_fd_cpu_()[0]
        object_bytes = os.fstat(fd).st_size
    # torch's shared memory may start with a header (a reference count) before the data.
    header = object_bytes - storage_bytes
    if header < 0:
        raise ShardsyncError(grpc.StatusCode.INTERNAL, "shared memory is smaller than its storage")
    offset = header + tensor.storage_offset() * tensor.element_size()
    if by_name:
        return shardsync_pb2.MemoryHandle(shm_name=name, offset_bytes=offset, device=-1), nbytes
    return DescriptorBuffer(fd=fd, nbytes=nbytes, offset_bytes=offset)
