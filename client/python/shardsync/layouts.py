"""Buffers and layouts for registration: host shared memory, the rollout's weight
arena, and TensorLayout messages for ZeRO partitions and TP shards. Sizes, offsets and
boxes are in elements unless a name says bytes."""

import itertools
import math
import os
from multiprocessing import shared_memory
from typing import Any, Dict, Iterable, List, Optional, Sequence, Tuple

from shardsync import layout_pb2, shardsync_pb2

__all__ = ["ALIGNMENT", "DTYPE_BYTES", "SharedBuffer", "WeightArena", "flat_partition", "tensor_layout",
           "tp_shard_box", "zero3_partition"]

DTYPE_BYTES = {
    "float32": 4, "bfloat16": 2, "float16": 2, "float8_e4m3": 1, "float8_e5m2": 1,
    "int64": 8, "int32": 4, "int8": 1, "uint8": 1,
}
_DTYPE_ENUM = {
    "float32": layout_pb2.FLOAT32, "bfloat16": layout_pb2.BFLOAT16, "float16": layout_pb2.FLOAT16,
    "float8_e4m3": layout_pb2.FLOAT8_E4M3, "float8_e5m2": layout_pb2.FLOAT8_E5M2, "int64": layout_pb2.INT64,
    "int32": layout_pb2.INT32, "int8": layout_pb2.INT8, "uint8": layout_pb2.UINT8,
}
ALIGNMENT = 256  # bytes: every arena view starts on this boundary


class SharedBuffer:
    """Host memory this process owns as a POSIX shared memory object (CPU mode); the
    agent maps it by name. close() unlinks it."""

    def __init__(self, nbytes: int, name: Optional[str] = None) -> None:
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=max(nbytes, 1))
        self.nbytes = nbytes
        self.buf = self._shm.buf[:nbytes]
        self._unlinked = False

    def handle(self) -> Tuple[shardsync_pb2.MemoryHandle, int]:
        """The registration handle and size of this buffer."""
        return shardsync_pb2.MemoryHandle(shm_name="/" + self._shm.name, device=-1), self.nbytes

    def close(self) -> None:
        """Unlinks the object, then releases this process's mapping. Views into `buf`
        (memoryviews, numpy arrays) that are still alive keep the mapping: BufferError
        names the object, which is unlinked all the same; close() again once they are
        gone."""
        if not self._unlinked:
            self._unlinked = True
            self._shm.unlink()
        try:
            self.buf.release()
            self._shm.close()
        except BufferError:
            raise BufferError(f"shared memory /{self._shm.name} is unlinked, but views of it are alive: drop them "
                              "and close() again to unmap it") from None


def tensor_layout(name: str, shape: Sequence[int], dtype: str, placements: Iterable[Sequence[Any]] = (),
                  flat_placements: Iterable[Tuple[int, int, str, int]] = (),
                  fills: Iterable[Tuple[str, int, Sequence[int]]] = (),
                  block_scales: Iterable[Sequence[Any]] = ()) -> layout_pb2.TensorLayout:
    """A TensorLayout message: `placements` are (box_lo, box_hi, buffer, base[, strides]),
    `flat_placements` are (begin, end, buffer, base). A "float8_e4m3" target quantized in
    128 x 128 blocks gives `block_scales`: per placement, in order, (buffer, base[,
    row_stride]) of its float32 scales (row_stride 0 or left out: ceil(columns / 128))."""
    layout = layout_pb2.TensorLayout(name=name, shape=list(shape), dtype=_DTYPE_ENUM[dtype])
    for scales in block_scales:
        buffer, base = scales[:2]
        layout.block_scales.add(buffer=buffer, base=base, row_stride=scales[2] if len(scales) > 2 else 0)
    for placement in placements:
        lo, hi, buffer, base = placement[:4]
        strides = placement[4] if len(placement) > 4 else ()
        layout.placements.add(box=layout_pb2.Box(lo=list(lo), hi=list(hi)), buffer=buffer, base=base,
                              strides=list(strides))
    for begin, end, buffer, base in flat_placements:
        layout.flat_placements.add(buffer=buffer, base=base, begin=begin, end=end)
    for buffer, base, fill_shape in fills:
        layout.fills.add(buffer=buffer, base=base, shape=list(fill_shape))
    return layout


def flat_partition(numel: int, world: int, dp_rank: int) -> Tuple[int, int]:
    """ZeRO-3 (DeepSpeed partition_parameters): DP index r holds flat [r*p, r*p + v_r),
    p = ceil(numel / world), v_r = clamp(numel - r*p, 0, p)."""
    p = math.ceil(numel / world)
    begin = dp_rank * p
    return begin, begin + max(0, min(numel - begin, p))


def tp_shard_box(shape: Sequence[int], axis: Optional[int], tp: int,
                 tp_rank: int) -> Tuple[List[int], List[int]]:
    """The box [lo, hi) TP rank `tp_rank` of `tp` holds: axis `axis` split AutoTP-style
    (rank r gets n // tp + (r < n % tp) indices), or the whole tensor when `axis` is
    None (replicated)."""
    lo, hi = [0] * len(shape), list(shape)
    if axis is not None:
        n = shape[axis]
        lo[axis] = tp_rank * (n // tp) + min(tp_rank, n % tp)
        hi[axis] = lo[axis] + n // tp + (1 if tp_rank < n % tp else 0)
    return lo, hi


def zero3_partition(name: str, shape: Sequence[int], dtype: str, world: int, dp_rank: int, buffer: str,
                    base: int) -> Optional[layout_pb2.TensorLayout]:
    """The TensorLayout of one rank's ZeRO-3 partition of a parameter, stored at `base`
    of `buffer`. None when this rank holds nothing of it (padding)."""
    begin, end = flat_partition(math.prod(shape), world, dp_rank)
    if begin >= end:
        return None
    return tensor_layout(name, shape, dtype, flat_placements=[(begin, end, buffer, base)])


class WeightArena:
    """A rank's target tensors as views of one buffer that is never reallocated, so code
    captured on it (CUDA graphs) reads new weights after every sync. Each view starts on
    a 256-byte boundary. `shards` are (name, shard_shape, dtype), the dtype a name of
    DTYPE_BYTES or, with a device, a torch dtype. Without `device` the arena is host
    shared memory (CPU agents); with a CUDA `device` (needs torch) it is one CUDA
    allocation, registered by its CUDA IPC handle. `buffer_name` must be unique among
    all clients of one agent; by default it is "arena-<pid>-<n>", unique per process."""

    _made = itertools.count()

    def __init__(self, shards: Iterable[Tuple[str, Sequence[int], Any]], device: Any = None,
                 buffer_name: Optional[str] = None) -> None:
        self.buffer_name = buffer_name or f"arena-{os.getpid()}-{next(WeightArena._made)}"
        self.offsets: Dict[str, Tuple[int, Tuple[int, ...], str]] = {}  # name -> (byte offset, shape, dtype name)
        used = 0
        for name, shard_shape, dtype in shards:
            start = (used + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
            dtype_name = dtype if isinstance(dtype, str) else _torch_dtype_name(dtype)
            self.offsets[name] = (start, tuple(shard_shape), dtype_name)
            used = start + math.prod(shard_shape) * DTYPE_BYTES[dtype_name]
        self.device = device
        self.memory: Any  # SharedBuffer, or a uint8 CUDA tensor
        if device is None:
            self.memory = SharedBuffer(used)
        else:
            from shardsync import torch_support
            self.memory = torch_support.aligned_cuda_bytes(used, device, ALIGNMENT)

    def view(self, name: str) -> Any:
        """One shard's view into the arena, never a copy: a memoryview (host; release it
        before close()) or a torch tensor of the shard's shape and dtype."""
        start, shape, dtype = self.offsets[name]
        if self.device is None:
            return self.memory.buf[start:start + _nbytes(shape, dtype)]
        from shardsync import torch_support
        return torch_support.typed_view(self.memory[start:start + _nbytes(shape, dtype)], dtype, shape)

    def placement(self, name: str, box_lo: Sequence[int], box_hi: Sequence[int]) -> Tuple[Any, ...]:
        """A target placement putting tensor box [box_lo, box_hi) in this shard."""
        start, _, dtype = self.offsets[name]
        return (box_lo, box_hi, self.buffer_name, start // DTYPE_BYTES[dtype])

    def block_scales(self, name: str) -> Tuple[str, int]:
        """(buffer, base) of float32 shard `name` holding a float8 placement's scales, one
        per 128 x 128 block row-major, for ``tensor_layout(..., block_scales=[...])``."""
        start, _, dtype = self.offsets[name]
        if dtype != "float32":
            raise ValueError(f"arena shard '{name}' is {dtype}; block scales are float32")
        return self.buffer_name, start // DTYPE_BYTES[dtype]

    def buffers(self) -> Dict[str, Any]:
        """The arena's one buffer, for AgentClient.register."""
        if self.device is None:
            return {self.buffer_name: self.memory}
        from shardsync import torch_support
        return {self.buffer_name: torch_support.cuda_buffer(self.memory)}

    def close(self) -> None:
        """Releases host memory (a CUDA arena is freed with its last reference)."""
        if self.device is None:
            self.memory.close()


def _nbytes(shape: Sequence[int], dtype: str) -> int:
    return math.prod(shape) * DTYPE_BYTES[dtype]


def _torch_dtype_name(dtype: Any) -> str:
    from shardsync.torch_support import TORCH_DTYPES
    return TORCH_DTYPES[dtype]
