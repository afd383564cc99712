"""vLLM: a worker extension that registers each worker's live weights as shardsync
targets, placements learned by running the worker's own ``model.load_weights`` once.

Start vLLM with ``worker_extension_cls="shardsync.integrations.vllm.WorkerExtension"``
(``--worker-extension-cls``), then from the driver::

    llm.collective_rpc("shardsync_register", args=("/run/shardsync/agent-{device}.sock", "rollout"))
    ...   # each step: llm.collective_rpc("shardsync_pause"); trainer syncs;
    llm.collective_rpc("shardsync_resume", args=(version,))

Only unquantized weights are registered: their ``process_weights_after_loading`` leaves
CUDA weights as loaded, so what the loader wrote is what the engine reads. After
``llm.wake_up()`` from sleep level 1 the weights keep their addresses (vLLM's CuMem
allocator keeps the virtual range); after level 2 their contents are gone until the next
sync. ``shardsync_reregister`` registers again if the memory moved.
"""

from shardsync.client import AgentClient
from shardsync.integrations.modules import safetensors_shapes
from shardsync.integrations.targets import EngineTarget, loader_targets


class WorkerExtension:
    """Mixed into vLLM's worker class by vLLM itself (worker_extension_cls); uses the
    worker's ``model_runner.model``, ``device``, ``rank`` and ``model_config``."""

    def shardsync_register(self, socket, client_id, checkpoint_shapes=None):
        """Registers this worker's weights with the agent at `socket` (formatted with
        ``device``, this worker's CUDA ordinal, and ``rank``) as client
        ``{client_id}-{rank}``. `checkpoint_shapes` ({name: shape}) defaults to the
        tensors of the model's safetensors files. Returns the agent's rank."""
        model = self.model_runner.model
        shapes = checkpoint_shapes or safetensors_shapes(self.model_config.model)
        agent = AgentClient(socket.format(device=self.device.index, rank=self.rank))
        self._shardsync = EngineTarget(agent, f"{client_id}-{self.rank}",
                                       lambda: loader_targets(model, model.load_weights, shapes))
        return self._shardsync.registration.rank

    def shardsync_reregister(self):
        self._shardsync.reregister()

    def shardsync_pause(self):
        self._shardsync.pause()

    def shardsync_resume(self, version):
        self._shardsync.resume(version)

    def shardsync_weight_version(self):
        return self._shardsync.weight_version()

    def shardsync_close(self):
        self._shardsync.close()
