"""Random programs must give the buffers of a sequential numpy run on every configuration."""
import os
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import celeritas as cl
from celeritas.testing import run_cluster

from differential import compare, generate, run_celeritas, run_model

EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_EXAMPLES", "200"))


@pytest.mark.timeout(1800)
@settings(max_examples=EXAMPLES, deadline=None, derandomize=False,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**31 - 1), ranks=st.integers(1, 4), devices=st.integers(1, 3),
       lookahead=st.sampled_from(["none", "auto", "infinite"]), oversubscribe=st.sampled_from([1, 3]),
       transfers=st.sampled_from(["staged", "direct"]))
def test_random_programs_match_numpy(seed, ranks, devices, lookahead, oversubscribe, transfers):
    prog = generate(random.Random(seed))
    want = run_model(prog)

    def program(rank):
        q = cl.Queue()
        if oversubscribe > 1:
            _oversubscribe_all(q, oversubscribe)
        return run_celeritas(prog, q)

    results = run_cluster(program, nodes=ranks, devices=devices, timeout=120, CELERITAS_LOOKAHEAD=lookahead,
                          CELERITAS_HORIZON_STEP="2", CELERITAS_MPI_DEVICE_MEMORY=transfers)
    for rank, got in enumerate(results):
        compare(got, want, rank)


def _oversubscribe_all(q, k):
    """Wrap submit so every command group carries the oversubscribe hint."""
    submit = q.submit

    def hinted(cgf):
        def wrapped(cgh):
            cgf(cgh)
            cl.hint(cgh, cl.oversubscribe(k))
        submit(wrapped)

    q.submit = hinted


OPENCL_EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_OPENCL_EXAMPLES", "25"))


def _have_opencl() -> bool:
    try:
        from executor.backends.opencl import opencl_devices
        opencl_devices()
        return True
    except Exception:  # noqa: BLE001 - no PyOpenCL or no device that builds kernels
        return False


@pytest.mark.timeout(1800)
@pytest.mark.skipif(not _have_opencl(), reason="no OpenCL device (apt-get install pocl-opencl-icd)")
@settings(max_examples=OPENCL_EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), ranks=st.integers(1, 3), lookahead=st.sampled_from(["none", "auto"]))
def test_random_programs_match_numpy_on_opencl(seed, ranks, lookahead):
    prog = generate(random.Random(seed))
    want = run_model(prog)
    results = run_cluster(lambda rank: run_celeritas(prog, cl.Queue()), nodes=ranks, timeout=120,
                          CELERITAS_DEVICES="opencl:0:0,0:0", CELERITAS_LOOKAHEAD=lookahead)
    for rank, got in enumerate(results):
        compare(got, want, rank)
