"""Trainer adapters: the shards a trainer holds, read from the framework's own partition
metadata, as shardsync sources in checkpoint (Hugging Face) names. Each ``*_sources``
function returns (buffers, layouts) for ``AgentClient.register``; ``TrainerSource``
registers them and registers again when the memory moved.

- ``module_sources``: every parameter whole on this rank (a plain module, a Hugging Face
  model, DeepSpeed ZeRO-1/2, whose bf16 parameters are views of a flat that every DP rank
  holds whole after each step).
- ``fsdp2_sources``: each DTensor's local shard, where the DTensor itself says it lies
  (Shard(0) and Replicate placements, HSDP's replicate x shard included; an uneven last
  shard and empty shards as torch.chunk makes them).
- ``zero3_sources``: each DeepSpeed ZeRO-3 parameter's ``ds_tensor`` partition: rank r of
  the parameter's process group holds elements [r*P, min((r+1)*P, ds_numel)) of its
  row-major elements, P the partition's size.
- ``zero12_master_sources``: DeepSpeed ZeRO-1/2's fp32 master partitions instead of the
  bf16 copy (targets in bf16: the sender converts), frozen parameters from their bf16
  memory.
"""


import math
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Tuple

import torch

from shardsync import layout_pb2
from shardsync.client import AgentClient, Registration
from shardsync.integrations.memory import tensor_buffer
from shardsync.integrations.modules import checkpoint_name, flat_pieces, segments
from shardsync.layouts import tensor_layout
from shardsync.torch_support import TORCH_DTYPES

# What every *_sources and *_targets function returns, for AgentClient.register: the
# buffers by name, and the tensors' layouts in them.
Described = Tuple[Dict[str, Any], List[layout_pb2.TensorLayout]]
# Checkpoint names from a module's parameter names (None: as they are).
Rename = Optional[Callable[[str], str]]

__all__ = ["Described", "Layouts", "Registered", "TrainerSource", "dtype_name", "fsdp2_sources", "module_sources", "namespaced",
           "Rename", "zero12_master_sources", "zero3_sources"]


def dtype_name(tensor: torch.Tensor, name: str) -> str:
    """shardsync's name of `tensor`'s dtype; parameter `name` is named if it has none."""
    if tensor.dtype not in TORCH_DTYPES:
        raise ValueError(f"parameter '{name}' has dtype {tensor.dtype}, which shardsync does not move")
    return TORCH_DTYPES[tensor.dtype]


class Layouts:
    """Buffers and TensorLayouts of one side, built a stretch at a time."""

    def __init__(self) -> None:
        self.buffers: Dict[str, Any] = {}  # tensor_buffer's, by name
        self._tensors: Dict[str, layout_pb2.TensorLayout] = {}

    def add_stretch(self, buffer_name: str, tensor: torch.Tensor, param_name: str, param_shape: Sequence[int],
                    begin: int, end: int, base: int = 0) -> None:
        """`tensor` (contiguous, registered as `buffer_name`) holds, from its element
        `base` on, elements [begin, end) of the row-major elements of parameter
        `param_name` (a checkpoint-style name) of global `param_shape`."""
        if end <= begin:
            return
        if buffer_name not in self.buffers:
            self.buffers[buffer_name] = tensor_buffer(tensor)
        dtype = dtype_name(tensor, param_name)
        for seg, first, last, offset in flat_pieces(segments(param_name, param_shape), begin, end):
            layout = self._tensors.get(seg.name)
            if layout is None:
                layout = self._tensors[seg.name] = tensor_layout(seg.name, seg.shape, dtype)
            layout.flat_placements.add(buffer=buffer_name, base=base + offset, begin=first, end=last)

    def result(self) -> Described:
        return self.buffers, list(self._tensors.values())


def module_sources(module: torch.nn.Module, rename: Rename = None) -> Described:
    """Every parameter of `module` whole, from its own memory."""
    out = Layouts()
    for name, param in module.named_parameters():
        ckpt = checkpoint_name(name, rename)
        out.add_stretch(ckpt, param.data, ckpt, param.shape, 0, param.numel())
    return out.result()


def _dtensor_api() -> Any:
    try:
        from torch.distributed.tensor import DTensor, Replicate, Shard
    except ImportError:  # torch < 2.4
        from torch.distributed._tensor import DTensor, Replicate, Shard
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset
    return DTensor, Replicate, Shard, compute_local_shape_and_global_offset


def fsdp2_sources(module: torch.nn.Module, rename: Rename = None) -> Described:
    """Each parameter's local shard as FSDP2 (fully_shard) holds it: a DTensor whose
    placements are Shard(0) or Replicate on each mesh dimension. A parameter that is no
    DTensor (left out of sharding) counts whole. Other placements are refused by name."""
    DTensor, Replicate, Shard, local_shape_and_offset = _dtensor_api()
    out = Layouts()
    for name, param in module.named_parameters():
        ckpt = checkpoint_name(name, rename)
        if not isinstance(param, DTensor):
            out.add_stretch(ckpt, param.data, ckpt, param.shape, 0, param.numel())
            continue
        for placement in param.placements:
            # Exact types: _StridedShard (FSDP2 over tensor parallelism) subclasses Shard
            # but holds rows that are not one stretch.
            if not (type(placement) is Replicate or (type(placement) is Shard and placement.dim == 0)):
                raise ValueError(f"parameter '{name}' has placement {placement}: shardsync reads Shard(0) and "
                                 "Replicate placements only")
        local = param.to_local()
        if local.numel() == 0:
            continue
        local_shape, offset = local_shape_and_offset(param.shape, param.device_mesh, param.placements)
        if tuple(local_shape) != tuple(local.shape):
            raise ValueError(f"parameter '{name}': the local tensor is {list(local.shape)}, its placements say "
                             f"{list(local_shape)}")
        row = local.numel() // local.shape[0] if local.dim() else 1
        begin = offset[0] * row if local.dim() else 0
        out.add_stretch(ckpt, local, ckpt, param.shape, begin, begin + local.numel())
    return out.result()


def zero3_sources(module: torch.nn.Module, rename: Rename = None, rank_of: Optional[Callable[[Any], int]] = None,
                  world_of: Optional[Callable[[Any], int]] = None) -> Described:
    """Each parameter's ZeRO-3 partition (``ds_tensor``), placed by DeepSpeed's own
    partition arithmetic: the partition's size P, and this rank's index and the size of
    the parameter's ``ds_process_group`` (``rank_of(group)`` and ``world_of(group)``;
    default ``torch.distributed.get_rank``/``get_world_size`` of the group). What cannot
    be read so (attributes missing, a shape unlike ``ds_numel``, a rank outside the
    group, partitions too small for the parameter) is refused naming the parameter."""
    if rank_of is None or world_of is None:
        import torch.distributed as dist
        rank_of = rank_of or (lambda group: dist.get_rank(group=group))
        world_of = world_of or (lambda group: dist.get_world_size(group=group))
    out = Layouts()
    for name, param in module.named_parameters():
        ckpt = checkpoint_name(name, rename)
        partition = getattr(param, "ds_tensor", None)
        if partition is None:
            raise ValueError(f"parameter '{name}' has no ds_tensor: not partitioned by ZeRO-3")
        try:
            shape, numel, group = tuple(int(d) for d in param.ds_shape), int(param.ds_numel), param.ds_process_group
        except AttributeError as error:
            raise ValueError(f"parameter '{name}' has a ds_tensor but no {error.name}") from None
        if any(d < 0 for d in shape) or math.prod(shape) != numel:
            raise ValueError(f"parameter '{name}': ds_shape {list(shape)} does not hold ds_numel {numel} elements")
        size, rank, world = partition.numel(), rank_of(group), world_of(group)
        if not 0 <= rank < world:
            raise ValueError(f"parameter '{name}': rank {rank} is outside its process group of {world}")
        if size * world < numel:
            raise ValueError(f"parameter '{name}': {world} partitions of {size} elements cannot hold its {numel}")
        begin = rank * size
        end = min(begin + size, numel)
        if end > begin:
            out.add_stretch(ckpt, partition.narrow(0, 0, end - begin), ckpt, shape, begin, end)
    return out.result()


def namespaced(buffers: Mapping[str, Any], layouts: List[layout_pb2.TensorLayout], prefix: str) -> Described:
    """`buffers` and `layouts` with every buffer name prefixed by ``prefix + "/"``: buffer
    names are unique among all clients of an agent."""
    renamed = {f"{prefix}/{name}": buffer for name, buffer in buffers.items()}
    for layout in layouts:
        for placement in (list(layout.placements) + list(layout.flat_placements) + list(layout.fills) +
                          list(layout.block_scales)):
            placement.buffer = f"{prefix}/{placement.buffer}"
    return renamed, layouts


def _zero12_groups(optimizer: Any) -> List[Tuple[List[torch.nn.Parameter], torch.Tensor, torch.Tensor]]:
    """(parameters, bit16 flat, this rank's fp32 partition) per parameter group, from
    either optimizer DeepSpeed's ZeRO-1/2 runs: ``DeepSpeedZeroOptimizer``
    (stage_1_and_2.py) or ``BF16_Optimizer`` (ZeRO-1 with bf16 weights and fp32 gradient
    accumulation). Another object is refused by name."""
    if hasattr(optimizer, "single_partition_of_fp32_groups"):
        return list(zip(optimizer.round_robin_bit16_groups, optimizer.bit16_groups_flat,
                        optimizer.single_partition_of_fp32_groups))
    if hasattr(optimizer, "fp32_groups_flat_partition"):
        return list(zip(optimizer.bf16_groups, optimizer.bf16_groups_flat, optimizer.fp32_groups_flat_partition))
    raise ValueError(f"optimizer {type(optimizer).__name__} holds no ZeRO-1/2 fp32 partitions (neither "
                     "single_partition_of_fp32_groups nor fp32_groups_flat_partition)")


def zero12_master_sources(optimizer: Any, module: torch.nn.Module, rename: Rename = None,
                          rank_of: Optional[Callable[[Any], int]] = None) -> Described:
    """DeepSpeed ZeRO-1/2's fp32 master partitions (synced into bf16 targets, the sender
    converting). Parameter group g's trainable parameters are views of one bit16 flat,
    each where its memory says (its address minus the flat's); this rank holds flat
    elements [r*P, (r+1)*P) as fp32, P the partition's length, r this rank's index in
    ``real_dp_process_group[g]`` (``rank_of``, as for zero3_sources). Parameters in no
    group (frozen ones: DeepSpeed keeps no master of them) come whole from their own
    memory, as module_sources reads them. Masters on another device than the weights
    (``offload_optimizer``) are refused before any memory is shared."""
    groups = _zero12_groups(optimizer)
    for g, (_, flat, partition) in enumerate(groups):
        if partition.device != flat.device:
            raise ValueError(f"parameter group {g}: the fp32 masters are on {partition.device} and the bit16 weights "
                             f"on {flat.device} (DeepSpeed's offload_optimizer keeps the masters in host memory); "
                             "an agent reads one device's memory: register the bit16 weights (module_sources)")
    if rank_of is None:
        import torch.distributed as dist
        rank_of = lambda group: dist.get_rank(group=group)  # noqa: E731
    names = {id(param): name for name, param in module.named_parameters()}
    out = Layouts()
    mastered = set()
    for g, (params, flat, partition) in enumerate(groups):
        # Group g is partitioned over its own group (MoE expert groups differ from the DP group).
        rank = rank_of(optimizer.real_dp_process_group[g])
        size = partition.numel()
        first = rank * size
        if rank < 0 or first + size > flat.numel():
            raise ValueError(f"parameter group {g}: rank {rank} holds no partition of {size} elements of its "
                             f"{flat.numel()}-element flat")
        for param in params:
            if id(param) not in names:
                raise ValueError(f"parameter group {g} holds a parameter that is not in the module")
            name = names[id(param)]
            mastered.add(id(param))
            if param.numel() == 0:
                continue
            offset = _offset_in(param.data, flat, name)
            lo, hi = max(offset, first), min(offset + param.numel(), first + size)
            if lo < hi:
                ckpt = checkpoint_name(name, rename)
                out.add_stretch(f"fp32-group-{g}", partition, ckpt, param.shape, lo - offset, hi - offset,
                                base=lo - first)
    for name, param in module.named_parameters():
        if id(param) not in mastered:
            ckpt = checkpoint_name(name, rename)
            out.add_stretch(ckpt, param.data, ckpt, param.shape, 0, param.numel())
    return out.result()


def _offset_in(view: torch.Tensor, flat: torch.Tensor, name: str) -> int:
    """The element of `flat` where contiguous `view` (parameter `name`) starts; a
    parameter that is not a view of the flat is refused by name."""
    size = flat.element_size()
    start = view.data_ptr() - flat.data_ptr()
    if (view.dtype != flat.dtype or not view.is_contiguous() or start < 0 or start % size or
            start // size + view.numel() > flat.numel()):
        raise ValueError(f"parameter '{name}' is not a view of its group's bit16 flat")
    return start // size


class Registered:
    """One client's registration with its agent, remade from `describe()` (returning
    (buffers, layouts)) by ``reregister()`` after its memory moved: the layout is the
    same, so the coordinator keeps its plan. Buffer names get the client id as prefix."""

    def __init__(self, agent: AgentClient, client_id: str, role: str, describe: Callable[[], Described],
                 ready_event: Optional[bytes] = None) -> None:
        self._agent, self._client_id, self._role = agent, client_id, role
        self._describe, self._ready_event = describe, ready_event
        self.registration: Optional[Registration] = None
        self.reregister()

    def reregister(self) -> None:
        if self.registration is not None:
            self.registration.close()
        buffers, layouts = namespaced(*self._describe(), self._client_id)
        self.registration = self._agent.register(self._client_id, self._role, buffers, layouts,
                                                 ready_event=self._ready_event)

    def close(self) -> None:
        if self.registration is not None:
            self.registration.close()
            self.registration = None


class TrainerSource(Registered):
    """A trainer's shards registered with its agent as sources, from construction until
    ``close()``: `describe()` is e.g. ``lambda: fsdp2_sources(model)``; ``reregister()``
    after the trainer's memory moved
    (offload and reload, ``load_state_dict(assign=True)``). `ready_event`: as
    ``AgentClient.register``'s."""

    def __init__(self, agent: AgentClient, client_id: str, describe: Callable[[], Described],
                 ready_event: Optional[bytes] = None) -> None:
        super().__init__(agent, client_id, "source", describe, ready_event)
