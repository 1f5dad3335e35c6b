"""The command group handler (``cgh``): what one ``submit`` declares, turned into a task.

Also the objects kernels and host tasks receive (``Chunk``, ``Partition``,
``Reducer``) and the launchers the executor calls with a ``LaunchContext``.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable

import numpy as np

from scheduler import task_graph as tg
from scheduler.errors import AccessError, CeleritasError, KernelError, exception_text
from scheduler.geometry import Box
from scheduler.geometry.box import as_ints
from scheduler.instruction_graph import AccessorArg, LaunchContext

from .accessor import Accessor, Hydration, _binding
from .context import CopiesAsItself, cluster, current_runtime


def handler_of(cgh: Any, what: str) -> "CommandGroupHandler":
    """``cgh`` if it is the handler of the command group function running now: another
    object failed deep inside with an AttributeError, and the handler of an earlier
    submit took the declaration silently, for a task that had been built already."""
    if type(cgh) is not CommandGroupHandler:
        raise CeleritasError(f"{what} takes the command group handler (the cgh argument of the command group "
                             f"function) as its cgh, got {type(cgh).__name__}")
    if cgh._closed:
        raise CeleritasError(f"{what}: this cgh belongs to a command group that was already submitted; use the cgh "
                             f"the current command group function receives")
    return cgh


_ASYNC = inspect.CO_COROUTINE | inspect.CO_ASYNC_GENERATOR
_SUSPENDING = inspect.CO_GENERATOR | _ASYNC


# ---- reductions ---------------------------------------------------------------------
plus = np.add
multiplies = np.multiply
minimum = np.minimum
maximum = np.maximum
logical_and = np.logical_and
logical_or = np.logical_or
bit_and = np.bitwise_and
bit_or = np.bitwise_or
bit_xor = np.bitwise_xor


def identity_of(op: Any, dtype: np.dtype) -> Any:
    """The identity of ``op`` for ``dtype`` (numpy's ``ufunc.identity`` is not always defined)."""
    dtype = np.dtype(dtype)
    if op is np.minimum or op is np.fmin:
        return np.inf if dtype.kind in "fc" else (True if dtype.kind == "b" else np.iinfo(dtype).max)
    if op is np.maximum or op is np.fmax:
        return -np.inf if dtype.kind in "fc" else (False if dtype.kind == "b" else np.iinfo(dtype).min)
    if op is np.bitwise_and:
        return True if dtype.kind == "b" else (-1 if dtype.kind == "i" else np.iinfo(dtype).max)
    ident = getattr(op, "identity", None)
    if ident is None:
        raise CeleritasError(f"reduction operation {getattr(op, '__name__', op)!r} has no identity; pass identity=")
    return ident


def _identity_fits(identity: Any, dtype: np.dtype) -> bool:
    """Whether ``identity`` casts into ``dtype`` by numpy's ``same_kind`` rule, the rule
    reduction values follow; a Python number by its value (numpy's weak scalars: ``0``
    fits a uint8 target, ``-1`` does not)."""
    if isinstance(identity, (bool, np.bool_)):
        return True
    if isinstance(identity, int):
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return info.min <= identity <= info.max
        return dtype.kind in "fc"
    if isinstance(identity, float):
        return dtype.kind in "fc"
    if isinstance(identity, complex):
        return dtype.kind == "c"
    try:
        value = np.asarray(identity)
        return value.ndim == 0 and bool(np.can_cast(value.dtype, dtype, casting="same_kind"))
    except (TypeError, ValueError):
        return False


def _code_of(fn) -> Any:
    """The code object a call of ``fn`` runs: through functools.partial, bound methods and
    callable objects' ``__call__`` (None for builtins and classes)."""
    for _ in range(8):
        code = getattr(fn, "__code__", None)
        if code is not None:
            return code
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif getattr(fn, "__func__", None) is not None:
            fn = fn.__func__
        elif not isinstance(fn, type) and getattr(type(fn).__call__, "__code__", None) is not None:
            fn = type(fn).__call__
        else:
            return None
    return None


def kernel_name(fn: Any) -> str:
    """The name of a kernel or host task submitted without ``name=``: a function's own name
    (not its enclosing function's qualification), a callable object's class name, the wrapped
    function's for a ``functools.partial``.  As Celerity names an unnamed kernel after its type
    without namespaces or template arguments: short enough for a graph label, and what the
    program calls it.  Empty when nothing names it."""
    for _ in range(8):
        if isinstance(fn, functools.partial):
            fn = fn.func
            continue
        name = getattr(fn, "__name__", None)
        if isinstance(name, str):
            return name
        return type(fn).__name__ if callable(fn) else ""
    return ""


def _suspended(result: Any) -> bool:
    """Whether a kernel's return value is a generator or coroutine: its body never ran."""
    return inspect.isgenerator(result) or inspect.iscoroutine(result) or inspect.isasyncgen(result)


class ReductionDescriptor:
    """What ``cl.reduction`` returns: passed to ``parallel_for(reductions=...)``."""

    __slots__ = ("buffer", "op", "identity", "initialize_to_identity", "id")

    def __init__(self, buffer, op, identity, initialize_to_identity):
        self.buffer = buffer
        self.op = op
        self.identity = identity
        self.initialize_to_identity = initialize_to_identity
        self.id = 0


def reduction(buffer, cgh, op, *, identity=None, initialize_to_identity: bool = False) -> ReductionDescriptor:
    if not isinstance(op, np.ufunc):
        raise CeleritasError(f"reduction op must be cl.plus, cl.minimum, ... or a numpy ufunc, got {op!r}")
    if op.nin != 2:
        raise CeleritasError(f"reduction op {op.__name__} is not a binary ufunc")
    from .buffer import Buffer
    if not isinstance(buffer, Buffer):
        raise CeleritasError(f"cl.reduction takes a cl.Buffer as its target, got {type(buffer).__name__}")
    handler_of(cgh, "cl.reduction")
    buffer._require_alive()
    if buffer.size != 1:
        raise AccessError(f"reduction into buffer {buffer.label} of shape {buffer.shape}: a reduction target "
                          f"holds exactly one element")
    dt = buffer.dtype if buffer.dtype.isnative else buffer.dtype.newbyteorder("=")
    try:
        op.resolve_dtypes((dt, dt, None))
    except TypeError:   # (e.g. a bitwise op on floats: numpy would fail in every chunk's combine)
        raise CeleritasError(f"reduction into buffer {buffer.label}: {op.__name__} does not take its dtype "
                             f"{buffer.dtype.name} (bitwise operations take integer or bool targets)") from None
    if identity is None:
        ident = identity_of(op, buffer.dtype)
    else:
        ident = identity
        if not _identity_fits(identity, buffer.dtype):
            raise CeleritasError(f"reduction into buffer {buffer.label}: identity {identity!r} is not a scalar that "
                                 f"casts same_kind into the buffer's dtype {buffer.dtype}")
    d = ReductionDescriptor(buffer, op, ident, initialize_to_identity)
    cgh._reductions.append(d)
    return d


class Reducer:
    """Handed to a kernel per reduction; ``combine`` folds values into the chunk's partial result.

    Values are cast into the target buffer's dtype element by element (numpy's
    ``same_kind`` rule) before they are combined, so every partial result is exact in
    the target dtype and the total does not depend on how the range was split: with
    float values summed into an int target, truncating each chunk's partial sum made
    the result depend on the number of chunks.  Casts that ``same_kind`` forbids (float
    into int, say) are an error rather than a silent truncation.
    """

    __slots__ = ("_acc", "op", "_dtype", "_label", "_checked")

    def __init__(self, acc, op, dtype, label: str = ""):
        self._acc = acc
        self.op = op
        self._dtype = np.dtype(dtype)
        self._label = label
        self._checked = None   # the last values dtype found castable

    def combine(self, values) -> None:
        acc = self._acc
        if acc is None:
            raise AccessError(f"reducer of buffer {self._label} used outside its kernel")
        flat = acc.reshape(-1)
        target = self._dtype
        vdt = getattr(values, "dtype", None)
        if vdt is None and isinstance(values, (list, tuple)):   # (values as a sequence: as an array)
            values = np.asarray(values)
            vdt = values.dtype
        if vdt is None:   # a Python scalar: numpy's default dtype of its kind
            vdt = _SCALAR_DTYPES.get(type(values)) or np.asarray(values).dtype
        if vdt is not self._checked:
            if not np.can_cast(vdt, target, "same_kind"):
                raise CeleritasError(
                    f"reduction into buffer {self._label} of dtype {target}: values of dtype {np.dtype(vdt)} "
                    f"cannot be cast to {target} (numpy's same_kind rule); convert them explicitly, "
                    f"e.g. values.astype({target.name})")
            self._checked = vdt
        op = self.op
        if getattr(values, "ndim", 0) > 0:
            if values.size == 0:
                return
            v = values.reshape(-1)
            if v.dtype != target:
                v = v.astype(target)
            v = op.reduce(v)
        else:
            v = values
            if vdt != target:
                v = np.asarray(values).astype(target)[()]
        r = op(flat[0], v)
        if r.dtype != target:   # numpy sums small ints in a wider accumulator: wrap back
            r = r.astype(target)
        flat[0] = r


_SCALAR_DTYPES = {bool: np.dtype(np.bool_), int: np.dtype(np.int64), float: np.dtype(np.float64),
                  complex: np.dtype(np.complex128)}


# ---- hints and tags -----------------------------------------------------------------
class _Hint:
    __slots__ = ("kind", "value")

    def __init__(self, kind: str, value: Any = None):
        self.kind = kind
        self.value = value

    def __repr__(self):
        return f"cl.{self.kind}({self.value if self.value is not None else ''})"


def split_1d() -> _Hint:
    return _Hint("split_1d")


def split_2d() -> _Hint:
    return _Hint("split_2d")


def oversubscribe(k: int) -> _Hint:
    (n,) = as_ints(k, f"cl.oversubscribe({k!r}): the factor", CeleritasError, scalar=True)
    if n < 1:
        raise CeleritasError(f"cl.oversubscribe({k}): the factor must be >= 1")
    return _Hint("oversubscribe", n)


def hint(cgh, h: _Hint) -> None:
    handler_of(cgh, "cl.hint")
    if not isinstance(h, _Hint):
        raise CeleritasError(f"cl.hint takes cl.split_1d(), cl.split_2d() or cl.oversubscribe(k), got {h!r}")
    # (as in Celerity: a hint of each kind once, and the two split hints exclude each other)
    given = cgh._hints
    if given is None:
        given = cgh._hints = {}
    if h.kind in given:
        raise CeleritasError(f"cl.hint({h!r}): this command group already has the hint {given[h.kind]!r}; "
                             f"give each kind of hint once")
    other = _OTHER_SPLIT.get(h.kind)
    if other in given:
        raise CeleritasError(f"cl.hint({h!r}): this command group already has the hint {given[other]!r}; "
                             f"cl.split_1d() and cl.split_2d() cannot be combined")
    given[h.kind] = h
    if h.kind == "oversubscribe":
        cgh._oversubscribe = h.value
    else:
        cgh._split = "2d" if h.kind == "split_2d" else "1d"


_OTHER_SPLIT = {"split_1d": "split_2d", "split_2d": "split_1d"}


def constrain_split(cgh, granularity) -> None:
    handler_of(cgh, "cl.constrain_split")
    g = as_ints(granularity, "cl.constrain_split granularity", CeleritasError, scalar=True)
    if any(x < 1 for x in g):
        raise CeleritasError(f"cl.constrain_split granularity must be >= 1, got {g}")
    cgh._granularity = g


class _Placement:
    __slots__ = ("kind", "group", "group_handle")

    def __init__(self, kind: str, group: int | None = None, group_handle: CollectiveGroup | None = None):
        self.kind = kind
        self.group = group
        self.group_handle = group_handle    # the cl.CollectiveGroup of cl.collective(group)

    def __repr__(self):
        return f"cl.{self.kind}"

    def __call__(self, *args, **kwargs):
        raise CeleritasError(f"cl.{self.kind} is a placement, not a function: write on=cl.{self.kind} (without "
                             f"parentheses)")


class CollectiveGroup(CopiesAsItself):
    """Host tasks of one collective group run in order and share one communicator."""

    def __init__(self):
        # ids come from the runtime so that every rank numbers its groups identically
        self._runtime = current_runtime(create=True)
        self.id = self._runtime.new_collective_group_id()

    def __repr__(self) -> str:
        return f"<cl.CollectiveGroup {self.id}>"


class _Collective(_Placement):
    def __call__(self, group: CollectiveGroup | None = None) -> _Placement:
        if group is not None and not isinstance(group, CollectiveGroup):
            raise CeleritasError(f"cl.collective(group) takes a cl.CollectiveGroup(), got {type(group).__name__}")
        return _Placement("collective", group.id if group is not None else 1, group)


on_master_node = _Placement("on_master_node")
collective = _Collective("collective", 1)
once = _Placement("once")


# ---- what kernels and host tasks receive -------------------------------------------
class Chunk:
    """The part of the index space one kernel call covers (global coordinates)."""

    __slots__ = ("box", "xp", "device", "global_range", "global_offset")

    def __init__(self, box: Box, xp, device, global_range, global_offset):
        self.box = box
        self.xp = xp
        self.device = device
        self.global_range = global_range
        self.global_offset = global_offset

    @property
    def offset(self) -> tuple[int, ...]:
        return self.box.offset

    @property
    def range(self) -> tuple[int, ...]:
        return self.box.range

    @property
    def slices(self) -> tuple[slice, ...]:
        return self.box.slices

    @property
    def dims(self) -> int:
        return self.box.dims

    def arange(self, dim: int = 0):
        """Global indices of this chunk along ``dim`` (on the chunk's device)."""
        return self.xp.arange(self.box.lo[dim], self.box.hi[dim])

    def indices(self):
        """Global index grids of this chunk, like ``numpy.indices`` shifted to the offset."""
        xp = self.xp
        return xp.meshgrid(*[xp.arange(self.box.lo[d], self.box.hi[d]) for d in range(self.dims)], indexing="ij")

    def __repr__(self) -> str:
        return f"Chunk({self.box})"


class Partition:
    """What a host task receives."""

    __slots__ = ("box", "global_range", "comm", "rank")

    def __init__(self, box, global_range, comm, rank):
        self.box = box
        self.global_range = global_range
        self.comm = comm
        self.rank = rank

    @property
    def offset(self):
        return self.box.offset

    @property
    def range(self):
        return self.box.range

    @property
    def slices(self):
        return self.box.slices

    def __repr__(self) -> str:
        return f"Partition({self.box}, global_range={self.global_range})"


# ---- the handler ---------------------------------------------------------------------
class CommandGroupHandler:
    def __init__(self, runtime):
        self._runtime = runtime
        self._accesses: list[tuple[Any, Any, str]] = []   # (buffer, user mapper, mode)
        self._accessors: list[Accessor] = []
        self._hydration: Hydration | None = None   # made with the first accessor
        self._reductions: list[ReductionDescriptor] = []
        self._side_effects: list[Any] = []
        self._split = "1d"
        self._oversubscribe = 1
        self._hints: dict[str, _Hint] | None = None   # the cl.hint kinds given (made by the first)
        self._granularity: tuple[int, ...] | None = None
        self._kind: str | None = None
        self._kernel = None
        self._geometry: tg.TaskGeometry | None = None
        self._name = ""
        self._collective_group: int | None = None
        self._args: tuple = ()
        self._local_range = None
        self._closed = False    # set once submit built the task from it

    def _add_access(self, buffer, mapper, mode: str) -> Accessor:
        rt = self._runtime
        if buffer._runtime is not rt:
            raise AccessError(f"buffer {buffer.label} belongs to another runtime")
        hydration = self._hydration
        if hydration is None:
            hydration = self._hydration = Hydration()
        accessors = self._accessors
        acc = Accessor(buffer, mode, mapper, len(accessors), hydration, rt.config.accessor_checks)
        self._accesses.append((buffer, mapper, mode))
        accessors.append(acc)
        return acc

    def _set_kernel(self, kind, kernel, geometry, name):
        if self._closed:
            handler_of(self, "parallel_for" if kind == tg.DEVICE_COMPUTE else "host_task")
        if self._kind is not None:
            raise CeleritasError("one command group submits exactly one parallel_for or host_task")
        if name is not None and not isinstance(name, str):
            raise CeleritasError(f"a kernel's or host task's name= is a str, got {type(name).__name__} {name!r}")
        code = getattr(kernel, "__code__", None)   # (a plain function's, without _code_of's call)
        if code is None:
            code = _code_of(kernel)
        if code is not None and code.co_flags & _SUSPENDING:
            # (calling one only makes a generator or coroutine object: its body, the writes
            # included, would never run, silently)
            what = "coroutine (async def)" if code.co_flags & _ASYNC else "generator (it yields)"
            raise CeleritasError(f"{'parallel_for' if kind == tg.DEVICE_COMPUTE else 'host_task'} "
                                 f"{name or kernel_name(kernel)!r}: the function is a {what}; a kernel "
                                 f"or host task is a plain function, run once per chunk")
        self._kind = kind
        self._kernel = kernel
        self._geometry = geometry
        self._name = name or kernel_name(kernel)

    def _geometry_of(self, global_range, offset) -> tg.TaskGeometry:
        """The task geometry, shared by every submit with the same range and offset (a
        geometry is never changed once made, and its box is computed once)."""
        memo = self._runtime.geometries
        try:
            geom = memo.get((global_range, offset))
        except TypeError:   # (a list or an array: not a memo key)
            return self._make_geometry(global_range, offset)
        if geom is None:
            geom = self._make_geometry(global_range, offset)
            if len(memo) >= 1024:
                memo.clear()
            memo[(global_range, offset)] = geom
        elif not (_plain_ints(global_range) and (offset is None or _plain_ints(offset))):
            # ((4.0,) == (4,) and hashes alike: a key of floats must not reuse a checked one)
            return self._make_geometry(global_range, offset)
        return geom

    @staticmethod
    def _make_geometry(global_range, offset) -> tg.TaskGeometry:
        rng = as_ints(global_range, "global range", CeleritasError, scalar=True)
        if len(rng) > 3 or any(x < 0 for x in rng):
            raise CeleritasError(f"global range {global_range} must have 0 to 3 non-negative extents")
        if offset is None:
            off = (0,) * len(rng)
        else:
            off = as_ints(offset, "offset", CeleritasError, scalar=True)
            if len(off) != len(rng):
                raise CeleritasError(f"offset {offset} and global range {global_range} differ in dimensionality")
        geom = tg.TaskGeometry(len(rng), rng, off, (1,) * len(rng))
        geom.box   # (computed now: the geometry is shared)
        return geom

    def parallel_for(self, global_range, kernel=None, *, offset=None, name=None, reductions=(),
                     local_range=None, args=()):
        geom = self._geometry_of(global_range, offset)
        if not isinstance(args, (tuple, list)):
            raise CeleritasError(f"{_parallel_for(name)}: args= takes a tuple or list of the kernel's extra "
                                 f"arguments, got {type(args).__name__}")
        self._args = tuple(args)
        self._local_range = None if local_range is None else self._check_local_range(local_range, geom, name)
        if not isinstance(reductions, (tuple, list)):
            raise CeleritasError(f"{_parallel_for(name)}: reductions= takes a list of cl.reduction(...) results"
                                 f"{' (write reductions=[r])' if isinstance(reductions, ReductionDescriptor) else ''}"
                                 f", got {type(reductions).__name__}")
        for r in reductions:
            if not isinstance(r, ReductionDescriptor):
                raise CeleritasError(f"reductions= takes the results of cl.reduction(...), got {r!r}")
        self._kernel_reductions = list(reductions)

        if kernel is not None:   # (no closure made for the common form)
            return self._register_kernel(kernel, geom, name)

        def register(fn):        # (the decorator form)
            return self._register_kernel(fn, geom, name)
        return register

    def _register_kernel(self, fn, geom: tg.TaskGeometry, name):
        if not callable(fn) and not hasattr(fn, "source"):
            raise CeleritasError(f"parallel_for needs a callable kernel, got {fn!r}")
        self._set_kernel(tg.DEVICE_COMPUTE, fn, geom, name)
        return fn

    @staticmethod
    def _check_local_range(local_range, geom: tg.TaskGeometry, name) -> tuple[int, ...] | None:
        """An nd-range's work-group size, as SYCL requires it: one extent per dimension, each
        dividing the global range (OpenCL rejects partial work groups)."""
        if local_range is None:
            return None
        what = f"parallel_for{f' {name!r}' if name else ''} with global range {geom.global_range}"
        lr = as_ints(local_range, f"{what}: local_range", CeleritasError, scalar=True)
        if len(lr) != geom.dims:
            raise CeleritasError(f"{what}: local_range {lr} must have {geom.dims} extent(s)")
        if any(x < 1 for x in lr):
            raise CeleritasError(f"{what}: local_range {lr} must be positive")
        if any(g % x for g, x in zip(geom.global_range, lr)):
            raise CeleritasError(f"{what}: the global range is not a multiple of local_range {lr} "
                                 f"(work groups must be whole)")
        return lr

    def _split_granularity(self, geom: tg.TaskGeometry) -> tuple[int, ...]:
        """Chunks on ranks and devices are cut at multiples of this: whole work groups
        (``local_range``) and whatever ``constrain_split`` asked for, so their lcm."""
        if self._granularity is None and self._local_range is None and geom.granularity:
            return geom.granularity   # (the common case: nothing to combine)
        gran = list(geom.granularity) if geom.granularity else [1] * geom.dims
        if self._granularity is not None:
            if len(self._granularity) > geom.dims:
                raise CeleritasError(f"cl.constrain_split granularity {self._granularity} has more dimensions than "
                                     f"the {geom.dims}-D range {geom.global_range} of {self._name or 'the task'!r}")
            g = self._granularity + (1,) * (geom.dims - len(self._granularity))
            gran = [math.lcm(a, b) for a, b in zip(gran, g[: geom.dims])]
        if self._local_range is not None:
            gran = [math.lcm(a, b) for a, b in zip(gran, self._local_range)]
        return tuple(gran)

    def host_task(self, fn=None, *, range=None, on=None, name=None):  # noqa: A002 - API name
        def register(f):
            if not callable(f):
                raise CeleritasError(f"host_task needs a callable, got {f!r}")
            if on is None and range is None:
                kind, geom = tg.HOST_COMPUTE, self._geometry_of((1,), None)
            elif range is not None and on is None:
                kind, geom = tg.HOST_COMPUTE, self._geometry_of(range, None)
            elif isinstance(on, _Placement) and on.kind == "on_master_node":
                kind = tg.MASTER_NODE
                geom = self._geometry_of(range if range is not None else (), None)
            elif isinstance(on, _Placement) and on.kind in ("once", "collective") and range is not None:
                raise CeleritasError(f"host_task(on={on!r}) runs {'once' if on.kind == 'once' else 'once per rank'}; "
                                     f"range={range!r} would be ignored (a host task over a range takes no on=, "
                                     f"or on=cl.on_master_node)")
            elif isinstance(on, _Placement) and on.kind == "once":
                kind, geom = tg.HOST_COMPUTE, self._geometry_of((1,), None)
            elif isinstance(on, _Placement) and on.kind == "collective":
                g = on.group_handle
                if g is not None and g._runtime is not self._runtime:
                    # (its id would name another group of this runtime, or none, silently)
                    raise CeleritasError(f"cl.collective({g!r}): the group was made for a runtime that was shut "
                                         f"down (q.shutdown() or an error); make a new cl.CollectiveGroup() after "
                                         f"the new Queue")
                kind = tg.COLLECTIVE
                geom = self._geometry_of((self._runtime.num_ranks,), None)
                self._collective_group = on.group
            elif isinstance(on, CollectiveGroup):
                raise CeleritasError(f"host_task(on=...) takes a placement: write on=cl.collective({on!r}) to run "
                                     f"in that collective group")
            else:
                raise CeleritasError(f"host_task(on=...) takes cl.on_master_node, cl.collective or cl.once, "
                                     f"got {on!r}")
            self._set_kernel(kind, f, geom, name)
            return f

        if fn is not None:
            return register(fn)
        return register

    # ---- building the task --------------------------------------------------------
    def _build(self) -> tuple:
        """Arguments for TaskManager.submit, with mappers wrapped and the launcher built:
        ``(name, geometry, accesses, side_effects, collective_group, reductions, split,
        oversubscribe, launcher)``, a tuple that ``Runtime.submit`` passes on by keyword (a
        dict unpacked with ``**`` cost ~1 us more)."""
        kind = self._kind
        if kind is None:
            raise CeleritasError("the command group function declared no parallel_for or host_task")
        rt = self._runtime
        geom = self._geometry
        if self._granularity is not None or self._local_range is not None or not geom.granularity:
            gran = self._split_granularity(geom)
            if gran is not geom.granularity and gran != geom.granularity:
                geom = tg.TaskGeometry(geom.dims, geom.global_range, geom.offset, gran)
        accesses = []
        if self._accesses:
            full = geom.box
            wrap = rt.mappers.wrap_positional
            task_label = _task_label(self)
            kdims = geom.dims
            for buf, mapper, mode in self._accesses:
                sm, pure = wrap(mapper, buf._label, len(buf.shape), kdims, full, task_label)
                accesses.append(tg.BufferAccess(buf.id, mode, sm, pure))
        else:
            task_label = None   # (made below only where an error names it)
        reductions = []
        passed = getattr(self, "_kernel_reductions", None)
        if passed or self._reductions:   # (neither for most tasks: nothing to check)
            self._check_reductions(passed, task_label or _task_label(self), reductions)
        elif self._side_effects:         # (_check_reductions checks this too, in its order)
            self._check_kernel_side_effects(task_label or _task_label(self))
        launcher = _make_launcher(self, rt)
        side_effects = self._side_effects
        return (self._name, geom, accesses, [h.id for h in side_effects] if side_effects else [],
                self._collective_group, reductions, self._split, self._oversubscribe, launcher)

    def _check_reductions(self, passed, task_label: str, reductions: list) -> None:
        """``_build`` for the command groups with reductions: checks them against what was
        passed to ``parallel_for(reductions=...)`` (and a kernel's side effects, in the order
        the checks always ran), numbers them and appends them to ``reductions`` as the
        scheduler's Reduction records."""
        rt = self._runtime
        if passed is not None:
            for d in passed:
                if d not in self._reductions:
                    raise CeleritasError("a reduction passed to parallel_for was created for another command group")
            for d in self._reductions:
                if d not in passed:
                    raise CeleritasError(f"{task_label}: the reduction into buffer {d.buffer.label} is not passed to "
                                         f"parallel_for's reductions=, which hands the kernel one reducer per entry")
            # (the kernel gets its reducers in the order of reductions=, not of the cl.reduction calls)
            self._reductions = list(passed)
        for d in self._reductions:
            d.id = rt.task_manager.new_reduction_id()
            reductions.append(tg.Reduction(d.id, d.buffer.id, d.op, d.identity, not d.initialize_to_identity))
        if self._kind != tg.DEVICE_COMPUTE and reductions:
            raise CeleritasError("reductions are only supported in parallel_for")
        self._check_kernel_side_effects(task_label)
        if self._reductions:
            accessed = {buf.id for buf, _m, _mode in self._accesses}
            seen: set = set()
            for d in self._reductions:
                b = d.buffer
                if b.id in seen:
                    raise AccessError(f"{task_label}: more than one reduction writes buffer {b.label}")
                if b.id in accessed:
                    raise AccessError(f"{task_label}: buffer {b.label} is both accessed through an accessor and the "
                                      f"target of a reduction")
                seen.add(b.id)


    def _check_kernel_side_effects(self, task_label: str) -> None:
        if self._kind == tg.DEVICE_COMPUTE and self._side_effects:
            raise CeleritasError(f"{task_label}: cl.side_effect orders host tasks only; a parallel_for's chunks run "
                                 f"on devices, concurrently (use a host_task for host object "
                                 f"{self._side_effects[0]!r})")


def _task_label(cgh: CommandGroupHandler) -> str:
    """``kernel 'name'`` or ``host task 'name'``, as errors and mapper wrappers name a task."""
    return f"{'kernel' if cgh._kind == tg.DEVICE_COMPUTE else 'host task'} {cgh._name!r}"


def _make_launcher(cgh: CommandGroupHandler, rt) -> Callable[[LaunchContext], None]:
    fn = cgh._kernel
    kind = cgh._kind
    name = cgh._name or "kernel"
    source = hasattr(fn, "source")
    if source and kind == tg.DEVICE_COMPUTE:
        if cgh._reductions:
            # (a source kernel gets no reducer: the target kept its identity, silently)
            raise CeleritasError(f"kernel {name!r} is device source code, which cannot combine into reductions "
                                 f"(target buffer {cgh._reductions[0].buffer.label}); reduce in a Python kernel, "
                                 f"or write partial results to a buffer")
        _check_source_args(cgh, name)
        for a in cgh._args:
            if isinstance(a, Accessor) and not a.dtype.isnative:
                # (device code reads the bytes in the device's order: silently wrong values)
                raise CeleritasError(f"kernel {name!r}: buffer {a.buffer_name} has the non-native byte order dtype "
                                     f"{a.dtype.str}, which device source code would misread; make the buffer "
                                     f"from data.astype({a.dtype.newbyteorder('=').str!r})")
        launch_source = getattr(rt.backend, "launch_source_kernel", None)
        if launch_source is None:
            raise CeleritasError(f"kernel {name!r} is device source code; the {rt.backend_name} backend runs only "
                                 f"Python kernels")
    return _Launcher(cgh, rt, fn, kind, name, source)


# (complex is not among them: CUDA refuses it, see below)
_SOURCE_SCALARS = frozenset((int, float, bool, np.float16, np.float32, np.float64, np.int8, np.int16,
                             np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64, np.bool_))


def _check_source_args(cgh: CommandGroupHandler, name: str) -> None:
    """A source kernel's ``args`` are this command group's accessors and numbers, checked at
    submit: an accessor kept from another command group carries that group's index and
    bound whatever this group's accessor of that index was, silently; anything else failed
    only at launch, on the executor (they stay cl.BackendError, which the backends raised);
    Buffer is imported here because celeritas.buffer imports this module."""
    hydration = cgh._hydration
    for i, a in enumerate(cgh._args):
        if type(a) in _SOURCE_SCALARS:       # (the common case, without the checks below)
            continue
        if isinstance(a, Accessor):
            if a._hydration is not hydration:
                raise AccessError(f"kernel {name!r}: args[{i}] is an accessor of buffer {a.buffer_name} made in "
                                  f"another command group; make it with buffer.access(cgh, ...) in this one")
            continue
        from executor.backends.backend import BackendError

        from .buffer import Buffer
        if isinstance(a, Buffer):
            raise BackendError(f"kernel {name!r}: args[{i}] is cl.Buffer {a.label}, not an accessor: pass "
                                 f"{a.name or 'buffer'}.access(cgh, ...) (a range mapper and a mode) instead")
        elif isinstance(a, np.ndarray):
            raise BackendError(f"kernel {name!r}: args[{i}] is a numpy array of shape {a.shape}; pass arrays as "
                                 f"buffers through accessors (cl.Buffer(array).access(cgh, ...))")
        elif isinstance(a, (complex, np.complexfloating)) and cgh._runtime.backend_name == "cuda":
            # (the launch would fail on the executor, whose parameters are real scalars and
            # pointers; OpenCL passes complex scalars as float2 / double2)
            raise BackendError(f"kernel {name!r}: args[{i}] is the complex scalar {a!r}, which a CUDA source "
                               f"kernel cannot take as a parameter; pass its real and imaginary parts as two "
                               f"arguments ({a.real!r}, {a.imag!r})")
        elif not isinstance(a, (bool, int, float, complex, np.bool_, np.number)):
            what = "None" if a is None else f"{a!r} of type {type(a).__name__}"
            raise BackendError(f"kernel {name!r}: args[{i}] is {what}: a source kernel takes accessors and scalars "
                                 f"(bool, int, float, complex or numpy numbers)")


def _parallel_for(name) -> str:
    """``parallel_for 'name'`` (or without a name), for an error message."""
    return f"parallel_for{f' {name!r}' if isinstance(name, str) else ''}"


def _plain_ints(v) -> bool:
    """An int, or a tuple of ints (what a geometry memo hit may stand for unchecked)."""
    if type(v) is int:
        return True
    if type(v) is not tuple:
        return False
    for x in v:
        if type(x) is not int:
            return False
    return True


class _Launcher:
    """What the executor calls with a ``LaunchContext`` to run one chunk of a command group.

    A slotted object rather than a closure: one exists per task while the task's
    instructions are alive, and a closure over a dozen variables is a dozen cells
    for the garbage collector to traverse.
    """

    __slots__ = ("fn", "device", "hydration", "task_name", "geom", "rank", "red_ops", "args", "device_args",
                 "backend", "local_range", "source", "what", "plain", "global_range", "global_offset", "inside",
                 "rank_context")

    def __init__(self, cgh: CommandGroupHandler, rt, fn, kind: str, name: str, source: bool):
        # (locals rather than attributes read back: this runs at every submit)
        self.fn = fn
        self.device = device = kind == tg.DEVICE_COMPUTE
        self.what = "kernel" if device else "host task"
        # accessors read their arrays from the hydration; without accessors it stays unused
        self.hydration = cgh._hydration if cgh._accessors else None
        self.task_name = name
        self.geom = geom = cgh._geometry
        self.rank = rt.rank
        reductions = cgh._reductions
        self.red_ops = red_ops = ([(d.op, d.identity, d.buffer.dtype, d.buffer.label) for d in reductions]
                                  if reductions else [])
        self.args = args = cgh._args
        self.source = source = source and device
        self.backend = rt.backend if source else None
        self.local_range = cgh._local_range
        # accessors become AccessorArg(index): the backends may not import celeritas types
        self.device_args = (tuple(AccessorArg(a.index, a.buffer_name) if isinstance(a, Accessor) else a
                                  for a in args)
                            if source else ())
        # the common launch: a Python kernel without reductions (see __call__)
        self.plain = device and not red_ops and not source
        self.global_range = geom.global_range if geom is not None else None
        self.global_offset = geom.offset if geom is not None else None
        self.inside = rt.inside_task       # (what Runtime._refuse_inside_task reads: this launcher,
        #                                    as ``str(self)`` only when it refuses a call)
        # under run_cluster: the rank's context, which the executor and lane threads running
        # this task lack; without it cl.Buffer() there reached (and started) a process runtime
        # instead of the rank's, which refuses it
        self.rank_context = ((cluster.communicator, cluster.env, rt) if cluster.communicator is not None
                             else None)

    def __str__(self) -> str:
        # (what a call refused inside this kernel or host task names: formatted only then, not
        # at every submit)
        return f"{self.what} {self.task_name!r}"

    def __call__(self, ctx: LaunchContext) -> None:
        # accessors read their chunk's arrays and boxes from the context itself, at their
        # first use (Accessor._local): building a per-launch table cost every launch
        # ~0.3 us per accessor, whether the kernel used them or not
        hydration = self.hydration
        if hydration is not None:   # (this thread's accessor binding: see Hydration)
            prev = _binding.cur
            _binding.cur = (hydration, ctx)
        inside = self.inside
        outer = inside.where
        inside.where = self
        rc = self.rank_context
        if rc is not None and cluster.runtime is not rc[2]:   # (once per thread: lanes serve one rank)
            cluster.communicator, cluster.env, cluster.runtime = rc
        try:
            r = None
            if self.plain:
                # The chunk of a context the executor keeps (a repeating step's direct runs: same
                # box, device and array module every time) is made once: it holds nothing else
                # that changes, and a Chunk made per launch cost ~0.35 us of a ~1.6 us launch.
                c = ctx.chunk
                if c is None or c.global_range is not self.global_range or c.global_offset is not self.global_offset:
                    c = ctx.chunk = Chunk(ctx.box, ctx.xp, ctx.device, self.global_range, self.global_offset)
                args = self.args
                r = self.fn(c, *args) if args else self.fn(c)
            elif self.device:
                if self.red_ops:
                    reducers = []
                    for arr, red, (op, ident, dt, label) in zip(ctx.reduction_arrays, ctx.reductions, self.red_ops):
                        if not red.include_current:   # (else the target's value, reduced into in place)
                            arr.reshape(-1)[0] = ident
                        reducers.append(Reducer(arr, op, dt, label))
                else:
                    reducers = ()
                try:
                    if self.source:
                        self.backend.launch_source_kernel(self.fn, ctx, self.device_args, self.local_range)
                    else:
                        r = self.fn(Chunk(ctx.box, ctx.xp, ctx.device, self.global_range, self.global_offset),
                                    *reducers, *self.args)
                finally:
                    for reducer in reducers:      # (a reducer kept past its kernel combines into nothing)
                        reducer._acc = None
            else:
                r = self.fn(Partition(ctx.box, self.global_range, ctx.communicator, self.rank))
            if r is not None and _suspended(r):
                _refuse(self, r)
        except CeleritasError as exc:
            if isinstance(exc, KernelError):
                raise
            where = f"(in {self.what} {self.task_name!r} of task T{ctx_task(ctx)}, rank {self.rank}, chunk {ctx.box})"
            try:
                wrapped = type(exc)(f"{exception_text(exc)} {where}")
            except Exception:   # (a subclass whose __init__ takes other arguments)
                wrapped = _kernel_failure(self, ctx, exc)
            raise wrapped from exc
        except BaseException as exc:   # (whatever the kernel raised, KeyboardInterrupt and GeneratorExit too)
            raise _kernel_failure(self, ctx, exc) from exc
        finally:
            inside.where = outer
            if hydration is not None:
                _binding.cur = prev


def _refuse(launcher, result: Any) -> None:
    close = getattr(result, "close", None)
    if close is not None:   # (no "never awaited" warning on top of the error)
        close()
    raise CeleritasError(f"{launcher.what} {launcher.task_name!r}: calling it made a "
                         f"{type(result).__name__} object; a kernel or host task is a plain function, run once "
                         f"per chunk (its body never ran)")


def _kernel_failure(launcher, ctx: LaunchContext, exc: BaseException) -> KernelError:
    return KernelError(f"{launcher.what} {launcher.task_name!r} of task T{ctx_task(ctx)} failed on rank "
                       f"{launcher.rank}, chunk {ctx.box}{'' if ctx.device is None else f', device {ctx.device}'}: "
                       f"{type(exc).__name__}: {exception_text(exc)}")


def ctx_task(ctx: LaunchContext) -> Any:
    return ctx.task
