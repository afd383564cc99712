"""Engine adapters: an inference engine's live parameters (their memory, no copy, no new
arena) registered as shardsync targets.

``loader_targets`` learns where each checkpoint element lands by running the engine's
own weight-loading code once on encoded values (shardsync.integrations.probe); rows no
checkpoint element reaches (padded vocabulary) become zero fills. ``module_targets`` is
for a module whose parameters are the checkpoint's tensors (a Hugging Face model on one
device). ``EngineTarget`` keeps the registration through the engine's lifecycle.
"""

import torch

from shardsync import layout_pb2
from shardsync.integrations.memory import tensor_buffer
from shardsync.integrations.probe import ProbeError, probe
from shardsync.integrations.sources import Registered, dtype_name, module_sources
from shardsync.layouts import tensor_layout


def loader_targets(model, load_weights, checkpoint_shapes, created=None):
    """(buffers, layouts) of `model`'s parameters as `load_weights` (the engine's own
    loader: an iterable of (checkpoint name, full tensor) -> None) fills them from a
    checkpoint of `checkpoint_shapes` ({name: shape}). A parameter no checkpoint element
    reaches is left out. Raises ProbeError for a loader that changes values or writes a
    checkpoint element into a buffer (no target).

    `created` ({parameter name: a CPU tensor of the class and attributes the engine
    created that parameter with}) is for an engine whose loaders no longer run on its live
    parameters once it has processed them after loading (vLLM's quantized layers): the
    probe puts each in its module's place while the loader runs, then puts the live one
    back. Each live parameter must have its created one's shape.

    A float8_e4m3fn parameter is a block-quantized target: its float32
    ``<name>_scale_inv`` (vLLM's ``weight_scale_inv``: one scale per 128 x 128
    block, row-major) is filled by the agent, not synced; where the loader puts the
    checkpoint's ``<tensor>_scale_inv`` says which scale belongs to which block."""
    live = dict(model.named_parameters())
    params = live
    if created is not None:
        params = {name: created.get(name, param) for name, param in live.items()}
    for name, param in params.items():
        if tuple(param.shape) != tuple(live[name].shape):
            raise ProbeError(f"parameter '{name}' is {list(live[name].shape)} in the engine but was created "
                             f"{list(param.shape)}: its memory no longer has the layout its loader writes")
    with _installed(model, params, live):
        result = probe(params, checkpoint_shapes, load_weights, dict(model.named_buffers()))
    quantized = _block_scales(result, live, checkpoint_shapes)
    used = {p.param for p in result.pieces}
    buffers = {name: tensor_buffer(live[name].data) for name in live if name in used}
    layouts = {}
    first_tensor = {}  # parameter -> the layout its fills join
    for piece in result.pieces:
        if piece.param in quantized.scale_params:
            continue  # the agent writes the scales
        param = live[piece.param]
        layout = layouts.get(piece.tensor)
        if layout is None:
            layout = layouts[piece.tensor] = tensor_layout(piece.tensor, checkpoint_shapes[piece.tensor],
                                                           dtype_name(param.data, piece.param))
        layout.placements.add(box=layout_pb2.Box(lo=list(piece.lo), hi=list(piece.hi)), buffer=piece.param,
                              base=piece.base, strides=list(piece.strides))
        scales = quantized.scales.get(id(piece))
        if scales is not None:
            layout.block_scales.add(buffer=scales[0], base=scales[1], row_stride=scales[2])
        first_tensor.setdefault(piece.param, layout)
    for fill in result.fills:
        if fill.param in first_tensor:
            first_tensor[fill.param].fills.add(buffer=fill.param, base=fill.base, shape=list(fill.shape),
                                               strides=list(fill.strides))
    return buffers, list(layouts.values())


class _installed:
    """Puts `params` ({name: parameter}) in their modules' places for a `with` block and
    `live` back after it, also on error, where the two differ."""

    def __init__(self, model, params, live):
        self._model = model
        self._swaps = [(name, params[name], live[name]) for name in live if params[name] is not live[name]]

    def _put(self, which):
        for swap in self._swaps:
            owner, _, leaf = swap[0].rpartition(".")
            self._model.get_submodule(owner)._parameters[leaf] = swap[which]

    def __enter__(self):
        self._put(1)

    def __exit__(self, *_):
        self._put(2)


BLOCK = 128  # rows and columns of a float8 quantization block


class _Quantized:
    def __init__(self):
        self.scale_params = set()  # parameters that hold scales
        self.scales = {}           # id(piece) -> (scale parameter, base, row stride)


def _block_scales(result, live, checkpoint_shapes):
    """Where the agent writes each block's scale, for every piece of a float8 parameter;
    refuses, by name, a piece whose blocks are not whole blocks of both the checkpoint
    tensor and the parameter (the engine scales each parameter block by one number)."""
    out = _Quantized()
    float8 = {name for name, p in live.items() if p.dtype == getattr(torch, "float8_e4m3fn", None)}
    if not float8:
        return out
    scale_of = {}  # scale parameter -> {flat index: (checkpoint tensor, row, col)}
    for piece in result.pieces:
        if piece.param.endswith("_scale_inv") and piece.param[:-len("_scale_inv")] in float8:
            scale_of.setdefault(piece.param, {}).update(_elements(piece))
    for name in sorted(float8):
        scale_name = name + "_scale_inv"
        weight, scale = live[name], live.get(scale_name)
        rows, cols = weight.shape if weight.dim() == 2 else (0, 0)
        grid = (-(-rows // BLOCK), -(-cols // BLOCK))
        if (weight.dim() != 2 or scale is None or scale.dtype != torch.float32 or tuple(scale.shape) != grid
                or not scale.is_contiguous()):
            raise ProbeError(f"float8 parameter '{name}' {list(weight.shape)} needs '{scale_name}', float32 "
                             f"{list(grid)}, contiguous, one scale per {BLOCK} x {BLOCK} block; found "
                             f"{'none' if scale is None else f'{scale.dtype} {list(scale.shape)}'}")
        out.scale_params.add(scale_name)
    written = {}
    for piece in result.pieces:
        if piece.param not in float8:
            continue
        scale_name = piece.param + "_scale_inv"
        base, row_stride = _piece_scales(piece, live[piece.param].shape, checkpoint_shapes,
                                         scale_of.get(scale_name, {}))
        out.scales[id(piece)] = (scale_name, base, row_stride)
        written[scale_name] = written.get(scale_name, 0) + _blocks(piece)
    for fill in result.fills:
        if fill.param in float8:
            raise ProbeError(f"float8 parameter '{fill.param}' has elements no checkpoint element reaches: their "
                             "blocks would have no scale")
    for scale_name in sorted(out.scale_params):
        if written.get(scale_name, 0) != live[scale_name].numel():
            raise ProbeError(f"'{scale_name}' has {live[scale_name].numel()} scales but the checkpoint's tensors "
                             f"fill {written.get(scale_name, 0)} blocks of its parameter")
    return out


def _elements(piece):
    """{flat index in the parameter: (checkpoint tensor, row, col)} of a 2-D piece."""
    (r0, c0), (r1, c1) = piece.lo, piece.hi
    return {piece.base + (r - r0) * piece.strides[0] + (c - c0) * piece.strides[1]: (piece.tensor, r, c)
            for r in range(r0, r1) for c in range(c0, c1)}


def _blocks(piece):
    (r0, c0), (r1, c1) = piece.lo, piece.hi
    return -(-(r1 - r0) // BLOCK) * -(-(c1 - c0) // BLOCK)


def _piece_scales(piece, param_shape, checkpoint_shapes, scale_elements):
    """(base, row stride) of a float8 piece's scales in its parameter's scale grid, after
    checking that its blocks are whole blocks on both sides and that the loader puts the
    checkpoint's scale of each block there."""
    what = f"checkpoint tensor '{piece.tensor}' in float8 parameter '{piece.param}'"
    if len(piece.lo) != 2:
        raise ProbeError(f"{what}: only 2-D tensors are quantized in blocks")
    (r0, c0), (r1, c1) = piece.lo, piece.hi
    rows, cols = param_shape
    tensor_rows, tensor_cols = checkpoint_shapes[piece.tensor]
    param_row, param_col = divmod(piece.base, cols)
    if r1 - r0 > 1 and piece.strides[0] != cols:
        raise ProbeError(f"{what}: rows {piece.strides[0]} elements apart in a parameter of {cols} columns")
    if piece.strides[1] != 1:
        raise ProbeError(f"{what}: strided columns")
    whole = (r0 % BLOCK == 0 and c0 % BLOCK == 0 and param_row % BLOCK == 0 and param_col % BLOCK == 0 and
             ((r1 - r0) % BLOCK == 0 or (r1 == tensor_rows and param_row + r1 - r0 == rows)) and
             ((c1 - c0) % BLOCK == 0 or (c1 == tensor_cols and param_col + c1 - c0 == cols)))
    if not whole:
        raise ProbeError(f"{what}: rows [{r0}, {r1}) x columns [{c0}, {c1}) at parameter row {param_row}, column "
                         f"{param_col} cut a {BLOCK} x {BLOCK} block of the checkpoint or of the parameter")
    grid_cols = -(-cols // BLOCK)
    base = param_row // BLOCK * grid_cols + param_col // BLOCK
    scale_tensor = piece.tensor + "_scale_inv"
    for i in range(-(-(r1 - r0) // BLOCK)):
        for j in range(-(-(c1 - c0) // BLOCK)):
            found = scale_elements.get(base + i * grid_cols + j)
            expected = (scale_tensor, r0 // BLOCK + i, c0 // BLOCK + j)
            if found != expected:
                raise ProbeError(f"{what}: the loader puts {_named(found)} where the scale of block {list(expected[1:])} "
                                 f"belongs, not {_named(expected)}")
    return base, grid_cols


def _named(element):
    return "nothing" if element is None else f"'{element[0]}' element {list(element[1:])}"


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
