"""Adversarial probes of the public API: the inputs a user gets wrong.

Each probe feeds a wrong type, shape, value or order of calls to a public name (buffers
from odd numpy data, kernel ranges and local ranges, accessor indices, reductions, range
mappers, hints, fences, host objects, collective groups, queues after shutdown, kernels
that raise unusual exceptions) and checks the project rule: a clear ``cl.*Error`` (the
class docs/api.md's error table names) whose message names the task, buffer or rank at
fault, never a hang, a bare exception from inside celeritas, an "internal error" or
silently wrong data.

The first group of tests are the 22 defects probing found (each was a strict xfail,
fixed since; its docstring gives the input and the required error).  The other tests pin
probes that already behaved well and are not pinned elsewhere (tests/test_errors.py,
tests/test_range_mapper_errors.py, the restated Celerity suites).
"""
from __future__ import annotations

import functools
import threading

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pytestmark = pytest.mark.timeout(120)


def _run_kernel(q, body, *, shape=(8,), rng=(8,), mapper=None, mode=cl.read_write, name="probe"):
    """Submit a kernel over ``rng`` whose chunks call ``body(acc, chunk)`` on a buffer named
    "b" holding ``arange``; return (what the chunks returned, the buffer afterwards)."""
    b = cl.Buffer(np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape), name="b")
    got, lock = [], threading.Lock()

    def cgf(cgh):
        acc = b.access(cgh, mapper or cl.one_to_one(), mode)

        @cgh.parallel_for(rng, name=name)
        def kernel(chunk):
            value = body(acc, chunk)
            with lock:
                got.append((chunk.offset, value))

    q.submit(cgf)
    q.wait()
    return sorted(got, key=lambda item: item[0]), q.fence(b).result()


# =====================================================================================
# Defects found by probing (fixed): each asserts what the rule requires
# =====================================================================================

def test_ragged_buffer_data_is_a_buffer_error(queue):
    """Input: ragged nested lists as buffer data.  Expected: cl.BufferError about the data."""
    with pytest.raises(cl.BufferError, match="data"):
        cl.Buffer([[1, 2], [3]], name="ragged")


def test_buffer_element_count_does_not_wrap(queue):
    """Input: buffers whose element count exceeds int64.  Expected: ``size`` as in numpy
    (the exact count) or a cl.BufferError at construction; never a wrapped count that lets
    cl.reduction take a 10**19-element buffer as a one-element target."""
    try:
        huge = cl.Buffer(shape=(2 ** 32, 2 ** 32), dtype=np.float32, name="huge")
    except cl.BufferError:
        pass
    else:
        assert huge.size == 2 ** 64
    try:
        fake_one = cl.Buffer(shape=(274177, 67280421310721), dtype=np.int8, name="fake_one")
    except cl.BufferError:
        return
    with pytest.raises(cl.AccessError, match="exactly one element"):
        queue.submit(lambda cgh: (cl.reduction(fake_one, cgh, cl.plus),
                                  cgh.parallel_for((1,), lambda c, r: None)))


def test_a_float_range_is_rejected_even_after_an_equal_int_range(queue):
    """Input: parallel_for((4.0,)) after parallel_for((4,)); host_task(range=(4.0,)) likewise.
    Expected: cl.CeleritasError naming the global range, as for a fresh runtime."""
    queue.submit(lambda cgh: cgh.parallel_for((4,), lambda c: None))
    with pytest.raises(cl.CeleritasError, match=r"global range \(4\.0,\)"):
        queue.submit(lambda cgh: cgh.parallel_for((4.0,), lambda c: None))
    with pytest.raises(cl.CeleritasError, match=r"global range \(4\.0,\)"):
        queue.submit(lambda cgh: cgh.host_task(lambda p: None, range=(4.0,)))


@pytest.mark.parametrize("local_range", ["x", 2.5, (None,), (2.5,)])
def test_a_local_range_that_is_not_integers_is_a_celeritas_error(queue, local_range):
    """Input: parallel_for((4,), local_range=<not integers>).  Expected: cl.CeleritasError
    naming local_range and the kernel, as for a non-integer global range."""
    with pytest.raises(cl.CeleritasError, match=r"local_range.*|.*'k'.*local_range"):
        queue.submit(lambda cgh: cgh.parallel_for((4,), lambda c: None, name="k", local_range=local_range))


@pytest.mark.parametrize("what", ["args_int", "args_none", "reductions_single"])
def test_args_or_reductions_that_are_not_sequences(queue, what):
    """Input: parallel_for(..., args=5 | None) or reductions=r (one descriptor, not a list).
    Expected: cl.CeleritasError naming the argument (args= / reductions=)."""
    t = cl.Buffer(np.zeros(1), name="t")

    def cgf(cgh):
        if what == "reductions_single":
            r = cl.reduction(t, cgh, cl.plus)
            cgh.parallel_for((4,), lambda c, r: None, reductions=r, name="k")
        else:
            cgh.parallel_for((4,), lambda c, *a: None, args=5 if what == "args_int" else None, name="k")

    with pytest.raises(cl.CeleritasError, match="reductions=" if what == "reductions_single" else "args="):
        queue.submit(cgf)


def test_reducers_follow_the_order_of_reductions(queue):
    """Input: two reductions made in one order and passed in the other.  Expected (docs:
    'one reducer per entry of reductions= in that order'): sum 45 and max 9."""
    s = cl.Buffer(np.zeros((), np.int64), name="sum")
    m = cl.Buffer(np.zeros((), np.int64), name="max")

    def cgf(cgh):
        rs = cl.reduction(s, cgh, cl.plus, initialize_to_identity=True)
        rm = cl.reduction(m, cgh, cl.maximum, initialize_to_identity=True)

        @cgh.parallel_for((10,), reductions=[rm, rs], name="swapped")
        def kernel(chunk, r_max, r_sum):
            r_max.combine(chunk.arange().max())
            r_sum.combine(chunk.arange())

    queue.submit(cgf)
    assert int(queue.fence(m).result()) == 9
    assert int(queue.fence(s).result()) == 45


def test_a_reduction_not_passed_to_parallel_for_is_named_at_submit(queue):
    """Input: cl.reduction(t, cgh, cl.plus) then parallel_for without reductions=.
    Expected: cl.CeleritasError from submit naming buffer "t" and reductions=."""
    t = cl.Buffer(np.zeros(1), name="t")

    def cgf(cgh):
        cl.reduction(t, cgh, cl.plus)
        cgh.parallel_for((8,), lambda c: None, name="forgot")

    with pytest.raises(cl.CeleritasError, match=r'B\d+ "t".*reductions=|reductions=.*B\d+ "t"'):
        queue.submit(cgf)
        queue.wait()


@pytest.mark.parametrize("op, dtype", [(cl.bit_and, np.float64), (cl.bit_or, np.float64),
                                       (cl.bit_xor, np.complex128)])
def test_a_bitwise_reduction_on_a_float_target_names_buffer_and_dtype(queue, op, dtype):
    """Input: a bitwise reduction into a float/complex buffer.  Expected: cl.CeleritasError
    from submit naming the buffer and its dtype."""
    t = cl.Buffer(np.zeros(1, dtype), name="target")

    def cgf(cgh):
        r = cl.reduction(t, cgh, op)
        cgh.parallel_for((8,), lambda c, r: r.combine(c.arange().astype(dtype)), reductions=[r], name="bits")

    with pytest.raises(cl.CeleritasError, match=rf'B\d+ "target".*{np.dtype(dtype).name}'):
        queue.submit(cgf)


@pytest.mark.parametrize("op, dtype", [(cl.logical_and, np.int64), (cl.logical_or, np.float64)])
def test_a_logical_reduction_on_a_numeric_target_is_not_an_internal_error(queue, op, dtype):
    """Input: a documented logical reduction op into a numeric (non-bool) one-element buffer.
    Expected: the reduced value (0/1), or a cl.CeleritasError naming buffer "target"; never
    an internal error."""
    t = cl.Buffer(np.ones(1, dtype), name="target")

    def cgf(cgh):
        r = cl.reduction(t, cgh, op)
        cgh.parallel_for((8,), lambda c, r: r.combine(c.arange().astype(dtype)), reductions=[r], name="logic")

    try:
        queue.submit(cgf)
        got = queue.fence(t).result(timeout=30)
    except cl.CeleritasError as exc:
        assert "internal error" not in str(exc) and '"target"' in str(exc), str(exc)
    else:
        expected = 0 if op is cl.logical_and else 1    # arange(8) holds a 0 and nonzero values
        assert got[0] == expected


@pytest.mark.parametrize("checks", ["0", "1"])
@pytest.mark.parametrize("key", [lambda lo: lo + 0.5, lambda lo: str(lo)], ids=["float", "str"])
def test_a_non_integer_accessor_index_is_an_access_error(monkeypatch, checks, key):
    """Input: acc[lo + 0.5] / acc[str(lo)] inside a kernel.  Expected: cl.AccessError naming
    buffer "b" (and the kernel)."""
    monkeypatch.setenv("CELERITAS_ACCESSOR_CHECKS", checks)
    q = cl.Queue(devices="host:2")
    try:
        with pytest.raises(cl.AccessError, match=r'B\d+ "b".*probe'):
            _run_kernel(q, lambda acc, c: acc[key(c.offset[0])])
    finally:
        try:
            q.shutdown()
        except cl.CeleritasError:
            pass


def test_a_boolean_mask_index_is_not_silently_reinterpreted(queue):
    """Input: acc[np.ones(chunk.range[0], bool)] in a kernel.  Expected: cl.AccessError naming
    buffer "b" (a mask has no global coordinates), not integer indexing by True == 1."""
    with pytest.raises(cl.AccessError, match=r'B\d+ "b"'):
        _run_kernel(queue, lambda acc, c: acc[np.ones(c.range[0], bool)])


@pytest.mark.parametrize("where", ["below", "above"])
def test_fancy_indices_outside_the_mapped_region_with_checks(monkeypatch, where):
    """Input: an index array one past the chunk's granted region, accessor checks on.
    Expected (docs: 'every access is checked'): cl.AccessError 'outside what its range
    mapper grants' naming buffer "b"."""
    monkeypatch.setenv("CELERITAS_ACCESSOR_CHECKS", "1")
    q = cl.Queue(devices="host:2")

    def body(acc, c):
        lo, hi = c.offset[0], c.offset[0] + c.range[0]
        if where == "below" and lo == 0:
            return acc[np.array([lo - 1])]
        if where == "above" and lo == 0:
            return acc[np.array([hi])]
        return None

    try:
        with pytest.raises(cl.AccessError, match=r'buffer B\d+ "b" is outside what its range mapper grants'):
            _run_kernel(q, body)
    finally:
        try:
            q.shutdown()
        except cl.CeleritasError:
            pass


@pytest.mark.parametrize("index", ["list", "ellipsis_tuple"])
def test_list_and_ellipsis_tuple_indices_work_or_are_access_errors(queue, index):
    """Input: acc[[lo, lo + 1]] on a 1-D buffer, acc[..., 0] on a 2-D one.  Expected: numpy's
    meaning in global coordinates, or a cl.AccessError naming buffer "b" -- never an
    internal TypeError."""
    if index == "list":
        body, shape, rng, mapper = (lambda acc, c: acc[[c.offset[0], c.offset[0] + 1]].tolist()), (8,), (8,), None
        want = {(0,): [0.0, 1.0], (4,): [4.0, 5.0]}
    else:
        body, shape, rng, mapper = (lambda acc, c: acc[..., 0].tolist()), (4, 2), (4,), cl.slice(1)
        want = {(0,): [0.0, 2.0], (2,): [4.0, 6.0]}
    try:
        got, _ = _run_kernel(queue, body, shape=shape, rng=rng, mapper=mapper)
    except cl.AccessError as exc:
        assert '"b"' in str(exc)
    else:
        assert dict(got) == want


class _Halt(BaseException):
    """A BaseException of the user's own (not Exception, KeyboardInterrupt or SystemExit)."""


@pytest.mark.parametrize("exc, host", [(_Halt, False), (GeneratorExit, False), (_Halt, True)],
                         ids=["custom_kernel", "generator_exit_kernel", "custom_host_task"])
def test_a_kernel_raising_any_base_exception_is_a_kernel_error(queue, exc, host):
    """Input: a kernel / host task raising a BaseException subclass.  Expected: cl.KernelError
    naming the kernel, with the original exception as __cause__."""
    def fn(arg):
        raise exc("stop here")

    if host:
        queue.submit(lambda cgh: cgh.host_task(fn, name="halts"))
    else:
        queue.submit(lambda cgh: cgh.parallel_for((4,), fn, name="halts"))
    with pytest.raises(cl.KernelError, match=r"'halts' of task T\d+") as ei:
        queue.wait()
    assert isinstance(ei.value.__cause__, exc)


@pytest.mark.parametrize("kind", ["str_raises", "custom_init"])
def test_a_kernel_exception_that_does_not_format_is_still_a_kernel_error(queue, kind):
    """Input: a kernel raising an exception whose __str__ raises, or a cl.CeleritasError
    subclass with a two-argument __init__.  Expected: a cl.CeleritasError naming kernel
    'odd' (not an internal error), the original exception its __cause__."""
    class Unprintable(Exception):
        def __str__(self):
            raise RuntimeError("cannot print me")

    class TwoArgs(cl.CeleritasError):
        def __init__(self, a, b):
            super().__init__(f"{a}/{b}")

    def kernel(chunk):
        raise Unprintable() if kind == "str_raises" else TwoArgs(1, 2)

    queue.submit(lambda cgh: cgh.parallel_for((4,), kernel, name="odd"))
    with pytest.raises(cl.CeleritasError) as ei:
        queue.wait()
    msg = str(ei.value)
    assert "internal error" not in msg and "'odd'" in msg, msg


def test_a_mapper_raising_a_base_exception_on_the_scheduler_thread(queue):
    """Input: a mapper that raises _Halt(BaseException) for device chunks only (not the whole
    range).  Expected: cl.RangeMapperError at wait() naming the mapper and buffer "mb"."""
    b = cl.Buffer(np.zeros(8), name="mb")

    def halting_mapper(chunk, shape):
        if chunk.range[0] != 8:
            raise _Halt("device chunk")
        return chunk

    queue.submit(lambda cgh: (b.access(cgh, halting_mapper, cl.read_write),
                              cgh.parallel_for((8,), lambda c: None, name="mk")))
    with pytest.raises(cl.RangeMapperError, match=r'halting_mapper.*B\d+ "mb"|B\d+ "mb".*halting_mapper'):
        queue.wait()


def test_fixed_with_a_flat_pair_is_a_range_mapper_error():
    """Input: cl.fixed((0, 4)).  Expected (docs: 'Invalid arguments of the built-in mappers
    raise it where the mapper is written'): cl.RangeMapperError naming cl.fixed."""
    with pytest.raises(cl.RangeMapperError, match="cl.fixed"):
        cl.fixed((0, 4))


@pytest.mark.parametrize("k", [1.5, "x", None])
def test_oversubscribe_needs_an_integer(k):
    """Input: cl.oversubscribe(1.5 | 'x' | None).  Expected: cl.CeleritasError naming
    cl.oversubscribe, as cl.constrain_split(2.0) is."""
    with pytest.raises(cl.CeleritasError, match="oversubscribe"):
        cl.oversubscribe(k)


def _generator_kernel(chunk, w):
    w[chunk] = 1
    yield


class _GeneratorCallable:
    def __init__(self, w):
        self.w = w

    def __call__(self, chunk):
        self.w[chunk] = 1
        yield


@pytest.mark.parametrize("wrap", ["partial", "callable_object"])
def test_a_generator_kernel_behind_partial_or_call_is_an_error(queue, wrap):
    """Input: parallel_for with functools.partial(generator_fn, w=acc) or an object whose
    __call__ yields.  Expected: cl.CeleritasError (at submit or wait) saying the kernel is a
    generator -- not a kernel that never runs."""
    b = cl.Buffer(np.zeros(4), name="b")

    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.discard_write)
        fn = functools.partial(_generator_kernel, w=w) if wrap == "partial" else _GeneratorCallable(w)
        cgh.parallel_for((4,), fn, name="gen")

    with pytest.raises(cl.CeleritasError, match="generator"):
        queue.submit(cgf)
        queue.fence(b).result(timeout=30)


def test_a_collective_group_made_on_one_rank_only_is_a_divergence():
    """Input: rank 0 makes an extra CollectiveGroup before the one both ranks use.
    Expected: cl.DivergenceError (the task streams' collective groups differ), not a hang."""
    def program(rank):
        q = cl.Queue()
        if rank == 0:
            cl.CollectiveGroup()
        group = cl.CollectiveGroup()
        q.submit(lambda cgh: cgh.host_task(lambda p: p.comm.allreduce(1), on=cl.collective(group), name="cg"))
        q.wait()

    with pytest.raises(cl.DivergenceError):
        run_cluster(program, nodes=2, timeout=12, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="4")


def test_set_lookahead_after_shutdown_says_so():
    """Input: q.set_lookahead('none') after q.shutdown().  Expected: cl.CeleritasError
    'shut down', as every other queue call."""
    q = cl.Queue(devices="host:1")
    q.shutdown()
    with pytest.raises(cl.CeleritasError, match="shut down"):
        q.set_lookahead("none")


# =====================================================================================
# Probes that already behave well
# =====================================================================================

@pytest.mark.parametrize("make", [
    lambda: np.arange(10, dtype=np.int32)[::2],                              # non-contiguous
    lambda: np.asfortranarray(np.arange(6, dtype=np.float32).reshape(2, 3)),
    lambda: np.arange(4, dtype=">i4"),                                       # big-endian
    lambda: np.zeros((3, 0)),                                                # 0-size
    lambda: memoryview(b"abc"),                                              # buffer protocol
], ids=["strided", "fortran", "big_endian", "zero_size", "memoryview"])
def test_odd_but_valid_numpy_data_is_copied_exactly(queue, make):
    """Input: non-contiguous, Fortran-order, big-endian, 0-size (all read-only) or
    buffer-protocol data.  Expected: the fence returns the same values, dtype and shape."""
    src = make()
    expected = np.array(src, copy=True)
    if isinstance(src, np.ndarray):
        src.setflags(write=False)
    b = cl.Buffer(src, name="odd")
    got = queue.fence(b).result(timeout=30)
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("kwargs, match", [
    ({"data": np.array([1, None])}, "dtype object is not supported"),
    ({"data": b"abc"}, r"dtype \|S3 is not supported"),
    ({"data": (i for i in range(3))}, "dtype object is not supported"),
    ({"shape": (2,), "dtype": "datetime64[s]"}, "datetime64"),
    ({"shape": (2,), "dtype": "no such dtype"}, "'no such dtype' is not a numpy dtype"),
    ({"shape": (None,)}, r"shape \(None,\) must be a sequence of integers"),
    ({"data": ["1", "2"], "dtype": np.int64}, "data of dtype <U1 cannot be stored in a buffer of dtype int64"),
])
def test_buffer_data_and_dtype_misuse_is_a_buffer_error(queue, kwargs, match):
    """Input: object/bytes/generator data, non-numeric dtypes, a None extent, strings stored as
    ints.  Expected: cl.BufferError saying what is wrong."""
    with pytest.raises(cl.BufferError, match=match):
        cl.Buffer(**kwargs)


def test_buffer_from_another_buffer_is_a_buffer_error(queue):
    """Input: cl.Buffer(other_buffer).  Expected: cl.BufferError telling to fence it first."""
    other = cl.Buffer(np.zeros(2), name="other")
    with pytest.raises(cl.BufferError, match="fence it first"):
        cl.Buffer(other)


@pytest.mark.parametrize("mode", ["rw", None, [cl.read]])
def test_an_unknown_access_mode_names_the_buffer(queue, mode):
    """Input: b.access(cgh, mapper, 'rw' | None | [cl.read]).  Expected: cl.AccessError naming
    the buffer and listing the modes."""
    b = cl.Buffer(np.zeros(4), name="modes")
    with pytest.raises(cl.AccessError, match=r'unknown access mode .* for buffer B\d+ "modes"; use one of cl.read'):
        queue.submit(lambda cgh: (b.access(cgh, cl.one_to_one(), mode), cgh.parallel_for((4,), lambda c: None)))


@pytest.mark.parametrize("op, identity, match", [
    (lambda a, b: a + b, None, "reduction op must be cl.plus, cl.minimum, ... or a numpy ufunc"),
    ("plus", None, "reduction op must be .* got 'plus'"),
    (np.sin, None, "reduction op sin is not a binary ufunc"),
    (np.subtract, None, "reduction operation 'subtract' has no identity; pass identity="),
])
def test_reduction_op_misuse_is_a_celeritas_error(queue, op, identity, match):
    """Input: a lambda, a string, a unary ufunc, a ufunc without identity.  Expected:
    cl.CeleritasError at submit saying what op is required."""
    t = cl.Buffer(np.zeros(1), name="t")
    with pytest.raises(cl.CeleritasError, match=match):
        queue.submit(lambda cgh: (cl.reduction(t, cgh, op, identity=identity),
                                  cgh.parallel_for((4,), lambda c, r: None)))


@pytest.mark.parametrize("shape", [(), (1, 1, 1)])
def test_zero_d_and_three_d_one_element_reduction_targets(queue, shape):
    """Input: reduction targets of shape () and (1, 1, 1).  Expected: both reduce (0..7 sum
    plus the initial 5 = 33)."""
    t = cl.Buffer(np.full(shape, 5, np.int64), name="t")
    queue.submit(lambda cgh: cgh.parallel_for((8,), lambda c, r: r.combine(c.arange()),
                                              reductions=[cl.reduction(t, cgh, cl.plus)]))
    assert int(queue.fence(t).result().reshape(-1)[0]) == 33


@pytest.mark.parametrize("value, dtype", [(None, "object"), ("a", "<U1")])
def test_combining_non_numbers_names_the_buffer_and_both_dtypes(queue, value, dtype):
    """Input: reducer.combine(None | 'a') into a float64 target.  Expected: cl.CeleritasError
    naming buffer "t", the values' dtype and float64."""
    t = cl.Buffer(np.zeros(1), name="t")
    queue.submit(lambda cgh: cgh.parallel_for((4,), lambda c, r: r.combine(value), name="comb",
                                              reductions=[cl.reduction(t, cgh, cl.plus)]))
    with pytest.raises(cl.CeleritasError, match=rf'buffer B\d+ "t" of dtype float64: values of dtype {dtype} cannot '
                                                r"be cast.*kernel 'comb'"):
        queue.wait()


def test_a_host_object_that_cannot_be_copied_names_it_at_the_fence(queue):
    """Input: q.fence(HostObject(threading.Lock())).  Expected: cl.CeleritasError from the
    fence's result naming the host object and saying how to fix it (__deepcopy__)."""
    h = cl.HostObject(threading.Lock())
    with pytest.raises(cl.CeleritasError, match=r"fence of host object H\d+ .*lock cannot be copied.*__deepcopy__"):
        queue.fence(h).result(timeout=30)


@pytest.mark.parametrize("cgf, match", [
    (lambda cgh: cgh.parallel_for((4,), 5), "parallel_for needs a callable kernel, got 5"),
    (lambda cgh: cgh.host_task(5), "host_task needs a callable, got 5"),
    (lambda cgh: None, "the command group function declared no parallel_for or host_task"),
    (lambda cgh: cgh.parallel_for((4,)), "declared no parallel_for or host_task"),    # decorator never applied
    (lambda cgh: cgh.host_task(lambda p: None, on="master"), "host_task\\(on=...\\) takes cl.on_master_node"),
    (lambda cgh: cgh.parallel_for((1, 1, 1, 1), lambda c: None), "must have 0 to 3 non-negative extents"),
    (lambda cgh: cgh.host_task(lambda p: None, range=(-1,)), "must have 0 to 3 non-negative extents"),
])
def test_command_group_declaration_misuse_is_a_celeritas_error(queue, cgf, match):
    """Input: a non-callable kernel or host task, no kernel at all, an unused decorator, an
    unknown placement, a 4-D or negative range.  Expected: cl.CeleritasError from submit, and
    the queue keeps working."""
    with pytest.raises(cl.CeleritasError, match=match):
        queue.submit(cgf)
    queue.wait()


@pytest.mark.parametrize("body, shape, rng, mapper, match", [
    (lambda a, c: a[c.offset[0], 0], (8,), (8,), None, r'2 indices for the 1-D buffer B\d+ "b"'),
    (lambda a, c: a[c.offset[0]], (8, 2), (8,), cl.slice(1), r'1 indices for the 2-D buffer B\d+ "b"'),
    (lambda a, c: a[cl.Box((0, 0), (1, 1))], (8,), (8,), None, r'a 2-D box indexes the 1-D buffer B\d+ "b"'),
    (lambda a, c: a[::-1], (8,), (8,), None, "accessor slices need a positive step"),
    (lambda a, c: a[0], (), (), cl.all(), r'1 indices for the 0-D buffer B\d+ "b"'),
])
def test_accessor_index_misuse_is_an_access_error_naming_the_kernel(queue, body, shape, rng, mapper, match):
    """Input: too many / too few indices, a box of other dimensionality, a negative step, an
    index into a 0-D buffer.  Expected: cl.AccessError naming buffer "b" and kernel 'probe'."""
    with pytest.raises(cl.AccessError, match=match + r".*\(in kernel 'probe' of task T\d+, rank 0"):
        _run_kernel(queue, body, shape=shape, rng=rng, mapper=mapper)


_USES = {"index": lambda acc, c: acc[c], "array": lambda acc, c: acc.array[0],
         "offset": lambda acc, c: acc.offset[0]}


@pytest.mark.parametrize("use", sorted(_USES))
@pytest.mark.parametrize("where", ["later_kernel", "command_group_function"])
def test_an_accessor_used_outside_its_own_task_is_an_access_error(queue, where, use):
    """Input: an accessor kept from an earlier submit and read (indexed, or its ``array`` or
    ``offset``) in a later kernel, or in the command group function itself.  Expected:
    cl.AccessError naming its buffer."""
    b = cl.Buffer(np.arange(8.0), name="kept")
    out = cl.Buffer(np.zeros(8), name="out")
    saved = {}
    read = _USES[use]

    def first(cgh):
        saved["acc"] = b.access(cgh, cl.one_to_one(), cl.read)
        if where == "command_group_function":
            read(saved["acc"], 0)
        cgh.parallel_for((8,), lambda c: None, name="first")

    def second(cgh):
        w = out.access(cgh, cl.one_to_one(), cl.discard_write)
        old = saved["acc"]
        cgh.parallel_for((8,), lambda c: w.__setitem__(c, read(old, c)), name="second")

    match = r'accessor of buffer B\d+ "kept" used outside its kernel or host task'
    if where == "command_group_function":
        with pytest.raises(cl.AccessError, match=match):
            queue.submit(first)
    else:
        queue.submit(first)
        queue.submit(second)
        with pytest.raises(cl.AccessError, match=match + r".*kernel 'second'"):
            queue.fence(out).result(timeout=30)


def test_every_queue_call_after_shutdown_says_the_runtime_was_shut_down():
    """Input: submit, fence, wait and flush on a queue after q.shutdown().
    Expected: cl.CeleritasError 'has been shut down' (no hang); a second shutdown is quiet.
    (q.graphs() after shutdown returns the final records: tests/test_probing_graph_tools.py.)"""
    q = cl.Queue(devices="host:1", record=True)
    b = cl.Buffer(np.zeros(2), name="b")
    q.shutdown()
    for call in (lambda: q.submit(lambda cgh: cgh.parallel_for((1,), lambda c: None)), lambda: q.fence(b),
                 q.wait, q.flush):
        with pytest.raises(cl.CeleritasError, match="the celeritas runtime has been shut down"):
            call()
    q.shutdown()


@pytest.mark.parametrize("obj", [np.zeros(3), None])
def test_fence_of_something_else_is_a_celeritas_error(queue, obj):
    """Input: q.fence(ndarray | None).  Expected: cl.CeleritasError naming what it got."""
    with pytest.raises(cl.CeleritasError, match=rf"fence takes a cl.Buffer or cl.HostObject, got {type(obj).__name__}"):
        queue.fence(obj)


def test_empty_and_zero_d_fence_subranges_give_shaped_arrays(queue):
    """Input: empty subranges (1-D and 2-D) and ((), ()) on a 0-D buffer.  Expected: arrays of
    the requested (empty) shape and the 0-D value."""
    b1 = cl.Buffer(np.arange(8.0), name="b1")
    b2 = cl.Buffer(np.arange(16.0).reshape(4, 4), name="b2")
    z = cl.Buffer(np.float64(3.0), name="z")
    assert queue.fence(b1, cl.Subrange((2,), (0,))).result(timeout=30).shape == (0,)
    assert queue.fence(b2, cl.Subrange((1, 1), (0, 2))).result(timeout=30).shape == (0, 2)
    assert queue.fence(z, ((), ())).result(timeout=30) == 3.0


@pytest.mark.parametrize("mode", [None, ["none"], "NONE"])
def test_set_lookahead_with_an_invalid_mode_is_a_config_error(queue, mode):
    """Input: q.set_lookahead(None | ['none'] | 'NONE').  Expected: cl.ConfigError listing
    the modes."""
    with pytest.raises(cl.ConfigError, match="use one of none, auto, infinite"):
        queue.set_lookahead(mode)


def test_a_command_group_function_that_raises_leaves_the_runtime_usable(queue):
    """Input: a cgf that declares a discard_write access and then raises KeyError.
    Expected: the KeyError propagates from submit unchanged, nothing is submitted (the
    buffer keeps its data), and later submits work."""
    b = cl.Buffer(np.arange(4.0), name="b")

    def half(cgh):
        b.access(cgh, cl.one_to_one(), cl.discard_write)
        raise KeyError("half declared")

    with pytest.raises(KeyError, match="half declared"):
        queue.submit(half)
    assert queue.fence(b).result(timeout=30).tolist() == [0.0, 1.0, 2.0, 3.0]


@pytest.mark.parametrize("exc", [StopIteration, RecursionError, MemoryError])
def test_a_kernel_raising_a_builtin_exception_is_a_kernel_error(queue, exc):
    """Input: a kernel raising StopIteration, RecursionError or MemoryError.  Expected:
    cl.KernelError naming the kernel, the original as __cause__ (MemoryError is not mistaken
    for cl.OutOfMemoryError)."""
    def kernel(chunk):
        raise exc("from the kernel")

    queue.submit(lambda cgh: cgh.parallel_for((4,), kernel, name="raiser"))
    with pytest.raises(cl.KernelError, match=rf"kernel 'raiser' of task T\d+ failed on rank 0.*{exc.__name__}") as ei:
        queue.wait()
    assert isinstance(ei.value.__cause__, exc) and not isinstance(ei.value, cl.OutOfMemoryError)


@pytest.mark.parametrize("dim", [-1, 5])
def test_slice_of_a_negative_or_missing_dimension_names_it(queue, dim):
    """Input: cl.slice(-1) / cl.slice(5) on a 2-D buffer.  Expected: cl.RangeMapperError
    naming the mapper, the buffer and the dimension."""
    b = cl.Buffer(np.zeros((4, 2)), name="grid")
    with pytest.raises(cl.RangeMapperError, match=rf'cl.slice\({dim}\) for buffer B\d+ "grid".*spans dimension {dim}'):
        queue.submit(lambda cgh: (b.access(cgh, cl.slice(dim), cl.read), cgh.parallel_for((4, 2), lambda c: None)))


def test_mapper_results_outside_the_buffer_are_clipped_and_numpy_ints_accepted(queue):
    """Input: a mapper returning a Subrange of numpy ints, one entirely outside the buffer.
    Expected: documented clipping (the outside one maps nothing), no error."""
    _, data = _run_kernel(queue, lambda a, c: None, mode=cl.read,
                          mapper=lambda c, s: cl.Subrange((np.int64(0),), (np.int64(8),)))
    assert data.tolist() == list(range(8))
    got, _ = _run_kernel(queue, lambda a, c: a.region.empty, mode=cl.read,
                         mapper=lambda c, s: cl.Subrange((20,), (5,)))
    assert [v for _, v in got] == [True, True]


@pytest.mark.parametrize("mode", ["fence_on_rank_0", "collective_on_rank_0", "barrier_on_rank_0"])
def test_one_rank_fencing_or_collecting_alone_is_a_divergence(mode):
    """Input (2 simulated ranks): only rank 0 fences a buffer / submits a collective host task /
    waits with barrier=True.  Expected: cl.DivergenceError naming both ranks' tasks, no hang."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(8.0), name="b")
        if rank == 0:
            if mode == "fence_on_rank_0":
                q.fence(b).result(timeout=30)
            elif mode == "collective_on_rank_0":
                q.submit(lambda cgh: cgh.host_task(lambda p: p.comm.allreduce(1), on=cl.collective, name="coll"))
            q.wait(barrier=(mode == "barrier_on_rank_0"))
        else:
            q.wait()

    with pytest.raises(cl.DivergenceError, match="ranks [01] and [01] submitted different task streams"):
        run_cluster(program, nodes=2, timeout=30, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="10")


def test_combine_takes_a_list_of_values_as_an_array(queue):
    """Input: reducer.combine([1.0, 2.0]) in each of two chunks.  Expected: the values folded
    as an array would be (6.0 in all); it was a KernelError 'setting an array element with a
    sequence' (the list was taken for a scalar)."""
    t = cl.Buffer(np.zeros(()), name="t")

    def cgf(cgh):
        r = cl.reduction(t, cgh, cl.plus, initialize_to_identity=True)
        cgh.parallel_for((4,), lambda c, r: r.combine([1.0, 2.0]), reductions=[r], name="lists")

    queue.submit(cgf)
    assert float(queue.fence(t).result(timeout=30)) == 6.0
