"""Minimal standalone programs for the defect classes the differential fuzzer finds.

    python -m tests.defect_repros            # every reproducer: "ok" or what went wrong
    python -m tests.defect_repros local_range host_object_fence

Each one is the shortest program (found with ``python -m tests.fuzz --minimize``, then
written out by hand) that shows one class; it states the expected behaviour (API.md,
Celerity conventions) and reports the observed one.  The exit status is the number of
reproducers that still fail.  They are not collected by pytest: the differential tests
in ``test_differential.py`` hold the runtime to the same semantics.
"""
from __future__ import annotations

import logging
import sys
import traceback
from pathlib import Path

import numpy as np

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

import celeritas as cl  # noqa: E402
from celeritas.testing import run_cluster  # noqa: E402


def remote_current_value() -> str | None:
    """Defect 1: a reduction without initialize_to_identity whose current value was written on
    rank 1 (a custom mapper gives element 0 of the target to the chunk holding index 7)."""
    def program(rank):
        q = cl.Queue()
        r = cl.Buffer(shape=(1,), dtype=np.int64, name="r")

        def last_chunk_owns_it(chunk, shape):
            hit = chunk.offset[0] <= 7 < chunk.offset[0] + chunk.range[0]
            return cl.Subrange((0,), (1,)) if hit else cl.Region([])

        def write(cgh):
            w = r.access(cgh, last_chunk_owns_it, cl.discard_write)

            @cgh.parallel_for((8,))
            def k(chunk):
                if chunk.box.contains((7,)):
                    w[0] = 5

        def reduce(cgh):
            red = cl.reduction(r, cgh, cl.plus)          # initialize_to_identity=False
            cgh.parallel_for((8,), lambda chunk, s: s.combine(np.ones(chunk.range, np.int64)), reductions=(red,))

        q.submit(write)
        q.submit(reduce)
        return int(q.fence(r).result()[0])

    got = run_cluster(program, nodes=2, devices=1, timeout=60)
    return None if got == [13, 13] else f"2 ranks: expected 5 + 8 = 13 on both ranks, got {got}"


def _reduce(values: np.ndarray, target_dtype, op=cl.plus, nodes=1, devices=1):
    def program(rank):
        q = cl.Queue()
        r = cl.Buffer(shape=(1,), dtype=target_dtype, name="target")

        def cgf(cgh):
            red = cl.reduction(r, cgh, op, initialize_to_identity=True)
            cgh.parallel_for(values.shape, lambda chunk, s: s.combine(values[chunk.slices]), reductions=(red,))
        q.submit(cgf)
        return q.fence(r).result()[0]
    return run_cluster(program, nodes=nodes, devices=devices, timeout=60)


def _outcome(fn) -> tuple[object, BaseException | None]:
    try:
        return fn(), None
    except Exception as exc:  # noqa: BLE001 - reported
        return None, exc


def float_into_int_target() -> str | None:
    """Defect 2 (disallowed cast): float64 values into an int32 target must raise a
    cl.CeleritasError naming the buffer and both dtypes."""
    got, exc = _outcome(lambda: _reduce(np.arange(8, dtype=np.float64) + 0.5, np.int32))
    if isinstance(exc, cl.CeleritasError) and all(w in str(exc) for w in ("target", "float64", "int32")):
        return None
    return f"no error naming target/float64/int32; result {got}, error {exc!r}"


def int64_into_int32_wraps() -> str | None:
    """Defect 2 (allowed cast): int64 values into an int32 target are cast (wrapping), then summed in int32."""
    vals = np.full(8, 2**31 + 1, dtype=np.int64)
    want = np.add.reduce(vals.astype(np.int32), dtype=np.int32)
    got, exc = _outcome(lambda: _reduce(vals, np.int32, devices=2))
    if exc is None and all(g == want for g in got):
        return None
    return f"expected {want!r}; got {got}, error {type(exc).__name__ if exc else None}: {str(exc)[:160] if exc else ''}"


def int64_minimum_into_int32() -> str | None:
    """Defect 2 (allowed cast): the minimum of int64 values cast to int32 (cast first, then reduce)."""
    vals = np.array([1 * 2**27 + 1, 9 * 2**27 + 9, 20 * 2**27 + 20], dtype=np.int64)   # the last wraps negative
    want = vals.astype(np.int32).min()
    got, exc = _outcome(lambda: _reduce(vals, np.int32, op=cl.minimum))
    if exc is None and all(g == want for g in got):
        return None
    return f"expected {want!r}; got {got}, error {exc!r}"


def int32_sum_wraps() -> str | None:
    """int32 values into an int32 target whose sum passes 2**31 must wrap (numpy int32
    arithmetic), the same on any split; today the reducer widens and the store raises."""
    vals = np.full(8, 2**30, dtype=np.int32)
    got, exc = _outcome(lambda: _reduce(vals, np.int32, devices=2))
    if exc is None and all(g == 0 for g in got):
        return None
    return f"expected int32 0; got {got}, error {type(exc).__name__ if exc else None}: {str(exc)[:160] if exc else ''}"


def local_range_split() -> str | None:
    """Defect 3: with local_range=(4,), every chunk must be whole work groups (2 ranks, range 12:
    chunks 8+4 or 4+8, never 6+6)."""
    def program(rank):
        q = cl.Queue()
        seen = []

        def cgf(cgh):
            cgh.parallel_for((12,), lambda chunk: seen.append((chunk.offset[0], chunk.range[0])), local_range=(4,))
        q.submit(cgf)
        q.wait()
        return seen
    chunks = [c for rank in run_cluster(program, nodes=2, devices=1, timeout=60) for c in rank]
    bad = [c for c in chunks if c[0] % 4 or (c[1] % 4 and c[0] + c[1] != 12)]
    return None if not bad else f"chunks (offset, range) {sorted(chunks)} are not multiples of 4"


def overlapping_writes_between_devices() -> str | None:
    """Defect 4: two device chunks of one rank write all of b; with CELERITAS_DIAGNOSTICS=error
    that is a cl.DiagnosticError naming the buffer (as it is between ranks)."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.zeros(8, np.int64), name="b")

        def cgf(cgh):
            w = b.access(cgh, cl.all(), cl.discard_write)
            cgh.parallel_for((8,), lambda chunk: w.__setitem__(Ellipsis, 1))
        q.submit(cgf)
        return q.fence(b).result()
    got, exc = _outcome(lambda: run_cluster(program, nodes=1, devices=2, timeout=60, CELERITAS_DIAGNOSTICS="error"))
    if isinstance(exc, cl.DiagnosticError) and "b" in str(exc):
        return None
    between_ranks, exc2 = _outcome(lambda: run_cluster(program, nodes=2, devices=1, timeout=60,
                                                       CELERITAS_DIAGNOSTICS="error"))
    return (f"1 rank x 2 devices: no DiagnosticError (result {got}, error {exc!r}); "
            f"2 ranks x 1 device: {type(exc2).__name__ if exc2 else 'no error'}")


def host_object_fence_snapshot() -> str | None:
    """Defect 7: fence(host_object) returns the object as it was when the fence ran."""
    q = cl.Queue()
    log = cl.HostObject([])
    fut = q.fence(log)

    def cgf(cgh):
        lst = cl.side_effect(log, cgh)
        cgh.host_task(lambda part: lst.append("after the fence"), on=cl.on_master_node)
    q.submit(cgf)
    q.wait()
    got = fut.result()
    q.shutdown()
    return None if got == [] else f"the fence's result is {got!r} (the live object), expected []"


def host_task_oversubscribe() -> str | None:
    """Defect 9: a side-effect-free host task over range (9,) with cl.oversubscribe(3) runs as
    3 partitions (Celerity splits a locally splittable task's chunk k ways)."""
    q = cl.Queue()
    parts = []

    def cgf(cgh):
        cl.hint(cgh, cl.oversubscribe(3))
        cgh.host_task(lambda part: parts.append(part.box), range=(9,))
    q.submit(cgf)
    q.wait()
    q.shutdown()
    return None if len(parts) == 3 else f"ran as {len(parts)} partition(s): {parts}"


def failed_kernel_dependents() -> str | None:
    """Defect 10: after a kernel fails, nothing that depends on it runs; the KernelError
    surfaces at the next wait."""
    q = cl.Queue()
    x = cl.Buffer(np.zeros(4, np.int64), name="x")
    ran = []

    def fails(cgh):
        w = x.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((4,), name="fails")
        def k(chunk):
            raise ValueError("on purpose")

    def dependent(cgh):
        r = x.access(cgh, cl.all(), cl.read)
        cgh.host_task(lambda part: ran.append(int(np.asarray(r[...]).sum())), on=cl.on_master_node)

    q.submit(fails)
    q.submit(dependent)
    try:
        q.wait()
        err = None
    except cl.CeleritasError as exc:
        err = exc
    problems = []
    if ran:
        problems.append(f"the dependent host task ran and read {ran}")
    if not isinstance(err, cl.KernelError):
        problems.append(f"q.wait() raised {err!r}, expected a cl.KernelError")
    return "; ".join(problems) or None


REPROS = {
    "remote_current_value": remote_current_value,
    "float_into_int_target": float_into_int_target,
    "int64_into_int32_wraps": int64_into_int32_wraps,
    "int64_minimum_into_int32": int64_minimum_into_int32,
    "int32_sum_wraps": int32_sum_wraps,
    "local_range": local_range_split,
    "overlap_between_devices": overlapping_writes_between_devices,
    "host_object_fence": host_object_fence_snapshot,
    "host_task_oversubscribe": host_task_oversubscribe,
    "failed_kernel_dependents": failed_kernel_dependents,
}


def main(argv: list[str]) -> int:
    lg = logging.getLogger("celeritas")
    lg.addHandler(logging.NullHandler())
    lg.propagate = False
    names = argv or list(REPROS)
    failed = 0
    for name in names:
        try:
            problem = REPROS[name]()
        except Exception:  # noqa: BLE001 - a crash is a finding too
            problem = "crashed:\n" + traceback.format_exc(limit=3)
        failed += problem is not None
        print(f"{name:28s} {'ok' if problem is None else 'FAILS: ' + problem}", flush=True)
    return failed


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
