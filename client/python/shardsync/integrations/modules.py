"""A module's parameters in checkpoint (Hugging Face) terms: which checkpoint tensors each
parameter holds, and where in its row-major elements.

Most parameters are one checkpoint tensor under the parameter's name. Hugging Face
transformers 5 stores a MoE layer's experts fused: ``mlp.experts.gate_up_proj``
``[E, 2I, H]`` is, in row-major order, gate_proj of expert 0, up_proj of expert 0, gate
of expert 1, ... (its loader concatenates each expert's gate and up rows), and
``mlp.experts.down_proj`` ``[E, H, I]`` is down_proj of expert 0, 1, ...; checkpoints
keep one tensor per expert. What wrappers add to a name (``module.``, ``_orig_mod.``,
FSDP1's and activation checkpointing's components) is not part of a checkpoint name.
"""

from typing import Callable, Dict, List, Optional, Sequence, Tuple
from dataclasses import dataclass
import glob
import json
import math
import os
import struct

__all__ = ["WRAPPER_COMPONENTS", "Segment", "checkpoint_name", "flat_pieces", "safetensors_shapes", "segments"]

# Path components wrappers add: torch.compile, FSDP1, activation checkpointing, Lightning.
WRAPPER_COMPONENTS = {"_orig_mod", "_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_forward_module"}


@dataclass(frozen=True)
class Segment:
    """Checkpoint tensor `name` of `shape` is elements [offset, offset + numel) of a
    parameter's row-major elements."""
    name: str
    shape: tuple
    offset: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


def checkpoint_name(name: str, rename: Optional[Callable[[str], str]] = None) -> str:
    """`name` without what wrappers add (a leading ``module.`` of DeepSpeed's or DDP's
    engine, WRAPPER_COMPONENTS anywhere), then through `rename` (a callable, or None)."""
    parts = [p for p in name.split(".") if p not in WRAPPER_COMPONENTS]
    if parts and parts[0] == "module":
        parts = parts[1:]
    name = ".".join(parts)
    return rename(name) if rename else name


def segments(name: str, shape: Sequence[int]) -> List[Segment]:
    """The checkpoint tensors parameter `name` (a checkpoint-style name) of global `shape`
    holds, in its row-major order."""
    shape = tuple(shape)
    stem, _, leaf = name.rpartition(".")
    if stem.endswith("mlp.experts") and len(shape) == 3 and leaf in ("gate_up_proj", "down_proj"):
        experts, rows, cols = shape
        out = []
        if leaf == "gate_up_proj":
            if rows % 2:
                raise ValueError(f"'{name}' {list(shape)}: a fused gate_up has an even number of rows")
            half = rows // 2
            for e in range(experts):
                out.append(Segment(f"{stem}.{e}.gate_proj.weight", (half, cols), e * rows * cols))
                out.append(Segment(f"{stem}.{e}.up_proj.weight", (half, cols), e * rows * cols + half * cols))
        else:
            for e in range(experts):
                out.append(Segment(f"{stem}.{e}.down_proj.weight", (rows, cols), e * rows * cols))
        return out
    return [Segment(name, shape, 0)]


def flat_pieces(param_segments: Sequence[Segment], begin: int, end: int) -> List[Tuple[Segment, int, int, int]]:
    """Where elements [begin, end) of a parameter's row-major elements lie in checkpoint
    tensors: (segment, checkpoint begin, checkpoint end, offset from `begin`) for every
    segment they reach."""
    out = []
    for seg in param_segments:
        lo, hi = max(begin, seg.offset), min(end, seg.offset + seg.numel)
        if lo < hi:
            out.append((seg, lo - seg.offset, hi - seg.offset, lo - begin))
    return out


def safetensors_shapes(path: str) -> Dict[str, Tuple[int, ...]]:
    """{tensor name: shape} of every tensor in the ``*.safetensors`` files of the folder
    `path` (or of one such file), read from their headers: 8 bytes of little-endian header
    length, then a JSON object of {name: {"dtype", "shape", "data_offsets"}}."""
    files = sorted(glob.glob(os.path.join(path, "*.safetensors"))) if os.path.isdir(path) else [path]
    if not files:
        raise FileNotFoundError(f"no .safetensors file in {path}")
    shapes = {}
    for file in files:
        with open(file, "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for name, info in header.items():
            if name != "__metadata__":
                shapes[name] = tuple(info["shape"])
    return dict(sorted(shapes.items()))
