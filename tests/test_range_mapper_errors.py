"""Every ``RangeMapperError`` a submit can raise names the task, the buffer and the mapper.

The task id does not exist yet when a mapper is first evaluated (inside ``submit``), so
the task is named by its kind and name and by the line of the submit call.
"""
from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

HERE = __file__.rsplit("/", 1)[-1]


@pytest.fixture
def q():
    queue = cl.Queue()
    yield queue
    queue.shutdown()


def _submit(q, cgf) -> tuple[str, int]:
    """Submit ``cgf``, expecting a RangeMapperError; return its message and the submit's line."""
    line = inspect.currentframe().f_lineno + 2
    with pytest.raises(cl.RangeMapperError) as info:
        q.submit(cgf)
    return str(info.value), line


def _names(msg: str, task: str, buffer: str, mapper: str, line: int) -> None:
    assert task in msg, msg
    assert buffer in msg, msg
    assert mapper in msg, msg
    assert re.search(rf"submitted at \S*{re.escape(HERE)}:{line}\b", msg), msg


def test_one_to_one_on_a_buffer_of_other_dimensionality(q):
    b = cl.Buffer(shape=(4, 4), dtype=np.float32, name="grid")

    def cgf(cgh):
        b.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((16,), lambda chunk: None, name="fill")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'fill'", 'B0 "grid"', "cl.one_to_one()", line)
    assert "the kernel is 1-D and the buffer 2-D" in msg


def test_a_shared_built_in_mapper_names_the_kernel_that_was_submitted(q):
    # built-in mappers are shared across tasks; the second kernel must not be reported
    # under the first one's name
    b = cl.Buffer(shape=(4, 4), dtype=np.float32, name="grid")
    for kernel in ("first", "second"):
        def cgf(cgh, kernel=kernel):
            b.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((16,), lambda chunk: None, name=kernel)

        msg, line = _submit(q, cgf)
        _names(msg, f"kernel {kernel!r}", 'B0 "grid"', "cl.one_to_one()", line)
        assert ("first" in msg) == (kernel == "first")


def test_slice_of_a_dimension_the_buffer_lacks(q):
    b = cl.Buffer(shape=(8,), dtype=np.float32, name="row")

    def cgf(cgh):
        b.access(cgh, cl.slice(1), cl.read)
        cgh.parallel_for((8,), lambda chunk: None, name="rows")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'rows'", 'B0 "row"', "cl.slice(1)", line)
    assert "dimension 1" in msg


def test_neighborhood_with_too_few_extents(q):
    b = cl.Buffer(shape=(8, 8), dtype=np.float32, name="u")

    def cgf(cgh):
        b.access(cgh, cl.neighborhood(1), cl.read)
        cgh.parallel_for((8, 8), lambda chunk: None, name="stencil")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'stencil'", 'B0 "u"', "cl.neighborhood((1,)", line)
    assert "1 extent(s) but the kernel is 2-D" in msg


def test_transposed_onto_a_buffer_of_other_dimensionality(q):
    b = cl.Buffer(shape=(4, 4, 4), dtype=np.float32, name="cube")

    def cgf(cgh):
        b.access(cgh, cl.transposed(), cl.read)
        cgh.parallel_for((4, 4), lambda chunk: None, name="flip")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'flip'", 'B0 "cube"', "cl.transposed()", line)
    assert "2-D subrange for a 3-D buffer" in msg


def test_fixed_box_of_other_dimensionality(q):
    b = cl.Buffer(shape=(4, 4), dtype=np.float32, name="m")

    def cgf(cgh):
        b.access(cgh, cl.fixed(cl.Box((0,), (4,))), cl.read)
        cgh.parallel_for((4,), lambda chunk: None, name="head")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'head'", 'B0 "m"', "cl.fixed(", line)
    assert "1-D box for a 2-D buffer" in msg


@pytest.mark.parametrize("result, words", [
    (cl.Subrange((0,), (4,)), "returned a 1-D subrange for a 2-D buffer"),
    (cl.Box((0, 0, 0), (1, 1, 1)), "returned a 3-D box for a 2-D buffer"),
    (cl.Region([cl.Box((0,), (2,))]), "returned a 1-D region for a 2-D buffer"),
    ((0, 4), "returned tuple; a range mapper must return a cl.Subrange, cl.Box or cl.Region"),
])
def test_user_mapper_returning_something_else(q, result, words):
    b = cl.Buffer(shape=(4, 4), dtype=np.float32, name="img")

    def my_mapper(chunk, shape):
        return result

    def cgf(cgh):
        b.access(cgh, my_mapper, cl.read)
        cgh.parallel_for((4, 4), lambda chunk: None, name="blur")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'blur'", 'B0 "img"', "my_mapper", line)
    assert words in msg


def test_user_mapper_that_raises(q):
    b = cl.Buffer(shape=(16,), dtype=np.float32, name="v")

    def broken(chunk, shape):
        return chunk.offset[5]

    def cgf(cgh):
        b.access(cgh, broken, cl.read)
        cgh.host_task(lambda part: None, range=(16,), name="report")

    msg, line = _submit(q, cgf)
    _names(msg, "host task 'report'", 'B0 "v"', "broken", line)
    assert "the mapper raised IndexError" in msg
    assert "chunk Subrange(offset=(0,), range=(16,))" in msg


def test_user_mapper_raising_range_mapper_error_gets_the_context(q):
    b = cl.Buffer(shape=(16,), dtype=np.float32, name="v")

    def picky(chunk, shape):
        raise cl.RangeMapperError("only even chunks")

    def cgf(cgh):
        b.access(cgh, picky, cl.read)
        cgh.parallel_for((16,), lambda chunk: None, name="k")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'k'", 'B0 "v"', "picky", line)
    assert msg.endswith("only even chunks")


def test_mapper_that_is_not_callable(q):
    b = cl.Buffer(shape=(16,), dtype=np.float32, name="v")

    def cgf(cgh):
        b.access(cgh, (0, 16), cl.read)
        cgh.parallel_for((16,), lambda chunk: None, name="k")

    msg, line = _submit(q, cgf)
    _names(msg, "kernel 'k'", 'B0 "v"', "(0, 16)", line)
    assert "not callable" in msg


@pytest.mark.timeout(120)
def test_mapper_failing_for_one_ranks_chunk_names_task_and_buffer():
    # the full range evaluates fine at submit; rank 1's chunk fails on the scheduler thread
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(shape=(16,), dtype=np.float32, name="halves")

        def lower_half_only(chunk, shape):
            if chunk.offset[0] >= 8:
                raise ValueError("upper half")
            return chunk

        def cgf(cgh):
            w = b.access(cgh, lower_half_only, cl.discard_write)
            cgh.parallel_for((16,), lambda c: w.__setitem__(c, 1), name="split_me")

        q.submit(cgf)
        q.wait()

    with pytest.raises(cl.RangeMapperError) as info:
        run_cluster(program, nodes=2, timeout=60)
    msg = str(info.value)
    assert "kernel 'split_me'" in msg and 'B0 "halves"' in msg and "lower_half_only" in msg
    assert "chunk Subrange(offset=(8,), range=(8,))" in msg and "ValueError: upper half" in msg


@pytest.mark.parametrize("make, words", [
    (lambda: cl.neighborhood(-1), "non-negative extents, got (-1,)"),
    (lambda: cl.neighborhood(1, shape="diamond"), "'bounding_box' or 'along_axes', got 'diamond'"),
    (lambda: cl.fixed(3), "cl.fixed takes a Subrange, Box or Region, got int"),
])
def test_bad_mapper_arguments_fail_where_the_mapper_is_written(make, words):
    # no task or buffer exists yet at construction; the error points at the bad argument
    with pytest.raises(cl.RangeMapperError, match=re.escape(words)):
        make()


def test_even_split_of_an_empty_kernel_range_maps_nothing():
    """A kernel over an empty range runs no chunk; ``cl.even_split`` divided by the range
    and raised ZeroDivisionError at submit.  Found by the fuzzer."""
    import numpy as np

    import celeritas as cl
    got = cl.even_split()(cl.Subrange((0,), (0,)), (8, 3))
    assert tuple(got.range) == (0, 3)
    q = cl.Queue(devices="host:1")
    try:
        a = cl.Buffer(np.arange(8), name="a")
        b = cl.Buffer(np.arange(8), name="b")

        def cgf(cgh):
            r = a.access(cgh, cl.even_split(), cl.read)
            w = b.access(cgh, cl.one_to_one(), cl.write)

            @cgh.parallel_for((0,), name="empty")
            def kernel(chunk):
                w[chunk] = r[chunk]
        q.submit(cgf)
        assert q.fence(b).result().tolist() == list(range(8))
    finally:
        q.shutdown()
