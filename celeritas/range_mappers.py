"""Range mappers: which part of a buffer a chunk of a kernel accesses.

A user-facing mapper is any callable ``(chunk: Subrange, buffer_shape) -> Subrange
| Box | Region``.  ``to_scheduler_mapper`` turns it into what the scheduler calls
(``(Box, shape) -> Region``), checking dimensionality and clipping to the buffer
so that errors name the task, the buffer and the mapper instead of failing deep
inside.  The built-in mappers raise bare ``RangeMapperError``s that say what is
wrong with the geometry; the wrapper prefixes the task and buffer, which only it
knows.
"""
from __future__ import annotations

import inspect
import operator
import os
import sys
import threading
from typing import Any, Callable, Sequence

import numpy as np

from scheduler.errors import GeometryError, RangeMapperError, exception_text
from scheduler.geometry import Box, Region, Subrange


class RangeMapper:
    """Base of the built-in mappers; ``__call__`` follows the user mapper signature."""

    name = "range_mapper"

    def __call__(self, chunk: Subrange, shape: tuple[int, ...]) -> Subrange | Box | Region:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"cl.{self.name}()"


class one_to_one(RangeMapper):
    name = "one_to_one"

    def __call__(self, chunk, shape):
        if len(chunk.offset) != len(shape):
            raise RangeMapperError(f"one_to_one maps each kernel index to the same buffer index, but the kernel "
                                   f"is {len(chunk.offset)}-D and the buffer {len(shape)}-D; the "
                                   f"dimensionalities must match")
        return chunk


class all(RangeMapper):  # noqa: A001 - the API name is cl.all
    name = "all"

    def __call__(self, chunk, shape):
        return Box.full(shape)


class fixed(RangeMapper):
    name = "fixed"

    def __init__(self, subrange: Subrange | Box | Region | tuple):
        if isinstance(subrange, tuple) and len(subrange) == 2:
            try:
                subrange = Subrange(*subrange)
            except GeometryError as exc:
                raise RangeMapperError(f"cl.fixed({subrange!r}): takes a Subrange, Box or Region, or an "
                                       f"(offset, range) pair of sequences ({exc})") from None
        if not isinstance(subrange, (Subrange, Box, Region)):
            raise RangeMapperError(f"cl.fixed takes a Subrange, Box or Region, got {type(subrange).__name__}")
        self.subrange = subrange

    def __call__(self, chunk, shape):
        return self.subrange

    def __repr__(self):
        return f"cl.fixed({self.subrange})"


def _integer(value, what: str) -> int:
    try:
        return operator.index(value)
    except TypeError:
        raise RangeMapperError(f"{what} must be an integer, got {value!r}") from None


class slice(RangeMapper):  # noqa: A001 - the API name is cl.slice
    """The chunk's extent in every dimension except ``dim``, where it spans the buffer."""

    name = "slice"

    def __init__(self, dim: int):
        self.dim = _integer(dim, "cl.slice dimension")

    def __call__(self, chunk, shape):
        if not 0 <= self.dim < len(shape):
            raise RangeMapperError(f"cl.slice({self.dim}) spans dimension {self.dim}, which a {len(shape)}-D "
                                   f"buffer does not have")
        off = list(chunk.offset[: len(shape)]) + [0] * (len(shape) - len(chunk.offset))
        rng = list(chunk.range[: len(shape)]) + [1] * (len(shape) - len(chunk.range))
        off[self.dim] = 0
        rng[self.dim] = shape[self.dim]
        return Subrange(off, rng)

    def __repr__(self):
        return f"cl.slice({self.dim})"


class neighborhood(RangeMapper):
    """The chunk grown by ``extent`` per dimension: a box, or a cross along the axes."""

    name = "neighborhood"

    def __init__(self, *extent: int | Sequence[int], shape: str = "bounding_box"):
        # one argument holding every extent: a tuple, a list or a 1-D numpy array
        if len(extent) == 1 and (isinstance(extent[0], (tuple, list))
                                 or (isinstance(extent[0], np.ndarray) and extent[0].ndim == 1)):
            extent = tuple(extent[0])
        if shape not in ("bounding_box", "along_axes"):
            raise RangeMapperError(f"cl.neighborhood shape must be 'bounding_box' or 'along_axes', got {shape!r}")
        for e in extent:   # (made at every submit of a stencil: plain ints take the short way)
            if type(e) is not int:
                extent = tuple([_integer(x, "cl.neighborhood extent") for x in extent])
                break
        if not extent or min(extent) < 0:
            raise RangeMapperError(f"cl.neighborhood needs non-negative extents, got {extent}")
        self.extent = extent
        self.shape = shape

    def __call__(self, chunk, shape):
        n = len(chunk.offset)
        if len(self.extent) != n:
            raise RangeMapperError(f"cl.neighborhood{self.extent} gives {len(self.extent)} extent(s) but the "
                                   f"kernel is {n}-D; give one extent per kernel dimension")
        lo = chunk.offset
        hi = tuple(o + r for o, r in zip(chunk.offset, chunk.range))
        if self.shape == "bounding_box" or n == 1:
            return Box(tuple(l - e for l, e in zip(lo, self.extent)), tuple(h + e for h, e in zip(hi, self.extent)), n)
        boxes = []
        for d in range(n):
            l2 = list(lo)
            h2 = list(hi)
            l2[d] -= self.extent[d]
            h2[d] += self.extent[d]
            boxes.append(Box(tuple(l2), tuple(h2), n))
        return Region(boxes)

    def __repr__(self):
        return f"cl.neighborhood({self.extent}, shape={self.shape!r})"


class transposed(RangeMapper):
    """Chunk (i, j) reads (j, i): reverses the dimensions."""

    name = "transposed"

    def __call__(self, chunk, shape):
        return Subrange(tuple(reversed(chunk.offset)), tuple(reversed(chunk.range)))


class even_split(RangeMapper):
    """Maps the chunk's relative position in the kernel range onto dimension 0 of the buffer.

    As Celerity splits: every kernel item gets ``rows // (items * granularity)`` granules;
    the whole granules left over go one each to the first items, and the rows that do
    not fill a granule to the last item (so only one chunk holds a misaligned part)."""

    name = "even_split"

    def __init__(self, granularity: int | None = None):
        self.granularity = 1 if granularity is None else _integer(granularity, "cl.even_split granularity")
        if self.granularity < 1:
            raise RangeMapperError(f"cl.even_split granularity must be >= 1, got {granularity!r}")

    def __call__(self, chunk, shape):
        g = getattr(chunk, "global_range", None) or chunk.range
        if not shape:
            return Box.full(shape)
        total = shape[0]
        items = g[0]
        if not items:    # (an empty kernel range: no chunk of it reads anything)
            return Subrange((0,) * len(shape), (0,) + tuple(shape[1:]))
        gran = self.granularity
        step = total // (items * gran) * gran            # rows every item gets
        rest = total - items * step                      # rows left over
        whole_rest = rest // gran * gran                 # ... in whole granules, one per item from the first
        offset = chunk.offset[0] - (getattr(chunk, "global_offset", None) or (0,))[0]
        n = chunk.range[0]
        before = min(whole_rest, offset * gran)          # leftover granules the items before this chunk took
        rows = n * step
        if rest > before:
            rows += min(n, (rest - before) // gran) * gran
            if offset + n == items:
                rows += rest % gran
        return Subrange((offset * step + before,) + (0,) * (len(shape) - 1), (rows,) + tuple(shape[1:]))


class ChunkView(Subrange):
    """The chunk a user mapper receives: a Subrange that also knows the kernel's global range."""

    __slots__ = ("global_range", "global_offset")

    def __init__(self, offset, range, global_range=None, global_offset=None):
        Subrange.__init__(self, offset, range)
        self.global_range = global_range
        self.global_offset = global_offset


def _arity(fn: Callable, memo: dict | None = None) -> int:
    """1 or 2 positional parameters; memoized per code object where a memo is given
    (inspect is slow on the submit path)."""
    if isinstance(fn, RangeMapper):
        return 2
    code = getattr(fn, "__code__", None)
    if code is not None and memo is not None:
        hit = memo.get(code)
        if hit is None:
            if len(memo) >= _WRAPPED_LIMIT:
                memo.clear()
            hit = memo[code] = _arity_slow(fn)
        return hit
    return _arity_slow(fn)


def _arity_slow(fn: Callable) -> int:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
        if any(p.kind == p.VAR_POSITIONAL for p in inspect.signature(fn).parameters.values()):
            return 2
        return len(params)
    except (TypeError, ValueError):
        return 2


def to_region(result: Any, dims: int, what: str = "the range mapper") -> Region:
    """Convert a mapper result to a Region of ``dims`` dimensions, or say what is wrong."""
    if isinstance(result, Subrange):
        if result.dims != dims:
            raise RangeMapperError(f"{what} returned a {result.dims}-D subrange for a {dims}-D buffer")
        return Region.from_box(result.box)
    if isinstance(result, Box):
        if result.dims != dims:
            raise RangeMapperError(f"{what} returned a {result.dims}-D box for a {dims}-D buffer")
        return Region.from_box(result)
    if isinstance(result, Region):
        if result.dims != dims and not result.empty:
            raise RangeMapperError(f"{what} returned a {result.dims}-D region for a {dims}-D buffer")
        return result.with_dims(dims)
    raise RangeMapperError(f"{what} returned {type(result).__name__}; a range mapper must return "
                           f"a cl.Subrange, cl.Box or cl.Region")


def describe(mapper: Any) -> str:
    """``cl.one_to_one()``, ``cl.neighborhood((1,), ...)``, or a user function's qualified name."""
    if isinstance(mapper, RangeMapper):
        return repr(mapper)
    name = getattr(mapper, "__qualname__", None)
    return name if isinstance(name, str) else repr(mapper)


_SUBMIT_FILES = tuple(os.sep + os.path.join("celeritas", f) for f in ("queue.py", "runtime.py"))


def submit_site() -> str | None:
    """``file:line`` of the program's ``submit`` call, when called on the submitting thread.

    Only computed when an error is being reported: the task id does not exist yet while
    the mappers are first evaluated, and a kernel name alone does not say which of
    several submits of one kernel failed, the line does.  On the scheduler thread (a
    mapper failing for one rank's chunk only) there is no such frame and this is None.
    """
    frame = sys._getframe(1)
    outer = None
    while frame is not None:
        code = frame.f_code
        if code.co_name == "submit" and code.co_filename.endswith(_SUBMIT_FILES):
            outer = frame
        frame = frame.f_back
    if outer is None or outer.f_back is None:
        return None
    path = outer.f_back.f_code.co_filename
    try:
        rel = os.path.relpath(path)
        if not rel.startswith(".."):
            path = rel
    except ValueError:   # another drive (Windows)
        pass
    return f"{path}:{outer.f_back.f_lineno}"


# Bounds of the memos a MapperWrappers keeps (see ``to_scheduler_mapper``).
_WRAPPED_LIMIT = 4096        # distinct (mapper, buffer, kernel geometry) combinations kept
_CHUNK_CACHE_LIMIT = 4096    # chunks remembered per wrapped mapper (128 ranks x 4 devices fit)


def _cache_key(mapper: Callable, names_memo: dict | None = None) -> tuple | None:
    """A hashable key that determines a mapper's results, or None when nothing does.

    The exact built-in classes qualify by their parameters (a user subclass may override
    ``__call__``).  A plain user function qualifies by its code and every value it can
    read besides its arguments (see ``_function_key``).  Anything else (callable objects,
    bound methods, functions that see a list, a dict or an array) may depend on state
    that changes between submissions, so it is never shared across tasks.
    """
    cls = type(mapper)
    if cls is _FunctionType:
        return _function_key(mapper, names_memo)
    if cls is one_to_one or cls is all or cls is transposed:
        return (cls,)
    if cls is neighborhood:
        return (cls, mapper.extent, mapper.shape)
    if cls is slice:
        return (cls, mapper.dim)
    if cls is even_split:
        return (cls, mapper.granularity)
    if cls is fixed:
        sr = mapper.subrange
        if isinstance(sr, Subrange):
            return (cls, Subrange, sr.offset, sr.range)
        if isinstance(sr, Box):
            return (cls, Box, sr.lo, sr.hi, sr.dims)
        return (cls, Region, sr.corners, sr.dims)
    return None


_FunctionType = type(_cache_key)
_SCALARS = frozenset([type(None), bool, int, float, complex, str, bytes, range])
_ModuleType = type(sys)
_BuiltinType = type(len)
# packages whose classes a mapper may name and still be keyed (their classes hold no state a
# mapper reads); a user class is opaque
_KNOWN_MODULES = frozenset({"builtins", "numpy", "math", "celeritas", "scheduler", "executor", "typing",
                            "collections", "itertools", "functools", "operator"})
_KEY_DEPTH = 4


def _function_key(fn, names_memo: dict | None = None, depth: int = 0) -> tuple | None:
    """A user function mapper's key: its code, defaults, closure cells and the globals its
    code names, each an immutable value, a function keyed the same way (a helper it calls),
    a module, or a class of Python, numpy or celeritas (by identity).

    Celerity's contract for range mappers is that they are deterministic functions of the
    chunk and of what they capture (every rank evaluates them, at any time); under it two
    such functions with equal keys map every chunk alike, so the wrapper is shared and
    steps that use one replay like steps with built-in mappers (``scheduler/replay.py``).
    A mapper built anew per submit from the same values (a closure in a loop) keys alike.
    """
    code = fn.__code__
    parts = [code]
    v = fn.__defaults__
    if v is not None:
        k = _value_key(v, depth, names_memo)
        if k is None:
            return None
        parts.append(k)
    v = fn.__kwdefaults__       # (None where the function has none)
    if v is not None:
        k = _value_key(tuple(sorted(v.items())), depth, names_memo)
        if k is None:
            return None
        parts.append(k)
    for cell in fn.__closure__ or ():
        try:
            v = cell.cell_contents
        except ValueError:   # (a cell not filled yet)
            return None
        t = type(v)
        if t in _SCALARS:    # (_value_key's first cases, without the call: most cells are ints
            parts.append((t, v))     # or a module the mapper's factory imported)
            continue
        if t is _ModuleType and depth <= _KEY_DEPTH:
            parts.append(v)
            continue
        k = _value_key(v, depth, names_memo)
        if k is None:
            return None
        parts.append(k)
    glob = fn.__globals__
    names = None if names_memo is None else names_memo.get(code)
    if names is None:
        names = _global_names(code)
        if names_memo is not None:
            if len(names_memo) >= _WRAPPED_LIMIT:
                names_memo.clear()
            names_memo[code] = names
    for name in names:
        if name in glob:
            v = glob[name]
            k = ("self",) if v is fn else _value_key(v, depth, names_memo)
            if k is None:
                return None
            parts.append((name, k))
    return (_FunctionType, tuple(parts))


def _global_names(code) -> tuple:
    """Names the code (and code nested in it) may look up as globals; attribute names are
    among them, which only adds unneeded (but harmless) parts to a key."""
    names = list(code.co_names)
    for c in code.co_consts:
        if type(c) is type(code):
            names.extend(_global_names(c))
    return tuple(names)


def _value_key(v, depth: int, names_memo: dict | None = None):
    """A hashable stand-in for an immutable value (types kept apart: 1, 1.0 and True
    differ to a mapper that formats or divides), or None."""
    t = type(v)
    if t in _SCALARS:
        return (t, v)
    if depth > _KEY_DEPTH:
        return None
    if t is tuple or t is frozenset:
        items = []
        for x in (v if t is tuple else sorted(v, key=repr)):
            k = _value_key(x, depth + 1, names_memo)
            if k is None:
                return None
            items.append(k)
        return (t, tuple(items))
    if t is _FunctionType:   # a helper it calls: what that one reads counts too
        return _function_key(v, names_memo, depth + 1)
    if t is _ModuleType:
        return v
    if t is _BuiltinType:
        owner = getattr(v, "__self__", None)
        return v if owner is None or type(owner) is _ModuleType else None   # (not a list's or dict's method)
    if isinstance(v, type):
        # (by identity; a user class may carry state in class attributes a mapper reads)
        return v if v.__module__.split(".")[0] in _KNOWN_MODULES else None
    if t is Box or t is Region or t is Subrange:
        return (t, v)
    if isinstance(v, np.generic):
        return (t, v.item())
    key = _cache_key(v)
    if key is not None:   # a built-in mapper it delegates to
        return key
    params = getattr(t, "__dataclass_params__", None)
    if params is not None and params.frozen:
        items = []
        for name in t.__dataclass_fields__:
            k = _value_key(getattr(v, name), depth + 1, names_memo)
            if k is None:
                return None
            items.append(k)
        return (t, tuple(items))
    return None


def is_pure(mapper: Callable) -> bool:
    """Whether ``mapper`` is a built-in mapper, a pure function of its parameters and the
    chunk: its wrapper is shared across tasks and may stand for its results (replay)."""
    return _cache_key(mapper) is not None


class MapperWrappers:
    """The wrapped built-in mappers shared across tasks, and the arity memo of user mappers.

    Owned by the runtime (or a simulated cluster), never by this module, so that separate
    runtimes share nothing.  Bounded: cleared when ``_WRAPPED_LIMIT`` distinct (mapper,
    buffer, kernel geometry, task) combinations are held.
    """

    __slots__ = ("wrapped", "arity", "names")

    def __init__(self) -> None:
        self.wrapped: dict = {}
        self.arity: dict = {}
        self.names: dict = {}    # code object -> the global names it may read (_function_key)

    def wrap(self, mapper: Callable, *, buffer_label: str, buffer_dims: int, kernel_dims: int | None = None,
             global_box: Box | None = None, task_label: str = "a task") -> tuple[Callable[[Box, tuple], Region], bool]:
        """``(to_scheduler_mapper(...), is_pure(mapper))`` with the wrapper shared across tasks."""
        return self.wrap_positional(mapper, buffer_label, buffer_dims, kernel_dims, global_box, task_label)

    def wrap_positional(self, mapper: Callable, buffer_label: str, buffer_dims: int, kernel_dims: int | None,
                        global_box: Box | None, task_label: str) -> tuple[Callable[[Box, tuple], Region], bool]:
        """``wrap`` with positional arguments, for the submit path (keywords cost ~0.1 us a call)."""
        mkey = _cache_key(mapper, self.names)
        if mkey is not None:
            wkey = (mkey, buffer_label, buffer_dims, kernel_dims,
                    None if global_box is None else (global_box.lo, global_box.hi, global_box.dims), task_label)
            hit = self.wrapped.get(wkey)
            if hit is not None:
                return hit, True
        mapped = to_scheduler_mapper(mapper, buffer_label=buffer_label, buffer_dims=buffer_dims,
                                     kernel_dims=kernel_dims, global_box=global_box, task_label=task_label,
                                     _arity_memo=self.arity)
        if mkey is not None:
            if len(self.wrapped) >= _WRAPPED_LIMIT:
                self.wrapped.clear()
            self.wrapped[wkey] = mapped
        return mapped, mkey is not None


def to_scheduler_mapper(mapper: Callable, *, buffer_label: str, buffer_dims: int,
                        kernel_dims: int | None = None, global_box: Box | None = None,
                        task_label: str = "a task", _arity_memo: dict | None = None) -> Callable[[Box, tuple], Region]:
    """Wrap a user-facing mapper into the scheduler's ``(Box, shape) -> Region`` form.

    This runs on the submit path and the wrapped mapper is evaluated by the task manager
    (full range), the command graph generator (every rank's chunk) and the instruction
    graph generator (every device chunk), so results are cached per chunk.  Built-in
    mappers are pure functions of their parameters, the chunk, the buffer shape and the
    kernel's global box: ``MapperWrappers.wrap`` shares their wrappers across tasks, so a
    program that submits the same pattern every step (every stencil) evaluates each
    mapper once per distinct chunk instead of once per task and chunk.

    ``task_label`` (``kernel 'name'`` / ``host task 'name'``) is part of the sharing key,
    so that an error names the kernel that was actually submitted; repeated submits of
    one kernel still share.  Every ``RangeMapperError`` the wrapper raises names the
    task (and the line of its submit, when known), the buffer and the mapper.
    """
    g_range = global_box.range if global_box is not None else None
    g_off = global_box.offset if global_box is not None else None

    def context() -> str:
        site = submit_site()
        return (f"{task_label}{f' (submitted at {site})' if site else ''}: range mapper "
                f"{describe(mapper)} for buffer {buffer_label}")

    if not callable(mapper):
        raise RangeMapperError(f"{context()}: the range mapper is not callable (a range mapper is "
                               f"cl.one_to_one(), cl.all(), ... or a function (chunk, buffer_shape))")
    arity = _arity(mapper, _arity_memo)
    cache: dict = {}

    def mapped(chunk: Box, shape: tuple) -> Region:
        key = (chunk.lo, chunk.hi, chunk.dims, shape if type(shape) is tuple else tuple(shape))
        hit = cache.get(key)
        if hit is not None:
            return hit
        view = ChunkView(chunk.offset, chunk.range, g_range, g_off)
        try:
            res = mapper(view, tuple(shape)) if arity >= 2 else mapper(view)
            reg = to_region(res, len(shape), "the mapper") & Box.full(shape)
        except RangeMapperError as exc:
            raise RangeMapperError(f"{context()}, chunk {view}: {exc}") from exc
        except BaseException as exc:
            # (a Ctrl-C or exit on the application thread stays what it is; anything else, on the
            # scheduler thread too, names the mapper instead of failing the scheduler)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)) and threading.current_thread() is \
                    threading.main_thread():
                raise
            raise RangeMapperError(f"{context()}, chunk {view}: the mapper raised {type(exc).__name__}: "
                                   f"{exception_text(exc)}") from exc
        if len(cache) < _CHUNK_CACHE_LIMIT:
            cache[key] = reg
        return reg

    mapped.__name__ = getattr(mapper, "name", getattr(mapper, "__name__", "mapper"))
    mapped.user_mapper = mapper  # type: ignore[attr-defined]
    return mapped
