"""Host backend: separate memories, n-d strided copies, in-order concurrent lanes."""
from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from executor.backends import AllocationError, BackendError, HostBackend, Lane, box_view, copy_box
from executor.backends.host import HUGE_PAGE, host_empty
from scheduler.geometry import Box
from scheduler.instruction_graph import HOST_MEMORY, USER_MEMORY, device_memory

SETTINGS = settings(max_examples=150, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

D0 = Lane("device", 0, 0)
D1 = Lane("device", 1, 0)
H0 = Lane("host", None, 0)


@pytest.fixture
def backend():
    b = HostBackend(2)
    yield b
    b.close()


def test_allocations_are_separate_arrays(backend):
    arrays = [backend.allocate(m, (4, 5), np.float32) for m in (USER_MEMORY, HOST_MEMORY,
                                                                  device_memory(0), device_memory(1))]
    arrays.append(backend.allocate(device_memory(0), (4, 5), np.float32))
    for a in arrays:
        assert a.shape == (4, 5) and a.dtype == np.float32
    for i, a in enumerate(arrays):
        for b in arrays[i + 1:]:
            assert not np.shares_memory(a, b)
    assert backend.live_bytes(device_memory(0)) == 2 * 80
    backend.free(device_memory(0), arrays[2])
    assert backend.live_bytes(device_memory(0)) == 80
    with pytest.raises(BackendError):
        backend.free(device_memory(0), arrays[2])    # double free


def test_allocation_failures_are_clear():
    b = HostBackend(1, memory_capacity=1000)
    try:
        keep = b.allocate(device_memory(0), (100,), np.float64)   # 800 bytes
        with pytest.raises(AllocationError, match=r"cannot allocate 800 bytes in M2.*\n.*M2: 1 live"):
            b.allocate(device_memory(0), (100,), np.float64)
        b.free(device_memory(0), keep)
        b.allocate(device_memory(0), (100,), np.float64)          # fits again
        with pytest.raises(AllocationError, match="M7 does not exist"):
            b.allocate(7, (1,), np.float32)
        with pytest.raises(AllocationError, match="invalid allocation"):
            b.allocate(HOST_MEMORY, (-3,), np.float32)
        with pytest.raises(MemoryError):                           # AllocationError is a MemoryError
            b.allocate(HOST_MEMORY, (1,), "not-a-dtype")
    finally:
        b.close()


def _mapped(addr: int) -> bool:
    """Whether ``addr`` lies in a mapping of this process."""
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split(None, 1)[0].split("-"))
            if lo <= addr < hi:
                return True
    return False


@pytest.mark.parametrize("shape,dtype", [((1024, 1024), np.float32), ((3, 700_001), np.float64),
                                         ((HUGE_PAGE,), np.uint8)])
def test_large_allocations_are_huge_page_aligned_and_pooled_once_no_view_is_left(backend, shape, dtype):
    a = backend.allocate(device_memory(1), shape, dtype)
    addr = a.ctypes.data
    assert addr % HUGE_PAGE == 0 and a.shape == shape and a.dtype == dtype
    assert a.flags.c_contiguous and a.flags.writeable
    a[...] = 7
    a.flat[-1] = 3                       # the last element is inside the mapping
    assert a.sum() == 7 * (a.size - 1) + 3
    view = a[1:]                         # a view keeps the mapping from the pool
    backend.free(device_memory(1), a)
    del a
    pool = backend.memory_pool
    assert pool.pooled_bytes == 0 and view.flat[0] == 7
    other = backend.allocate(device_memory(0), shape, dtype)
    assert other.ctypes.data != addr     # not the memory the view still shows
    backend.free(device_memory(0), other)
    del other                            # (pooled now)
    del view                             # the last view gone: its mapping is pooled too
    assert pool.pooled_bytes > 0
    reused_before = pool.reused
    again = backend.allocate(device_memory(1), shape, dtype)
    assert pool.reused == reused_before + 1 and again.ctypes.data % HUGE_PAGE == 0
    backend.free(device_memory(1), again)
    del again
    backend.close()                      # the pool lets go of its mappings
    assert pool.pooled_bytes == 0
    import sys
    if sys.platform.startswith("linux"):
        assert not _mapped(addr)


def test_without_a_pool_the_mapping_goes_with_the_last_view():
    a = host_empty((1024, 1024), np.float32)
    addr = a.ctypes.data
    view = a[3:]
    del a
    assert _mapped(addr)
    del view
    import sys
    if sys.platform.startswith("linux"):
        assert not _mapped(addr)         # unmapped, not kept by malloc


@pytest.mark.timeout(30)
def test_an_array_freed_while_the_pool_is_busy_on_the_same_thread_is_pooled():
    """A garbage collection started inside the pool's critical section may run an array's
    finalizer (``give``) on the same thread: it must not deadlock."""
    from executor.backends.host import HostMemoryPool
    pool = HostMemoryPool()
    a = host_empty((HUGE_PAGE,), np.uint8, pool=pool)
    with pool._lock:
        del a                                        # the finalizer runs here
    assert pool.pooled_bytes == 2 * HUGE_PAGE


def test_the_pool_is_bounded():
    from executor.backends.host import HostMemoryPool
    pool = HostMemoryPool(limit=3 * HUGE_PAGE)
    arrays = [host_empty((HUGE_PAGE,), np.uint8, pool=pool) for _ in range(3)]   # 2 huge pages each
    del arrays
    assert pool.pooled_bytes == 2 * HUGE_PAGE       # one fits, the others were unmapped
    b = host_empty((HUGE_PAGE - 4096,), np.uint8, 0, pool)            # the same size class
    assert pool.reused == 1 and pool.pooled_bytes == 0 and b.ctypes.data % HUGE_PAGE == 0
    pool.close()
    del b
    assert pool.pooled_bytes == 0                    # closed: nothing is kept any more


def test_huge_pages_setting_is_parsed_and_reaches_the_backend(monkeypatch):
    import celeritas as cl
    from celeritas.config import from_env
    assert from_env({}).huge_pages == HUGE_PAGE
    assert from_env({"CELERITAS_HUGE_PAGES": "on"}).huge_pages == HUGE_PAGE
    assert from_env({"CELERITAS_HUGE_PAGES": "Off"}).huge_pages is None
    assert from_env({"CELERITAS_HUGE_PAGES": "0"}).huge_pages == 0
    assert from_env({"CELERITAS_HUGE_PAGES": "8388608"}).huge_pages == 8 << 20
    for setting, aligned in (("0", True), ("off", False)):
        monkeypatch.setenv("CELERITAS_HUGE_PAGES", setting)
        q = cl.Queue(devices="host:2")
        try:
            rt = q._rt
            assert rt.backend.huge_pages == (0 if aligned else None)
            a = rt.backend.allocate(device_memory(1), (4,), np.float32)   # 16 bytes
            if aligned:
                assert a.ctypes.data % HUGE_PAGE == 0
            rt.backend.free(device_memory(1), a)
            b = cl.Buffer(np.arange(12, dtype=np.int64).reshape(3, 4))

            def cgf(cgh, b=b):
                acc = b.access(cgh, cl.one_to_one(), cl.read_write)

                @cgh.parallel_for((3, 4), name="double")
                def k(chunk):
                    acc[chunk] = acc[chunk] * 2
            q.submit(cgf)
            np.testing.assert_array_equal(q.fence(b).result(timeout=30), np.arange(12).reshape(3, 4) * 2)
        finally:
            q.shutdown()


def test_only_whole_huge_pages_are_advised():
    """A tail shorter than a huge page stays on small pages: an array never takes more
    resident memory than its bytes (plus less than one small page)."""
    def rss_kb() -> int:
        with open("/proc/self/smaps_rollup") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("Rss:"))
    before = rss_kb()
    a = host_empty((HUGE_PAGE + 100_000,), np.uint8)
    a[:] = 1
    grew = rss_kb() - before
    assert grew * 1024 < 2 * HUGE_PAGE - 100_000      # not rounded up to two huge pages
    assert a.ctypes.data % HUGE_PAGE == 0 and int(a.sum()) == a.size


def test_a_failed_mapping_is_an_allocation_error(backend, monkeypatch):
    import errno
    import mmap as mmap_module

    def refuse(*args, **kwargs):
        raise OSError(errno.ENOMEM, "Cannot allocate memory")
    monkeypatch.setattr(mmap_module, "mmap", refuse)
    with pytest.raises(AllocationError, match=r"cannot allocate 4194304 bytes in M3.*cannot map 4194304 bytes"):
        backend.allocate(device_memory(1), (1024, 1024), np.float32)
    assert backend.live_bytes(device_memory(1)) == 0        # the reservation was given back


def test_transparent_huge_page_mode_is_read_from_the_kernel_setting(tmp_path):
    from executor.backends.host import transparent_huge_pages
    f = tmp_path / "enabled"
    f.write_text("always [madvise] never\n")
    assert transparent_huge_pages(str(f)) == "madvise"
    f.write_text("always madvise [never]\n")
    assert transparent_huge_pages(str(f)) == "never"
    assert transparent_huge_pages(str(tmp_path / "absent")) is None


def test_small_allocations_are_plain_numpy_arrays():
    a = host_empty((HUGE_PAGE // 8 - 1,), np.float64)
    assert a.base is None and a.shape == (HUGE_PAGE // 8 - 1,)
    assert host_empty((0, 5), np.int32).shape == (0, 5)


def test_backend_info():
    b = HostBackend(2, peer_to_peer=False)
    info = b.backend_info()
    assert info.num_devices == 2
    assert info.memories == (0, 1, 2, 3)
    assert info.can_copy(1, 2) and info.can_copy(3, 1) and info.can_copy(0, 1)
    assert not info.can_copy(2, 3)
    assert HostBackend(2).backend_info().can_copy(2, 3)
    assert info.communicator_memories == {USER_MEMORY, HOST_MEMORY}
    assert info.device_memories == {0: 2, 1: 3}


@st.composite
def copy_case(draw, dims):
    """Two allocation extents and a box inside both."""
    box_lo, box_hi = [], []
    s_lo, s_hi, d_lo, d_hi = [], [], [], []
    for _ in range(dims):
        lo = draw(st.integers(-3, 5))
        hi = lo + draw(st.integers(1, 5))
        box_lo.append(lo)
        box_hi.append(hi)
        s_lo.append(lo - draw(st.integers(0, 3)))
        s_hi.append(hi + draw(st.integers(0, 3)))
        d_lo.append(lo - draw(st.integers(0, 3)))
        d_hi.append(hi + draw(st.integers(0, 3)))
    return Box(s_lo, s_hi), Box(d_lo, d_hi), Box(box_lo, box_hi)


def _expected(src, src_box, dst, dst_box, box):
    out = dst.copy()
    sl_d = tuple(slice(b - e, c - e) for b, c, e in zip(box.min, box.max, dst_box.min))
    sl_s = tuple(slice(b - e, c - e) for b, c, e in zip(box.min, box.max, src_box.min))
    out[sl_d] = src[sl_s]
    return out


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dims", [1, 2, 3])
@SETTINGS
@given(data=st.data())
def test_strided_copy_matches_numpy(backend, dims, data):
    src_box, dst_box, box = data.draw(copy_case(dims))
    src = backend.allocate(device_memory(0), src_box.shape, np.int64)
    dst = backend.allocate(device_memory(1), dst_box.shape, np.int64)
    src[...] = np.arange(src.size).reshape(src.shape)
    dst[...] = -1
    want = _expected(src, src_box, dst, dst_box, box)
    c = backend.copy(src, src_box, dst, dst_box, box, D1)
    assert c.wait(10)
    assert c.error() is None
    np.testing.assert_array_equal(dst, want)
    backend.free(device_memory(0), src)
    backend.free(device_memory(1), dst)


def test_copy_into_and_out_of_linearized_staging(backend):
    src_box = Box((0, 0, 0), (4, 5, 6))
    box = Box((1, 2, 1), (3, 4, 5))
    src = np.arange(120, dtype=np.float32).reshape(4, 5, 6)
    flat = backend.allocate(HOST_MEMORY, (box.area,), np.float32)
    assert backend.copy(src, src_box, flat, None, box, H0).wait(10)
    np.testing.assert_array_equal(flat, src[1:3, 2:4, 1:5].reshape(-1))
    back = np.zeros_like(src)
    assert backend.copy(flat, None, back, src_box, box, H0).wait(10)
    np.testing.assert_array_equal(back[1:3, 2:4, 1:5], src[1:3, 2:4, 1:5])
    assert back.sum() == src[1:3, 2:4, 1:5].sum()


def test_box_view_is_a_view_and_checks_bounds():
    a = np.zeros((4, 4))
    v = box_view(a, Box((2, 2), (6, 6)), Box((3, 4), (5, 6)))
    v[...] = 1
    assert a[1:3, 2:4].sum() == 4 and a.sum() == 4
    with pytest.raises(BackendError):
        box_view(a, Box((2, 2), (6, 6)), Box((0, 0), (3, 3)))
    scalar = np.zeros(())
    copy_box(np.full((), 7.0), Box(), scalar, Box(), Box())   # 0-d buffers: the unit box
    assert scalar == 7.0
    empty = Box((1,), (1,))
    assert empty.empty
    dst = np.zeros(3)
    copy_box(np.ones(3), Box((0,), (3,)), dst, Box((0,), (3,)), empty)   # empty box: no-op
    assert dst.sum() == 0


@pytest.mark.timeout(60)
def test_lane_runs_in_order(backend):
    seen = []
    cs = [backend.launch(D0, lambda i=i: seen.append(i)) for i in range(500)]
    assert cs[-1].wait(10)
    assert seen == list(range(500))
    assert all(c.is_done() and c.error() is None for c in cs)
    assert all(c.start_ns <= c.end_ns for c in cs)


@pytest.mark.timeout(60)
def test_lanes_run_concurrently(backend):
    # each lane waits for the other: only possible if they run at the same time
    a_started, b_started = threading.Event(), threading.Event()
    result = {}

    def on_a():
        a_started.set()
        result["a"] = b_started.wait(10)

    def on_b():
        b_started.set()
        result["b"] = a_started.wait(10)

    ca = backend.launch(D0, on_a)
    cb = backend.launch(D1, on_b)
    assert ca.wait(20) and cb.wait(20)
    assert result == {"a": True, "b": True}


@pytest.mark.timeout(60)
def test_a_lane_keeps_nothing_of_the_work_it_finished(backend):
    """A copy run on a lane holds its arrays in the work item; the worker kept its last item
    while it waited for the next, so an allocation freed after the copy stayed alive, and its
    mapping out of the pool (wave_sim's fields, copied in from host data on two lanes,
    were mapped anew by every later run instead of taken from the pool)."""
    import time
    shape = (HUGE_PAGE // 4,)
    src = np.arange(shape[0], dtype=np.float32)
    dst = backend.allocate(device_memory(0), shape, np.float32)
    assert backend.copy(src, None, dst, None, Box((0,), shape), D0).wait(10)
    assert dst[-1] == shape[0] - 1
    backend.free(device_memory(0), dst)
    del dst
    deadline = time.monotonic() + 5
    while backend.memory_pool.pooled_bytes == 0 and time.monotonic() < deadline:
        time.sleep(0.01)       # (the worker lets go of the item just after completing it)
    assert backend.memory_pool.pooled_bytes > 0


def test_lane_threads_are_reused(backend):
    idents = {H0: set(), D0: set()}
    for i in range(50):
        lane = H0 if i % 2 else D0
        backend.launch(lane, lambda lane=lane: idents[lane].add(threading.get_ident()))
    assert backend.launch(H0, lambda: None).wait(10)
    assert backend.launch(D0, lambda: None).wait(10)
    assert sorted(backend.lanes) == sorted([H0, D0])
    assert len(idents[H0]) == 1 and len(idents[D0]) == 1
    assert idents[H0] != idents[D0]
    assert threading.get_ident() not in idents[H0] | idents[D0]


@pytest.mark.timeout(60)
def test_errors_are_reported_and_the_lane_survives(backend):
    def boom():
        raise ZeroDivisionError("boom")

    c1 = backend.launch(D0, boom)
    c2 = backend.launch(D0, lambda: 42)
    assert c2.wait(10)
    assert isinstance(c1.error(), ZeroDivisionError)
    assert c2.error() is None


@pytest.mark.timeout(60)
def test_notifier_sees_every_completion(backend):
    got = []
    done = threading.Event()

    def notify(c):
        got.append(c)
        if len(got) == 3:
            done.set()

    backend.set_notifier(notify)
    cs = [backend.launch(D0, lambda: None), backend.launch(H0, lambda: None), backend.launch(D1, lambda: None)]
    assert done.wait(10)
    assert set(map(id, got)) == set(map(id, cs))
    assert all(c.notifying for c in cs)


def test_lane_cost_counts_time_recorded_as_blocked_on_a_device(backend):
    """A lane's cost estimate is the worker's CPU time plus what the work recorded as time
    blocked on a device (an OpenCL event): waiting for the device is the work's cost, waiting
    for the GIL is not."""
    from executor.backends.backend import note_blocked
    lane = Lane("device", 0, 0)
    plain = backend.launch(lane, lambda: None)
    blocked = backend.launch(lane, lambda: note_blocked(50_000_000))     # "50 ms on the device"
    assert plain.wait(5) and blocked.wait(5)
    assert plain.cpu_ns < 50_000_000 <= blocked.cpu_ns
