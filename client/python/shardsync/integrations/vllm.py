"""vLLM: a worker extension that registers each worker's live weights as shardsync
targets, placements learned by running the worker's own ``model.load_weights`` once.

Start vLLM with ``worker_extension_cls="shardsync.integrations.vllm.WorkerExtension"``
(``--worker-extension-cls``), then from the driver::

    llm.collective_rpc("shardsync_register", args=("/run/shardsync/agent-{device}/agent.sock", "rollout"))
    ...   # each step: llm.collective_rpc("shardsync_pause"); trainer syncs;
    llm.collective_rpc("shardsync_resume", args=(version,))

Unquantized weights, and block-quantized float8 weights (a float8 checkpoint with
``weight_block_size`` [128, 128], vLLM's ``Fp8LinearMethod``), are registered: the agent
quantizes what the trainer sends (bfloat16 or float32) into each float8 ``weight`` and its
``weight_scale_inv``. For those layers vLLM's loaders no longer run on the live parameters
after ``process_weights_after_loading``, so the probe runs on the parameters as vLLM
created them, from vLLM's own record of them for reloading
(``vllm.model_executor.model_loader.reload``); a vLLM without that record is refused for
float8 layers, and so is DeepGEMM's power-of-two scale format (``VLLM_USE_DEEP_GEMM_E8M0``),
which changes the weights after loading. Where vLLM leaves the memory it loaded in place
(its CUDA weights, unquantized or float8 on the CUTLASS and Triton kernels), what the
loader wrote is what the engine reads. Sleep mode (``enable_sleep_mode=True``) is
refused: vLLM then maps the weights through its CuMem allocator (``cuMemCreate``), which
gives no CUDA IPC handle. ``shardsync_reregister`` registers again if the memory moved.
"""

from typing import Any, Dict, Mapping, Optional, Sequence
import grpc
import torch

from shardsync.client import AgentClient, ShardsyncError
from shardsync.integrations.modules import safetensors_shapes
from shardsync.integrations.probe import ProbeError
from shardsync.integrations.targets import SCALES, EngineTarget, float8_names, loader_targets

__all__ = ["WorkerExtension", "created_parameters"]


class WorkerExtension:
    """Mixed into vLLM's worker class by vLLM itself (worker_extension_cls); uses the
    worker's ``model_runner.model``, ``device``, ``rank`` and ``model_config``."""

    # The worker's, declared for the type checker.
    model_runner: Any
    model_config: Any
    device: torch.device
    rank: int
    _shardsync: EngineTarget

    def shardsync_register(self, socket: str, client_id: str,
                           checkpoint_shapes: Optional[Mapping[str, Sequence[int]]] = None,
                           probe_dir: Optional[str] = None) -> int:
        """Registers this worker's weights with the agent at `socket` (formatted with
        ``device``, this worker's CUDA ordinal, and ``rank``) as client
        ``{client_id}-{rank}``. `checkpoint_shapes` ({name: shape}) defaults to the
        tensors of the model's safetensors files; `probe_dir`: loader_targets'. Returns
        the agent's rank. Refused under sleep mode: its weights have no CUDA IPC handle."""
        if self.model_config.enable_sleep_mode:
            raise ShardsyncError(grpc.StatusCode.FAILED_PRECONDITION,
                                 "vLLM's sleep mode (enable_sleep_mode=True) maps the weights with cuMemCreate, "
                                 "which gives no CUDA IPC handle: shardsync cannot register them; start vLLM "
                                 "without sleep mode")
        model = self.model_runner.model
        shapes = checkpoint_shapes or safetensors_shapes(self.model_config.model)
        agent = AgentClient(socket.format(device=self.device.index, rank=self.rank))
        self._shardsync = EngineTarget(agent, f"{client_id}-{self.rank}",
                                       lambda: loader_targets(model, model.load_weights, shapes,
                                                              _created_if_float8(model), probe_dir))
        registration = self._shardsync.registration
        assert registration is not None  # EngineTarget registers as it is made
        return registration.rank

    def shardsync_reregister(self) -> None:
        self._shardsync.reregister()

    def shardsync_pause(self) -> None:
        self._shardsync.pause()

    def shardsync_resume(self, version: str) -> None:
        self._shardsync.resume(version)

    def shardsync_weight_version(self) -> Optional[str]:
        return self._shardsync.weight_version()

    def shardsync_close(self) -> None:
        self._shardsync.close()


def created_parameters(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """{name: CPU tensor of the class, attributes, shape, strides and dtype} of every
    parameter of `model` as vLLM created it, from vLLM's record for reloading (meta
    tensors whose loaders were unbound from their layer, rebound here to copies);
    ProbeError for a vLLM without that record."""
    try:
        from vllm.model_executor.model_loader.reload.layerwise import LAYERWISE_INFO
    except ImportError:
        raise ProbeError("this vLLM keeps no record of its layers as created "
                         "(vllm.model_executor.model_loader.reload): shardsync cannot learn where its float8 "
                         "layers load") from None
    try:
        from vllm.model_executor.model_loader.reload.sanitize import restore_layer_refs
    except ImportError:  # a record that keeps its loaders bound
        def restore_layer_refs(tensor: torch.Tensor, layer: Any) -> torch.Tensor:
            return tensor
    created = {}
    for prefix, layer in model.named_modules():
        info = LAYERWISE_INFO.get(layer)
        params = info.restore_metadata[0] if info is not None and info.restore_metadata else {}
        for leaf, meta in params.items():
            tensor = torch.empty_strided(meta.shape, meta.stride(), dtype=meta.dtype)
            tensor.__class__ = type(meta)
            tensor.__dict__ = dict(meta.__dict__)
            created[f"{prefix}.{leaf}" if prefix else leaf] = restore_layer_refs(tensor, layer)
    return created


def _created_if_float8(model: torch.nn.Module) -> Optional[Dict[str, torch.Tensor]]:
    """None for a model without float8 parameters (the probe runs on the live ones);
    otherwise created_parameters(model), after refusing DeepGEMM's power-of-two scales and
    float8 layers the record lacks."""
    float8 = float8_names(dict(model.named_parameters()))
    if not float8:
        return None
    created = created_parameters(model)
    for name in float8 + [n + SCALES for n in float8]:
        if name not in created:
            raise ProbeError(f"vLLM's record of its layers as created has no parameter '{name}'")
    try:
        from vllm.utils.deep_gemm import is_deep_gemm_e8m0_used
    except ImportError:
        raise ProbeError("this vLLM has no vllm.utils.deep_gemm.is_deep_gemm_e8m0_used: shardsync cannot tell "
                         "whether DeepGEMM's power-of-two scales change the float8 weights after loading") from None
    if is_deep_gemm_e8m0_used():
        raise ProbeError("vLLM requantizes float8 weights to power-of-two scales for DeepGEMM after loading; "
                         "start it with VLLM_USE_DEEP_GEMM_E8M0=0 so that the weights stay as loaded")
    return created
