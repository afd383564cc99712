"""SGLang: each tensor-parallel worker's live weights as shardsync targets, placements
learned by running the worker's own ``model.load_weights`` once.

SGLang calls a custom weight loader inside every TP worker with the worker's model:
start the server with ``--custom-weight-loader shardsync.integrations.sglang.register``
and call, from the driver, ``engine.update_weights_from_tensor(named_tensors=[],
load_format="shardsync.integrations.sglang.register", flush_cache=False)`` once the
agents run. Around each sync: ``engine.pause_generation()``, the trainer's sync, then
``engine.flush_cache()`` and ``engine.continue_generation()``.

SGLang's hook passes only the model, so the rest comes from the environment of the
SGLang process: SHARDSYNC_SOCKET (the agent's socket, formatted with ``device``),
SHARDSYNC_CHECKPOINT (the model folder, whose safetensors headers give the checkpoint's
shapes; required), SHARDSYNC_CLIENT_ID (default "sglang") and SHARDSYNC_PROBE_DIR
(loader_targets' `probe_dir`; default: the probe in memory).
SGLang's memory saver (``--enable-memory-saver``, which ``release_memory_occupation``
needs) maps the weights with ``cuMemCreate``, which gives no CUDA IPC handle: their
registration fails; run SGLang without it.
"""

from typing import Dict, Iterable, Optional, Tuple
import os

import torch

from shardsync.client import AgentClient
from shardsync.integrations.modules import safetensors_shapes
from shardsync.integrations.targets import EngineTarget, loader_targets

__all__ = ["current", "register"]

_targets: Dict[int, EngineTarget] = {}  # by device: this process's registration, kept alive


def register(model: torch.nn.Module, named_tensors: Iterable[Tuple[str, torch.Tensor]]) -> None:
    """SGLang's custom-weight-loader hook: registers `model`'s weights (the call's
    `named_tensors` are not used)."""
    device = next(model.parameters()).device
    index = device.index if device.type == "cuda" else 0
    socket = os.environ["SHARDSYNC_SOCKET"].format(device=index)
    client_id = f"{os.environ.get('SHARDSYNC_CLIENT_ID', 'sglang')}-{index}"
    shapes = safetensors_shapes(os.environ["SHARDSYNC_CHECKPOINT"])
    probe_dir = os.environ.get("SHARDSYNC_PROBE_DIR")
    if index in _targets:
        _targets[index].reregister()
        return
    _targets[index] = EngineTarget(AgentClient(socket), client_id,
                                   lambda: loader_targets(model, model.load_weights, shapes, probe_dir=probe_dir))


def current(device: Optional[int] = None) -> EngineTarget:
    """The EngineTarget this process registered for `device` (default: the current CUDA
    device)."""
    return _targets[torch.cuda.current_device() if device is None else device]
