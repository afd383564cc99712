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
  rank's fp32 master partition of the flat, [r*P, (r+1)*P) with P = len / W
  (``single_partition_of_fp32_groups``).
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


class Zero12Optimizer:
    """What ZeRO-1/2's optimizer holds for one DP rank and one parameter group: the bf16
    flat (every parameter a view of it), the order the flat follows, and this rank's fp32
    master partition, filled from `values` (fp32 masters; the bf16 copy is their
    conversion)."""

    def __init__(self, module, dp_rank, dp_world, values, round_robin=False):
        self.dp_process_group = DpGroup(dp_rank, dp_world)
        self.real_dp_process_group = [self.dp_process_group]  # the group each parameter group is partitioned over
        params = list(module.parameters())
        names = {id(p): n for n, p in module.named_parameters()}
        if round_robin:
            lists = [params[j::dp_world] for j in range(dp_world)]
            params = [p for part in lists for p in part]
        self.bit16_groups = [list(module.parameters())]
        self.round_robin_bit16_groups = [params]
        numel = sum(p.numel() for p in params)
        padded = math.ceil(numel / (2 * dp_world)) * (2 * dp_world)
        flat = torch.zeros(padded, dtype=params[0].dtype)
        master = torch.zeros(padded, dtype=torch.float32)
        at = 0
        for param in params:
            value = values[names[id(param)]].to(torch.float32).reshape(-1)
            master.narrow(0, at, param.numel()).copy_(value)
            view = flat.narrow(0, at, param.numel()).view(param.shape)
            view.copy_(value.view(param.shape))
            param.data = view
            at += param.numel()
        self.bit16_groups_flat = [flat]
        self.partition_size = [padded // dp_world]
        self.single_partition_of_fp32_groups = [master.narrow(0, dp_rank * self.partition_size[0],
                                                              self.partition_size[0]).clone()]
