"""Stand-in for DeepSpeed ZeRO partitioning (deepspeed/runtime/zero/partition_parameters.py
and stage3.py for ZeRO-3, stage_1_and_2.py for ZeRO-1/2; DeepSpeed cannot be installed
here). It gives a module's parameters the attributes and memory DeepSpeed gives them, for
one DP rank, without DeepSpeed's engine:

- ZeRO-3: each parameter gets ``ds_shape``, ``ds_numel``, ``ds_process_group`` and
  ``ds_tensor``: partition size P = ceil(numel / W) (numel padded to a multiple of W),
  rank r holding flat [r*P, min((r+1)*P, numel)) of the row-major parameter, the rest
  of the partition padding (left uninitialized, as DeepSpeed's torch.empty leaves it).
  The partitions of all parameters are views of one flat buffer, back to back (stage3's
  defragmented ``lp_param_buffer``), and ``param.data`` is an empty tensor.
- ZeRO-1/2: every parameter becomes a view of one flat holding all of them, padded at
  its end to a multiple of 2 * W (``bit16_groups_flat``); every rank holds it whole. With
  round_robin_gradients the parameters are reordered first (``_round_robin_reorder``:
  parameter i goes to list i % W, the lists joined in order). The optimizer keeps this
  rank's fp32 master partition of the flat, [r*P, (r+1)*P) with P = len / W, a float
  (``single_partition_of_fp32_groups``). Frozen parameters are in no group and keep their
  own memory. ``BF16_Optimizer`` (ZeRO-1, bf16 with fp32 gradient accumulation) holds
  the same flat and partition under other names, in parameter order.
"""

import math

import torch


class DpGroup:
    """What the stand-in keeps as ``ds_process_group``: this rank and the DP world."""

    def __init__(self, rank, world):
        self.rank, self.world = rank, world


def partition_zero3(module, dp_rank, dp_world, values):
    """Partitions `module`'s parameters for DP rank `dp_rank` of `dp_world`, filling each
    partition from `values` ({parameter name: full tensor}). Returns the flat buffer."""
    group = DpGroup(dp_rank, dp_world)
    params = list(module.named_parameters())
    sizes = [math.ceil(p.numel() / dp_world) for _, p in params]
    dtype = params[0][1].dtype
    flat = torch.empty(sum(sizes), dtype=dtype)
    at = 0
    for (name, param), size in zip(params, sizes):
        param.ds_shape = tuple(param.shape)
        param.ds_numel = param.numel()
        param.ds_process_group = group
        param.ds_tensor = flat.narrow(0, at, size)
        begin = dp_rank * size
        end = min(begin + size, param.ds_numel)
        if end > begin:
            param.ds_tensor.narrow(0, 0, end - begin).copy_(values[name].reshape(-1)[begin:end])
        param.data = torch.empty(0, dtype=dtype)
        at += size
    return flat


def refill_zero3(module, values):
    """New values into every partition, in place (an optimizer step)."""
    for name, param in module.named_parameters():
        size = param.ds_tensor.numel()
        begin = param.ds_process_group.rank * size
        end = min(begin + size, param.ds_numel)
        if end > begin:
            param.ds_tensor.narrow(0, 0, end - begin).copy_(values[name].reshape(-1)[begin:end])


def _aligned_flat(params, alignment, dtype):
    """A zeroed flat for `params` back to back, padded at its end to a multiple of
    `alignment` (``flatten_dense_tensors_aligned``)."""
    numel = sum(p.numel() for p in params)
    return torch.zeros(math.ceil(numel / alignment) * alignment, dtype=dtype)


def _fill(module, params, flat, values):
    """`params` become views of `flat` back to back, filled from `values` (fp32 masters,
    converted); returns the fp32 flat of those masters, padded as `flat`."""
    names = {id(p): n for n, p in module.named_parameters()}
    master = torch.zeros(flat.numel(), dtype=torch.float32)
    at = 0
    for param in params:
        value = values[names[id(param)]].to(torch.float32).reshape(-1)
        master.narrow(0, at, param.numel()).copy_(value)
        view = flat.narrow(0, at, param.numel()).view(param.shape)
        view.copy_(value.view(param.shape))
        param.data = view
        at += param.numel()
    return master


def _fill_frozen(module, values):
    """Parameters that do not require grad keep their own memory (DeepSpeed keeps no flat
    nor master of them), filled from `values`."""
    for name, param in module.named_parameters():
        if not param.requires_grad:
            param.data.copy_(values[name].to(param.dtype))


def _groups(module, param_groups):
    """The optimizer's parameter groups: lists of parameter names (default: one group of
    all), as lists of the trainable parameters in order."""
    params = dict(module.named_parameters())
    names = param_groups or [list(params)]
    return [[params[n] for n in group if params[n].requires_grad] for group in names]


class Zero12Optimizer:
    """What ZeRO-1/2's ``DeepSpeedZeroOptimizer`` (stage_1_and_2.py) holds for one DP
    rank, as DeepSpeed v0.14.5 holds it: per parameter group the trainable parameters in
    order (``bit16_groups``) and in flat order (``round_robin_bit16_groups``, reordered
    with round_robin_gradients), the bf16 flat every trainable parameter is a view of,
    padded to a multiple of 2 * W, ``partition_size`` a float (``len(flat) / W``), and
    this rank's fp32 master partition; frozen parameters are in no group. Masters are
    filled from `values` (fp32), the bf16 copy is their conversion. `param_groups`: lists
    of parameter names (default one group of all)."""

    def __init__(self, module, dp_rank, dp_world, values, round_robin=False, param_groups=None):
        self.dp_process_group = DpGroup(dp_rank, dp_world)
        groups = _groups(module, param_groups)
        self.real_dp_process_group = [self.dp_process_group] * len(groups)
        self.bit16_groups, self.round_robin_bit16_groups, self.bit16_groups_flat = [], [], []
        self.partition_size, self.single_partition_of_fp32_groups = [], []
        for params in groups:
            ordered = params
            if round_robin:
                ordered = [p for j in range(dp_world) for p in params[j::dp_world]]
            flat = _aligned_flat(ordered, 2 * dp_world, ordered[0].dtype)
            master = _fill(module, ordered, flat, values)
            size = len(flat) / dp_world
            self.bit16_groups.append(params)
            self.round_robin_bit16_groups.append(ordered)
            self.bit16_groups_flat.append(flat)
            self.partition_size.append(size)
            self.single_partition_of_fp32_groups.append(master.narrow(0, dp_rank * int(size), int(size)).clone())
        _fill_frozen(module, values)


class Bf16Optimizer:
    """What DeepSpeed v0.14.5's ``BF16_Optimizer`` (bf16_optimizer.py; ZeRO-1 with bf16
    and ``grad_accum_dtype`` fp32) holds for one DP rank: per group the trainable
    parameters in order (``bf16_groups``, no round robin), their flat padded to a multiple
    of 2 * W (``bf16_groups_flat``) and this rank's fp32 partition of it
    (``fp32_groups_flat_partition``); no ``partition_size``. Filled as Zero12Optimizer."""

    def __init__(self, module, dp_rank, dp_world, values, param_groups=None):
        groups = _groups(module, param_groups)
        self.real_dp_process_group = [DpGroup(dp_rank, dp_world)] * len(groups)
        self.bf16_groups, self.bf16_groups_flat, self.fp32_groups_flat_partition = [], [], []
        for params in groups:
            flat = _aligned_flat(params, 2 * dp_world, params[0].dtype)
            master = _fill(module, params, flat, values)
            size = flat.numel() // dp_world
            self.bf16_groups.append(params)
            self.bf16_groups_flat.append(flat)
            self.fp32_groups_flat_partition.append(master.narrow(0, dp_rank * size, size).clone())
        _fill_frozen(module, values)
