"""Adversarial probes of the OpenCL device path and of device source kernels (``cl.Kernel``).

Each probe does what a hostile or confused user does with ``devices="opencl"``: OpenCL C
that does not build, parameters that do not match ``args=`` (count, element types of
accessors, scalar types and ranges), buffers of every dtype and of 0 to 3 dimensions,
chunk offsets, reductions, data moving between source kernels, Python kernels and host
tasks, splits over two devices with halos, zero-size ranges and accessors, work-group
sizes, compiler options, ``CELERITAS_DEVICES`` strings, huge-page allocations and two
simulated ranks.  Every numeric result is compared with numpy; every wrong input must give
a clear ``cl.*Error`` naming the kernel (and the parameter, buffer or device at fault),
never a bare driver error, a hang or silently wrong data.

The first group are the defects probing found (each was a strict xfail, fixed since; its
docstring gives the input, what happened before, and what is required).  The other tests
pin probes that already behaved well.

Most probes run on ``opencl:0:0,0:0`` (two logical devices on the first device of the
first platform: every chunk split is exercised on any OpenCL machine); the probes that
need two physical devices use ``opencl:0:0,0:1`` where the first platform has two
(``POCL_DEVICES="pthread pthread"``) and fall back to the doubled device otherwise.
"""
from __future__ import annotations

import numpy as np
import pytest

import celeritas as cl
from celeritas.testing import run_cluster

pyopencl = pytest.importorskip("pyopencl")
from executor.backends.opencl import opencl_devices

try:
    _FIRST = opencl_devices()
    HAVE_DEVICE = True
except Exception:  # noqa: BLE001 - any failure: no usable OpenCL device here
    _FIRST = []
    HAVE_DEVICE = False

pytestmark = [pytest.mark.timeout(300),
              pytest.mark.skipif(not HAVE_DEVICE, reason="no OpenCL device that builds kernels "
                                 "(apt-get install pocl-opencl-icd)")]

TWO = "opencl:0:0,0:0"


def _two_physical() -> str:
    """Two devices of platform 0 if it has them (whether they build is checked by use)."""
    try:
        n = len(pyopencl.get_platforms()[0].get_devices())
    except Exception:  # noqa: BLE001
        n = 0
    return "opencl:0:0,0:1" if n >= 2 else TWO


@pytest.fixture(autouse=True)
def _pocl_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("POCL_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "pocl"))


@pytest.fixture
def queue():
    """A queue on two logical OpenCL devices, shut down afterwards (quietly after a failure
    that was already raised)."""
    q = cl.Queue(devices=TWO)
    yield q
    try:
        q.shutdown()
    except cl.CeleritasError:
        pass


def K(source: str, name: str, **kw) -> cl.Kernel:
    return cl.Kernel(source={"opencl": source}, name=name, **kw)


def _launch(q, kernel, buf, rng, args=lambda a: (a,), mapper=None, mode=cl.read_write, **kw):
    """Run ``kernel`` over ``rng`` with one accessor of ``buf`` (and extra args); return the buffer."""
    def cgf(cgh):
        a = buf.access(cgh, mapper or cl.one_to_one(), mode)
        cgh.parallel_for(rng, kernel, args=args(a), **kw)

    q.submit(cgf)
    return q.fence(buf).result()


FILL_INT = K("__kernel void fill(CHUNK_PARAMS, ACCESSOR(int, a), int v) { AT1(a, GID(0)) = v; }", "fill")
FILL_FLOAT = K("__kernel void fill(CHUNK_PARAMS, ACCESSOR(float, a), float v) { AT1(a, GID(0)) = v; }", "fill")
IOTA_FLOAT = K("__kernel void iota(CHUNK_PARAMS, ACCESSOR(float, a)) { AT1(a, GID(0)) = GID(0); }", "iota")


# =====================================================================================
# Defects found by probing (fixed): each asserts what the rule requires
# =====================================================================================

def test_accessor_declared_with_another_element_type_is_an_error(queue):
    """Input: ``ACCESSOR(float, a)`` given an accessor of a float64 buffer (the same
    cl.Kernel used with another dtype).  Happens (before): the kernel wrote floats into the
    doubles' bytes, the fence returned 7.8e-03, 32.0, 0, 0, 2048.0, ... silently.
    Expected: cl.BackendError naming the kernel, the parameter, the buffer, both types and
    the declaration to use."""
    b = cl.Buffer(np.zeros(8), name="doubles")
    with pytest.raises(cl.BackendError, match=r"kernel 'iota': parameter 'a' is declared float\* but gets an "
                                              r"accessor of buffer B\d+ \"doubles\" holding float64; declare it "
                                              r"ACCESSOR\(double, a\)"):
        _launch(queue, IOTA_FLOAT, b, (8,))


@pytest.mark.parametrize("value", [np.int32(5), 5, np.int8(5), np.uint16(5)])
def test_integer_scalars_fill_an_int_parameter(queue, value):
    """Input: an ``int v`` parameter given np.int32(5), a Python int, np.int8 or np.uint16.  Happens (before): every one was marshalled to a 64-bit long and the launch failed
    with "LogicError: clSetKernelArg failed: INVALID_ARG_SIZE - when processing arg#14".
    Expected: the value converted to the declared ``int``, as a C call would."""
    got = _launch(queue, FILL_INT, cl.Buffer(np.zeros(8, np.int32)), (8,), args=lambda a: (a, value))
    np.testing.assert_array_equal(got, np.full(8, int(value), np.int32))


@pytest.mark.parametrize("value", [1.5, np.float64(1.5), 3, np.float16(1.5)])
def test_python_and_numpy_scalars_fill_a_float_parameter(queue, value):
    """Input: a ``float v`` parameter given a Python float, np.float64, an int or np.float16.
    Happens (before): INVALID_ARG_SIZE from clSetKernelArg (a Python float became a double).
    Expected: the value converted to float."""
    got = _launch(queue, FILL_FLOAT, cl.Buffer(np.zeros(8, np.float32)), (8,), args=lambda a: (a, value))
    np.testing.assert_array_equal(got, np.full(8, float(value), np.float32))


def test_python_int_for_a_double_parameter_is_its_value(queue):
    """Input: the Python int 3 for a ``double`` parameter.  Happens (before): it was passed
    as a 64-bit long whose bits the kernel read as the double 1.5e-323: adding it changed
    nothing, silently.  Expected: 3.0, as a C call converts it."""
    k = K("__kernel void add(CHUNK_PARAMS, ACCESSOR(double, a), double s) { AT1(a, GID(0)) += s; }", "add")
    got = _launch(queue, k, cl.Buffer(np.ones(4)), (4,), args=lambda a: (a, 3))
    np.testing.assert_array_equal(got, np.full(4, 4.0))


def test_python_int_beyond_int64_fills_a_ulong_parameter(queue):
    """Input: 2**64 - 1 (a Python int) for a ``ulong`` parameter.  Happens (before):
    "OverflowError: Python int too large to convert to C long".  Expected: the value."""
    k = K("__kernel void fill(CHUNK_PARAMS, ACCESSOR(ulong, a), ulong v) { AT1(a, GID(0)) = v; }", "fill")
    got = _launch(queue, k, cl.Buffer(np.zeros(4, np.uint64)), (4,), args=lambda a: (a, 2 ** 64 - 1))
    np.testing.assert_array_equal(got, np.full(4, 2 ** 64 - 1, np.uint64))


@pytest.mark.parametrize("decl, value, match", [
    ("long", 2 ** 70, r"parameter 'v' \(long\) cannot hold 1180591620717411303424"),
    ("uchar", 300, r"parameter 'v' \(uchar\) cannot hold 300"),
    ("int", -2 ** 31 - 1, r"parameter 'v' \(int\) cannot hold -2147483649"),
    ("uint", -1, r"parameter 'v' \(uint\) cannot hold -1"),
    ("int", 2.5, r"parameter 'v' \(int\) cannot take args\[1\] 2\.5 of type float: it would truncate"),
    ("float", 1e300, r"parameter 'v' \(float\) cannot hold 1e\+300"),
    ("float", 1 + 2j, r"parameter 'v' \(float\) cannot take args\[1\] \(1\+2j\) of type complex"),
])
def test_scalar_that_its_parameter_cannot_hold_is_an_error_naming_it(queue, decl, value, match):
    """Input: a scalar out of its declared parameter's range or kind.  Happens (before):
    OverflowError / INVALID_ARG_SIZE naming no parameter, or a complex number refused as
    "neither an accessor nor a scalar".  Expected: cl.BackendError naming the kernel, the
    parameter, its type and the value."""
    k = K(f"__kernel void fill(CHUNK_PARAMS, ACCESSOR(int, a), {decl} v) {{ AT1(a, GID(0)) = 1; }}", "fill")
    with pytest.raises(cl.BackendError, match=r"kernel 'fill': " + match):
        _launch(queue, k, cl.Buffer(np.zeros(4, np.int32)), (4,), args=lambda a: (a, value))


def test_options_given_as_one_string(queue):
    """Input: ``cl.Kernel(..., options="-DV=7 -DW=2")``.  Happens (before): the string was
    split into characters, the build failed with "Invalid build option: -" (options:
    ``- D V = 7``).  Expected: a string is one option string (as pyopencl takes it)."""
    k = K("__kernel void f(CHUNK_PARAMS, ACCESSOR(int, a)) { AT1(a, GID(0)) = V * W; }", "f", options="-DV=7 -DW=2")
    assert k.options == ("-DV=7 -DW=2",)
    np.testing.assert_array_equal(_launch(queue, k, cl.Buffer(np.zeros(4, np.int32)), (4,)), np.full(4, 14))


def test_options_that_are_not_strings_are_an_error():
    """Input: options=("-DV=1", 3).  Expected: cl.CeleritasError at construction naming the
    kernel and the bad entry (before: the build failed later, at the first launch)."""
    with pytest.raises(cl.CeleritasError, match=r"cl.Kernel 'f': options must be strings \(compiler "
                                                r"options\), got 3"):
        K("__kernel void f(CHUNK_PARAMS) {}", "f", options=("-DV=1", 3))


def test_same_source_with_other_options_is_its_own_program(queue):
    """Input: two cl.Kernels with the same name and source but ``-DV=1`` / ``-DV=2``, one
    launched after the other on the same queue (the way to use one source for several
    types).  Happens (before): the second launch reused the first's kernel object and wrote
    1 again, silently.  Expected: 1, then 2."""
    src = "__kernel void g(CHUNK_PARAMS, ACCESSOR(int, a)) { AT1(a, GID(0)) = V; }"
    one, two = K(src, "g", options=("-DV=1",)), K(src, "g", options=("-DV=2",))
    b = cl.Buffer(np.zeros(8, np.int32))
    np.testing.assert_array_equal(_launch(queue, one, b, (8,)), np.full(8, 1))
    np.testing.assert_array_equal(_launch(queue, two, b, (8,)), np.full(8, 2))


def test_one_source_for_several_dtypes_through_options(queue):
    """The same source, typed through ``-DT=...``, on float32, float64 and int64 buffers in
    one queue: each gets its own program and its element type checked."""
    src = "__kernel void twice(CHUNK_PARAMS, ACCESSOR(T, a)) { AT1(a, GID(0)) = AT1(a, GID(0)) * 2; }"
    for dt, t in ((np.float32, "float"), (np.float64, "double"), (np.int64, "long")):
        k = K(src, "twice", options=(f"-DT={t}",))
        data = np.arange(10, dtype=dt) - 3
        np.testing.assert_array_equal(_launch(queue, k, cl.Buffer(data), (10,)), data * 2)


def test_negative_zero_scalar_is_not_taken_for_a_repeat(queue):
    """Input: the same launch with 0.0, then -0.0 (a kernel computing 1 / x).  Happens
    (before): the backend keeps a kernel's arguments when a launch repeats them, and
    compared 0.0 == -0.0: the second launch ran with 0.0 and gave +inf.  Expected: -inf."""
    k = K("__kernel void inv(CHUNK_PARAMS, ACCESSOR(double, a), double x) { AT1(a, GID(0)) = 1.0 / x; }", "inv")
    b = cl.Buffer(np.zeros(8))
    assert (_launch(queue, k, b, (8,), args=lambda a: (a, 0.0)) == np.inf).all()
    assert (_launch(queue, k, b, (8,), args=lambda a: (a, -0.0)) == -np.inf).all()


def test_reduction_with_a_source_kernel_is_an_error_at_submit(queue):
    """Input: ``parallel_for(..., SOURCE_KERNEL, reductions=[r])``.  Happens (before): the
    reducers were made but a source kernel has no way to get them; the target silently
    kept the identity (0.0).  Expected: cl.CeleritasError at submit naming the kernel and
    the target buffer."""
    s = cl.Buffer(np.zeros(1, np.float32), name="sum")
    b = cl.Buffer(np.ones(8, np.float32))

    def cgf(cgh):
        a = b.access(cgh, cl.one_to_one(), cl.read_write)
        r = cl.reduction(s, cgh, cl.plus)
        cgh.parallel_for((8,), IOTA_FLOAT, args=(a,), reductions=[r])

    with pytest.raises(cl.CeleritasError, match=r"kernel 'iota' is device source code, which cannot combine "
                                                r"into reductions \(target buffer B\d+ \"sum\"\)"):
        queue.submit(cgf)


def test_accessor_of_another_command_group_in_args_is_an_error(queue):
    """Input: an accessor kept from an earlier command group passed in ``args=`` of a
    later one.  Happens (before): the launch used the later group's accessor with the same
    index, here of buffer "b2", and wrote it silently.  Expected: cl.AccessError at submit
    naming the kernel and the buffer of the stale accessor."""
    b1 = cl.Buffer(np.zeros(8, np.float32), name="b1")
    b2 = cl.Buffer(np.zeros(8, np.float32), name="b2")
    kept = []

    def first(cgh):
        kept.append(b1.access(cgh, cl.one_to_one(), cl.read_write))
        cgh.parallel_for((8,), IOTA_FLOAT, args=(kept[0],))

    def second(cgh):
        b2.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((8,), IOTA_FLOAT, args=(kept[0],))

    queue.submit(first)
    with pytest.raises(cl.AccessError, match=r"kernel 'iota': args\[0\] is an accessor of buffer B\d+ \"b1\" "
                                             r"made in another command group"):
        queue.submit(second)
    np.testing.assert_array_equal(queue.fence(b2).result(), np.zeros(8))
    np.testing.assert_array_equal(queue.fence(b1).result(), np.arange(8))


@pytest.mark.parametrize("arg, match", [
    ("buffer", r"args\[0\] is cl.Buffer B\d+ \"b\", not an accessor: pass b.access\(cgh, \.\.\.\)"),
    ("array", r"args\[1\] is a numpy array of shape \(3,\); pass arrays as buffers through accessors"),
    ("none", r"args\[1\] is None: a source kernel takes accessors and scalars"),
    ("str", r"args\[1\] is 'x' of type str: a source kernel takes accessors and scalars"),
])
def test_argument_that_is_no_accessor_or_scalar_is_an_error_at_submit(queue, arg, match):
    """Input: a cl.Buffer, a numpy array, None or a str in ``args=`` of a source kernel.
    Happens (before): the launch failed on the executor ("argument ... is neither an
    accessor nor a scalar").  Expected: cl.BackendError at submit, naming the kernel and
    the position, with the fix for a buffer (still a cl.BackendError, as before)."""
    b = cl.Buffer(np.zeros(8, np.float32), name="b")

    def cgf(cgh):
        a = b.access(cgh, cl.one_to_one(), cl.read_write)
        bad = {"buffer": (b,), "array": (a, np.arange(3)), "none": (a, None), "str": (a, "x")}[arg]
        cgh.parallel_for((8,), IOTA_FLOAT, args=bad)

    with pytest.raises(cl.BackendError, match=r"kernel 'iota': " + match):
        queue.submit(cgf)


def test_local_range_beyond_the_device_limit_is_a_clear_error(queue):
    """Input: ``local_range=(8192,)`` on a device whose work groups hold at most
    ``max_work_group_size`` items.  Happens (before): KernelError "LogicError:
    clEnqueueNDRangeKernel failed: INVALID_WORK_GROUP_SIZE".  Expected: cl.BackendError
    naming the kernel, the local range, the device and its limit."""
    limit = _FIRST[0].max_work_group_size
    n = 2 * limit
    with pytest.raises(cl.BackendError, match=rf"kernel 'iota': local_range \({n},\) has {n} work items per work "
                                              rf"group; device 0 .* runs at most {limit} for this kernel"):
        _launch(queue, IOTA_FLOAT, cl.Buffer(np.zeros(n, np.float32)), (n,), local_range=(n,))


def test_accessor_that_maps_nothing_in_a_chunk(queue):
    """Input: a second accessor whose range mapper maps nothing (an empty ``cl.fixed``, a
    mapper that is empty for the second chunk, a zero-size buffer).  Happens (before):
    KernelError "AttributeError: 'NoneType' object has no attribute 'reshape'".  Expected:
    the kernel runs (the accessor is a null pointer with zero extents, which a kernel that
    does not touch it never notices)."""
    k = K("__kernel void w(CHUNK_PARAMS, ACCESSOR(int, a), ACCESSOR(int, e)) "
          "{ AT1(a, GID(0)) = 7 + (e_e0 == 0 ? 0 : AT1(e, GID(0))); }", "w")
    b, e = cl.Buffer(np.zeros(8, np.int32)), cl.Buffer(np.full(8, 10, np.int32))
    z = cl.Buffer(np.zeros(0, np.int32))

    def first_half(chunk, shape):
        return chunk if chunk.offset[0] < 4 else cl.Subrange((0,), (0,))

    for buf, mapper, want in ((e, cl.fixed(cl.Subrange((2,), (0,))), [7] * 8),
                              (e, first_half, [17] * 4 + [7] * 4),
                              (z, cl.all(), [7] * 8)):
        def cgf(cgh, buf=buf, mapper=mapper):
            a = b.access(cgh, cl.one_to_one(), cl.discard_write)
            ea = buf.access(cgh, mapper, cl.read)
            cgh.parallel_for((8,), k, args=(a, ea))

        queue.submit(cgf)
        np.testing.assert_array_equal(queue.fence(b).result(), want)


def test_kernel_named_like_an_opencl_builtin(queue):
    """Input: a kernel named ``step`` (an OpenCL built-in function).  Happens (before):
    PoCL builds it as ``_cl_step`` and the launch said "its OpenCL source defines no
    __kernel named 'step'", which it plainly does.  Expected: the kernel runs."""
    k = K("__kernel void step(CHUNK_PARAMS, ACCESSOR(float, a)) { AT1(a, GID(0)) = 2 * GID(0); }", "step")
    np.testing.assert_array_equal(_launch(queue, k, cl.Buffer(np.zeros(8, np.float32)), (8,)), 2 * np.arange(8))


def test_missing_entry_point_lists_the_kernels_the_source_defines(queue):
    """Input: name="other" for a source defining ``first`` and ``second``.  Expected:
    cl.BackendError naming the entry point and listing the kernels there are."""
    k = K("__kernel void first(CHUNK_PARAMS) {}\n__kernel void second(CHUNK_PARAMS) {}", "other")

    def cgf(cgh):
        cgh.parallel_for((4,), k)

    queue.submit(cgf)
    with pytest.raises(cl.BackendError, match=r"kernel 'other': its OpenCL source defines no __kernel named "
                                              r"'other' \(it defines: first, second\)"):
        queue.wait()


def test_shutdown_is_quiet_after_a_fence_raised_the_failure():
    """Input: a source kernel that fails (a parameter it cannot hold), its failure raised by
    ``q.fence(b).result()``, then ``q.shutdown()``.  Happened: shutdown raised the same
    BackendError again (on host devices too: only wait() and submit marked the runtime
    aborted).  Expected (docs/api.md, Errors): "every later submit, wait and
    fence raises the same error (shutdown() then returns quietly)"."""
    q = cl.Queue(devices=TWO)
    b = cl.Buffer(np.zeros(4, np.int32))
    k = K("__kernel void fill(CHUNK_PARAMS, ACCESSOR(int, a), uchar v) { AT1(a, GID(0)) = v; }", "fill")
    with pytest.raises(cl.BackendError):
        _launch(q, k, b, (4,), args=lambda a: (a, 300))
    try:
        q.shutdown()
    except cl.BackendError as exc:
        pytest.fail(f"shutdown raised again: {exc}")


# =====================================================================================
# Probes that behaved well: pinned
# =====================================================================================

_TYPES = [(np.float32, "float"), (np.float64, "double"), (np.int8, "char"), (np.uint8, "uchar"),
          (np.int16, "short"), (np.uint16, "ushort"), (np.int32, "int"), (np.uint32, "uint"),
          (np.int64, "long"), (np.uint64, "ulong")]


@pytest.mark.parametrize("dtype, ctype", _TYPES, ids=["float", "double", "char", "uchar", "short", "ushort", "int",
                                                       "uint", "long", "ulong"])
def test_every_numeric_dtype_reaches_the_kernel_bitwise(queue, dtype, ctype):
    """Each numpy dtype is the OpenCL type of its size and kind; negative and extreme
    values survive, and the scalar of the same type passes through exactly."""
    info = np.iinfo(dtype) if np.issubdtype(dtype, np.integer) else np.finfo(dtype)
    data = np.array([0, 1, info.max, info.min, 3, 7, 11, 5], dtype=dtype)
    k = K(f"__kernel void sub(CHUNK_PARAMS, ACCESSOR({ctype}, a), {ctype} s) "
          f"{{ AT1(a, GID(0)) = AT1(a, GID(0)) - s; }}", "sub")
    got = _launch(queue, k, cl.Buffer(data), (8,), args=lambda a: (a, dtype(1)))
    with np.errstate(over="ignore"):
        want = data - dtype(1)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dtype, ctype, body, want", [
    (np.bool_, "uchar", "AT1(a, GID(0)) = !AT1(a, GID(0));", lambda d: ~d),
    (np.complex64, "float2", "AT1(a, GID(0)).y = -AT1(a, GID(0)).y;", np.conj),
    (np.complex128, "double2", "AT1(a, GID(0)) = AT1(a, GID(0)).yx;", lambda d: d.imag + 1j * d.real),
    (np.float16, "half", "vstore_half(vload_half(0, &AT1(a, GID(0))) * 2.0f, 0, &AT1(a, GID(0)));",
     lambda d: d * 2),
])
def test_bool_complex_and_half_buffers_through_their_opencl_types(queue, dtype, ctype, body, want):
    """bool is a byte (uchar or char), complex64 float2, complex128 double2, float16 half
    (through vload_half / vstore_half)."""
    rng = np.random.default_rng(3)
    if dtype is np.bool_:
        data = rng.random(6) < 0.5
    elif np.issubdtype(dtype, np.complexfloating):
        data = (rng.random(6) + 1j * rng.random(6)).astype(dtype)
    else:
        data = np.arange(6, dtype=dtype)
    k = K(f"__kernel void t(CHUNK_PARAMS, ACCESSOR({ctype}, a)) {{ {body} }}", "t")
    got = _launch(queue, k, cl.Buffer(data), (6,))
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, want(data))


def test_void_and_typedef_accessors_are_not_second_guessed(queue):
    """An accessor declared through a typedef or as ``void`` (cast inside) is left to the
    author: only a built-in type that differs from the buffer's is an error."""
    k = K("typedef double real;\n__kernel void t(CHUNK_PARAMS, ACCESSOR(real, a), ACCESSOR(void, b)) "
          "{ AT1(a, GID(0)) += 1; ((__global double*)b)[GID(0) - b_o0] *= 3; }", "t")
    x, y = cl.Buffer(np.arange(6.0)), cl.Buffer(np.arange(6.0))

    def cgf(cgh):
        cgh.parallel_for((6,), k, args=(x.access(cgh, cl.one_to_one(), cl.read_write),
                                        y.access(cgh, cl.one_to_one(), cl.read_write)))

    queue.submit(cgf)
    np.testing.assert_array_equal(queue.fence(x).result(), np.arange(6.0) + 1)
    np.testing.assert_array_equal(queue.fence(y).result(), np.arange(6.0) * 3)


def test_const_qualified_accessor_matches(queue):
    """``__global const float*`` declared by hand (the ACCESSOR macro's parameters after
    it) counts as float."""
    k = K("__kernel void c(CHUNK_PARAMS, __global const float* s, long s_o0, long s_o1, long s_o2, long s_e0, "
          "long s_e1, long s_e2, ACCESSOR(float, d)) { AT1(d, GID(0)) = AT1(s, GID(0)) + 1; }", "c")
    src, dst = cl.Buffer(np.arange(8, dtype=np.float32)), cl.Buffer(shape=(8,), dtype=np.float32)

    def cgf(cgh):
        cgh.parallel_for((8,), k, args=(src.access(cgh, cl.one_to_one(), cl.read),
                                        dst.access(cgh, cl.one_to_one(), cl.discard_write)))

    queue.submit(cgf)
    np.testing.assert_array_equal(queue.fence(dst).result(), np.arange(8) + 1)


@pytest.mark.parametrize("shape", [(7,), (5, 6), (3, 4, 5)], ids=["1d", "2d", "3d"])
def test_kernels_see_global_ids_with_an_offset_in_1_to_3_dims(queue, shape):
    """A launch with ``offset=`` over part of a buffer, split over two devices: GID(d) are
    global ids, so each element gets its own linear index and the rest stays untouched."""
    nd = len(shape)
    if nd == 1:
        idx = "AT1(a, GID(0)) = GID(0);"
    elif nd == 2:
        idx = f"AT2(a, GID(0), GID(1)) = GID(0) * {shape[1]} + GID(1);"
    else:
        idx = f"AT3(a, GID(0), GID(1), GID(2)) = (GID(0) * {shape[1]} + GID(1)) * {shape[2]} + GID(2);"
    k = K(f"__kernel void lin(CHUNK_PARAMS, ACCESSOR(long, a)) {{ {idx} }}", "lin")
    b = cl.Buffer(np.full(shape, -1, np.int64))
    offset = (1,) + (0,) * (nd - 1)
    rng = (shape[0] - 1,) + shape[1:]
    got = _launch(queue, k, b, rng, offset=offset)
    want = np.arange(np.prod(shape)).reshape(shape)
    want[0] = -1
    np.testing.assert_array_equal(got, want)


def test_chunk_params_describe_the_chunk(queue):
    """CHUNK_PARAMS are the chunk's offset and range (global), the accessor's ``_o``/``_e``
    its allocation's; each device's chunk records them."""
    k = K("""__kernel void info(CHUNK_PARAMS, ACCESSOR(long, a)) {
        long i = GID(0);
        AT2(a, i, 0) = __cl_o0; AT2(a, i, 1) = __cl_r0; AT2(a, i, 2) = a_o0; AT2(a, i, 3) = a_e0;
        AT2(a, i, 4) = IN_CHUNK(); }""", "info")
    got = _launch(queue, k, cl.Buffer(np.zeros((10, 5), np.int64)), (10,), mapper=cl.slice(1), mode=cl.discard_write)
    want = np.array([[0, 5, 0, 5, 1]] * 5 + [[5, 5, 5, 5, 1]] * 5)
    np.testing.assert_array_equal(got, want)


def test_split_stencil_with_halos_on_two_devices_is_bitwise_numpy():
    """A 3-point stencil over 5 steps on two devices (physical ones where the platform has
    two): neighbourhood reads cross the split every step; bitwise equal to numpy."""
    q = cl.Queue(devices=_two_physical())
    try:
        data = np.random.default_rng(1).random((33, 7))
        got = _stencil(q, data, 5)
        np.testing.assert_array_equal(got, _stencil_reference(data, 5))
    finally:
        q.shutdown()


STENCIL = K("""
__kernel void stencil(CHUNK_PARAMS, ACCESSOR(double, u), ACCESSOR(double, v), long n) {
    long i = GID(0), j = GID(1);
    double up = i > 0 ? AT2(u, i - 1, j) : 0.0, dn = i < n - 1 ? AT2(u, i + 1, j) : 0.0;
    AT2(v, i, j) = 0.5 * AT2(u, i, j) + 0.25 * (up + dn);
}""", "stencil")


def _stencil(q, data, steps):
    bufs = [cl.Buffer(data), cl.Buffer(shape=data.shape, dtype=data.dtype)]
    for s in range(steps):
        u, v = bufs[s % 2], bufs[(s + 1) % 2]

        def cgf(cgh, u=u, v=v):
            a = u.access(cgh, cl.neighborhood((1, 0)), cl.read)
            w = v.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for(data.shape, STENCIL, args=(a, w, data.shape[0]))

        q.submit(cgf)
    return q.fence(bufs[steps % 2]).result()


def _stencil_reference(a, steps):
    for _ in range(steps):
        up, dn = np.zeros_like(a), np.zeros_like(a)
        up[1:], dn[:-1] = a[:-1], a[1:]
        a = 0.5 * a + 0.25 * (up + dn)
    return a


@pytest.mark.parametrize("nodes, devices, huge", [(2, TWO, "on"), (2, "opencl", "0"), (3, "opencl", "off")])
def test_stencil_on_simulated_ranks_and_huge_pages_is_bitwise_numpy(nodes, devices, huge):
    """Two or three simulated ranks on OpenCL, with every allocation on huge pages
    (``CELERITAS_HUGE_PAGES=0``) or none: halos cross ranks and devices; bitwise numpy."""
    data = np.random.default_rng(2).random((40, 6))
    res = run_cluster(lambda rank: _stencil(cl.Queue(), data, 4), nodes=nodes,
                      CELERITAS_DEVICES=devices, CELERITAS_HUGE_PAGES=huge)
    want = _stencil_reference(data, 4)
    for got in res:
        np.testing.assert_array_equal(got, want)


def test_large_allocations_on_huge_pages_with_source_kernels(queue):
    """A 4 MiB buffer (over the 2 MiB huge-page threshold) written by a source kernel split
    over two devices, then read back."""
    n = 1 << 20
    got = _launch(queue, IOTA_FLOAT, cl.Buffer(shape=(n,), dtype=np.float32), (n,), mode=cl.discard_write)
    np.testing.assert_array_equal(got, np.arange(n, dtype=np.float32))


def test_coherence_source_kernel_host_task_python_kernel_and_back(queue):
    """A buffer written by a source kernel, then read and changed by a host task, a Python
    kernel (with a reversing mapper: each device reads the other's part), and a source
    kernel again; every stage sees the previous one's values."""
    n = 12
    b = cl.Buffer(shape=(n,), dtype=np.float32, name="b")
    c = cl.Buffer(shape=(n,), dtype=np.float32, name="c")
    seen = {}
    _launch(queue, IOTA_FLOAT, b, (n,), mode=cl.discard_write)

    def host(cgh):
        a = b.access(cgh, cl.all(), cl.read_write)

        def fn(part):
            seen["host"] = np.array(a[0:n])
            a[0:n] = a[0:n] * 10
        cgh.host_task(fn)

    queue.submit(host)

    def reverse(cgh):
        src = b.access(cgh, lambda ch, shape: cl.Subrange((n - ch.offset[0] - ch.range[0],), ch.range), cl.read)
        dst = c.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((n,), name="reverse")
        def kernel(chunk):
            lo, hi = chunk.offset[0], chunk.offset[0] + chunk.range[0]
            dst[lo:hi] = src[n - hi:n - lo][::-1] + 1

    queue.submit(reverse)
    add = K("__kernel void add(CHUNK_PARAMS, ACCESSOR(float, c), float s) { AT1(c, GID(0)) += s; }", "add")
    got = _launch(queue, add, c, (n,), args=lambda a: (a, np.float32(0.5)))
    np.testing.assert_array_equal(seen["host"], np.arange(n))
    np.testing.assert_array_equal(got, (np.arange(n)[::-1] * 10 + 1 + 0.5).astype(np.float32))
    np.testing.assert_array_equal(queue.fence(b).result(), np.arange(n) * 10)


def test_fence_of_a_subrange_after_a_source_kernel(queue):
    """A fence of a 2-D subrange reads exactly that part of what the devices wrote."""
    k = K("__kernel void f(CHUNK_PARAMS, ACCESSOR(int, a)) { AT2(a, GID(0), GID(1)) = GID(0) * 10 + GID(1); }",
          "f")
    b = cl.Buffer(shape=(6, 5), dtype=np.int32)

    def cgf(cgh):
        cgh.parallel_for((6, 5), k, args=(b.access(cgh, cl.one_to_one(), cl.discard_write),))

    queue.submit(cgf)
    part = queue.fence(b, cl.Subrange((2, 1), (3, 3))).result()
    i, j = np.mgrid[2:5, 1:4]
    np.testing.assert_array_equal(part, i * 10 + j)


def test_zero_size_range_launches_nothing(queue):
    """A source kernel over (0,) or (0, 4) runs no work item and leaves the buffer as is."""
    b = cl.Buffer(np.arange(4, dtype=np.float32))
    boom = K("__kernel void boom(CHUNK_PARAMS, ACCESSOR(float, a)) { AT1(a, 0) = -1; }", "boom")
    np.testing.assert_array_equal(_launch(queue, boom, b, (0,), mapper=cl.all()), np.arange(4))
    b2 = cl.Buffer(np.ones((2, 4), np.float32))
    np.testing.assert_array_equal(_launch(queue, boom, b2, (0, 4), mapper=cl.all()), np.ones((2, 4)))


def test_odd_range_split_over_two_devices(queue):
    """A range of 7 (not divisible by the 2 devices) is covered exactly once."""
    k = K("__kernel void inc(CHUNK_PARAMS, ACCESSOR(int, a)) { AT1(a, GID(0)) += 1; }", "inc")
    np.testing.assert_array_equal(_launch(queue, k, cl.Buffer(np.arange(7, dtype=np.int32)), (7,)), np.arange(7) + 1)


def test_local_range_in_two_dimensions(queue):
    """Work groups of 2x4 over 6x8: local ids within each group, chunks whole groups."""
    k = K("__kernel void loc(CHUNK_PARAMS, ACCESSOR(int, a)) "
          "{ AT2(a, GID(0), GID(1)) = get_local_id(0) * 10 + get_local_id(1); }", "loc")
    got = _launch(queue, k, cl.Buffer(np.zeros((6, 8), np.int32)), (6, 8), local_range=(2, 4))
    i, j = np.mgrid[0:6, 0:8]
    np.testing.assert_array_equal(got, (i % 2) * 10 + j % 4)


@pytest.mark.parametrize("local, match", [((3,), "not a multiple of local_range"), ((0,), "must be positive"),
                                          ((2, 2), "must have 1 extent")])
def test_local_range_that_does_not_fit_the_range_is_an_error_at_submit(queue, local, match):
    b = cl.Buffer(np.zeros(8, np.float32))

    def cgf(cgh):
        cgh.parallel_for((8,), IOTA_FLOAT, args=(b.access(cgh, cl.one_to_one(), cl.write),), local_range=local)

    with pytest.raises(cl.CeleritasError, match=match):
        queue.submit(cgf)


def test_build_error_names_kernel_task_and_shows_the_log(queue):
    """A source that does not compile: cl.BackendError with the kernel, the task, and the
    compiler's message (the undeclared identifier)."""
    k = K("__kernel void bad(CHUNK_PARAMS, ACCESSOR(float, a)) { AT1(a, GID(0)) = undeclared_thing; }", "bad")
    with pytest.raises(cl.BackendError, match=r"(?s)OpenCL kernel 'bad' failed to build.*undeclared_thing.*"
                                              r"in kernel 'bad' of task T\d+"):
        _launch(queue, k, cl.Buffer(np.zeros(4, np.float32)), (4,))


@pytest.mark.parametrize("extra", [0, 2])
def test_wrong_parameter_count_says_what_the_arguments_make(queue, extra):
    """One accessor and ``extra`` scalars for a kernel with one accessor and one scalar."""
    b = cl.Buffer(np.zeros(4, np.int32))
    with pytest.raises(cl.BackendError, match=rf"kernel 'fill' has 14 parameters, but its arguments make "
                                              rf"{13 + extra}: CHUNK_PARAMS \(6\), 1 accessor"):
        _launch(queue, FILL_INT, b, (4,), args=lambda a: (a,) + (1,) * extra)


@pytest.mark.parametrize("value", [True, np.bool_(False)])
def test_bool_scalar_is_an_int(queue, value):
    """As documented: a bool argument is an ``int`` (0 or 1)."""
    got = _launch(queue, FILL_INT, cl.Buffer(np.full(4, 9, np.int32)), (4,), args=lambda a: (a, value))
    np.testing.assert_array_equal(got, np.full(4, int(value)))


def test_complex_and_float32_scalars_into_vector_and_double_parameters(queue):
    """A Python complex fills a ``float2`` parameter (as complex64), an np.float32 a
    ``double`` one; a ``__constant`` pointer takes a read accessor."""
    k = K("__kernel void z(CHUNK_PARAMS, __constant float2* s, long s_o0, long s_o1, long s_o2, long s_e0, "
          "long s_e1, long s_e2, ACCESSOR(float2, d), float2 c, double f) "
          "{ AT1(d, GID(0)) = AT1(s, GID(0)) * (float)f + c; }", "z")
    src = cl.Buffer((np.arange(4) + 1j).astype(np.complex64))
    dst = cl.Buffer(shape=(4,), dtype=np.complex64)

    def cgf(cgh):
        cgh.parallel_for((4,), k, args=(src.access(cgh, cl.one_to_one(), cl.read),
                                        dst.access(cgh, cl.one_to_one(), cl.discard_write), 0.5 - 2j,
                                        np.float32(2)))

    queue.submit(cgf)
    np.testing.assert_array_equal(queue.fence(dst).result(),
                                  ((np.arange(4) + 1j) * 2 + (0.5 - 2j)).astype(np.complex64))


def test_kernel_without_opencl_source_is_an_error_naming_it(queue):
    k = cl.Kernel(source={"cuda": "__global__ void z() {}"}, name="z")
    with pytest.raises(cl.BackendError, match=r"kernel 'z' has no OpenCL source"):
        _launch(queue, k, cl.Buffer(np.zeros(4, np.float32)), (4,))


def test_alternating_scalars_each_launch_gets_its_own(queue):
    """The backend keeps a kernel's arguments between launches that repeat them: 1, 2, 1,
    2 (and an int / float of equal value) must each reach the kernel."""
    k = K("__kernel void add(CHUNK_PARAMS, ACCESSOR(double, a), double s) { AT1(a, GID(0)) += s; }", "add")
    b = cl.Buffer(np.zeros(4))
    total = 0.0
    for s in (1.0, 2.0, 1.0, 2.0, 3, 3.0, np.float32(0.5)):
        total += float(s)
        np.testing.assert_array_equal(_launch(queue, k, b, (4,), args=lambda a, s=s: (a, s)), np.full(4, total))


@pytest.mark.parametrize("op, want", [(cl.plus, 500500), (cl.maximum, 1000), (cl.minimum, 1)])
def test_reductions_of_python_kernels_on_opencl(queue, op, want):
    """BEHAVIOURS 12 on OpenCL devices: the item indices 1..1000 reduced."""
    r = cl.Buffer(np.zeros(1, np.int64))

    def cgf(cgh):
        red = cl.reduction(r, cgh, op, initialize_to_identity=True)

        @cgh.parallel_for((1000,), offset=(1,), reductions=[red], name="sum")
        def kernel(chunk, red):
            red.combine(chunk.xp.arange(chunk.offset[0], chunk.offset[0] + chunk.range[0]))

    queue.submit(cgf)
    assert queue.fence(r).result()[0] == want


def test_python_kernel_on_opencl_gets_numpy_views_of_device_memory(queue):
    """chunk.xp is numpy and a Python kernel after a source kernel sees its values."""
    b = cl.Buffer(shape=(8,), dtype=np.float32)
    _launch(queue, IOTA_FLOAT, b, (8,), mode=cl.discard_write)
    modules = []

    def cgf(cgh):
        a = b.access(cgh, cl.one_to_one(), cl.read_write)

        @cgh.parallel_for((8,), name="square")
        def kernel(chunk):
            modules.append(chunk.xp)
            a[chunk] = a[chunk] ** 2

    queue.submit(cgf)
    np.testing.assert_array_equal(queue.fence(b).result(), np.arange(8) ** 2)
    assert set(modules) == {np}


def test_same_buffer_in_two_accessors_of_one_source_kernel(queue):
    """A buffer read through a neighbourhood accessor and written through another accessor
    of a second buffer, and the same accessor passed twice in ``args``."""
    k = K("__kernel void two(CHUNK_PARAMS, ACCESSOR(int, a), ACCESSOR(int, b), ACCESSOR(int, out)) "
          "{ AT1(out, GID(0)) = AT1(a, GID(0)) + AT1(b, GID(0)); }", "two")
    x = cl.Buffer(np.arange(8, dtype=np.int32))
    y = cl.Buffer(shape=(8,), dtype=np.int32)

    def cgf(cgh):
        r = x.access(cgh, cl.one_to_one(), cl.read)
        cgh.parallel_for((8,), k, args=(r, r, y.access(cgh, cl.one_to_one(), cl.discard_write)))

    queue.submit(cgf)
    np.testing.assert_array_equal(queue.fence(y).result(), 2 * np.arange(8))


def test_zero_dimensional_buffer_and_kernel(queue):
    """A 0-D buffer updated by a 0-D launch (one work item)."""
    k = K("__kernel void z(CHUNK_PARAMS, ACCESSOR(int, a)) { a[0] += 1; }", "z")
    got = _launch(queue, k, cl.Buffer(np.array(5, np.int32)), (), mapper=cl.all())
    assert got.shape == () and got == 6


@pytest.mark.parametrize("devices, match", [
    ("opencl:0", r"devices='opencl:0' is not a device list; use host:N, cuda, cuda:0,1, opencl or opencl:P:D"),
    ("opencl:0:0,", "is not a device list"),
    ("opencl:-1:0", "is not a device list"),
    ("opencl:a:b", "is not a device list"),
    ("opencl:9:0", r"OpenCL platform 9 does not exist; this machine has \d+ platform"),
    ("opencl:0:99", r"OpenCL platform 0 .* has no device 99; this machine has: platform 0"),
])
def test_device_strings_that_name_no_opencl_device_are_config_errors(devices, match):
    with pytest.raises(cl.ConfigError, match=match):
        cl.Queue(devices=devices)


def test_device_string_is_case_and_space_insensitive():
    q = cl.Queue(devices=" OpenCL:0:0,0:0 ")
    try:
        assert q.runtime.backend_name == "opencl" and q.runtime.backend.num_devices == 2
    finally:
        q.shutdown()


def test_mixing_backends_across_ranks_with_source_kernels_where_they_run():
    """Rank 0 on OpenCL runs the source kernel on its half; rank 1 on host devices runs a
    Python kernel on its half (a source kernel there is refused); the reader of all()
    sees both halves on either rank."""
    def program(rank):
        q = cl.Queue(devices="opencl" if rank == 0 else "host:2")
        b = cl.Buffer(shape=(16,), dtype=np.float32)

        def write(cgh):
            a = b.access(cgh, cl.one_to_one(), cl.discard_write)
            if rank == 0:
                cgh.parallel_for((16,), IOTA_FLOAT, args=(a,))
            else:
                cgh.parallel_for((16,), lambda c: a.__setitem__(c, np.arange(c.offset[0], c.offset[0] + c.range[0])),
                                 name="iota")
        q.submit(write)
        return q.fence(b).result()

    for got in run_cluster(program, nodes=2):
        np.testing.assert_array_equal(got, np.arange(16))
