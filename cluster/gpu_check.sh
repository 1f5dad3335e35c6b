#!/bin/bash
# The GPU checks, as one script for a machine with an NVIDIA GPU and CuPy (run from the
# repository root): tests/test_cuda.py, then benchmarks/bench_cuda.py, outputs under
# ${OUT:-gpu_check}/.  The two-rank test of test_cuda.py needs an mpiexec: where the machine
# has none that matches its mpi4py, put the mpi4py and mpich wheels for its Python in .whl/
# (pip download --no-deps --only-binary=:all: --python-version 3.12 ... mpi4py mpich) and
# this script unpacks them (MPICH's wheel keeps libmpi in its data folder, which
# pip --target drops, so it is unpacked by hand).
set -u
export PYTHONUNBUFFERED=1
ROOT=$(pwd)
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
{ nvidia-smi -L; $PY --version; $PY -c "import cupy; print('cupy', cupy.__version__)"; } 2>&1 | tee "$OUT/info.txt"
export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
if ls .whl/mpich-*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/celeritas-mpi .whl/mpi4py*.whl
    $PY - <<'PY'
import glob, zipfile
z = zipfile.ZipFile(glob.glob(".whl/mpich-*.whl")[0])
for n in z.namelist():
    if ".data/data/" in n:
        z.extract(n, "/tmp/celeritas-mpich")
PY
    D=$(echo /tmp/celeritas-mpich/mpich-*.data/data)
    chmod +x "$D"/bin/*
    export PYTHONPATH=$PYTHONPATH:/tmp/celeritas-mpi PATH=$D/bin:$PATH LD_LIBRARY_PATH=$D/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
echo "=== tests/test_cuda.py"
timeout 300 $PY -m pytest tests/test_cuda.py -v -p no:cacheprovider --timeout 240 -rA 2>&1 | tee "$OUT/pytest.txt" | tail -5
echo "=== benchmarks/bench_cuda.py"
timeout 300 $PY -m benchmarks.bench_cuda --json "$OUT/bench_cuda.json" 2>&1 | tee "$OUT/bench_cuda.txt"
