"""Engine adapters: an inference engine's live parameters (their memory, no copy, no new
arena) registered as shardsync targets.

``loader_targets`` learns where each checkpoint element lands by running the engine's
own weight-loading code once on encoded values (shardsync.integrations.probe); rows no
checkpoint element reaches (padded vocabulary) become zero fills. ``module_targets`` is
for a module whose parameters are the checkpoint's tensors (a Hugging Face model on one
device). ``EngineTarget`` keeps the registration through the engine's lifecycle.
"""

from shardsync import layout_pb2
from shardsync.integrations.memory import tensor_buffer
from shardsync.integrations.probe import probe
from shardsync.integrations.sources import Registered, dtype_name, module_sources
from shardsync.layouts import tensor_layout


def loader_targets(model, load_weights, checkpoint_shapes):
    """(buffers, layouts) of `model`'s parameters as `load_weights` (the engine's own
    loader: an iterable of (checkpoint name, full tensor) -> None) fills them from a
    checkpoint of `checkpoint_shapes` ({name: shape}). A parameter no checkpoint element
    reaches is left out. Raises ProbeError for a loader that changes values or writes a
    checkpoint element into a buffer (no target)."""
    params = dict(model.named_parameters())
    result = probe(params, checkpoint_shapes, load_weights, dict(model.named_buffers()))
    used = {p.param for p in result.pieces}
    buffers = {name: tensor_buffer(params[name].data) for name in params if name in used}
    layouts = {}
    first_tensor = {}  # parameter -> the layout its fills join
    for piece in result.pieces:
        param = params[piece.param]
        layout = layouts.get(piece.tensor)
        if layout is None:
            layout = layouts[piece.tensor] = tensor_layout(piece.tensor, checkpoint_shapes[piece.tensor],
                                                           dtype_name(param.data, piece.param))
        layout.placements.add(box=layout_pb2.Box(lo=list(piece.lo), hi=list(piece.hi)), buffer=piece.param,
                              base=piece.base, strides=list(piece.strides))
        first_tensor.setdefault(piece.param, layout)
    for fill in result.fills:
        if fill.param in first_tensor:
            first_tensor[fill.param].fills.add(buffer=fill.param, base=fill.base, shape=list(fill.shape),
                                               strides=list(fill.strides))
    return buffers, list(layouts.values())


def module_targets(module, rename=None):
    """(buffers, layouts) of every parameter of `module` whole, as targets: the layouts
    module_sources makes."""
    return module_sources(module, rename)


class EngineTarget(Registered):
    """An engine's weights registered with the agent of its device as targets.

    `describe()` returns (buffers, layouts), e.g. ``lambda: loader_targets(model,
    model.load_weights, shapes)``. Around each sync the orchestrator calls ``pause()``
    (no forward pass reads the weights while they change) and, once the sync succeeded,
    ``resume(version)``: it runs `post_load` (the engine's step after loading weights,
    where it has one), records `version` and calls `resume_engine`. ``reregister()`` after
    the engine's memory moved. ``weight_version()`` is the agent's word: the last sync
    that completed into these targets, None while they are invalid."""

    def __init__(self, agent, client_id, describe, *, pause_engine=None, resume_engine=None, post_load=None):
        self._pause, self._resume, self._post_load = pause_engine, resume_engine, post_load
        self.version = None
        super().__init__(agent, client_id, "target", describe)

    def pause(self):
        if self._pause:
            self._pause()

    def resume(self, version):
        if self._post_load:
            self._post_load()
        self.version = version
        if self._resume:
            self._resume()

    def weight_version(self):
        status = self._agent.status()
        return status.last_sync_id if status.target_valid and status.last_sync_id else None
