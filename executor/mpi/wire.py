"""What celeritas puts on the MPI wire: pilot messages, payload buffer specs, datatypes.

* **pilots** travel on ``PILOT_TAG`` as messages of 1 to ``PILOT_BATCH`` pilots of 12 x int64
  each (the receiver reads the count from the message's length).
* **payloads** go straight from / into the allocation: contiguous boxes as raw
  bytes, strided boxes through a cached ``hvector`` datatype over the view's
  memory or through a contiguous staging copy, whichever the size says is
  faster (see ``use_datatype``); 2 GiB and more as one element of a datatype of
  1 GiB blocks (``bytes_type``: an MPI-3 count is a C int).  Everything is sent as
  ``MPI.BYTE`` so a gather slot (raw bytes) may receive a typed partial result
  without a type-signature mismatch; the receiver checks the byte count.
"""
from __future__ import annotations

import struct
import threading
from typing import Any, Callable

import numpy as np

from scheduler.geometry import Box
from scheduler.instruction_graph import Pilot

from ..communicator import CommunicatorError

PILOT_TAG = 1
EPOCH_TAG = 2
PAYLOAD_TAG_BASE = 16
PILOT_RING = 16                  # standing pilot receives
PILOT_WINDOW = 16                # pilots to one rank out ahead of their payloads (MpiCommunicator.send_pilot)
PILOT_WORDS = 12                 # msg_id, to, t0, t1, t2, dims, lo0..2, hi0..2
PILOT_BATCH = 8                  # pilots per message at most (MpiCommunicator.send_pilots)

# Strided boxes: "datatype" (hvector over the allocation), "staging" (contiguous
# copy), or "auto".  Measured with MPICH 5 (shared memory, 2 ranks, ping-pong,
# benchmarks/bench_mpi.py --strided): a derived datatype loses to a staging copy
# for small messages and short runs (1024 runs of 64 B: 420 us vs 60 us), and
# collapses beyond ~1024 blocks (4096 x 8 KiB rows: 400 ms vs 10 ms); it wins only
# for large messages made of few long runs (1024 x 16 KiB: 1.8 ms vs 2.8 ms,
# 32 x 512 KiB: 0.8 ms vs 2.4 ms).  "auto" picks the datatype exactly there.
STRIDED_POLICIES = ("auto", "datatype", "staging")
_AUTO_DATATYPE_MIN_BYTES = 1 << 20
_AUTO_DATATYPE_MIN_RUN = 8 << 10
_AUTO_DATATYPE_MAX_BLOCKS = 1024

# (buffer spec for mpi4py, what must stay alive until completion, completion hook, byte count)
Spec = tuple[Any, Any, "Callable[[], None] | None", int]

# Every count handed to MPI stays at most MAX_COUNT: an MPI-3 library (Open MPI 4, most
# vendor MPIs of today's clusters) takes counts as C ints, so a message or contiguous run
# of 2 GiB or more goes as one element of a datatype of CHUNK-byte blocks and a remainder
# (``bytes_type``), as Celerity splits such transfers for its communicator.  MPI-4 libraries
# (MPICH 4+) take larger counts, but the datatype works with every library alike.
MAX_COUNT = (1 << 31) - 1
CHUNK = 1 << 30


# --------------------------------------------------------------------------------------
# pilots


_PILOT = struct.Struct("=12q")     # native int64 words, as numpy writes them


_PILOT_BYTES = _PILOT.size


def encode_pilot(p: Pilot, out: np.ndarray, index: int = 0) -> None:
    """Write ``p`` into the ``index``-th pilot of ``out`` (PILOT_WORDS int64 words each).
    Through ``struct``: 0.2 us, against 1.1 us for numpy item assignments."""
    b = p.box
    t = p.transfer
    lo, hi = b.lo, b.hi           # (always three coordinates: unused dimensions are padded)
    _PILOT.pack_into(out, index * _PILOT_BYTES, p.msg_id, p.to, t[0], t[1], t[2], b.dims,
                     lo[0], lo[1], lo[2], hi[0], hi[1], hi[2])


def encode_pilots(pilots: list[Pilot]) -> np.ndarray:
    """One message's words for ``pilots`` (at most PILOT_BATCH)."""
    out = np.empty(len(pilots) * PILOT_WORDS, dtype=np.int64)
    for k, p in enumerate(pilots):
        encode_pilot(p, out, k)
    return out


def decode_pilot(w: np.ndarray, index: int = 0) -> Pilot:
    """The ``index``-th pilot in ``w`` (PILOT_WORDS int64 words each).  Through ``struct``:
    0.7 us, against 2.1 us for ``tolist``."""
    v = _PILOT.unpack_from(w, index * _PILOT_BYTES)
    dims = v[5]
    lo, hi = v[6:9], v[9:12]
    if hi[0] <= lo[0] or hi[1] <= lo[1] or hi[2] <= lo[2]:
        box = Box.empty_box(dims)
    else:
        box = Box.from_bounds(lo, hi, dims)
    return Pilot(msg_id=v[0], to=v[1], transfer=(v[2], v[3], v[4]), box=box)


# --------------------------------------------------------------------------------------
# strided layouts


def strided_layout(shape: tuple[int, ...], strides: tuple[int, ...],
                   itemsize: int) -> tuple[int, list[tuple[int, int]]] | None:
    """(innermost contiguous run in bytes, [(count, byte stride), …] outermost first).

    Unit dimensions are dropped and dimensions that continue the same stride
    pattern are merged, so a box of whole rows is one run and a column of a
    3-D block is a single hvector.  None for strides MPI datatypes cannot
    express here (negative or zero).
    """
    dims = [(n, s) for n, s in zip(shape, strides) if n != 1]
    if any(s <= 0 for _n, s in dims):
        return None
    run = itemsize
    while dims and dims[-1][1] == run:
        run *= dims.pop()[0]
    outer: list[tuple[int, int]] = []
    for n, s in reversed(dims):            # innermost remaining first
        if outer and s == outer[-1][0] * outer[-1][1]:
            outer[-1] = (outer[-1][0] * n, outer[-1][1])
        else:
            outer.append((n, s))
    outer.reverse()
    return run, outer


def use_datatype(arr: np.ndarray, policy: str) -> bool:
    """Whether strided ``arr`` goes through a derived datatype (else a staging copy)."""
    if policy == "datatype":
        return True
    if policy == "staging":
        return False
    if arr.nbytes < _AUTO_DATATYPE_MIN_BYTES:
        return False
    layout = strided_layout(arr.shape, arr.strides, arr.itemsize)
    if layout is None or layout[0] < _AUTO_DATATYPE_MIN_RUN:
        return False
    blocks = 1
    for n, _s in layout[1]:
        blocks *= n
    return blocks <= _AUTO_DATATYPE_MAX_BLOCKS


class DatatypeCache:
    """Committed hvector datatypes per (shape, strides, itemsize); freed on close."""

    def __init__(self, mpi: Any):
        self._mpi = mpi
        self._types: dict[tuple, tuple[Any, int]] = {}
        self._lock = threading.Lock()

    def get(self, shape: tuple, strides: tuple, itemsize: int) -> tuple[Any, int] | None:
        """(committed datatype, byte span from the first element) or None."""
        key = (shape, strides, itemsize)
        hit = self._types.get(key)
        if hit is not None:
            return hit
        layout = strided_layout(shape, strides, itemsize)
        if layout is None:
            return None
        run, outer = layout
        t, created = bytes_type(self._mpi, run)
        span = run
        for n, s in reversed(outer):            # innermost first
            t = t.Create_hvector(n, 1, s)
            created.append(t)
            span += (n - 1) * s
        return self._keep(key, t, created, span)

    def contiguous(self, nbytes: int) -> Any:
        """The committed datatype of ``nbytes`` contiguous bytes (``bytes_type``), for a
        message past ``MAX_COUNT`` bytes."""
        key = ("bytes", nbytes)
        hit = self._types.get(key)
        if hit is not None:
            return hit[0]
        t, created = bytes_type(self._mpi, nbytes)
        return self._keep(key, t, created, nbytes)[0]

    def _keep(self, key: tuple, t: Any, created: list, span: int) -> tuple[Any, int]:
        """Commit ``t`` (the last of the datatypes ``created`` for it, which are freed) and
        keep it under ``key`` with its byte span."""
        t.Commit()
        for old in created[:-1]:
            old.Free()
        with self._lock:
            self._types[key] = (t, span)
        return t, span

    def free(self) -> None:
        with self._lock:
            types, self._types = list(self._types.values()), {}
        for t, _span in types:
            try:
                t.Free()
            except Exception:  # noqa: BLE001 - after finalize
                pass


def bytes_type(mpi: Any, nbytes: int) -> tuple[Any, list]:
    """An uncommitted datatype of ``nbytes`` contiguous bytes whose counts all stay within
    ``MAX_COUNT`` (``nbytes // CHUNK`` blocks of ``CHUNK`` bytes and the remainder, where it
    is larger), and every datatype made for it, itself last (the caller commits it and
    frees the others)."""
    if nbytes <= MAX_COUNT:
        t = mpi.BYTE.Create_contiguous(nbytes)
        return t, [t]
    blocks, rest = divmod(nbytes, CHUNK)
    chunk = mpi.BYTE.Create_contiguous(CHUNK)
    if not rest:
        t = chunk.Create_contiguous(blocks)
    else:
        t = mpi.Datatype.Create_struct([blocks, rest], [0, blocks * CHUNK], [chunk, mpi.BYTE])
    return t, [chunk, t]


# --------------------------------------------------------------------------------------
# payload buffer specs


def buffer_spec(mpi: Any, arr: Any, receive: bool, policy: str, types: DatatypeCache) -> Spec:
    """How mpi4py sends or receives ``arr`` (a numpy view, or a CUDA array)."""
    if not isinstance(arr, np.ndarray):
        if hasattr(arr, "__cuda_array_interface__"):
            return device_spec(mpi, arr, receive, types)
        arr = np.asarray(arr)
    nbytes = arr.nbytes
    if arr.flags.c_contiguous or nbytes == 0:
        if receive and not arr.flags.writeable:
            raise CommunicatorError("receive buffer is read-only")
        return _contiguous(mpi, arr, nbytes, types), arr, None, nbytes
    if use_datatype(arr, policy):
        hit = types.get(arr.shape, arr.strides, arr.itemsize)
        if hit is not None:
            dtype, span = hit
            mem = mpi.buffer.fromaddress(arr.ctypes.data, span, readonly=False)
            return [mem, 1, dtype], (arr, mem), None, nbytes
    if receive:
        staging = np.empty(arr.shape, dtype=arr.dtype)

        def land(view=arr, tmp=staging) -> None:
            view[...] = tmp

        return _contiguous(mpi, staging, nbytes, types), staging, land, nbytes
    staging = np.ascontiguousarray(arr)
    return _contiguous(mpi, staging, nbytes, types), staging, None, nbytes


def _contiguous(mpi: Any, buf: Any, nbytes: int, types: DatatypeCache) -> list:
    """mpi4py's spec of ``nbytes`` contiguous bytes at ``buf`` (one element of a datatype
    from ``types`` past ``MAX_COUNT``)."""
    if nbytes > MAX_COUNT:
        return [buf, 1, types.contiguous(nbytes)]
    return [buf, nbytes, mpi.BYTE]


def device_spec(mpi: Any, arr: Any, receive: bool, types: DatatypeCache) -> Spec:
    """Buffer spec for a device (CUDA) array, for a CUDA-aware MPI library.

    A box inside a larger allocation is strided; rather than trusting every MPI
    build with derived datatypes on device pointers, such boxes go through a
    contiguous device-side staging array (a device-to-device copy is far cheaper
    than the host round trip that direct sends avoid).  The copies run on the
    current stream and are synchronized before MPI touches the memory, since MPI
    knows nothing of streams.
    """
    nbytes = int(arr.nbytes)
    if arr.flags.c_contiguous or nbytes == 0:
        return _contiguous(mpi, arr, nbytes, types), arr, None, nbytes
    import cupy  # only device arrays get here, and only the CUDA backend makes them
    if receive:
        staging = cupy.empty(arr.shape, dtype=arr.dtype)

        def land(view=arr, tmp=staging) -> None:
            view[...] = tmp
            cupy.cuda.get_current_stream().synchronize()

        return _contiguous(mpi, staging, nbytes, types), staging, land, nbytes
    staging = cupy.ascontiguousarray(arr)
    cupy.cuda.get_current_stream().synchronize()
    return _contiguous(mpi, staging, nbytes, types), staging, None, nbytes
