"""Sends and receives from device memory (CUDA-aware MPI) or staged through host memory.

``CELERITAS_MPI_DEVICE_MEMORY`` picks the path; the host backend's simulated
device memories are ordinary numpy arrays, so the direct path's graphs and
results are checked here on the CPU (the CUDA variant needs a GPU and a
CUDA-aware MPI: tests/test_cuda.py).
"""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest

import celeritas as cl
from apps import wave_sim
from celeritas.runtime import scheduler_system
from celeritas.testing import run_cluster
from executor.backends.backend import BackendInfo
from executor.backends.host import HostBackend

pytestmark = pytest.mark.timeout(120)


def _wave(rank):
    q = cl.Queue(record=True)
    result = wave_sim.run(q, 40, 6)
    graphs = q.graphs()
    q.shutdown()
    return result, graphs


@pytest.fixture(scope="module")
def reference():
    return run_cluster(_wave, nodes=1, devices=1)[0][0]


def _copies(instructions):
    return Counter((i["source_memory"], i["dest_memory"]) for i in instructions if i["kind"] == "copy")


def test_direct_sends_skip_the_host_staging_copies(reference):
    staged = run_cluster(_wave, nodes=2, devices=2, CELERITAS_MPI_DEVICE_MEMORY="staged")
    direct = run_cluster(_wave, nodes=2, devices=2, CELERITAS_MPI_DEVICE_MEMORY="direct")
    for res in (staged, direct):
        for result, _graphs in res:
            assert np.array_equal(result, reference)
    for rank in range(2):
        s_ins, d_ins = staged[rank][1]["instructions"], direct[rank][1]["instructions"]
        s_copies, d_copies = _copies(s_ins), _copies(d_ins)
        device_to_host = lambda c: sum(n for (src, dst), n in c.items() if src >= 2 and dst == 1)  # noqa: E731
        host_to_device = lambda c: sum(n for (src, dst), n in c.items() if src == 1 and dst >= 2)  # noqa: E731
        assert device_to_host(s_copies) > 0          # staged: halos leave through host memory
        assert host_to_device(s_copies) > 0          # ... and arrive there
        assert device_to_host(d_copies) == 0         # direct: straight from the device allocation
        assert host_to_device(d_copies) == 0         # ... into the reading device's allocation
        d_allocs = {i["allocation"]: i["memory"] for i in d_ins if i["kind"] == "alloc"}
        # halo receives that a kernel reads land in that kernel's device memory; only the
        # final fence's gather (read by a copy into user memory) still lands in host memory
        readers = {}
        for i in d_ins:
            for dep in i["deps"]:
                readers.setdefault(dep["id"], []).append(i["kind"])
        receives = [i for i in d_ins if i["kind"] in ("receive", "split_receive")]
        halo = [r for r in receives if "device_kernel" in readers.get(r["id"], ())]
        assert len(halo) >= 5 and all(d_allocs[r["dest"]] >= 2 for r in halo)
        assert sum(i["kind"] == "send" for i in s_ins) == sum(i["kind"] == "send" for i in d_ins) > 0
        assert sum(d_copies.values()) < sum(s_copies.values())
        # every send of the direct run reads a device allocation: its producers are kernels or
        # device copies, never a copy into host memory
        by_id = {i["id"]: i for i in d_ins}
        for send in (i for i in d_ins if i["kind"] == "send"):
            for dep in send["deps"]:
                producer = by_id[dep["id"]]
                assert not (producer["kind"] == "copy" and producer["dest_memory"] == 1), (send, producer)


def test_auto_sends_host_device_memory_directly():
    """The host backend's device memories are ordinary host memory: auto hands them to the
    communicator (no staging copies), exactly as direct does."""
    auto = run_cluster(_wave, nodes=2, devices=1)
    direct = run_cluster(_wave, nodes=2, devices=1, CELERITAS_MPI_DEVICE_MEMORY="direct")
    staged = run_cluster(_wave, nodes=2, devices=1, CELERITAS_MPI_DEVICE_MEMORY="staged")
    assert _copies(auto[0][1]["instructions"]) == _copies(direct[0][1]["instructions"])
    assert sum(_copies(auto[0][1]["instructions"]).values()) < sum(_copies(staged[0][1]["instructions"]).values())
    np.testing.assert_array_equal(auto[0][0], staged[0][0])


class _FakeBackend:
    def __init__(self, info: BackendInfo):
        self._info = info
        self.num_devices = info.num_devices

    def backend_info(self) -> BackendInfo:
        return self._info


def _cuda_like(direct=True) -> _FakeBackend:
    return _FakeBackend(BackendInfo(num_devices=2, memories=(0, 1, 2, 3),
                                    copy_pairs=frozenset((s, d) for s in range(4) for d in range(4)),
                                    communicator_memories=frozenset({0, 1}),
                                    direct_memories=frozenset({2, 3}) if direct else frozenset(),
                                    direct_needs="cuda" if direct else None))


@pytest.mark.parametrize("aware, mode, expected", [
    (True, "auto", {0, 1, 2, 3}), (False, "auto", {0, 1}), (None, "auto", {0, 1}),
    (True, "staged", {0, 1}), (True, "direct", {0, 1, 2, 3}),
])
def test_cuda_memory_goes_to_mpi_only_when_mpi_is_cuda_aware(aware, mode, expected):
    system = scheduler_system(_cuda_like(), mode, SimpleNamespace(cuda_aware=aware))
    assert system.comm_memories == frozenset(expected)


@pytest.mark.parametrize("aware", [False, None])
def test_direct_without_cuda_aware_mpi_is_a_config_error(aware):
    with pytest.raises(cl.ConfigError, match="CELERITAS_MPI_DEVICE_MEMORY=direct.*CUDA support"):
        scheduler_system(_cuda_like(), "direct", SimpleNamespace(cuda_aware=aware))


def test_direct_on_a_backend_whose_memory_mpi_cannot_touch_is_a_config_error():
    with pytest.raises(cl.ConfigError, match="fake backend's device memory"):
        scheduler_system(_cuda_like(direct=False), "direct", SimpleNamespace(cuda_aware=True))


def test_host_backend_device_memories_are_direct_capable():
    info = HostBackend(3).backend_info()
    assert info.direct_memories == frozenset({2, 3, 4}) and info.direct_needs is None
    assert scheduler_system(HostBackend(3), "direct", SimpleNamespace(cuda_aware=False)).comm_memories == \
        frozenset({0, 1, 2, 3, 4})
    # auto needs no CUDA awareness for them; staged keeps MPI on host memory
    assert scheduler_system(HostBackend(3), "auto", None).comm_memories == frozenset({0, 1, 2, 3, 4})
    assert scheduler_system(HostBackend(3), "staged", None).comm_memories == frozenset({0, 1})


def test_auto_keeps_memory_the_communicator_cannot_touch_staged():
    """A backend without direct-capable memories (OpenCL) stays staged under auto."""
    system = scheduler_system(_cuda_like(direct=False), "auto", SimpleNamespace(cuda_aware=True))
    assert system.comm_memories == frozenset({0, 1})


def test_cuda_awareness_override():
    """CELERITAS_MPI_CUDA_AWARE (parsed by the configuration) wins over asking the library."""
    from celeritas.config import from_env
    from executor.mpi import mpi_cuda_support
    assert mpi_cuda_support(from_env({"CELERITAS_MPI_CUDA_AWARE": "1"}).mpi_cuda_aware) is True
    assert mpi_cuda_support(from_env({"CELERITAS_MPI_CUDA_AWARE": "0"}).mpi_cuda_aware) is False
    with pytest.raises(cl.ConfigError, match="CELERITAS_MPI_CUDA_AWARE"):
        from_env({"CELERITAS_MPI_CUDA_AWARE": "perhaps"})
