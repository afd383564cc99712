"""Stand-in for vLLM's Qwen3 / Qwen3-MoE weight loading (follows vllm/model_executor/models/qwen2.py, qwen3.py, qwen3_moe.py, layers/linear.py, parameter.py, layers/vocab_parallel_embedding.py, layers/fused_moe/layer.py and model_loader/weight_utils.py).

vLLM cannot be installed here, so this module rebuilds, with torch alone, the parts of
vLLM that decide where each checkpoint element lands on a tensor-parallel rank:

* the parameters vLLM creates for Qwen3 (dense) and Qwen3-MoE (every layer sparse), with
  vLLM's names, shapes and attributes (``output_dim``/``input_dim``, ``tp_rank``/``tp_size``,
  ``num_kv_head_replicas``, ``output_sizes``, ``shard_indices``, ``expert_map``), created
  with ``torch.empty`` like vLLM's (RMSNorm weights start as ones, as vLLM's do);
* the weight loaders, with vLLM's narrow()/copy_()/fill_() steps in vLLM's order and vLLM's
  shape assertions: ``QKVParallelLinear`` / ``MergedColumnParallelLinear`` /
  ``RowParallelLinear`` through ``weight_loader_v2`` and the ``ModelWeightParameter`` methods
  (current vLLM: ``UnquantizedLinearMethod`` is in ``WEIGHT_LOADER_V2_SUPPORTED``; the older
  v1 ``weight_loader`` does the same arithmetic), ``ReplicatedLinear.weight_loader``,
  ``VocabParallelEmbedding``/``ParallelLMHead.weight_loader`` (vocabulary padded to a
  multiple of 64, pad rows zero-filled on every load), ``FusedMoE.weight_loader``
  (``_load_w13``/``_load_w2`` behind ``expert_map``) and ``default_weight_loader``;
* the models' ``load_weights`` (``stacked_params_mapping``, ``make_expert_params_mapping``,
  the ``AutoWeightsLoader`` routing with ``lm_head.`` skipped when embeddings are tied), which
  look parameters up in ``dict(self.named_parameters())`` at call time and call
  ``param.weight_loader(param, loaded_weight, ...)``, so replacing a parameter's ``.data``
  beforehand redirects every write.

Block-quantized float8 checkpoints (``Qwen3Config.weight_block_size``, vLLM's ``Fp8Config``
with ``weight_block_size``: ``quantization/fp8.py``, ``quantization/utils/fp8_utils.py``)
for the dense model's linear layers: a float8_e4m3fn ``weight`` and a float32
``weight_scale_inv`` per layer, the scales' loaders in block units
(``adjust_block_scale_shard``), and ``process_weights_after_loading`` as vLLM's CUTLASS and
Triton block kernels leave the layer: plain Parameters over the same memory, keeping
``weight_loader`` (``model_executor/utils.py`` ``replace_parameter``), so vLLM's loaders no
longer run on them. As vLLM's ``initialize_model`` does, the constructor records every
layer's parameters as created (``model_loader/reload``: ``record_metadata_for_reloading``,
meta tensors of the same class and attributes, loaders unbound from their layer);
``install_as_vllm()`` publishes that record, and DeepGEMM's switch, under vLLM's module
names for code that imports them.

Tensor-parallel rank and size are given to the constructor instead of being read from
vLLM's process groups. Data parallelism, pipeline parallelism, other quantizations,
float8 experts, LoRA-added vocabulary and EPLB/redundant experts are left out.
"""

from __future__ import annotations

import itertools
import sys
import types
import weakref
from dataclasses import dataclass
from types import MethodType
from typing import Dict, Iterable, List, Optional, Set, Tuple

import torch
from torch import nn
from torch.nn import Parameter

__all__ = [
    "Qwen3Config",
    "Qwen3ForCausalLM",
    "checkpoint_shapes",
    "pad_vocab_size",
    "DEFAULT_VOCAB_PADDING_SIZE",
    "install_as_vllm",
    "process_weights_after_loading",
]


# ----------------------------------------------------------------------------------------
# Configuration and checkpoint layout
# ----------------------------------------------------------------------------------------

@dataclass
class Qwen3Config:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    num_experts: int = 0            # 0: dense (Qwen3); > 0: Qwen3-MoE (every layer sparse)
    moe_intermediate_size: int = 0
    # A float8 checkpoint's quantization_config.weight_block_size ([128, 128]); None: bf16.
    weight_block_size: Optional[Tuple[int, int]] = None


def checkpoint_shapes(config: Qwen3Config) -> Dict[str, Tuple[int, ...]]:
    """Every Hugging Face checkpoint tensor of `config` with its shape, in a fixed order:
    the embedding, then per layer attention (q, k, v, o, q_norm, k_norm), the MLP (dense
    gate/up/down, or the router and each expert's gate/up/down) and the two layer norms,
    then the final norm and, unless the embeddings are tied, lm_head."""
    c = config
    H, hd = c.hidden_size, c.head_dim
    shapes: Dict[str, Tuple[int, ...]] = {"model.embed_tokens.weight": (c.vocab_size, H)}
    for i in range(c.num_hidden_layers):
        p = f"model.layers.{i}."
        shapes[p + "self_attn.q_proj.weight"] = (c.num_attention_heads * hd, H)
        shapes[p + "self_attn.k_proj.weight"] = (c.num_key_value_heads * hd, H)
        shapes[p + "self_attn.v_proj.weight"] = (c.num_key_value_heads * hd, H)
        shapes[p + "self_attn.o_proj.weight"] = (H, c.num_attention_heads * hd)
        shapes[p + "self_attn.q_norm.weight"] = (hd,)
        shapes[p + "self_attn.k_norm.weight"] = (hd,)
        if c.num_experts > 0:
            I = c.moe_intermediate_size
            shapes[p + "mlp.gate.weight"] = (c.num_experts, H)
            for e in range(c.num_experts):
                shapes[p + f"mlp.experts.{e}.gate_proj.weight"] = (I, H)
                shapes[p + f"mlp.experts.{e}.up_proj.weight"] = (I, H)
                shapes[p + f"mlp.experts.{e}.down_proj.weight"] = (H, I)
        else:
            I = c.intermediate_size
            shapes[p + "mlp.gate_proj.weight"] = (I, H)
            shapes[p + "mlp.up_proj.weight"] = (I, H)
            shapes[p + "mlp.down_proj.weight"] = (H, I)
        shapes[p + "input_layernorm.weight"] = (H,)
        shapes[p + "post_attention_layernorm.weight"] = (H,)
    shapes["model.norm.weight"] = (H,)
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, H)
    if c.weight_block_size is None:
        return shapes
    # A float8 checkpoint: each linear layer's weight_scale_inv, one float32 per block.
    block_n, block_k = c.weight_block_size
    quantized = {}
    for name, shape in shapes.items():
        quantized[name] = shape
        if _is_linear_weight(name):
            quantized[name[:-len("weight")] + "weight_scale_inv"] = (-(-shape[0] // block_n), -(-shape[1] // block_k))
    return quantized


def _is_linear_weight(name: str) -> bool:
    return name.endswith("_proj.weight") and ".mlp.experts." not in name


# ----------------------------------------------------------------------------------------
# Small helpers (vllm.distributed.utils.divide, vllm.model_executor.utils.set_weight_attrs,
# model_loader.weight_utils.default_weight_loader)
# ----------------------------------------------------------------------------------------

def divide(numerator: int, denominator: int) -> int:
    """vLLM's `divide`: exact division, asserting divisibility."""
    assert numerator % denominator == 0, f"{numerator} is not divisible by {denominator}"
    return numerator // denominator


def set_weight_attrs(weight: torch.Tensor, weight_attrs: Optional[dict]) -> None:
    """Sets attributes on a tensor, refusing to overwrite one (as vLLM's does)."""
    if weight_attrs is None:
        return
    for key, value in weight_attrs.items():
        assert not hasattr(weight, key), f"Overwriting existing tensor attribute: {key}"
        setattr(weight, key, value)


def default_weight_loader(param: torch.Tensor, loaded_weight: torch.Tensor) -> None:
    """Whole-tensor copy after a shape check; a one-element pair is filled instead."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.fill_(loaded_weight.item())
    else:
        assert param.size() == loaded_weight.size(), (
            f"Attempted to load weight ({loaded_weight.size()}) "
            f"into parameter ({param.size()})")
        param.data.copy_(loaded_weight)


# ----------------------------------------------------------------------------------------
# vllm/model_executor/parameter.py: the parameter classes used by unquantized linear layers
# ----------------------------------------------------------------------------------------

class BasevLLMParameter(Parameter):
    """A Parameter that carries its layer's loader and the tensor-parallel rank/size."""

    def __new__(cls, data: torch.Tensor, **kwargs):
        return super().__new__(cls, data=data, requires_grad=False)

    def __init__(self, data: torch.Tensor, weight_loader, tp_rank: int = 0, tp_size: int = 1):
        self._weight_loader = weight_loader
        self.tp_rank = tp_rank
        self.tp_size = tp_size

    @property
    def weight_loader(self):
        if self._weight_loader is None:
            raise AttributeError(f"{type(self).__name__} weight_loader attribute has been deleted")
        return self._weight_loader

    @weight_loader.setter
    def weight_loader(self, value):
        self._weight_loader = value

    @weight_loader.deleter
    def weight_loader(self):
        self._weight_loader = None

    def _assert_and_load(self, loaded_weight: torch.Tensor) -> None:
        scalar_into_one = (self.data.ndim == 1 and self.data.numel() == 1
                           and loaded_weight.ndim == 0 and loaded_weight.numel() == 1)
        assert self.data.shape == loaded_weight.shape or scalar_into_one
        self.data.copy_(loaded_weight)

    def load_column_parallel_weight(self, loaded_weight: torch.Tensor) -> None:
        self._assert_and_load(loaded_weight)

    def load_row_parallel_weight(self, loaded_weight: torch.Tensor) -> None:
        self._assert_and_load(loaded_weight)

    def load_merged_column_weight(self, loaded_weight: torch.Tensor, **kwargs) -> None:
        self._assert_and_load(loaded_weight)

    def load_qkv_weight(self, loaded_weight: torch.Tensor, **kwargs) -> None:
        self._assert_and_load(loaded_weight)


class _ColumnvLLMParameter(BasevLLMParameter):
    """Column-parallel loading along `output_dim`."""

    def __init__(self, output_dim: int, **kwargs):
        self._output_dim = output_dim
        super().__init__(**kwargs)

    @property
    def output_dim(self) -> int:
        return self._output_dim

    def load_column_parallel_weight(self, loaded_weight: torch.Tensor) -> None:
        # This rank's block of rows, as large as the parameter's own output dimension.
        rows = self.data.shape[self.output_dim]
        loaded_weight = loaded_weight.narrow(self.output_dim, self.tp_rank * rows, rows)
        assert self.data.shape == loaded_weight.shape
        self.data.copy_(loaded_weight)

    def load_merged_column_weight(self, loaded_weight: torch.Tensor, **kwargs) -> None:
        shard_offset: int = kwargs["shard_offset"]
        shard_size: int = kwargs["shard_size"]
        # Destination: the logical matrix's slot in the fused parameter; source: this
        # rank's block of that matrix.
        param_data = self.data
        param_data = param_data.narrow(self.output_dim, shard_offset, shard_size)
        loaded_weight = loaded_weight.narrow(self.output_dim, self.tp_rank * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)

    def load_qkv_weight(self, loaded_weight: torch.Tensor, **kwargs) -> None:
        shard_offset: int = kwargs["shard_offset"]
        shard_size: int = kwargs["shard_size"]
        shard_id: str = kwargs["shard_id"]
        num_heads: int = kwargs["num_heads"]  # the layer passes num_kv_head_replicas here
        param_data = self.data
        # q is split over all ranks; k/v blocks are shared by `num_heads` consecutive ranks.
        block = self.tp_rank if shard_id == "q" else self.tp_rank // num_heads
        param_data = param_data.narrow(self.output_dim, shard_offset, shard_size)
        loaded_weight = loaded_weight.narrow(self.output_dim, block * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class RowvLLMParameter(BasevLLMParameter):
    """Row-parallel loading along `input_dim`."""

    def __init__(self, input_dim: int, **kwargs):
        self._input_dim = input_dim
        super().__init__(**kwargs)

    @property
    def input_dim(self) -> int:
        return self._input_dim

    def load_row_parallel_weight(self, loaded_weight: torch.Tensor) -> None:
        cols = self.data.shape[self.input_dim]
        loaded_weight = loaded_weight.narrow(self.input_dim, self.tp_rank * cols, cols)
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert self.data.shape == loaded_weight.shape
        self.data.copy_(loaded_weight)


class ModelWeightParameter(_ColumnvLLMParameter, RowvLLMParameter):
    """The weight of an unquantized linear layer: column- and row-parallel loading."""


class BlockQuantScaleParameter(_ColumnvLLMParameter, RowvLLMParameter):
    """The float32 scales of a block-quantized weight, one per block_n x block_k block;
    the layer's loaders give their offsets and sizes in blocks."""


# ----------------------------------------------------------------------------------------
# vllm/model_executor/utils.py replace_parameter; quantization/utils/fp8_utils.py;
# quantization/fp8.py Fp8LinearMethod with weight_block_size (a float8 checkpoint)
# ----------------------------------------------------------------------------------------

def replace_parameter(layer: nn.Module, param_name: str, new_data: torch.Tensor) -> None:
    """A plain Parameter over `new_data` in place of the layer's, keeping its loader."""
    old = getattr(layer, param_name, None)
    new_param = Parameter(new_data, requires_grad=False)
    if old is not None and hasattr(old, "weight_loader"):
        set_weight_attrs(new_param, {"weight_loader": old.weight_loader})
    setattr(layer, param_name, new_param)


def adjust_block_scale_shard(weight_block_size, shard_size: int, shard_offset: int) -> Tuple[int, int]:
    """A weight shard's size and offset in rows, as the scales' in blocks (rounded up)."""
    assert weight_block_size is not None
    block_n = weight_block_size[0]
    shard_offset = (shard_offset + block_n - 1) // block_n
    shard_size = (shard_size + block_n - 1) // block_n
    return shard_size, shard_offset


def validate_fp8_block_shape(layer: nn.Module, input_size: int, output_size: int, input_size_per_partition: int,
                             output_partition_sizes: List[int], block_size) -> None:
    """vLLM's refusal of shards that would cut a quantization block (vLLM lets a layer
    with allow_fp8_block_shape_mismatch skip it; no stand-in layer sets that)."""
    tp_size = layer.tp_size
    block_n, block_k = block_size[0], block_size[1]
    if tp_size > 1 and input_size // input_size_per_partition == tp_size and input_size_per_partition % block_k != 0:
        raise ValueError(f"Weight input_size_per_partition = {input_size_per_partition} "
                         f"is not divisible by weight quantization block_k = {block_k}.")
    is_tp_split = tp_size > 1 and output_size // sum(output_partition_sizes) == tp_size
    is_merged_gemm = len(output_partition_sizes) > 1
    if is_tp_split or is_merged_gemm:
        sizes_to_check = output_partition_sizes if is_tp_split else output_partition_sizes[:-1]
        for output_partition_size in sizes_to_check:
            if output_partition_size % block_n != 0:
                raise ValueError(f"Weight output_partition_size = {output_partition_size} "
                                 f"is not divisible by weight quantization block_n = {block_n}.")


class Fp8BlockLinearMethod:
    """Fp8LinearMethod for a checkpoint serialized in float8 with weight_block_size
    (dynamic activation scales): a float8_e4m3fn weight and its float32 weight_scale_inv."""

    def __init__(self, weight_block_size):
        if not hasattr(torch, "float8_e4m3fn"):
            raise RuntimeError(f"torch {torch.__version__} has no float8_e4m3fn: float8 layers need torch >= 2.1")
        self.weight_block_size = list(weight_block_size)

    def create_weights(self, layer: nn.Module, input_size_per_partition: int, output_partition_sizes: List[int],
                       input_size: int, output_size: int, params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        output_size_per_partition = sum(output_partition_sizes)
        weight_loader = extra_weight_attrs.get("weight_loader")
        layer.weight_block_size = self.weight_block_size
        validate_fp8_block_shape(layer, input_size, output_size, input_size_per_partition, output_partition_sizes,
                                 self.weight_block_size)
        block_n, block_k = self.weight_block_size
        weight = ModelWeightParameter(
            data=torch.empty(output_size_per_partition, input_size_per_partition, dtype=torch.float8_e4m3fn,
                             device=layer.device),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        layer.register_parameter("weight", weight)
        scale = BlockQuantScaleParameter(
            data=torch.empty((output_size_per_partition + block_n - 1) // block_n,
                             (input_size_per_partition + block_k - 1) // block_k, dtype=torch.float32,
                             device=layer.device),
            input_dim=1, output_dim=0, weight_loader=weight_loader)
        scale[:] = torch.finfo(torch.float32).min
        set_weight_attrs(scale, {"scale_type": "weight_scale"})
        # The weight_scale_inv name is DeepSeek-V3's.
        layer.register_parameter("weight_scale_inv", scale)
        layer.register_parameter("input_scale", None)

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        # The CUTLASS and Triton block kernels on NVIDIA keep the loaded memory as it is.
        replace_parameter(layer, "weight", layer.weight.data)
        replace_parameter(layer, "weight_scale_inv", layer.weight_scale_inv.data)


def process_weights_after_loading(model: nn.Module) -> None:
    """model_loader/utils.py: each layer's quantization method finishes its weights."""
    for module in model.modules():
        method = getattr(module, "quant_method", None)
        if method is not None and hasattr(method, "process_weights_after_loading"):
            method.process_weights_after_loading(module)


# ----------------------------------------------------------------------------------------
# vllm/model_executor/model_loader/reload (layerwise.py, meta.py, sanitize.py): the record
# of every layer's parameters as created, kept for reloading
# ----------------------------------------------------------------------------------------

class LayerReloadingInfo:
    def __init__(self):
        self.restore_metadata = ({}, {})  # (parameters, buffers) as meta tensors


LAYERWISE_INFO: "weakref.WeakKeyDictionary[nn.Module, LayerReloadingInfo]" = weakref.WeakKeyDictionary()
_layer_ref_sentinel = object()


def _sanitize_layer_refs(tensor: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """The tensor's bound methods of `layer` rebound to a sentinel (no cycle to the layer)."""
    for key, value in tensor.__dict__.items():
        if isinstance(value, MethodType) and value.__self__ is layer:
            tensor.__dict__[key] = value.__func__.__get__(_layer_ref_sentinel)
    return tensor


def restore_layer_refs(tensor: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    """The sentinel's bound methods rebound to `layer`."""
    for key, value in tensor.__dict__.items():
        if isinstance(value, MethodType) and value.__self__ is _layer_ref_sentinel:
            tensor.__dict__[key] = value.__func__.__get__(layer)
    return tensor


def _to_meta_tensor(tensor: torch.Tensor) -> torch.Tensor:
    meta_tensor = tensor.data.to("meta")
    meta_tensor.__class__ = tensor.__class__
    meta_tensor.__dict__ = tensor.__dict__.copy()
    return meta_tensor


def record_metadata_for_reloading(model: nn.Module) -> None:
    for layer in model.modules():
        info = LAYERWISE_INFO.setdefault(layer, LayerReloadingInfo())
        params = {name: _sanitize_layer_refs(_to_meta_tensor(p), layer)
                  for name, p in layer._parameters.items() if p is not None}
        buffers = {name: _sanitize_layer_refs(_to_meta_tensor(b), layer)
                   for name, b in layer._buffers.items() if b is not None}
        info.restore_metadata = (params, buffers)


# vllm/utils/deep_gemm.py's switch: DeepGEMM's power-of-two scales (the stand-in never
# uses DeepGEMM; a test may turn this on to see an adapter refuse it).
DEEP_GEMM_E8M0 = {"used": False}


def install_as_vllm() -> None:
    """Publishes this stand-in's reload record and DeepGEMM switch under vLLM's module
    names (sys.modules), for code that imports them from vLLM."""
    names = {
        "vllm.model_executor.model_loader.reload.layerwise": {"LAYERWISE_INFO": LAYERWISE_INFO},
        "vllm.model_executor.model_loader.reload.sanitize": {"restore_layer_refs": restore_layer_refs},
        "vllm.utils.deep_gemm": {"is_deep_gemm_e8m0_used": lambda: DEEP_GEMM_E8M0["used"]},
    }
    for full, attributes in names.items():
        parts = full.split(".")
        for i in range(1, len(parts) + 1):
            sys.modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
        for key, value in attributes.items():
            setattr(sys.modules[full], key, value)


# ----------------------------------------------------------------------------------------
# vllm/model_executor/layers/linear.py
# ----------------------------------------------------------------------------------------

class UnquantizedLinearMethod:
    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: List[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        weight_loader = extra_weight_attrs.pop("weight_loader")
        weight = ModelWeightParameter(
            data=torch.empty(sum(output_partition_sizes), input_size_per_partition,
                             dtype=params_dtype, device=layer.device),
            input_dim=1,
            output_dim=0,
            weight_loader=weight_loader,
            tp_rank=layer.tp_rank,
            tp_size=layer.tp_size,
        )
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)


class LinearBase(nn.Module):
    def __init__(self, input_size: int, output_size: int, *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, bias: bool = False, quant_config=None):
        super().__init__()
        self.input_size = input_size
        self.output_size = output_size
        self.has_bias = bias
        self.params_dtype = params_dtype
        self.device = torch.device(device)
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.quant_method = UnquantizedLinearMethod()
        if quant_config is not None:  # a Qwen3Config with weight_block_size
            self.quant_method = Fp8BlockLinearMethod(quant_config.weight_block_size)

    def update_param_tp_status(self) -> None:
        for param in self.parameters():
            if isinstance(param, BasevLLMParameter):
                param.tp_rank = self.tp_rank
                param.tp_size = self.tp_size


class ReplicatedLinear(LinearBase):
    """The whole weight on every rank (Qwen3-MoE's router, `mlp.gate`)."""

    def __init__(self, input_size: int, output_size: int, *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, bias: bool = False, quant_config=None):
        self.output_partition_sizes = [output_size]
        super().__init__(input_size, output_size, tp_rank=tp_rank, tp_size=tp_size,
                         params_dtype=params_dtype, device=device, bias=bias, quant_config=quant_config)
        assert not bias, "the stand-in builds Qwen3 layers without bias"
        self.quant_method.create_weights(self, self.input_size, self.output_partition_sizes,
                                         self.input_size, self.output_size, self.params_dtype,
                                         weight_loader=self.weight_loader)
        self.register_parameter("bias", None)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert param.size() == loaded_weight.size(), (
            f"Tried to load weights of size {loaded_weight.size()}"
            f"to a parameter of size {param.size()}")
        param.data.copy_(loaded_weight)


class ColumnParallelLinear(LinearBase):
    """Weight split by output rows over the tensor-parallel ranks."""

    def __init__(self, input_size: int, output_size: int, *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, bias: bool = False, quant_config=None):
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.input_size_per_partition = input_size
        self.output_size_per_partition = divide(output_size, tp_size)
        self.output_partition_sizes = [self.output_size_per_partition]
        if hasattr(self, "output_sizes"):  # QKV / merged: one partition per logical matrix
            self.output_partition_sizes = [divide(size, tp_size) for size in self.output_sizes]
        super().__init__(input_size, output_size, tp_rank=tp_rank, tp_size=tp_size,
                         params_dtype=params_dtype, device=device, bias=bias, quant_config=quant_config)
        assert not bias, "the stand-in builds Qwen3 layers without bias"
        self.quant_method.create_weights(
            layer=self,
            input_size_per_partition=self.input_size_per_partition,
            output_partition_sizes=self.output_partition_sizes,
            input_size=self.input_size,
            output_size=self.output_size,
            params_dtype=self.params_dtype,
            weight_loader=self.weight_loader_v2,
        )
        self.register_parameter("bias", None)
        self.update_param_tp_status()

    def weight_loader_v2(self, param: BasevLLMParameter, loaded_weight: torch.Tensor) -> None:
        if len(loaded_weight.shape) == 0:
            assert loaded_weight.numel() == 1
            loaded_weight = loaded_weight.reshape(1)
        param.load_column_parallel_weight(loaded_weight=loaded_weight)


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel matrices (gate, up) stacked along the output dimension, each
    split over the ranks separately: rank r holds [gate block r; up block r]."""

    def __init__(self, input_size: int, output_sizes: List[int], *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, bias: bool = False, quant_config=None):
        self.output_sizes = list(output_sizes)
        assert all(size % tp_size == 0 for size in self.output_sizes)
        super().__init__(input_size, sum(self.output_sizes), tp_rank=tp_rank, tp_size=tp_size,
                         params_dtype=params_dtype, device=device, bias=bias, quant_config=quant_config)

    def validate_shard_id(self, shard_id) -> None:
        if isinstance(shard_id, int):
            if not 0 <= shard_id < len(self.output_sizes):
                raise ValueError(f"Shard id should be between 0 and {len(self.output_sizes) - 1}. "
                                 f"Got shard id {shard_id}.")
            return
        if shard_id is None:
            return
        if isinstance(shard_id, tuple):
            for idx in shard_id:
                if not 0 <= idx < len(self.output_sizes):
                    raise ValueError(f"Shard id index {idx} out of range. Got shard id {shard_id}.")
            if any(b - a != 1 for a, b in zip(shard_id[:-1], shard_id[1:])):
                raise ValueError(f"Shard id with multiple indices should be consecutive. Got {shard_id}.")
            return
        raise ValueError(f"Unknown shard id {shard_id!r}")

    def _load_fused_module_from_checkpoint(self, param: BasevLLMParameter, loaded_weight: torch.Tensor,
                                           output_sizes: Optional[List[int]] = None) -> None:
        """A checkpoint that already stores the matrices fused: split it and load each."""
        output_sizes = output_sizes or self.output_sizes
        offset = 0
        for shard_id, size in enumerate(output_sizes):
            piece = loaded_weight.narrow(param.output_dim, offset, size)
            self.weight_loader_v2(param, piece, shard_id)
            offset += size

    def weight_loader_v2(self, param: BasevLLMParameter, loaded_weight: torch.Tensor,
                         loaded_shard_id=None) -> None:
        self.validate_shard_id(loaded_shard_id)
        if loaded_shard_id is None or isinstance(loaded_shard_id, tuple):
            output_sizes = ([self.output_sizes[i] for i in loaded_shard_id]
                            if loaded_shard_id else None)
            if isinstance(param, BlockQuantScaleParameter):
                output_sizes = [adjust_block_scale_shard(self.weight_block_size, size, 0)[0]
                                for size in (output_sizes or self.output_sizes)]
            self._load_fused_module_from_checkpoint(param, loaded_weight, output_sizes=output_sizes)
            return
        assert loaded_shard_id < len(self.output_sizes)
        shard_offset = sum(self.output_sizes[:loaded_shard_id])
        shard_size = self.output_sizes[loaded_shard_id]
        shard_offset //= self.tp_size
        shard_size //= self.tp_size
        if isinstance(param, BlockQuantScaleParameter):
            shard_size, shard_offset = adjust_block_scale_shard(self.weight_block_size, shard_size, shard_offset)
        param.load_merged_column_weight(loaded_weight=loaded_weight, shard_id=loaded_shard_id,
                                        shard_offset=shard_offset, shard_size=shard_size)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v stacked along the output dimension, split by heads: rank r holds its q
    heads, then the k heads and v heads of its kv group. With fewer kv heads than ranks,
    each rank holds one kv head, shared by `num_kv_head_replicas` consecutive ranks."""

    def __init__(self, hidden_size: int, head_size: int, total_num_heads: int,
                 total_num_kv_heads: Optional[int], *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, bias: bool = False, quant_config=None):
        self.hidden_size = hidden_size
        self.head_size = head_size
        self.v_head_size = head_size
        self.total_num_heads = total_num_heads
        if total_num_kv_heads is None:
            total_num_kv_heads = total_num_heads
        self.total_num_kv_heads = total_num_kv_heads
        self.num_heads = divide(self.total_num_heads, tp_size)
        if tp_size >= self.total_num_kv_heads:
            self.num_kv_heads = 1
            self.num_kv_head_replicas = divide(tp_size, self.total_num_kv_heads)
        else:
            self.num_kv_heads = divide(self.total_num_kv_heads, tp_size)
            self.num_kv_head_replicas = 1
        # Per-rank sizes times tp_size (replicated kv heads counted once per rank).
        self.output_sizes = [
            self.num_heads * self.head_size * tp_size,
            self.num_kv_heads * self.head_size * tp_size,
            self.num_kv_heads * self.v_head_size * tp_size,
        ]
        super().__init__(hidden_size, sum(self.output_sizes), tp_rank=tp_rank, tp_size=tp_size,
                         params_dtype=params_dtype, device=device, bias=bias, quant_config=quant_config)

    def validate_shard_id(self, shard_id) -> None:
        if shard_id in ("q", "k", "v") or shard_id is None:
            return
        raise ValueError(f"Shard id for QKVParallelLinear should be 'q', 'k', or 'v', got shard id {shard_id}.")

    def _get_shard_offset_mapping(self, loaded_shard_id: str) -> Optional[int]:
        return {
            "q": 0,
            "k": self.num_heads * self.head_size,
            "v": (self.num_heads + self.num_kv_heads) * self.head_size,
            "total": (self.num_heads + self.num_kv_heads) * self.head_size
                     + self.num_kv_heads * self.v_head_size,
        }.get(loaded_shard_id)

    def _get_shard_size_mapping(self, loaded_shard_id: str) -> Optional[int]:
        return {
            "q": self.num_heads * self.head_size,
            "k": self.num_kv_heads * self.head_size,
            "v": self.num_kv_heads * self.v_head_size,
        }.get(loaded_shard_id)

    def _load_fused_module_from_checkpoint(self, param: BasevLLMParameter, loaded_weight: torch.Tensor) -> None:
        """A checkpoint that stores q, k and v fused (full sizes): split it and load each."""
        pieces = [
            ("q", 0, self.total_num_heads * self.head_size),
            ("k", self.total_num_heads * self.head_size, self.total_num_kv_heads * self.head_size),
            ("v", (self.total_num_heads + self.total_num_kv_heads) * self.head_size,
             self.total_num_kv_heads * self.v_head_size),
        ]
        for shard_id, offset, size in pieces:
            if isinstance(param, BlockQuantScaleParameter):
                size, offset = adjust_block_scale_shard(self.weight_block_size, size, offset)
            self.weight_loader_v2(param, loaded_weight.narrow(param.output_dim, offset, size), shard_id)

    def weight_loader_v2(self, param: BasevLLMParameter, loaded_weight: torch.Tensor,
                         loaded_shard_id: Optional[str] = None) -> None:
        self.validate_shard_id(loaded_shard_id)
        if loaded_shard_id is None:
            self._load_fused_module_from_checkpoint(param, loaded_weight)
            return
        assert loaded_shard_id in ["q", "k", "v"]
        shard_offset = self._get_shard_offset_mapping(loaded_shard_id)
        shard_size = self._get_shard_size_mapping(loaded_shard_id)
        assert shard_offset is not None and shard_size is not None
        if isinstance(param, BlockQuantScaleParameter):
            shard_size, shard_offset = adjust_block_scale_shard(self.weight_block_size, shard_size, shard_offset)
        param.load_qkv_weight(loaded_weight=loaded_weight, num_heads=self.num_kv_head_replicas,
                              shard_id=loaded_shard_id, shard_offset=shard_offset, shard_size=shard_size)


class RowParallelLinear(LinearBase):
    """Weight split by input columns over the tensor-parallel ranks."""

    def __init__(self, input_size: int, output_size: int, *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, bias: bool = False, quant_config=None):
        self.tp_rank, self.tp_size = tp_rank, tp_size
        self.input_size_per_partition = divide(input_size, tp_size)
        self.output_size_per_partition = output_size
        self.output_partition_sizes = [output_size]
        super().__init__(input_size, output_size, tp_rank=tp_rank, tp_size=tp_size,
                         params_dtype=params_dtype, device=device, bias=bias, quant_config=quant_config)
        assert not bias, "the stand-in builds Qwen3 layers without bias"
        self.quant_method.create_weights(
            layer=self,
            input_size_per_partition=self.input_size_per_partition,
            output_partition_sizes=self.output_partition_sizes,
            input_size=self.input_size,
            output_size=self.output_size,
            params_dtype=self.params_dtype,
            weight_loader=self.weight_loader_v2,
        )
        self.register_parameter("bias", None)
        self.update_param_tp_status()

    def weight_loader_v2(self, param: BasevLLMParameter, loaded_weight: torch.Tensor) -> None:
        if len(loaded_weight.shape) == 0:
            assert loaded_weight.numel() == 1
            loaded_weight = loaded_weight.reshape(1)
        param.load_row_parallel_weight(loaded_weight=loaded_weight)


# ----------------------------------------------------------------------------------------
# vllm/model_executor/layers/vocab_parallel_embedding.py
# ----------------------------------------------------------------------------------------

DEFAULT_VOCAB_PADDING_SIZE = 64


def pad_vocab_size(vocab_size: int, pad_to: int = DEFAULT_VOCAB_PADDING_SIZE) -> int:
    """Rounds the vocabulary up to a multiple of `pad_to`."""
    return ((vocab_size + pad_to - 1) // pad_to) * pad_to


def vocab_range_from_global_vocab_size(global_vocab_size: int, rank: int, world_size: int,
                                       offset: int = 0) -> Tuple[int, int]:
    per_partition = divide(global_vocab_size, world_size)
    first = rank * per_partition
    return first + offset, first + per_partition + offset


@dataclass
class VocabParallelEmbeddingShardIndices:
    """Padded and real index ranges of one rank's vocabulary shard."""
    padded_org_vocab_start_index: int
    padded_org_vocab_end_index: int
    padded_added_vocab_start_index: int
    padded_added_vocab_end_index: int
    org_vocab_start_index: int
    org_vocab_end_index: int
    added_vocab_start_index: int
    added_vocab_end_index: int

    @property
    def num_org_elements(self) -> int:
        return self.org_vocab_end_index - self.org_vocab_start_index

    @property
    def num_added_elements(self) -> int:
        return self.added_vocab_end_index - self.added_vocab_start_index

    @property
    def num_org_elements_padded(self) -> int:
        return self.padded_org_vocab_end_index - self.padded_org_vocab_start_index

    @property
    def num_added_elements_padded(self) -> int:
        return self.padded_added_vocab_end_index - self.padded_added_vocab_start_index

    @property
    def num_org_vocab_padding(self) -> int:
        return self.num_org_elements_padded - self.num_org_elements

    @property
    def num_added_vocab_padding(self) -> int:
        return self.num_added_elements_padded - self.num_added_elements

    @property
    def num_elements_padded(self) -> int:
        return self.num_org_elements_padded + self.num_added_elements_padded

    def __post_init__(self):
        assert self.padded_org_vocab_start_index <= self.padded_org_vocab_end_index
        assert self.padded_added_vocab_start_index <= self.padded_added_vocab_end_index
        assert self.org_vocab_start_index <= self.org_vocab_end_index
        assert self.added_vocab_start_index <= self.added_vocab_end_index
        assert self.org_vocab_start_index <= self.padded_org_vocab_start_index
        assert self.added_vocab_start_index <= self.padded_added_vocab_start_index
        assert self.org_vocab_end_index <= self.padded_org_vocab_end_index
        assert self.added_vocab_end_index <= self.padded_added_vocab_end_index
        assert self.num_org_elements <= self.num_org_elements_padded
        assert self.num_added_elements <= self.num_added_elements_padded


class UnquantizedEmbeddingMethod:
    def create_weights(self, layer: nn.Module, input_size_per_partition: int,
                       output_partition_sizes: List[int], input_size: int, output_size: int,
                       params_dtype: torch.dtype, **extra_weight_attrs) -> None:
        weight = Parameter(torch.empty(sum(output_partition_sizes), input_size_per_partition,
                                       dtype=params_dtype, device=layer.device),
                           requires_grad=False)
        set_weight_attrs(weight, {"input_dim": 1, "output_dim": 0})
        layer.register_parameter("weight", weight)
        set_weight_attrs(weight, extra_weight_attrs)


class VocabParallelEmbedding(nn.Module):
    """Embedding split by vocabulary rows. The vocabulary is padded to a multiple of 64
    and the padded rows split evenly: rank r holds padded rows [r*P, (r+1)*P); the real
    ones come first, the padding (only past the real vocabulary, so on the last ranks) is
    zero-filled at every load."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, org_num_embeddings: Optional[int] = None,
                 padding_size: int = DEFAULT_VOCAB_PADDING_SIZE):
        super().__init__()
        self.device = torch.device(device)
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.num_embeddings = num_embeddings
        self.padding_size = padding_size
        self.org_vocab_size = org_num_embeddings or num_embeddings
        num_added_embeddings = num_embeddings - self.org_vocab_size
        self.org_vocab_size_padded = pad_vocab_size(self.org_vocab_size, self.padding_size)
        self.num_embeddings_padded = pad_vocab_size(self.org_vocab_size_padded + num_added_embeddings,
                                                    self.padding_size)
        assert self.org_vocab_size_padded <= self.num_embeddings_padded
        self.shard_indices = self._get_indices(self.num_embeddings_padded, self.org_vocab_size_padded,
                                               self.num_embeddings, self.org_vocab_size,
                                               tp_rank, self.tp_size)
        self.embedding_dim = embedding_dim
        self.quant_method = UnquantizedEmbeddingMethod()
        self.num_added_embeddings = self.num_embeddings - self.org_vocab_size
        self.num_embeddings_per_partition = divide(self.num_embeddings_padded, self.tp_size)
        assert self.shard_indices.num_elements_padded == self.num_embeddings_per_partition
        self.num_org_embeddings_per_partition = (self.shard_indices.org_vocab_end_index
                                                 - self.shard_indices.org_vocab_start_index)
        self.num_added_embeddings_per_partition = (self.shard_indices.added_vocab_end_index
                                                   - self.shard_indices.added_vocab_start_index)
        self.quant_method.create_weights(self, self.embedding_dim, [self.num_embeddings_per_partition],
                                         self.embedding_dim, self.num_embeddings_padded,
                                         params_dtype=params_dtype, weight_loader=self.weight_loader)

    @classmethod
    def _get_indices(cls, vocab_size_padded: int, org_vocab_size_padded: int, vocab_size: int,
                     org_vocab_size: int, tp_rank: int, tp_size: int) -> VocabParallelEmbeddingShardIndices:
        num_added_embeddings_padded = vocab_size_padded - org_vocab_size_padded
        padded_org_start, padded_org_end = vocab_range_from_global_vocab_size(
            org_vocab_size_padded, tp_rank, tp_size)
        padded_added_start, padded_added_end = vocab_range_from_global_vocab_size(
            num_added_embeddings_padded, tp_rank, tp_size, offset=org_vocab_size)
        # Clip the padded ranges to the real vocabulary.
        org_start = min(padded_org_start, org_vocab_size)
        org_end = min(padded_org_end, org_vocab_size)
        added_start = min(padded_added_start, vocab_size)
        added_end = min(padded_added_end, vocab_size)
        return VocabParallelEmbeddingShardIndices(padded_org_start, padded_org_end,
                                                  padded_added_start, padded_added_end,
                                                  org_start, org_end, added_start, added_end)

    def get_sharded_to_full_mapping(self) -> Optional[List[int]]:
        """For gathered logits (all ranks' shards concatenated): the gathered index of each
        token id in order, then of the padding. None for one rank."""
        if self.tp_size < 2:
            return None
        base, added, padding = [], [], []
        for rank in range(self.tp_size):
            idx = self._get_indices(self.num_embeddings_padded, self.org_vocab_size_padded,
                                    self.num_embeddings, self.org_vocab_size, rank, self.tp_size)
            start = self.num_embeddings_per_partition * rank
            end = self.num_embeddings_per_partition * (rank + 1)
            base.extend(range(start, start + idx.num_org_elements))
            padding.extend(range(start + idx.num_org_elements, start + idx.num_org_elements_padded))
            added.extend(range(start + idx.num_org_elements_padded,
                               start + idx.num_org_elements_padded + idx.num_added_elements))
            padding.extend(range(start + idx.num_org_elements_padded + idx.num_added_elements,
                                 start + idx.num_org_elements_padded + idx.num_added_elements_padded))
            assert start + idx.num_org_elements_padded + idx.num_added_elements_padded == end
        mapping = base + added + padding
        assert len(mapping) == self.num_embeddings_padded
        return mapping

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor) -> None:
        output_dim = getattr(param, "output_dim", None)
        packed_dim = getattr(param, "packed_dim", None)
        if output_dim is None:  # replicated (not the case for the unquantized weight)
            assert param.data.shape == loaded_weight.shape
            param.data.copy_(loaded_weight)
            return
        start_idx = self.shard_indices.org_vocab_start_index
        shard_size = self.shard_indices.org_vocab_end_index - start_idx
        if packed_dim is not None and packed_dim == output_dim:
            assert loaded_weight.shape[output_dim] == self.org_vocab_size // param.packed_factor
            start_idx = start_idx // param.packed_factor
            shard_size = shard_size // param.packed_factor
        else:
            assert loaded_weight.shape[output_dim] == self.org_vocab_size
        loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        # Real rows first, then the pad rows zeroed (on every load).
        param[: loaded_weight.shape[0]].data.copy_(loaded_weight)
        param[loaded_weight.shape[0]:].data.fill_(0)


class ParallelLMHead(VocabParallelEmbedding):
    """The output projection, laid out exactly like the embedding."""

    def __init__(self, num_embeddings: int, embedding_dim: int, *, tp_rank: int, tp_size: int,
                 params_dtype: torch.dtype, device, org_num_embeddings: Optional[int] = None,
                 padding_size: int = DEFAULT_VOCAB_PADDING_SIZE):
        super().__init__(num_embeddings, embedding_dim, tp_rank=tp_rank, tp_size=tp_size,
                         params_dtype=params_dtype, device=device,
                         org_num_embeddings=org_num_embeddings, padding_size=padding_size)
        self.register_parameter("bias", None)


# ----------------------------------------------------------------------------------------
# vllm/model_executor/layers/fused_moe/layer.py (and FusedMoEParallelConfig from config.py)
# ----------------------------------------------------------------------------------------

def determine_expert_map(ep_size: int, ep_rank: int,
                         global_num_experts: int) -> Tuple[int, Optional[torch.Tensor]]:
    """Contiguous blocks of experts per expert-parallel rank, the remainder going one each
    to the first ranks. Returns (local expert count, int32 map global -> local id or -1),
    the map being None for a single rank."""
    assert ep_size > 0
    if ep_size == 1:
        return global_num_experts, None
    base_experts = global_num_experts // ep_size
    remainder = global_num_experts % ep_size
    local_num_experts = base_experts + 1 if ep_rank < remainder else base_experts
    expert_map = torch.full((global_num_experts,), -1, dtype=torch.int32)
    start_idx = ep_rank * base_experts + min(ep_rank, remainder)
    expert_map[start_idx:start_idx + local_num_experts] = torch.arange(0, local_num_experts, dtype=torch.int32)
    return local_num_experts, expert_map


@dataclass
class FusedMoEParallelConfig:
    tp_size: int
    dp_size: int
    ep_size: int
    tp_rank: int
    dp_rank: int
    ep_rank: int
    use_ep: bool

    @staticmethod
    def make(tp_size_: int, tp_rank_: int, dp_size_: int = 1, dp_rank_: int = 0,
             enable_expert_parallel: bool = False) -> "FusedMoEParallelConfig":
        """Without expert parallelism the experts are tensor-parallel over all dp*tp
        devices; with it (and more than one device) each device holds whole experts and
        the MoE tensor parallelism is 1."""
        use_ep = dp_size_ * tp_size_ > 1 and enable_expert_parallel
        tp_size = dp_size_ * tp_size_
        tp_rank = dp_rank_ * tp_size_ + tp_rank_
        if not use_ep:
            return FusedMoEParallelConfig(tp_size=tp_size, tp_rank=tp_rank, dp_size=dp_size_,
                                          dp_rank=dp_rank_, ep_size=1, ep_rank=0, use_ep=False)
        return FusedMoEParallelConfig(tp_size=1, tp_rank=0, dp_size=dp_size_, dp_rank=dp_rank_,
                                      ep_size=tp_size, ep_rank=tp_rank, use_ep=True)


class UnquantizedFusedMoEMethod:
    def create_weights(self, layer: nn.Module, num_experts: int, hidden_size: int,
                       intermediate_size_per_partition: int, params_dtype: torch.dtype,
                       **extra_weight_attrs) -> None:
        # gate and up of each local expert, fused (column parallel): [E, 2*I_tp, H]
        w13_weight = Parameter(torch.empty(num_experts, 2 * intermediate_size_per_partition, hidden_size,
                                           dtype=params_dtype, device=layer.device),
                               requires_grad=False)
        layer.register_parameter("w13_weight", w13_weight)
        set_weight_attrs(w13_weight, extra_weight_attrs)
        # down of each local expert (row parallel): [E, H, I_tp]
        w2_weight = Parameter(torch.empty(num_experts, hidden_size, intermediate_size_per_partition,
                                          dtype=params_dtype, device=layer.device),
                              requires_grad=False)
        layer.register_parameter("w2_weight", w2_weight)
        set_weight_attrs(w2_weight, extra_weight_attrs)


class FusedMoE(nn.Module):
    """All experts of one layer in two 3-D parameters, w13 (gate then up) and w2 (down)."""

    def __init__(self, num_experts: int, hidden_size: int, intermediate_size: int, *,
                 tp_rank: int, tp_size: int, enable_expert_parallel: bool,
                 params_dtype: torch.dtype, device, num_redundant_experts: int = 0):
        super().__init__()
        self.device = torch.device(device)
        self.params_dtype = params_dtype
        self.moe_parallel_config = FusedMoEParallelConfig.make(
            tp_size_=tp_size, tp_rank_=tp_rank, enable_expert_parallel=enable_expert_parallel)
        assert num_redundant_experts == 0, "redundant experts (EPLB) are not part of the stand-in"
        self.global_num_experts = num_experts + num_redundant_experts
        if self.use_ep:
            self.local_num_experts, self.expert_map = determine_expert_map(
                ep_size=self.ep_size, ep_rank=self.ep_rank, global_num_experts=self.global_num_experts)
        else:
            self.local_num_experts, self.expert_map = self.global_num_experts, None
        assert intermediate_size % self.tp_size == 0
        self.hidden_size = hidden_size
        self.intermediate_size_per_partition = intermediate_size // self.tp_size
        self.quant_method = UnquantizedFusedMoEMethod()
        self.quant_method.create_weights(layer=self, num_experts=self.local_num_experts,
                                         hidden_size=hidden_size,
                                         intermediate_size_per_partition=self.intermediate_size_per_partition,
                                         params_dtype=params_dtype, weight_loader=self.weight_loader)

    # The MoE's own parallel sizes (tp_size is 1 under expert parallelism).
    @property
    def tp_size(self) -> int:
        return self.moe_parallel_config.tp_size

    @property
    def tp_rank(self) -> int:
        return self.moe_parallel_config.tp_rank

    @property
    def ep_size(self) -> int:
        return self.moe_parallel_config.ep_size

    @property
    def ep_rank(self) -> int:
        return self.moe_parallel_config.ep_rank

    @property
    def use_ep(self) -> bool:
        return self.moe_parallel_config.use_ep

    def _map_global_expert_id_to_local_expert_id(self, expert_id: int) -> int:
        if self.expert_map is None:
            return expert_id
        return self.expert_map[expert_id].item()

    def _load_w13(self, expert_data: torch.Tensor, shard_dim: int, shard_id: str,
                  loaded_weight: torch.Tensor, tp_rank: int, load_full: bool = False) -> None:
        # gate_up is merged column parallel: this rank's block of rows of gate (w1) goes to
        # the first half of w13, of up (w3) to the second half.
        shard_size = expert_data.shape[shard_dim] // 2
        if not load_full:
            loaded_weight = loaded_weight.narrow(shard_dim, shard_size * tp_rank, shard_size)
        if shard_id == "w1":
            expert_data = expert_data.narrow(shard_dim, 0, shard_size)
        else:
            assert shard_id == "w3"
            expert_data = expert_data.narrow(shard_dim, shard_size, shard_size)
        # Stand-in's explicit check: vLLM relies on copy_ refusing a mismatch (copy_ would
        # broadcast a size-1 dimension; real checkpoints never have one there).
        assert expert_data.shape == loaded_weight.shape, (expert_data.shape, loaded_weight.shape)
        expert_data.copy_(loaded_weight)

    def _load_w2(self, expert_data: torch.Tensor, shard_dim: int, loaded_weight: torch.Tensor,
                 tp_rank: int, load_full: bool = False) -> None:
        # down is row parallel: this rank's block of columns.
        shard_size = expert_data.shape[shard_dim]
        if not load_full:
            loaded_weight = loaded_weight.narrow(shard_dim, shard_size * tp_rank, shard_size)
        assert expert_data.shape == loaded_weight.shape, (expert_data.shape, loaded_weight.shape)
        expert_data.copy_(loaded_weight)

    def _load_model_weight_or_group_weight_scale(self, shard_dim: int, expert_data: torch.Tensor,
                                                 shard_id: str, loaded_weight: torch.Tensor,
                                                 tp_rank: int, load_full_w2: bool = False) -> None:
        if shard_id == "w2":
            self._load_w2(shard_dim=shard_dim, loaded_weight=loaded_weight, expert_data=expert_data,
                          tp_rank=tp_rank, load_full=load_full_w2)
        elif shard_id in ("w1", "w3"):
            self._load_w13(shard_id=shard_id, shard_dim=shard_dim, loaded_weight=loaded_weight,
                           expert_data=expert_data, tp_rank=tp_rank)

    def weight_loader(self, param: Parameter, loaded_weight: torch.Tensor, weight_name: str,
                      shard_id: str, expert_id: int, return_success: bool = False) -> Optional[bool]:
        expert_id = self._map_global_expert_id_to_local_expert_id(expert_id)
        if expert_id == -1:  # not on this rank
            return False if return_success else None
        if shard_id not in ("w1", "w2", "w3"):
            raise ValueError(f"shard_id must be ['w1','w2','w3'] but got {shard_id}.")
        # The dimension holding the intermediate size: rows of gate/up, columns of down.
        SHARD_ID_TO_SHARDED_DIM = {"w1": 0, "w2": 1, "w3": 0}
        shard_dim = SHARD_ID_TO_SHARDED_DIM[shard_id]
        if getattr(param, "is_transposed", False):
            shard_dim = int(not shard_dim)
        full_load = len(loaded_weight.shape) == 3  # all experts in one tensor
        if full_load:
            shard_dim += 1
        expert_data = param.data if full_load else param.data[expert_id]
        if "weight" in weight_name:
            self._load_model_weight_or_group_weight_scale(shard_id=shard_id, shard_dim=shard_dim,
                                                          loaded_weight=loaded_weight,
                                                          expert_data=expert_data, tp_rank=self.tp_rank)
            return True if return_success else None
        return False if return_success else None

    @classmethod
    def make_expert_params_mapping(cls, ckpt_gate_proj_name: str, ckpt_down_proj_name: str,
                                   ckpt_up_proj_name: str, num_experts: int,
                                   num_redundant_experts: int = 0) -> List[Tuple[str, str, int, str]]:
        """(param_name, checkpoint name fragment, expert id, shard id) for every expert and
        gate (w1) / down (w2) / up (w3); physical ids equal logical ones without EPLB."""
        num_physical_experts = num_experts + num_redundant_experts
        physical_to_logical = [e % num_experts for e in range(num_physical_experts)]
        mapping = []
        for expert_id in range(num_physical_experts):
            for shard_id, weight_name in (("w1", ckpt_gate_proj_name), ("w2", ckpt_down_proj_name),
                                          ("w3", ckpt_up_proj_name)):
                param_name = ("experts.w13_" if weight_name in (ckpt_gate_proj_name, ckpt_up_proj_name)
                              else "experts.w2_")
                mapping.append((param_name, f"experts.{physical_to_logical[expert_id]}.{weight_name}.",
                                expert_id, shard_id))
        return mapping


# ----------------------------------------------------------------------------------------
# vllm/model_executor/layers/layernorm.py
# ----------------------------------------------------------------------------------------

class RMSNorm(nn.Module):
    """Only the weight (vLLM starts it at ones; it has no weight_loader attribute, so the
    default whole-tensor loader fills it)."""

    def __init__(self, hidden_size: int, *, params_dtype: torch.dtype, device):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, dtype=params_dtype, device=device))


# ----------------------------------------------------------------------------------------
# The models: vllm/model_executor/models/qwen2.py, qwen3.py, qwen3_moe.py
# ----------------------------------------------------------------------------------------

class Qwen3Attention(nn.Module):
    def __init__(self, config: Qwen3Config, *, tp_rank: int, tp_size: int, params_dtype, device):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.total_num_heads = config.num_attention_heads
        assert self.total_num_heads % tp_size == 0
        self.num_heads = self.total_num_heads // tp_size
        self.total_num_kv_heads = config.num_key_value_heads
        if self.total_num_kv_heads >= tp_size:
            assert self.total_num_kv_heads % tp_size == 0  # kv heads split over the ranks
        else:
            assert tp_size % self.total_num_kv_heads == 0  # kv heads replicated
        self.num_kv_heads = max(1, self.total_num_kv_heads // tp_size)
        self.head_dim = config.head_dim
        self.q_size = self.num_heads * self.head_dim
        self.kv_size = self.num_kv_heads * self.head_dim
        kw = dict(tp_rank=tp_rank, tp_size=tp_size, params_dtype=params_dtype, device=device,
                  quant_config=config if config.weight_block_size else None)
        self.qkv_proj = QKVParallelLinear(self.hidden_size, self.head_dim, self.total_num_heads,
                                          self.total_num_kv_heads, bias=False, **kw)
        self.o_proj = RowParallelLinear(self.total_num_heads * self.head_dim, self.hidden_size,
                                        bias=False, **kw)
        self.q_norm = RMSNorm(self.head_dim, params_dtype=params_dtype, device=device)
        self.k_norm = RMSNorm(self.head_dim, params_dtype=params_dtype, device=device)


class Qwen3MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, *, tp_rank: int, tp_size: int,
                 params_dtype, device, quant_config=None):
        super().__init__()
        kw = dict(tp_rank=tp_rank, tp_size=tp_size, params_dtype=params_dtype, device=device,
                  quant_config=quant_config)
        self.gate_up_proj = MergedColumnParallelLinear(hidden_size, [intermediate_size] * 2, bias=False, **kw)
        self.down_proj = RowParallelLinear(intermediate_size, hidden_size, bias=False, **kw)


class Qwen3MoeSparseMoeBlock(nn.Module):
    def __init__(self, config: Qwen3Config, *, tp_rank: int, tp_size: int, enable_expert_parallel: bool,
                 params_dtype, device):
        super().__init__()
        self.tp_size = tp_size
        if self.tp_size > config.num_experts:
            raise ValueError(f"Tensor parallel size {self.tp_size} is greater than "
                             f"the number of experts {config.num_experts}.")
        self.experts = FusedMoE(num_experts=config.num_experts, hidden_size=config.hidden_size,
                                intermediate_size=config.moe_intermediate_size, tp_rank=tp_rank,
                                tp_size=tp_size, enable_expert_parallel=enable_expert_parallel,
                                params_dtype=params_dtype, device=device)
        self.gate = ReplicatedLinear(config.hidden_size, config.num_experts, bias=False, tp_rank=tp_rank,
                                     tp_size=tp_size, params_dtype=params_dtype, device=device)


class Qwen3DecoderLayer(nn.Module):
    def __init__(self, config: Qwen3Config, *, tp_rank: int, tp_size: int, enable_expert_parallel: bool,
                 params_dtype, device):
        super().__init__()
        self.hidden_size = config.hidden_size
        self.self_attn = Qwen3Attention(config, tp_rank=tp_rank, tp_size=tp_size,
                                        params_dtype=params_dtype, device=device)
        if config.num_experts > 0:
            self.mlp = Qwen3MoeSparseMoeBlock(config, tp_rank=tp_rank, tp_size=tp_size,
                                              enable_expert_parallel=enable_expert_parallel,
                                              params_dtype=params_dtype, device=device)
        else:
            self.mlp = Qwen3MLP(config.hidden_size, config.intermediate_size, tp_rank=tp_rank,
                                tp_size=tp_size, params_dtype=params_dtype, device=device,
                                quant_config=config if config.weight_block_size else None)
        self.input_layernorm = RMSNorm(config.hidden_size, params_dtype=params_dtype, device=device)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, params_dtype=params_dtype, device=device)


class Qwen3Model(nn.Module):
    """`model.*`: Qwen2Model.load_weights for dense, Qwen3MoeModel.load_weights for MoE."""

    def __init__(self, config: Qwen3Config, *, tp_rank: int, tp_size: int, enable_expert_parallel: bool,
                 params_dtype, device):
        super().__init__()
        self.config = config
        self.vocab_size = config.vocab_size
        self.embed_tokens = VocabParallelEmbedding(config.vocab_size, config.hidden_size, tp_rank=tp_rank,
                                                   tp_size=tp_size, params_dtype=params_dtype, device=device)
        self.layers = nn.ModuleList([
            Qwen3DecoderLayer(config, tp_rank=tp_rank, tp_size=tp_size,
                              enable_expert_parallel=enable_expert_parallel,
                              params_dtype=params_dtype, device=device)
            for _ in range(config.num_hidden_layers)])
        self.norm = RMSNorm(config.hidden_size, params_dtype=params_dtype, device=device)

    STACKED_PARAMS_MAPPING = [
        # (param_name, shard_name, shard_id)
        ("qkv_proj", "q_proj", "q"),
        ("qkv_proj", "k_proj", "k"),
        ("qkv_proj", "v_proj", "v"),
        ("gate_up_proj", "gate_proj", 0),
        ("gate_up_proj", "up_proj", 1),
    ]

    def get_expert_mapping(self) -> List[Tuple[str, str, int, str]]:
        return FusedMoE.make_expert_params_mapping(ckpt_gate_proj_name="gate_proj",
                                                   ckpt_down_proj_name="down_proj",
                                                   ckpt_up_proj_name="up_proj",
                                                   num_experts=self.config.num_experts)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        """Names relative to this module (`layers.0.self_attn.q_proj.weight`)."""
        if self.config.num_experts > 0:
            return self._load_weights_moe(weights)
        return self._load_weights_dense(weights)

    def _load_weights_dense(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        # vLLM passes remove_duplicate=False (torch >= 2.0 only); nothing is shared inside
        # `model`, so the plain call gives the same dict on torch 1.13.
        params_dict = dict(self.named_parameters())
        loaded_params: Set[str] = set()
        for name, loaded_weight in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            for param_name, weight_name, shard_id in self.STACKED_PARAMS_MAPPING:
                if weight_name not in name:
                    continue
                name = name.replace(weight_name, param_name)
                if name.endswith(".bias") and name not in params_dict:
                    continue
                param = params_dict[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                if name.endswith(".bias") and name not in params_dict:
                    continue
                param = params_dict[name]
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                weight_loader(param, loaded_weight)
            loaded_params.add(name)
        return loaded_params

    def _load_weights_moe(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        ignore_suffixes = (".bias", "_bias", ".k_scale", "_k_scale", ".v_scale", "_v_scale",
                           ".weight_scale", "_weight_scale", ".input_scale", "_input_scale")
        params_dict = dict(self.named_parameters())
        loaded_params: Set[str] = set()
        expert_params_mapping = self.get_expert_mapping()
        for name, loaded_weight in weights:
            if "rotary_emb.inv_freq" in name:
                continue
            for param_name, weight_name, shard_id in self.STACKED_PARAMS_MAPPING:
                if weight_name not in name:
                    continue
                # Expert weights contain gate_proj/up_proj too: leave them to the expert
                # mapping below, before renaming.
                if "mlp.experts" in name:
                    continue
                name = name.replace(weight_name, param_name)
                if name.endswith(ignore_suffixes) and name not in params_dict:
                    continue
                if name not in params_dict:
                    continue
                param = params_dict[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                for param_name, weight_name, expert_id, shard_id in expert_params_mapping:
                    if weight_name not in name:
                        continue
                    name = name.replace(weight_name, param_name)
                    if name.endswith(ignore_suffixes) and name not in params_dict:
                        continue
                    param = params_dict[name]
                    param.weight_loader(param, loaded_weight, name, shard_id=shard_id, expert_id=expert_id)
                    break
                else:
                    if name.endswith(ignore_suffixes) and name not in params_dict:
                        continue
                    param = params_dict[name]
                    weight_loader = getattr(param, "weight_loader", default_weight_loader)
                    weight_loader(param, loaded_weight)
            loaded_params.add(name)
        return loaded_params


class Qwen3ForCausalLM(nn.Module):
    """One tensor-parallel rank of vLLM's Qwen3ForCausalLM (num_experts == 0) or
    Qwen3MoeForCausalLM (num_experts > 0)."""

    def __init__(self, config: Qwen3Config, tp_rank: int = 0, tp_size: int = 1,
                 enable_expert_parallel: bool = False, dtype: torch.dtype = torch.bfloat16,
                 device="cpu"):
        super().__init__()
        if not (tp_size >= 1 and 0 <= tp_rank < tp_size):
            raise ValueError(f"tp_rank {tp_rank} / tp_size {tp_size}")
        if config.num_experts > 0 and config.moe_intermediate_size <= 0:
            raise ValueError("a MoE config needs moe_intermediate_size")
        if config.num_experts > 0 and config.weight_block_size is not None:
            raise ValueError("the stand-in models float8 layers for the dense model only")
        self.config = config
        self.tp_rank = tp_rank
        self.tp_size = tp_size
        self.enable_expert_parallel = enable_expert_parallel
        self.model = Qwen3Model(config, tp_rank=tp_rank, tp_size=tp_size,
                                enable_expert_parallel=enable_expert_parallel, params_dtype=dtype, device=device)
        if config.tie_word_embeddings:
            # The same module (so one parameter, `model.embed_tokens.weight`); vLLM's MoE
            # model shares the parameter instead, which loads identically.
            self.lm_head = self.model.embed_tokens
        else:
            self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, tp_rank=tp_rank,
                                          tp_size=tp_size, params_dtype=dtype, device=device)
        record_metadata_for_reloading(self)

    def load_weights(self, weights: Iterable[Tuple[str, torch.Tensor]]) -> Set[str]:
        """Loads full Hugging Face checkpoint tensors the way AutoWeightsLoader does, streaming
        runs of names by their first component: `model.*` through the model's load_weights,
        `lm_head.*` through the parameter's own loader (skipped when the embeddings are tied).
        Returns the loaded parameter names."""
        skip_prefixes = ["lm_head."] if self.config.tie_word_embeddings else []
        weights = ((name, w) for name, w in weights
                   if not any(name.startswith(p) for p in skip_prefixes))
        loaded: Set[str] = set()
        for prefix, group in itertools.groupby(weights, key=lambda item: item[0].split(".", 1)[0]):
            if prefix == "model":
                relative = ((name[len("model."):], w) for name, w in group)
                loaded.update("model." + name for name in self.model.load_weights(relative))
                continue
            # A child without load_weights: its parameters, looked up now.
            params_dict = dict(self.named_parameters())
            for name, loaded_weight in group:
                if name not in params_dict:
                    raise ValueError(f"There is no module or parameter named '{name}' in Qwen3ForCausalLM")
                param = params_dict[name]
                weight_loader = getattr(param, "weight_loader", default_weight_loader)
                weight_loader(param, loaded_weight)
                loaded.add(name)
        return loaded
