"""celeritas' benchmarks (see docs/benchmarks.md).

Importing the package gives every benchmark process's baselines (numpy, Dask and mpi4py
loops) the malloc settings celeritas runs with (``celeritas.runtime.tune_host_allocator``),
before anything allocates: large temporaries then cost a baseline what they cost a
celeritas kernel, whichever of the two runs first, and a ratio measures the runtime.
"""
import sys
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:
    sys.path.insert(0, str(_ROOT))

from celeritas.runtime import baseline_allocator  # noqa: E402

baseline_allocator()
