"""Trainers and inference engines join shardsync with their layouts read from the
frameworks themselves; no user writes placement math. Needs torch.

Trainer side (sources, shardsync.integrations.sources): ``module_sources`` (a whole
module: a plain trainer, Hugging Face, DeepSpeed ZeRO-1/2), ``fsdp2_sources`` (FSDP2's
DTensors), ``zero3_sources`` (DeepSpeed ZeRO-3's ``ds_tensor`` partitions),
``zero12_master_sources`` (ZeRO-1/2's fp32 master partitions), registered by
``TrainerSource``.

Engine side (targets, shardsync.integrations.targets): ``loader_targets`` (placements
learned by running the engine's own weight loader once: vLLM, SGLang), ``module_targets``
(a Hugging Face model on one device), registered by ``EngineTarget``; vLLM's worker
extension is shardsync.integrations.vllm, SGLang's hook shardsync.integrations.sglang.

Names on both sides are checkpoint (Hugging Face) names.
"""

from shardsync.integrations.probe import ProbeError
from shardsync.integrations.sources import (TrainerSource, fsdp2_sources, module_sources, zero3_sources,
                                            zero12_master_sources)
from shardsync.integrations.targets import EngineTarget, loader_targets, module_targets

__all__ = ["EngineTarget", "ProbeError", "TrainerSource", "fsdp2_sources", "loader_targets", "module_sources",
           "module_targets", "zero3_sources", "zero12_master_sources"]
