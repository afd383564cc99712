"""Engine adapters: an inference engine's live parameters (their memory, no copy, no new
arena) registered as shardsync targets.

``loader_targets`` learns where each checkpoint element lands by running the engine's
own weight-loading code once on encoded values (shardsync.integrations.probe); rows no
checkpoint element reaches (padded vocabulary) become zero fills. ``module_targets`` is
for a module whose parameters are the checkpoint's tensors (a Hugging Face model on one
device). ``EngineTarget`` keeps the registration through the engine's lifecycle.
"""

import contextlib
import weakref
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

import torch

from shardsync import layout_pb2
from shardsync.client import AgentClient
from shardsync.integrations.memory import tensor_buffer
from shardsync.integrations.probe import FillRegion, Piece, ProbeError, ProbeResult, probe
from shardsync.integrations.sources import Described, Registered, dtype_name, module_sources
from shardsync.layouts import tensor_layout

__all__ = ["BLOCK", "SCALES", "EngineTarget", "float8_names", "loader_targets", "module_targets", "piece_scales"]


def loader_targets(model: torch.nn.Module, load_weights: Callable[[Iterable[Tuple[str, torch.Tensor]]], Any],
                   checkpoint_shapes: Mapping[str, Sequence[int]],
                   created: Optional[Mapping[str, torch.Tensor]] = None, probe_dir: Optional[str] = None,
                   by_layer: bool = True) -> Described:
    """(buffers, layouts) of `model`'s parameters as `load_weights` (the engine's own
    loader: an iterable of (checkpoint name, full tensor) -> None) fills them from a
    checkpoint of `checkpoint_shapes` ({name: shape}). A parameter no checkpoint element
    reaches is left out. Raises ProbeError for a loader that changes values or writes a
    checkpoint element into a buffer (no target).

    `created` ({parameter name: a CPU tensor of the class, attributes, shape, strides and
    dtype the engine created that parameter with}) is for an engine whose loaders no
    longer run on its live parameters once it has processed them after loading (vLLM's
    quantized layers): the probe puts each in its module's place while the loader runs,
    then puts the live ones back. A live parameter unlike its created one, and a created
    one the loader writes but the engine dropped, are refused by name.

    A float8_e4m3fn parameter of two axes is a block-quantized target: its float32
    ``<name>_scale_inv`` (vLLM's ``weight_scale_inv``: one scale per 128 x 128 block,
    row-major) is filled by the agent, not synced; where the loader puts the
    checkpoint's ``<tensor>_scale_inv`` says which scale belongs to which block.

    The probe takes host memory for a float64 copy of the parameters of one layer at a
    time (`by_layer`; False: of all at once); `probe_dir` (a folder on disk) keeps that
    copy in files the kernel can write out instead (shardsync.integrations.probe.probe).
    Its result is kept per model and reused while the parameters' names, classes,
    shapes, strides and dtypes, the checkpoint's shapes and the loader's function stay
    the same: registering again after the memory moved runs no loader."""
    live = dict(model.named_parameters())
    params = dict(live)
    if created is not None:
        for name, param in created.items():
            if name in live and (param.shape, param.stride(), param.dtype) != (
                    live[name].shape, live[name].stride(), live[name].dtype):
                raise ProbeError(f"parameter '{name}' is {_described(live[name])} in the engine but was created "
                                 f"{_described(param)}: its memory no longer has the layout its loader writes")
        params.update(created)
    key = _probe_key(params, checkpoint_shapes, load_weights)
    kept = _probed.get(model)
    if kept is not None and kept[0] == key:
        result = kept[1]
    else:
        with _installed(model, params, live) as replaced:
            result = probe(params, checkpoint_shapes, load_weights, dict(model.named_buffers()), probe_dir, by_layer)
        if replaced:
            raise ProbeError(f"the loader replaces parameter(s) {', '.join(repr(n) for n in sorted(replaced))} with "
                             "new tensors instead of writing into them: shardsync cannot learn where their elements "
                             "go (the model's own parameters are back in place)")
        _probed[model] = (key, result)
    for piece in result.pieces:
        if piece.param not in live:
            raise ProbeError(f"the loader puts checkpoint tensor '{piece.tensor}' into parameter '{piece.param}', "
                             "which the engine no longer has after loading")
    scales = _block_scales(result.pieces, result.fills, live, checkpoint_shapes)
    used = {p.param for p in result.pieces}
    buffers = {name: tensor_buffer(live[name].data) for name in live if name in used}
    layouts: Dict[str, layout_pb2.TensorLayout] = {}
    first_tensor: Dict[str, layout_pb2.TensorLayout] = {}  # parameter -> the layout its fills join
    for index, piece in enumerate(result.pieces):
        if piece.param in scales.holders:
            continue  # the agent writes the scales
        param = live[piece.param]
        layout = layouts.get(piece.tensor)
        if layout is None:
            layout = layouts[piece.tensor] = tensor_layout(piece.tensor, checkpoint_shapes[piece.tensor],
                                                           dtype_name(param.data, piece.param))
        layout.placements.add(box=layout_pb2.Box(lo=list(piece.lo), hi=list(piece.hi)), buffer=piece.param,
                              base=piece.base, strides=list(piece.strides))
        if index in scales.of_piece:
            buffer, base, row_stride = scales.of_piece[index]
            layout.block_scales.add(buffer=buffer, base=base, row_stride=row_stride)
        first_tensor.setdefault(piece.param, layout)
    for fill in result.fills:
        if fill.param in first_tensor:
            first_tensor[fill.param].fills.add(buffer=fill.param, base=fill.base, shape=list(fill.shape),
                                               strides=list(fill.strides))
    return buffers, list(layouts.values())


# The last probe of each model and what it depended on: registering again after the
# model's memory moved (offload and reload, sleep and wake) reuses it.
_probed: "weakref.WeakKeyDictionary[torch.nn.Module, Tuple[Any, ProbeResult]]" = weakref.WeakKeyDictionary()


def _probe_key(params: Mapping[str, torch.Tensor], checkpoint_shapes: Mapping[str, Sequence[int]],
               load_weights: Any) -> Any:
    """What a probe's result depends on: each parameter's name, class, shape, strides and
    dtype (not its memory), the checkpoint's shapes, the loader's function (not by_layer
    nor probe_dir: the same result either way)."""
    return (tuple((name, type(p), tuple(p.shape), p.stride(), p.dtype) for name, p in params.items()),
            tuple((name, tuple(shape)) for name, shape in checkpoint_shapes.items()),
            getattr(load_weights, "__func__", load_weights))


def _described(tensor: torch.Tensor) -> str:
    return f"{list(tensor.shape)} {tensor.dtype} with strides {list(tensor.stride())}"


@contextlib.contextmanager
def _installed(model: torch.nn.Module, params: Mapping[str, torch.Tensor], live: Mapping[str, torch.Tensor]) -> Any:
    """`params` ({name: parameter}) in their modules' places for a `with` block, which
    gets a list: the names whose parameter the block replaced with another object. Then
    the `live` ones back, those with no live one removed, and the replaced ones too,
    also on error."""
    def module_of(name: str) -> Tuple[torch.nn.Module, str]:
        owner, _, leaf = name.rpartition(".")
        return model.get_submodule(owner), leaf

    def put(name: str, param: Optional[torch.Tensor]) -> None:
        module, leaf = module_of(name)
        if param is None:
            module._parameters.pop(leaf, None)
        else:
            module._parameters[leaf] = param
    swapped = [name for name, param in params.items() if live.get(name) is not param]
    replaced: List[str] = []
    try:
        for name in swapped:
            put(name, params[name])
        yield replaced
    finally:
        for name, param in params.items():
            module, leaf = module_of(name)
            if module._parameters.get(leaf) is not param:
                replaced.append(name)
        for name in sorted(set(swapped) | set(replaced)):
            put(name, live.get(name))


BLOCK = 128  # rows and columns of a float8 quantization block
SCALES = "_scale_inv"  # a float8 tensor's name plus this names its block scales (vLLM's weight_scale_inv)


def float8_names(tensors: Mapping[str, torch.Tensor]) -> List[str]:
    """The names of the float8_e4m3fn tensors of `tensors` ({name: tensor}), sorted."""
    float8 = getattr(torch, "float8_e4m3fn", None)  # torch >= 2.1
    return sorted(name for name, tensor in tensors.items() if tensor.dtype == float8)


def _blocks(n: int) -> int:
    """Blocks that cover `n` rows or columns."""
    return -(-n // BLOCK)


class _BlockScales:
    def __init__(self) -> None:
        self.holders: Set[str] = set()  # parameters that hold scales
        self.of_piece: Dict[int, Tuple[str, int, int]] = {}  # piece index -> (scale parameter, base, row stride)


def _block_scales(pieces: Sequence[Piece], fills: Sequence[FillRegion], live: Mapping[str, torch.Tensor],
                  checkpoint_shapes: Mapping[str, Sequence[int]]) -> _BlockScales:
    """Where the agent writes each block's scale, for every piece of a float8 parameter;
    refuses, by name, a piece whose blocks are not whole blocks of both the checkpoint
    tensor and the parameter (the engine scales each parameter block by one number)."""
    out = _BlockScales()
    float8 = float8_names(live)
    for name in float8:
        weight, scale_name = live[name], name + SCALES
        scale = live.get(scale_name)
        if weight.dim() != 2:
            raise ProbeError(f"float8 parameter '{name}' {list(weight.shape)}: only float8 linear weights (two axes) "
                             "are registered, not float8 experts")
        grid = [_blocks(weight.shape[0]), _blocks(weight.shape[1])]
        if scale is None or scale.dtype != torch.float32 or list(scale.shape) != grid or not scale.is_contiguous():
            raise ProbeError(f"float8 parameter '{name}' {list(weight.shape)} needs '{scale_name}', float32 {grid}, "
                             f"contiguous: one scale per {BLOCK} x {BLOCK} block; found "
                             f"{'none' if scale is None else _described(scale)}")
        out.holders.add(scale_name)
    # scale parameter -> {flat index: (checkpoint tensor, row, col)}
    scale_elements: Dict[str, Dict[int, Tuple[str, int, int]]] = {}
    for piece in pieces:
        if piece.param in out.holders:
            scale_elements.setdefault(piece.param, {}).update(_elements(piece))
    for index, piece in enumerate(pieces):
        if piece.param in float8:
            scale_name = piece.param + SCALES
            base, row_stride = piece_scales(piece, tuple(live[piece.param].shape), checkpoint_shapes[piece.tensor],
                                            scale_elements.get(scale_name, {}))
            out.of_piece[index] = (scale_name, base, row_stride)
    for fill in fills:
        if fill.param in float8:
            raise ProbeError(f"float8 parameter '{fill.param}' has elements no checkpoint element reaches: their "
                             "blocks would have no scale")
    return out


def _elements(piece: Piece) -> Dict[int, Tuple[str, int, int]]:
    """{flat index in the parameter: (checkpoint tensor, row, col)} of a 2-D piece."""
    if len(piece.lo) != 2:
        raise ProbeError(f"the loader puts {len(piece.lo)}-D checkpoint tensor '{piece.tensor}' into scale "
                         f"parameter '{piece.param}'; block scales are 2-D")
    (r0, c0), (r1, c1) = piece.lo, piece.hi
    return {piece.base + (r - r0) * piece.strides[0] + (c - c0) * piece.strides[1]: (piece.tensor, r, c)
            for r in range(r0, r1) for c in range(c0, c1)}


def piece_scales(piece: Piece, param_shape: Sequence[int], tensor_shape: Sequence[int],
                 scale_elements: Mapping[int, Tuple[str, int, int]]) -> Tuple[int, int]:
    """(base, row stride) of a float8 piece's scales in its parameter's grid of block
    scales, after checking that its blocks are whole blocks of the checkpoint tensor (of
    `tensor_shape`) and of the parameter (of `param_shape`) and that `scale_elements`
    ({flat index in the grid: (checkpoint tensor, row, col)}, where the loader put the
    checkpoint's scales) holds the checkpoint's scale of each block there."""
    what = f"checkpoint tensor '{piece.tensor}' in float8 parameter '{piece.param}'"
    if len(piece.lo) != 2:
        raise ProbeError(f"{what}: only 2-D tensors are quantized in blocks")
    (r0, c0), (r1, c1) = piece.lo, piece.hi
    rows, cols = param_shape
    param_row, param_col = divmod(piece.base, cols)
    if r1 - r0 > 1 and piece.strides[0] != cols:
        raise ProbeError(f"{what}: rows {piece.strides[0]} elements apart in a parameter of {cols} columns")
    if piece.strides[1] != 1:
        raise ProbeError(f"{what}: strided columns")
    whole = (r0 % BLOCK == 0 and c0 % BLOCK == 0 and param_row % BLOCK == 0 and param_col % BLOCK == 0 and
             ((r1 - r0) % BLOCK == 0 or (r1 == tensor_shape[0] and param_row + r1 - r0 == rows)) and
             ((c1 - c0) % BLOCK == 0 or (c1 == tensor_shape[1] and param_col + c1 - c0 == cols)))
    if not whole:
        raise ProbeError(f"{what}: rows [{r0}, {r1}) x columns [{c0}, {c1}) at parameter row {param_row}, column "
                         f"{param_col} cut a {BLOCK} x {BLOCK} block of the checkpoint or of the parameter")
    row_stride = _blocks(cols)
    base = param_row // BLOCK * row_stride + param_col // BLOCK
    for i in range(_blocks(r1 - r0)):
        for j in range(_blocks(c1 - c0)):
            found = scale_elements.get(base + i * row_stride + j)
            expected = (piece.tensor + SCALES, r0 // BLOCK + i, c0 // BLOCK + j)
            if found != expected:
                raise ProbeError(f"{what}: the loader puts {_element(found)} where the scale of block "
                                 f"{list(expected[1:])} belongs, not {_element(expected)}")
    return base, row_stride


def _element(element: Optional[Tuple[str, int, int]]) -> str:
    return "nothing" if element is None else f"'{element[0]}' element {list(element[1:])}"


def module_targets(module: torch.nn.Module, rename: Optional[Callable[[str], str]] = None) -> Described:
    """(buffers, layouts) of every parameter of `module` whole, as targets: the layouts
    module_sources makes."""
    return module_sources(module, rename)


class EngineTarget(Registered):
    """An engine's weights registered with the agent of its device as targets, from
    construction until ``close()``.

    `describe()` returns (buffers, layouts), e.g. ``lambda: loader_targets(model,
    model.load_weights, shapes)``. Around each sync the orchestrator calls ``pause()``
    (runs `pause_engine`: no forward pass reads the weights while they change) and, once
    the sync succeeded, ``resume(version)`` with the sync's id (``SyncResponse.sync_id``):
    it runs `post_load` (the engine's step after loading weights, where it has one),
    keeps `version` in ``self.version`` and runs `resume_engine`. Without those callables
    both do nothing else, and the caller must keep forward passes off the weights during
    the sync itself. ``reregister()`` after the engine's memory moved.
    ``weight_version()`` is the agent's word: the id of the last sync that completed
    into these targets, None while they are invalid."""

    def __init__(self, agent: AgentClient, client_id: str, describe: Callable[[], Described], *,
                 pause_engine: Optional[Callable[[], Any]] = None, resume_engine: Optional[Callable[[], Any]] = None,
                 post_load: Optional[Callable[[], Any]] = None) -> None:
        self._pause, self._resume, self._post_load = pause_engine, resume_engine, post_load
        self.version: Optional[str] = None
        super().__init__(agent, client_id, "target", describe)

    def pause(self) -> None:
        if self._pause:
            self._pause()

    def resume(self, version: str) -> None:
        if self._post_load:
            self._post_load()
        self.version = version
        if self._resume:
            self._resume()

    def weight_version(self) -> Optional[str]:
        status = self._agent.status()
        return status.last_sync_id if status.target_valid and status.last_sync_id else None
