"""Buffers and layouts for registration: host shared memory, the rollout's weight
arena, and TensorLayout messages for ZeRO partitions and TP shards. Sizes, offsets and
boxes are in elements unless a name says bytes."""

import math
from multiprocessing import shared_memory

from shardsync import layout_pb2, shardsync_pb2

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
    agent maps it by name. Unlinked on close()."""

    def __init__(self, nbytes, name=None):
        self._shm = shared_memory.SharedMemory(name=name, create=True, size=max(nbytes, 1))
        self.nbytes = nbytes
        self.buf = self._shm.buf[:nbytes]

    def handle(self):
        """The registration handle and size of this buffer."""
        return shardsync_pb2.MemoryHandle(shm_name="/" + self._shm.name, device=-1), self.nbytes

    def close(self):
        self.buf.release()
        self._shm.close()
        self._shm.unlink()


def tensor_layout(name, shape, dtype, placements=(), flat_placements=(), fills=(), block_scales=()):
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


def flat_partition(numel, world, dp_rank):
    """ZeRO-3 (DeepSpeed partition_parameters): DP index r holds flat [r*p, r*p + v_r),
    p = ceil(numel / world), v_r = clamp(numel - r*p, 0, p)."""
    p = math.ceil(numel / world)
    begin = dp_rank * p
    return begin, begin + max(0, min(numel - begin, p))


def tp_shard_box(shape, axis, tp, tp_rank):
    """The box [lo, hi) TP rank `tp_rank` of `tp` holds: axis `axis` split AutoTP-style
    (rank r gets n // tp + (r < n % tp) indices), or the whole tensor when `axis` is
    None (replicated)."""
    lo, hi = [0] * len(shape), list(shape)
    if axis is not None:
        n = shape[axis]
        lo[axis] = tp_rank * (n // tp) + min(tp_rank, n % tp)
        hi[axis] = lo[axis] + n // tp + (1 if tp_rank < n % tp else 0)
    return lo, hi


def zero3_partition(name, shape, dtype, world, dp_rank, buffer, base):
    """The TensorLayout of one rank's ZeRO-3 partition of a parameter, stored at `base`
    of `buffer`. None when this rank holds nothing of it (padding)."""
    begin, end = flat_partition(math.prod(shape), world, dp_rank)
    if begin >= end:
        return None
    return tensor_layout(name, shape, dtype, flat_placements=[(begin, end, buffer, base)])


class WeightArena:
    """A rank's target tensors as views of one buffer that is never reallocated, so code
    captured on it (CUDA graphs) reads new weights after every sync. Each view starts on
    a 256-byte boundary. `shards` are (name, shard_shape, dtype)."""

    def __init__(self, shards, buffer_name="arena"):
        self.buffer_name = buffer_name
        self.offsets = {}  # name -> (byte offset, shard shape, dtype)
        used = 0
        for name, shard_shape, dtype in shards:
            start = (used + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT
            self.offsets[name] = (start, tuple(shard_shape), dtype)
            used = start + math.prod(shard_shape) * DTYPE_BYTES[dtype]
        self.memory = SharedBuffer(used)

    def view(self, name):
        """The bytes of one shard (a memoryview into the arena, never a copy)."""
        start, shard_shape, dtype = self.offsets[name]
        return self.memory.buf[start:start + math.prod(shard_shape) * DTYPE_BYTES[dtype]]

    def placement(self, name, box_lo, box_hi):
        """A target placement putting tensor box [box_lo, box_hi) in this shard."""
        start, _, dtype = self.offsets[name]
        return (box_lo, box_hi, self.buffer_name, start // DTYPE_BYTES[dtype])

    def buffers(self):
        return {self.buffer_name: self.memory}

    def close(self):
        self.memory.close()
