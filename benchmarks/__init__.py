"""celeritas' benchmarks (see docs/benchmarks.md).

Importing the package gives every benchmark process's baselines (numpy, Dask and mpi4py
loops) the malloc settings celeritas runs with (``celeritas.runtime.tune_host_allocator``),
before anything allocates: large temporaries then cost a baseline what they cost a
celeritas kernel, whichever of the two runs first, and a ratio measures the runtime.
"""
from celeritas.runtime import baseline_allocator

baseline_allocator()
