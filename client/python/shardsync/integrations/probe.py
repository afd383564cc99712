"""Where a framework's own weight-loading code puts each checkpoint element, learned by
running that code once on encoded values: never a second copy of its rules.

Every parameter's memory is swapped, for the duration of the probe, for a float64 CPU
tensor of zeros; the loader is then given each checkpoint tensor filled with codes:
element k of the n-th tensor is number ``g = offset[n] + k + 1``, encoded as
``g * 256 + check(g)`` with an 8-bit hash ``check`` (exact in float64 up to 2^45
elements in all). Afterwards each parameter element holds the code of the checkpoint
element it was loaded from, or 0 where no checkpoint element reached it (padding, which
becomes an explicit zero fill). A value that is no code (not whole, out of range, or
failing its check, as a scaled, summed or converted value does) means the loader
computed it rather than copied it: that parameter is refused by name. The parameters' own memory is
never written, and each gets its data back when the probe ends, also on error. Beside
the probes (8 bytes a parameter element) it makes each checkpoint tensor's codes as the
loader asks for it and reads the probes back a block of rows at a time.

Layer by layer: the loader runs once per layer (names grouped by their first numbered
component, ``layers.5``; the rest, embeddings, final norm and head, together), given
only that layer's checkpoint tensors, with only that layer's parameters probed; every
other parameter is a trap, one cell seen through strides of 0, into which any write of
more than one element raises and any other changes the cell. So the probes of one layer
are alive at a time. A loader that writes another layer's parameter (the trap raises or
changes), or reads one into its own (the trap's value arrives), is found, and then the
probe runs once more with every parameter probed at once; the result says why. Both
ways give the same result for a loader whose writes follow from the tensors it is
given, whatever else it was given before or beside them.

The result is compressed into boxes: runs along a parameter's last axis that take
consecutive elements of one checkpoint row, stacked into 2-D boxes where consecutive
runs take consecutive rows at a fixed distance.
"""

from typing import Any, Callable, Container, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple
from dataclasses import dataclass, field
import bisect
import logging
import math
import os
import re
import tempfile

import numpy as np
import torch

__all__ = ["CHECK_BITS", "CHUNK_ELEMENTS", "FillRegion", "Piece", "ProbeError", "ProbeResult", "encode", "layer_of",
           "probe"]

_LOG = logging.getLogger(__name__)


class ProbeError(ValueError):
    """A loader that does not copy checkpoint elements, or a probe that cannot run."""


@dataclass
class Piece:
    """Box [lo, hi) of checkpoint tensor `tensor` lies in parameter `param` at element
    `base`, axis k of the box stepping `strides[k]` elements (row-major of the box)."""
    tensor: str
    lo: tuple
    hi: tuple
    param: str
    base: int
    strides: tuple


@dataclass
class FillRegion:
    """Elements of `param` no checkpoint element reaches: `shape` at `base`, `strides`."""
    param: str
    base: int
    shape: tuple
    strides: tuple


@dataclass
class ProbeResult:
    pieces: list = field(default_factory=list)    # Piece
    fills: list = field(default_factory=list)     # FillRegion
    unreached: list = field(default_factory=list)  # parameters no checkpoint element reaches
    passes: int = 1                                # times the loader ran: once per layer, or once
    one_pass_because: Optional[str] = None         # why the probe went back to one pass, if it did


CHECK_BITS = 8


# Elements read back at a time, and at most encoded at a time: what the probe adds to
# the memory of the parameters' probes and of one checkpoint tensor is bounded by this,
# not by a tensor.
CHUNK_ELEMENTS = 1 << 18
# Codes are made fewer at a time: the arrays of the arithmetic stay in a core's cache.
_ENCODED_AT_ONCE = 1 << 14


def _check(numbers: np.ndarray) -> np.ndarray:
    """The 8-bit check of element numbers (int64 array, non-negative): a multiplicative
    hash's top bits."""
    mixed = numbers.view(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    mixed >>= np.uint64(64 - CHECK_BITS)
    return mixed.view(np.int64)


def encode(numbers: np.ndarray, out: Optional[np.ndarray] = None) -> np.ndarray:
    """Codes (float64) of element numbers (int64 array, from 1); written into `out` (a
    float64 array of their size) when given."""
    codes = numbers << CHECK_BITS
    codes += _check(numbers)
    if out is None:
        return codes.astype(np.float64)
    out[...] = codes
    return out


_LAYER = re.compile(r"(?:^|\.)([^.]+\.\d+)(?:\.|$)")


def layer_of(name: str) -> str:
    """The layer a parameter or checkpoint tensor belongs to: its first component
    followed by a number (``layers.5`` of ``model.layers.5.mlp.up_proj.weight``); "" for
    a name with none (embeddings, final norm, head)."""
    found = _LAYER.search(name)
    return found.group(1) if found else ""


def probe(params: Mapping[str, torch.Tensor], shapes: Mapping[str, Sequence[int]],
          load: Callable[[Iterable[Tuple[str, torch.Tensor]]], Any],
          buffers: Optional[Mapping[str, torch.Tensor]] = None, probe_dir: Optional[str] = None,
          by_layer: bool = True) -> ProbeResult:
    """Runs `load(weights)` with `params` ({name: Parameter}) swapped for float64
    probes; `weights` iterates (checkpoint name, tensor) over `shapes` ({name: shape}):
    once per layer (`by_layer`, the module's docstring), or once with every parameter
    probed. The floating-point tensors of `buffers` ({name: tensor}, a module's
    named_buffers()) are swapped too: a loader that writes one is refused (a buffer is
    no registered target). `probe_dir`: a folder on disk where the probes and the codes
    live as files (mapped, and removed as soon as they are), so that the kernel can
    write them out instead of the process running out of memory; None keeps them in
    memory. Returns a ProbeResult naming parameters by their keys in `params`, in their
    order."""
    if probe_dir is not None:
        _check_probe_dir(probe_dir)
    run = _Run(params, _Checkpoint(shapes), load, buffers or {}, probe_dir)
    passes, whole = _layers(params, shapes), [(list(params), list(shapes))]
    if by_layer and len(passes) > 1:
        try:
            return run.run(passes)
        except _Crossed as crossed:
            why = str(crossed)
            _LOG.warning("shardsync probe: %s; probing every parameter at once", why)
            result = run.run(whole)
            result.one_pass_because = why
            return result
    return run.run(whole)


def _layers(params: Mapping[str, Any], shapes: Mapping[str, Any]) -> List[Tuple[List[str], List[str]]]:
    """(parameters, checkpoint tensors) of each layer (layer_of), in checkpoint order."""
    layers: Dict[str, Tuple[List[str], List[str]]] = {}
    for name in shapes:
        layers.setdefault(layer_of(name), ([], []))[1].append(name)
    for name in params:
        layers.setdefault(layer_of(name), ([], []))[0].append(name)
    return list(layers.values())


def _given(tensors: Sequence[str]) -> str:
    """The checkpoint tensors of one pass by layer, in words."""
    layer = layer_of(tensors[0]) if tensors else ""
    return f"layer '{layer}'" if layer else "the tensors outside the layers"


class _Crossed(Exception):
    """In a pass by layer, the loader touched a parameter of another layer."""


# A trap's cell: a quiet NaN no loader writes by chance, compared bit for bit.
_TRAP_BITS = 0x7FF8_5348_4152_4453


class _Run:
    """One probe: its inputs, and passes of the loader over them."""

    def __init__(self, params: Mapping[str, torch.Tensor], checkpoint: "_Checkpoint",
                 load: Callable[[Iterable[Tuple[str, torch.Tensor]]], Any], buffers: Mapping[str, torch.Tensor],
                 probe_dir: Optional[str]) -> None:
        self.params, self.checkpoint = params, checkpoint
        self.load, self.probe_dir = load, probe_dir
        self.buffers = {name: b for name, b in buffers.items() if b.is_floating_point()}
        self.names = list(params)
        self.index = {name: index for index, name in enumerate(self.names)}

    def run(self, passes: Sequence[Tuple[List[str], List[str]]]) -> ProbeResult:
        """Runs the loader once per (parameters probed, checkpoint tensors given), every
        other parameter a trap (a cell of its own); with more than one pass, raises
        _Crossed where a pass touched a trap. Every parameter and buffer gets its data
        back, also on error."""
        layered = len(passes) > 1
        originals = {("param", n): p.data for n, p in self.params.items()}
        originals.update({("buffer", n): b.data for n, b in self.buffers.items()})
        cells = torch.full((len(self.names),), _TRAP_BITS, dtype=torch.int64)
        of_param: Dict[str, ProbeResult] = {}
        try:
            for name, buffer in self.buffers.items():
                buffer.data = _zeros(buffer.shape, self.probe_dir)
            for index, name in enumerate(self.names):
                self.params[name].data = self._trap(cells, index)
            for probed, tensors in passes:
                for name in probed:
                    self.params[name].data = _zeros(self.params[name].shape, self.probe_dir)
                try:
                    self.load(self.checkpoint.encoded(tensors, self.probe_dir))
                except Exception as error:
                    if not layered:
                        raise
                    raise _Crossed(f"the loader failed given {_given(tensors)} alone ({type(error).__name__}: "
                                   f"{error})") from None
                self._check_traps(cells, set(probed), tensors)
                self._check_buffers()
                values = {name: self.params[name].data.numpy() for name in probed}  # keeps the probes alive
                for name in probed:
                    self.params[name].data = self._trap(cells, self.index[name])
                for name in probed:
                    of_param[name] = self._read(name, values.pop(name), layered)  # each probe goes once read
        finally:
            for (kind, name), data in originals.items():
                (self.params if kind == "param" else self.buffers)[name].data = data
        result = ProbeResult(passes=len(passes))
        for name in self.names:
            one = of_param[name]
            result.pieces += one.pieces
            result.fills += one.fills
            result.unreached += one.unreached
        return result

    def _trap(self, cells: torch.Tensor, index: int) -> torch.Tensor:
        """Parameter `index`'s trap: its cell seen in the parameter's shape through
        strides of 0."""
        shape = tuple(self.params[self.names[index]].shape)
        return cells.view(torch.float64).as_strided(shape, (0,) * len(shape), index)

    def _check_traps(self, cells: torch.Tensor, probed: Container[str], tensors: Sequence[str]) -> None:
        """Every parameter not in `probed` still holds its trap, its cell unchanged."""
        changed = torch.nonzero(cells != _TRAP_BITS).flatten().tolist()
        if changed:
            raise _Crossed(f"the loader wrote parameter '{self.names[changed[0]]}' given {_given(tensors)}")
        first = cells.data_ptr()
        for index, name in enumerate(self.names):
            data = self.params[name].data
            if name not in probed and (data.data_ptr() != first + 8 * index or any(data.stride())):
                raise _Crossed(f"the loader wrote parameter '{name}' given {_given(tensors)}")

    def _check_buffers(self) -> None:
        for name, buffer in self.buffers.items():
            if bool((buffer.data != 0).any()):
                raise ProbeError(f"the loader writes buffer '{name}', which is no parameter: shardsync would not "
                                 "update it")

    def _read(self, name: str, values: Any, layered: bool) -> ProbeResult:
        """One parameter's pieces and fills from its probe; in a pass by layer, a value
        read from a trap (NaN) is _Crossed."""
        one = ProbeResult()
        try:
            _compress(name, values, self.checkpoint, one)
        except ProbeError:
            if layered and bool(np.isnan(values).any()):
                raise _Crossed(f"the loader put a value into parameter '{name}' that it read from a parameter of "
                               "another layer") from None
            raise
        return one


def _zeros(shape: Sequence[int], probe_dir: Optional[str]) -> torch.Tensor:
    """A float64 CPU tensor of zeros: in memory, or in a file of `probe_dir` that is
    removed once mapped (its pages stay until the tensor goes). The file's blocks are
    allocated first: a full disk is refused here, not met by a write into the mapping
    (SIGBUS)."""
    count = math.prod(shape)
    if probe_dir is None or count == 0:
        return torch.zeros(shape, dtype=torch.float64)
    fd, path = tempfile.mkstemp(dir=probe_dir, prefix="shardsync-probe-")
    try:
        try:
            os.posix_fallocate(fd, 0, count * 8)
        except OSError as error:
            raise ProbeError(f"probe_dir '{probe_dir}' has no room for a probe of {count * 8} bytes: "
                             f"{error.strerror}") from None
        finally:
            os.close(fd)
        return torch.from_file(path, shared=True, size=count, dtype=torch.float64).reshape(shape)
    finally:
        os.unlink(path)


def _check_probe_dir(probe_dir: str) -> None:
    """Refuses a `probe_dir` that is no folder, or whose files live in memory (tmpfs,
    ramfs), by name."""
    if not os.path.isdir(probe_dir):
        raise ProbeError(f"probe_dir '{probe_dir}' is no folder")
    path = os.path.realpath(probe_dir)
    mount, kind = "/", ""
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:  # fields: ... mount point (5th) ... - type source options
            fields = line.split()
            point = fields[4].replace("\\040", " ")
            inside = path == point or path.startswith(point.rstrip("/") + "/")
            if inside and len(point) >= len(mount):
                mount, kind = point, fields[fields.index("-") + 1]
    if kind in ("tmpfs", "ramfs"):
        raise ProbeError(f"probe_dir '{probe_dir}' is on {kind} ({mount}), whose files are memory: name a folder on "
                         "disk")


def _decode(param_name: str, flat: Any, total: int, first: int) -> Any:
    """Element numbers (int64, 0 where nothing was loaded) of probe values `flat`, the
    parameter's elements from `first` on; refuses a value that is no checkpoint
    element's code."""
    with np.errstate(invalid="ignore"):  # NaN and infinities: any integer, then not whole
        codes = flat.astype(np.int64)
    whole = (codes == flat) & (codes >= 0) & (codes < (total + 1) << CHECK_BITS)
    numbers = codes >> CHECK_BITS
    bad = ~whole | ((codes != 0) & ((numbers == 0) | (_check(numbers) != (codes & ((1 << CHECK_BITS) - 1)))))
    if bad.any():
        at = int(np.argmax(bad))
        raise ProbeError(f"the loader of parameter '{param_name}' wrote {flat[at]!r} at element {first + at}, which "
                         "is no checkpoint element's code: it changes values instead of copying them")
    return numbers


class _Stacker:
    """Stacks runs of equal length into 2-D regions: a run that continues a region (the
    next checkpoint row, at the region's distance) extends it; a region of one run takes
    the distance of the first run that continues it."""

    def __init__(self) -> None:
        self.regions: List[List[Any]] = []  # every region, in order: [head, base, rows, length, stride, first]
        self._single: Dict[Tuple[Any, int], List[Any]] = {}  # (head, next row) -> region of one run
        # (head, next row, next base) -> region of two or more runs
        self._stacked: Dict[Tuple[Any, int, int], List[Any]] = {}

    def add(self, head: Tuple[Any, ...], row: int, base: int, length: int, first: Any = None) -> None:
        """A run of `length` at `base`, row `row` of what `head` names; `first` is kept
        for the region it starts."""
        region = self._stacked.pop((head, row, base), None)
        if region is None:
            single = self._single.get((head, row))
            if single is not None and base > single[1]:
                del self._single[(head, row)]
                region, single[4] = single, base - single[1]
        if region is None:
            region = [head, base, 1, length, None, first]
            self.regions.append(region)
            self._single[(head, row + 1)] = region
            return
        region[2] += 1
        self._stacked[(head, row + 1, region[1] + region[4] * region[2])] = region


class _Checkpoint:
    """The checkpoint's tensors in order: the numbers of their elements, their codes,
    and what the probe's read-back looks up."""

    def __init__(self, shapes: Mapping[str, Sequence[int]]) -> None:
        self.names = list(shapes)
        self.shapes = [tuple(shapes[n]) for n in self.names]
        self.first_elements: List[int] = []  # of each tensor (from 0), ascending
        self.total = 0
        for shape in self.shapes:
            self.first_elements.append(self.total)
            self.total += math.prod(shape)
        if (self.total + 1) << CHECK_BITS >= 2 ** 53:
            raise ProbeError(f"{self.total} checkpoint elements: their codes would pass 2^53, past float64's whole "
                             "numbers")
        self.index = {name: t for t, name in enumerate(self.names)}
        self.last_axes = [shape[-1] if shape else 1 for shape in self.shapes]  # a checkpoint row's length

    def encoded(self, names: Sequence[str], probe_dir: Optional[str]) -> Iterator[Tuple[str, torch.Tensor]]:
        """(name, float64 tensor of codes) of tensors `names`, each made when asked for:
        in memory, or in a file of `probe_dir` (as _zeros)."""
        for name in names:
            t = self.index[name]
            start, count = self.first_elements[t] + 1, math.prod(self.shapes[t])
            codes = np.empty(count, dtype=np.float64) if probe_dir is None else _zeros((count,), probe_dir).numpy()
            step = min(CHUNK_ELEMENTS, _ENCODED_AT_ONCE)
            for at in range(0, count, step):
                end = min(at + step, count)
                encode(np.arange(start + at, start + end, dtype=np.int64), codes[at:end])
            yield name, torch.from_numpy(codes).reshape(self.shapes[t])


def _compress(param_name: str, values: Any, checkpoint: _Checkpoint, result: ProbeResult) -> None:
    """Adds one parameter's pieces and fills to `result`, reading its probe `values` a
    block of rows at a time (runs never cross a row)."""
    names, first_elements, last_axes = checkpoint.names, checkpoint.first_elements, checkpoint.last_axes
    cols = values.shape[-1] if values.ndim else 1
    flat = values.reshape(-1)
    rows = flat.size // cols
    block = max(1, CHUNK_ELEMENTS // max(cols, 1))
    pieces, fills = _Stacker(), _Stacker()
    reached = False
    for row0 in range(0, rows, block):
        grid = _decode(param_name, flat[row0 * cols:min(rows, row0 + block) * cols], checkpoint.total,
                       row0 * cols).reshape(-1, cols)
        reached = reached or bool(grid.any())
        filled = grid == 0
        # Runs of consecutive checkpoint elements (and of fills) along a row; each is cut
        # below where a checkpoint row, and so a tensor, ends.
        breaks = np.ones(grid.shape, dtype=bool)
        breaks[:, 1:] = (filled[:, 1:] != filled[:, :-1]) | (~filled[:, 1:] & (grid[:, 1:] != grid[:, :-1] + 1))
        run_rows, run_starts = np.nonzero(breaks)
        ends = np.append(run_starts[1:], cols)
        ends[np.append(run_rows[1:] != run_rows[:-1], True)] = cols
        firsts = grid[run_rows, run_starts] - 1  # checkpoint elements (-1: a fill)
        for r, start, end, element in zip(run_rows.tolist(), run_starts.tolist(), ends.tolist(), firsts.tolist()):
            row = row0 + r
            if element < 0:
                fills.add(("fill", end - start), row, row * cols + start, end - start)
                continue
            while start < end:
                t = bisect.bisect_right(first_elements, element) - 1
                index = element - first_elements[t]
                length = min(end - start, last_axes[t] - index % last_axes[t])
                _add_run(pieces, t, checkpoint.shapes[t], index, row, row * cols + start, length)
                start, element = start + length, element + length
    if not reached:
        result.unreached.append(param_name)
        return
    for head, base, count, length, stride, coord in pieces.regions:
        name = names[head[0]]
        if len(coord) >= 2:
            hi = tuple(c + 1 for c in coord[:-2]) + (coord[-2] + count, coord[-1] + length)
            strides = (1,) * (len(coord) - 2) + (stride if stride is not None else length, 1)
        else:
            hi, strides = ((coord[0] + length,), (1,)) if coord else ((), ())
        result.pieces.append(Piece(name, coord, hi, param_name, base, strides))
    for _, base, count, length, stride, _ in fills.regions:
        result.fills.append(FillRegion(param_name, base, (count, length), (stride if stride is not None else cols, 1)))


def _add_run(pieces: _Stacker, tensor: int, shape: Sequence[int], index: int, row: int, base: int,
             length: int) -> None:
    """A run of `length` elements of checkpoint tensor `tensor` (of `shape`) from its
    element `index` on, at `base` in row `row` of the parameter: stacked along the
    checkpoint's second-to-last axis where it has one."""
    coord = []
    for size in reversed(shape):
        index, at = divmod(index, size)
        coord.append(at)
    coord.reverse()
    if len(coord) >= 2:
        pieces.add((tensor, tuple(coord[:-2]), coord[-1], length), coord[-2], base, length, tuple(coord))
    else:
        pieces.regions.append([(tensor,), base, 1, length, None, tuple(coord)])
