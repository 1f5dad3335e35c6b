"""Adversarial probes of real multi-rank runs: ``mpiexec -n 2`` / ``-n 4`` jobs.

The first probing rounds (tests/test_api_probing.py, tests/test_probing_config_cli_ranks.py)
fed bad input to one process or to a simulated cluster; this one runs real jobs with the
``mpiexec`` next to the interpreter (MPICH from PyPI) and probes what only they exercise:
buffers whose size is not divisible by the rank count, smaller than it or empty; 1-D, 2-D
and 3-D splits with neighbourhood halos over hundreds of steps; all()-reads after
distributed writes; reductions across ranks; master-node and collective host tasks (with
their mpi4py communicators); fences on every rank; transfers of 64 MiB and hundreds of
small ones; failures on one rank (kernels, host tasks, the application, KeyboardInterrupt,
SystemExit); SIGINT and SIGTERM to the job and to one rank; buffers made and dropped in
loops; two queues in sequence in one process; ``CELERITAS_*`` settings that differ
between ranks (MPICH's ``A : B`` syntax); graph dumps and traces under mpiexec.

Each probe writes a small script to ``tmp_path`` and runs it in its own session with a
timeout (a hang fails the test and the whole job is killed); the ranks print or save
their results, which the test compares with numpy.

The project rule: results equal numpy's on any rank count; every bad input or failure
gives a clear ``cl.*Error`` naming what was wrong (task, buffer, rank, variable) and ends
every rank promptly with a non-zero exit, never a hang or lost data.

The first group are the defects probing found (each was a strict xfail, fixed since; its
docstring gives Input / Happened / Expected).  The second group pins probes that already
behaved well.
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from jobs import MPIEXEC, ROOT, clean_env, mpi_flavor, needs_mpi, needs_rank_env, rank_env_args, run_job

pytestmark = [pytest.mark.timeout(180), pytest.mark.mpi]


# What every script starts with: numpy, celeritas, the folder the test gave it (argv[1]),
# and save(tag, value), which stores a rank's result there for the test to compare.
PRELUDE = """import sys, os, time
import numpy as np
import celeritas as cl
OUT = sys.argv[1]


def save(tag, value):
    np.save(os.path.join(OUT, f"{tag}.rank{q.rank}.npy"), np.asarray(value))


"""


def _env(extra: dict | None = None) -> dict:
    return clean_env({"CELERITAS_DEVICES": "host:1", **(extra or {})})


def _script(tmp_path: Path, body: str, name: str = "prog.py") -> Path:
    path = tmp_path / name
    path.write_text(PRELUDE + textwrap.dedent(body))
    return path


def _explain(r) -> str:
    return f"exit {r.returncode} after {r.seconds:.1f} s\nstdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-6000:]}"


def _run(argv: list, env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``argv`` in its own session; past ``timeout`` the whole job (mpiexec and every
    rank) is killed and the test fails with what it printed (``jobs.run_job``)."""
    return run_job(argv, env, timeout, cwd=ROOT)


def mpirun(n: int, script: Path, *, env: dict | None = None, timeout: float = 60, args=()) -> subprocess.CompletedProcess:
    return _run([MPIEXEC, "-n", n, sys.executable, script, script.parent, *args], _env(env), timeout)


def mpirun_split(script: Path, rank1_env: dict, *, env: dict | None = None, timeout: float = 20):
    """mpiexec -n 1 python S : -n 1 -env K V ... python S (Open MPI: -x K=V): rank 1 gets
    ``rank1_env`` on top."""
    extra = rank_env_args(rank1_env)
    argv = [MPIEXEC, "-n", 1, sys.executable, script, script.parent, ":",
            "-n", 1, *extra, sys.executable, script, script.parent]
    return _run(argv, _env(env), timeout)


def _ok(r, ranks: int, tag: str = "ok") -> None:
    assert r.returncode == 0, _explain(r)
    for k in range(ranks):
        assert f"rank {k}: {tag}\n" in r.stdout or r.stdout.endswith(f"rank {k}: {tag}") or \
            f"rank {k}: {tag}rank" in r.stdout, _explain(r)


def _saved(tmp_path: Path, tag: str, ranks: int) -> list[np.ndarray]:
    return [np.load(tmp_path / f"{tag}.rank{k}.npy") for k in range(ranks)]


# A 30-step 1-D stencil; prints its comparison with numpy and "finished" after shutdown.
STENCIL = """
q = cl.Queue()
n = 23
a = cl.Buffer(np.arange(n, dtype=np.int64), name="a")
b = cl.Buffer(shape=(n,), dtype=np.int64, name="b")
src, dst = a, b
for t in range(30):
    def cgf(cgh, src=src, dst=dst):
        r = src.access(cgh, cl.neighborhood((1,)), cl.read)
        w = dst.access(cgh, cl.one_to_one(), cl.discard_write)
        def k(ch):
            lo, hi = ch.offset[0], ch.offset[0] + ch.range[0]
            x = r[cl.Box((max(lo - 1, 0),), (min(hi + 1, n),))]
            pad = np.concatenate([x[:1] if lo == 0 else [], x, x[-1:] if hi == n else []]).astype(np.int64)
            w[ch] = (pad[:-2] + pad[1:-1] * 2 + pad[2:]) % 10007
        cgh.parallel_for((n,), k, name="st")
    q.submit(cgf)
    src, dst = dst, src
ref = np.arange(n, dtype=np.int64)
for t in range(30):
    p = np.pad(ref, 1, mode="edge")
    ref = (p[:-2] + p[1:-1] * 2 + p[2:]) % 10007
got = q.fence(src).result()
q.wait(barrier=True)
print(f"rank {q.rank}: equal={np.array_equal(got, ref)}", flush=True)
q.shutdown()
print(f"rank {q.rank}: finished", flush=True)
"""


# =====================================================================================
# Defects found by probing (fixed): each asserts what the rule requires
# =====================================================================================


@needs_mpi
@needs_rank_env
@pytest.mark.parametrize("var", ["CELERITAS_HORIZON_STEP", "CELERITAS_HORIZON_MAX_PARALLELISM"])
def test_a_horizon_setting_that_differs_between_ranks_is_a_config_error(tmp_path, var):
    """Input: mpiexec -n 1 python s.py : -n 1 -env CELERITAS_HORIZON_STEP 1 python s.py (or
    CELERITAS_HORIZON_MAX_PARALLELISM 1), s.py a 30-step stencil.  Happened: horizons are
    tasks, so the ranks number their later tasks differently, no transfer matches, and
    the job hangs until killed.  Expected: at cl.Queue() every rank raises a
    cl.ConfigError naming the variable and each rank's value; the job ends non-zero."""
    r = mpirun_split(_script(tmp_path, STENCIL), {var: "1"})
    assert r.returncode != 0, _explain(r)
    assert "finished" not in r.stdout, _explain(r)
    default = {"CELERITAS_HORIZON_STEP": 4, "CELERITAS_HORIZON_MAX_PARALLELISM": 64}[var]
    assert f"ConfigError: {var} differs between ranks (rank 0: {default}, rank 1: 1)" in r.stderr, _explain(r)


@needs_mpi
@needs_rank_env
@pytest.mark.parametrize("var", ["CELERITAS_PRINT_GRAPHS", "CELERITAS_TRACE"])
def test_a_shutdown_output_set_on_one_rank_only_is_a_config_error(tmp_path, var):
    """Input: mpiexec -n 1 python s.py : -n 1 -env CELERITAS_PRINT_GRAPHS <folder> python
    s.py (or CELERITAS_TRACE <file>).  Happened: the results are right, then rank 1 waits
    at shutdown in the gather of the graphs (trace) that rank 0 never joins: the job
    hangs until killed.  Expected: at cl.Queue() every rank raises a cl.ConfigError
    naming the variable and which ranks set it; the job ends non-zero, nothing hangs."""
    target = str(tmp_path / ("graphs" if var == "CELERITAS_PRINT_GRAPHS" else "trace.json"))
    r = mpirun_split(_script(tmp_path, STENCIL), {var: target})
    assert r.returncode != 0, _explain(r)
    assert "finished" not in r.stdout, _explain(r)
    assert re.search(rf"ConfigError: {var} is set on rank 1 but not on rank 0", r.stderr), _explain(r)


@needs_mpi
@needs_rank_env
@pytest.mark.parametrize("var,value", [("CELERITAS_SUMMARY", "1"), ("CELERITAS_LOG_LEVEL", "info")])
def test_the_summary_asked_for_on_one_rank_only_is_printed_once(tmp_path, var, value):
    """Input: mpiexec -n 1 python s.py : -n 1 -env CELERITAS_SUMMARY 1 python s.py (or
    CELERITAS_LOG_LEVEL info, which also asks for the summary; a log level of its own on one
    rank is a normal way to look at it closer).  Happened: rank 1 waits at shutdown in the
    summary's gather that rank 0 never joins: the job hangs until killed.  Expected: both
    ranks finish with the right result and the summary (rank 0 prints it) appears once."""
    r = mpirun_split(_script(tmp_path, STENCIL), {var: value})
    _ok(r, 2, "finished")
    assert "rank 0: equal=True" in r.stdout and "rank 1: equal=True" in r.stdout, _explain(r)
    assert (r.stdout + r.stderr).count("celeritas summary") == 1, _explain(r)


@needs_mpi
@needs_rank_env
def test_a_dry_run_set_on_one_rank_only_ends_the_job(tmp_path):
    """Input: mpiexec -n 1 python s.py : -n 1 -env CELERITAS_DRY_RUN_NODES 2 python s.py.
    Happened: rank 1 raises its ConfigError (a dry run in a 2-rank job) without joining
    the MPI job; rank 0 waits for it in MPI start-up until killed.  Expected: rank 1's
    ConfigError naming CELERITAS_DRY_RUN_NODES, the job aborted on every rank, non-zero."""
    r = mpirun_split(_script(tmp_path, STENCIL), {"CELERITAS_DRY_RUN_NODES": "2"})
    assert r.returncode != 0, _explain(r)
    assert "ConfigError: CELERITAS_DRY_RUN_NODES=2" in r.stderr, _explain(r)
    assert "equal=" not in r.stdout, _explain(r)


def test_the_settings_agreement_names_the_variable_and_the_ranks():
    """The start-up check behind the four tests above, without MPI: the first differing
    horizon setting, or an output set on some ranks only, is a ConfigError naming the
    variable and the ranks; the summary is printed when any rank asks for it."""
    import celeritas as cl
    from celeritas.config import agree_across_ranks, collective_settings, from_env
    base = collective_settings(from_env({}), False)
    assert agree_across_ranks([base, base, base]) is False
    assert agree_across_ranks([base, {**base, "summary": True}]) is True
    with pytest.raises(cl.ConfigError, match=r"CELERITAS_HORIZON_STEP differs between ranks "
                                             r"\(ranks 0, 2: 4, rank 1: 2\)"):
        agree_across_ranks([base, collective_settings(from_env({"CELERITAS_HORIZON_STEP": "2"}), False), base])
    traced = collective_settings(from_env({"CELERITAS_TRACE": "t.json"}), False)
    with pytest.raises(cl.ConfigError, match=r"CELERITAS_TRACE is set on ranks 0, 2 but not on rank 1"):
        agree_across_ranks([traced, base, traced])


# =====================================================================================
# Probes that behave well
# =====================================================================================


@needs_mpi
@pytest.mark.parametrize("ranks,devices", [(4, "host:1"), (2, "host:2")])
def test_sizes_not_divisible_smaller_than_the_ranks_or_empty(tmp_path, ranks, devices):
    """1-D buffers of 0, 1, 3, 5, 7 and 1031 elements on 4 ranks (and 2 ranks of 2 devices):
    a distributed update, then an all()-read of it by every chunk (allgather), fenced on
    every rank; 2-D buffers of shape (0, 5), (5, 0), (1, 1), (1, 7), (3, 1) with a split_2d
    neighbourhood kernel; all equal numpy on every rank."""
    script = _script(tmp_path, """
    q = cl.Queue()
    for n in (0, 1, 3, 5, 7, 1031):
        b = cl.Buffer(np.arange(n, dtype=np.int64), name=f"b{n}")
        c = cl.Buffer(shape=(n,), dtype=np.int64, name=f"c{n}")
        def update(cgh, b=b, n=n):
            w = b.access(cgh, cl.one_to_one(), cl.read_write)
            cgh.parallel_for((n,), lambda ch: w.__setitem__(ch, w[ch] * 2 + 1), name="update")
        def gather(cgh, b=b, c=c, n=n):
            r = b.access(cgh, cl.all(), cl.read)
            w = c.access(cgh, cl.one_to_one(), cl.discard_write)
            def k(ch):
                whole = r[cl.Box((0,), (n,))]
                w[ch] = whole.sum() + whole[n - 1 - np.arange(ch.offset[0], ch.offset[0] + ch.range[0])]
            cgh.parallel_for((n,), k, name="gather")
        q.submit(update)
        q.submit(gather)
        save(f"b{n}", q.fence(b).result())
        save(f"c{n}", q.fence(c).result())
    for shape in [(0, 5), (5, 0), (1, 1), (1, 7), (3, 1), (5, 3)]:
        a = cl.Buffer(np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape), name="a2")
        o = cl.Buffer(shape=shape, dtype=np.int64, name="o2")
        def cgf(cgh, a=a, o=o, shape=shape):
            cl.hint(cgh, cl.split_2d())
            ra = a.access(cgh, cl.neighborhood((1, 1)), cl.read)
            rall = a.access(cgh, cl.all(), cl.read)
            wo = o.access(cgh, cl.one_to_one(), cl.discard_write)
            def k(ch):
                box = cl.Box(ch.offset, (ch.offset[0] + ch.range[0], ch.offset[1] + ch.range[1]))
                wo[ch] = ra[box] * 2 + rall[cl.Box((0, 0), shape)].sum()
            cgh.parallel_for(shape, k, name="nb2")
        q.submit(cgf)
        save(f"o{shape[0]}x{shape[1]}", q.fence(o).result())
    q.wait()
    print(f"rank {q.rank}: ok", flush=True)
    """)
    _ok(mpirun(ranks, script, env={"CELERITAS_DEVICES": devices, "CELERITAS_ACCESSOR_CHECKS": "1"}), ranks)
    for n in (0, 1, 3, 5, 7, 1031):
        b = np.arange(n) * 2 + 1
        for got_b, got_c in zip(_saved(tmp_path, f"b{n}", ranks), _saved(tmp_path, f"c{n}", ranks)):
            assert got_b.dtype == np.int64 and np.array_equal(got_b, b), n
            assert np.array_equal(got_c, b.sum() + b[::-1]), n
    for shape in [(0, 5), (5, 0), (1, 1), (1, 7), (3, 1), (5, 3)]:
        a = np.arange(int(np.prod(shape))).reshape(shape)
        for got in _saved(tmp_path, f"o{shape[0]}x{shape[1]}", ranks):
            assert got.shape == shape and np.array_equal(got, a * 2 + a.sum()), shape


HALO = """
q = cl.Queue()
steps = int(sys.argv[2])
def run(tag, shape, split2d, ext, along_axes):
    init = (np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * 7919) % 1000
    a = cl.Buffer(init, name="a")
    b = cl.Buffer(shape=shape, dtype=np.int64, name="b")
    nd = len(shape)
    src, dst = a, b
    for t in range(steps):
        def cgf(cgh, src=src, dst=dst):
            if split2d:
                cl.hint(cgh, cl.split_2d())
            r = src.access(cgh, cl.neighborhood((ext,) * nd, shape="along_axes" if along_axes else "bounding_box"),
                           cl.read)
            w = dst.access(cgh, cl.one_to_one(), cl.discard_write)
            def k(ch):
                lo = ch.offset
                hi = tuple(o + n for o, n in zip(ch.offset, ch.range))
                tot = r[cl.Box(lo, hi)] * 2
                for d in range(nd):
                    for s in (-ext, ext):
                        idx = [np.arange(lo[j], hi[j]) for j in range(nd)]
                        idx[d] = np.clip(idx[d] + s, 0, shape[d] - 1)
                        blo = tuple(int(i.min()) for i in idx)
                        block = r[cl.Box(blo, tuple(int(i.max()) + 1 for i in idx))]
                        tot = tot + block[np.ix_(*[i - m for i, m in zip(idx, blo)])]
                w[ch] = tot % 1000003
            cgh.parallel_for(shape, k, name="stencil")
        q.submit(cgf)
        src, dst = dst, src
    save(tag, q.fence(src).result())
run("d1", (37,), False, 1, True)
run("d2", (13, 11), True, 1, False)
run("d2e2", (13, 11), False, 2, True)
run("d3", (7, 6, 5), False, 1, True)
run("d3s", (7, 6, 5), True, 1, False)
q.wait(barrier=True)
print(f"rank {q.rank}: ok", flush=True)
"""


def _halo_reference(init: np.ndarray, steps: int, ext: int) -> np.ndarray:
    x = init.copy()
    for _ in range(steps):
        p = np.pad(x, ext, mode="edge")
        tot = x * 2
        for d in range(x.ndim):
            for s in (-ext, ext):
                sl = [slice(ext, ext + n) for n in x.shape]
                sl[d] = slice(ext + s, ext + s + x.shape[d])
                tot = tot + p[tuple(sl)]
        x = tot % 1000003
    return x


@needs_mpi
@pytest.mark.parametrize("ranks,devices", [(4, "host:1"), (2, "host:2")])
def test_neighbourhood_halos_over_hundreds_of_steps_equal_numpy(tmp_path, ranks, devices):
    """1-D, 2-D and 3-D integer stencils (edge-clamped, halo 1 or 2, split_1d and split_2d,
    along_axes and bounding_box neighbourhoods) for 300 steps: bit-equal to numpy on
    every rank."""
    steps = 300
    _ok(mpirun(ranks, _script(tmp_path, HALO), env={"CELERITAS_DEVICES": devices}, args=[str(steps)], timeout=120),
        ranks)
    for tag, shape, ext in [("d1", (37,), 1), ("d2", (13, 11), 1), ("d2e2", (13, 11), 2), ("d3", (7, 6, 5), 1),
                            ("d3s", (7, 6, 5), 1)]:
        init = (np.arange(int(np.prod(shape)), dtype=np.int64).reshape(shape) * 7919) % 1000
        want = _halo_reference(init, steps, ext)
        for k, got in enumerate(_saved(tmp_path, tag, ranks)):
            assert np.array_equal(got, want), f"{tag} differs on rank {k}"


@needs_mpi
def test_reductions_across_ranks_equal_numpy(tmp_path):
    """sum / max / min / bit_xor / a numpy ufunc, with and without include_current (the
    target's 5), over 1, 3, 7 and 1000 elements on 4 ranks; an empty range (keeps 5, or
    gives the identity); a 0-d float target; a reduction result read by every chunk."""
    script = _script(tmp_path, """
    q = cl.Queue()
    ops = {"sum": cl.plus, "max": cl.maximum, "min": cl.minimum, "xor": cl.bit_xor, "ufunc": np.add}
    for n in (0, 1, 3, 7, 1000):
        src = cl.Buffer((np.arange(n, dtype=np.int64) * 7919) % 1013 - 500, name="src")
        for name, op in ops.items():
            for include in (False, True):
                t = cl.Buffer(np.array([5], dtype=np.int64), name=f"t_{name}")
                def cgf(cgh, t=t, op=op, include=include, src=src, n=n):
                    r = src.access(cgh, cl.one_to_one(), cl.read)
                    red = cl.reduction(t, cgh, op, initialize_to_identity=not include)
                    cgh.parallel_for((n,), lambda ch, rd: rd.combine(r[ch]), reductions=[red], name="red")
                q.submit(cgf)
                save(f"{name}_{include}_{n}", q.fence(t).result())
    z = cl.Buffer(np.float64(1.5), name="zero_d")
    src = cl.Buffer(np.arange(10, dtype=np.float64), name="s")
    def cgf(cgh):
        r = src.access(cgh, cl.one_to_one(), cl.read)
        red = cl.reduction(z, cgh, cl.plus)
        cgh.parallel_for((10,), lambda ch, rd: rd.combine(r[ch]), reductions=[red], name="red0d")
    q.submit(cgf)
    save("zero_d", q.fence(z).result())
    t = cl.Buffer(np.zeros(1, np.int64), name="tt")
    o = cl.Buffer(shape=(9,), dtype=np.int64, name="o")
    def cgf(cgh):
        red = cl.reduction(t, cgh, cl.plus, initialize_to_identity=True)
        cgh.parallel_for((9,), lambda ch, rd: rd.combine(np.arange(ch.offset[0], ch.offset[0] + ch.range[0]) ** 2),
                         reductions=[red], name="squares")
    q.submit(cgf)
    def use(cgh):
        r = t.access(cgh, cl.all(), cl.read)
        w = o.access(cgh, cl.one_to_one(), cl.discard_write)
        def k(ch):
            w[ch] = r[0] + np.arange(ch.offset[0], ch.offset[0] + ch.range[0])
        cgh.parallel_for((9,), k, name="use")
    q.submit(use)
    save("use", q.fence(o).result())
    q.wait()
    print(f"rank {q.rank}: ok", flush=True)
    """)
    _ok(mpirun(4, script), 4)
    for n in (0, 1, 3, 7, 1000):
        data = (np.arange(n, dtype=np.int64) * 7919) % 1013 - 500
        for name, ufunc in {"sum": np.add, "max": np.maximum, "min": np.minimum, "xor": np.bitwise_xor,
                            "ufunc": np.add}.items():
            for include in (False, True):
                values = np.concatenate([data, [5]]) if include else data
                want = ufunc.reduce(values) if values.size else {
                    "max": np.iinfo(np.int64).min, "min": np.iinfo(np.int64).max}.get(name, 0)
                for k, got in enumerate(_saved(tmp_path, f"{name}_{include}_{n}", 4)):
                    assert got.shape == (1,) and got[0] == want, (name, include, n, k, got, want)
    for got in _saved(tmp_path, "zero_d", 4):
        assert got.shape == () and got == 46.5
    for got in _saved(tmp_path, "use", 4):
        assert np.array_equal(got, (np.arange(9) ** 2).sum() + np.arange(9))


@needs_mpi
def test_host_tasks_master_node_collective_groups_and_fences(tmp_path):
    """On 4 ranks: a master-node host task writes a buffer that a distributed kernel reads;
    collective host tasks in the default group and two cl.CollectiveGroup()s, each using
    its mpi4py communicator (allreduce, bcast, Get_size), in submission order per group; a
    ranged host task; fences of the whole buffer and of a subrange on every rank."""
    script = _script(tmp_path, """
    q = cl.Queue()
    n = 10
    b = cl.Buffer(shape=(n,), dtype=np.int64, name="b")
    ran = []
    def master(cgh):
        w = b.access(cgh, cl.all(), cl.discard_write)
        def fn(p):
            ran.append(q.rank)
            w[cl.Box((0,), (n,))] = np.arange(n) * 3
        cgh.host_task(fn, on=cl.on_master_node, name="master")
    q.submit(master)
    c = cl.Buffer(shape=(n,), dtype=np.int64, name="c")
    def plus1(cgh):
        r = b.access(cgh, cl.one_to_one(), cl.read)
        w = c.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((n,), lambda ch: w.__setitem__(ch, r[ch] + 1), name="plus1")
    q.submit(plus1)
    save("c", q.fence(c).result())
    groups = {"g1": cl.CollectiveGroup(), "g2": cl.CollectiveGroup(), "default": None}
    log = []
    for i in range(4):
        for gname, group in groups.items():
            def coll(cgh, tag=f"{gname}_{i}", group=group):
                r = c.access(cgh, cl.all(), cl.read)
                def fn(p):
                    total = p.comm.allreduce(int(r[cl.Box((0,), (n,))].sum()) + p.comm.Get_rank())
                    tag0 = p.comm.bcast(tag if p.comm.Get_rank() == 0 else None, root=0)
                    log.append((tag, tag0, total, p.comm.Get_size(), p.box.min, p.box.max))
                cgh.host_task(fn, on=cl.collective(group) if group else cl.collective, name=tag)
            q.submit(coll)
    q.wait()
    d = cl.Buffer(shape=(13,), dtype=np.int64, name="d")
    def ranged(cgh):
        w = d.access(cgh, cl.one_to_one(), cl.discard_write)
        def fn(p):
            w[p.box] = np.arange(p.box.min[0], p.box.max[0]) * 2
        cgh.host_task(fn, range=(13,), name="ranged")
    q.submit(ranged)
    save("d", q.fence(d).result())
    save("d_sub", q.fence(d, cl.Subrange((3,), (5,))).result())
    q.wait(barrier=True)
    print(f"rank {q.rank}: master ran here {ran == [0]}", flush=True)
    print(f"rank {q.rank}: log {sorted(log)}", flush=True)
    in_order = all([e[0] for e in log if e[0].startswith(g + "_")] == [f"{g}_{i}" for i in range(4)] for g in groups)
    print(f"rank {q.rank}: each group in submission order {in_order}", flush=True)
    print(f"rank {q.rank}: ok", flush=True)
    """)
    r = mpirun(4, script)
    _ok(r, 4)
    assert "rank 0: master ran here True" in r.stdout and r.stdout.count("master ran here False") == 3, _explain(r)
    for got in _saved(tmp_path, "c", 4):
        assert np.array_equal(got, np.arange(10) * 3 + 1)
    for got, sub in zip(_saved(tmp_path, "d", 4), _saved(tmp_path, "d_sub", 4)):
        assert np.array_equal(got, np.arange(13) * 2) and np.array_equal(sub, np.arange(3, 8) * 2)
    assert r.stdout.count("each group in submission order True") == 4, _explain(r)
    total = int(4 * (np.arange(10) * 3 + 1).sum() + 6)
    for k in range(4):
        log = sorted((f"{g}_{i}", f"{g}_{i}", total, 4, (k,), (k + 1,))
                     for i in range(4) for g in ("g1", "g2", "default"))
        assert f"rank {k}: log {log}" in r.stdout, _explain(r)


@needs_mpi
def test_a_64_mib_transfer_each_way_and_hundreds_of_small_ones(tmp_path):
    """2 ranks: a 128 MiB float64 buffer written distributed, then read reversed (each
    rank receives the other's 64 MiB half); a 2-D buffer read transposed (strided boxes);
    then 400 steps of a 16-element ring shift read through all() (hundreds of tiny
    messages).  Every value checked on both ranks."""
    script = _script(tmp_path, """
    q = cl.Queue()
    n = 16 * 1024 * 1024
    a = cl.Buffer(shape=(n,), dtype=np.float64, name="big")
    def fill(cgh):
        w = a.access(cgh, cl.one_to_one(), cl.discard_write)
        def k(ch):
            w[ch] = np.arange(ch.offset[0], ch.offset[0] + ch.range[0], dtype=np.float64)
        cgh.parallel_for((n,), k, name="fill")
    q.submit(fill)
    s = cl.Buffer(shape=(n,), dtype=np.float64, name="reversed")
    def reverse(cgh):
        r = a.access(cgh, lambda ch, shape: cl.Subrange((shape[0] - ch.offset[0] - ch.range[0],), ch.range), cl.read)
        w = s.access(cgh, cl.one_to_one(), cl.discard_write)
        def k(ch):
            lo = n - ch.offset[0] - ch.range[0]
            w[ch] = r[cl.Box((lo,), (lo + ch.range[0],))][::-1]
        cgh.parallel_for((n,), k, name="reverse")
    q.submit(reverse)
    got = q.fence(s).result()
    print(f"rank {q.rank}: big {np.array_equal(got, np.arange(n, dtype=np.float64)[::-1])}", flush=True)
    del got
    m = 1024
    t = cl.Buffer(np.arange(m * m, dtype=np.int32).reshape(m, m), name="square")
    tt = cl.Buffer(shape=(m, m), dtype=np.int32, name="transposed")
    def transpose(cgh):
        r = t.access(cgh, cl.transposed(), cl.read)
        w = tt.access(cgh, cl.one_to_one(), cl.discard_write)
        def k(ch):
            (y0, x0), (y1, x1) = ch.offset, (ch.offset[0] + ch.range[0], ch.offset[1] + ch.range[1])
            w[ch] = r[cl.Box((x0, y0), (x1, y1))].T
        cgh.parallel_for((m, m), k, name="transpose")
    q.submit(transpose)
    got = q.fence(tt).result()
    print(f"rank {q.rank}: transposed {np.array_equal(got, np.arange(m * m, dtype=np.int32).reshape(m, m).T)}", flush=True)
    k16 = 16
    src, dst = cl.Buffer(np.arange(k16, dtype=np.int64), name="ring"), cl.Buffer(shape=(k16,), dtype=np.int64, name="ring2")
    for step in range(400):
        def shift(cgh, src=src, dst=dst):
            r = src.access(cgh, cl.all(), cl.read)
            w = dst.access(cgh, cl.one_to_one(), cl.discard_write)
            def k(ch):
                i = np.arange(ch.offset[0], ch.offset[0] + ch.range[0])
                w[ch] = r[cl.Box((0,), (k16,))][(i - 1) % k16] + 1
            cgh.parallel_for((k16,), k, name="shift")
        q.submit(shift)
        src, dst = dst, src
    got = q.fence(src).result()
    print(f"rank {q.rank}: ring {np.array_equal(got, np.roll(np.arange(k16), 400) + 400)}", flush=True)
    q.wait()
    print(f"rank {q.rank}: ok", flush=True)
    """)
    r = mpirun(2, script, timeout=120)
    _ok(r, 2)
    for what in ("big", "transposed", "ring"):
        assert r.stdout.count(f": {what} True") == 2, _explain(r)


FAILURES = """
mode = sys.argv[2]
q = cl.Queue()
n = 64
b = cl.Buffer(np.arange(n, dtype=np.float64), name="b")
def step(name, bad_rank=None, exc=ValueError):
    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        def k(ch):
            if q.rank == bad_rank:
                raise exc(f"{name} fails on rank {q.rank}")
            w[ch] = w[ch] + 1
        cgh.parallel_for((n,), k, name=name)
    return cgf
def gather(cgh):
    b.access(cgh, cl.all(), cl.read)
    cgh.parallel_for((n,), lambda ch: None, name="gather")
if mode == "kernel_last_rank":
    q.submit(step("s1")); q.submit(step("bad", bad_rank=q.num_ranks - 1)); q.submit(gather)
    q.wait()
elif mode == "master_host_task":
    def m(cgh):
        b.access(cgh, cl.all(), cl.read_write)
        def fn(p):
            raise RuntimeError("master host task fails")
        cgh.host_task(fn, on=cl.on_master_node, name="mh")
    q.submit(m); q.submit(step("after"))
    print(f"rank {q.rank}: {q.fence(b).result().sum()}", flush=True)
elif mode == "collective":
    def c(cgh):
        def fn(p):
            if p.rank == 1:
                raise RuntimeError("collective fails on rank 1")
            p.comm.allreduce(1)
        cgh.host_task(fn, on=cl.collective, name="coll")
    q.submit(c); q.wait()
elif mode == "app_exception":
    q.submit(step("s1")); q.submit(gather)
    if q.rank == 1:
        raise RuntimeError("app bug on rank 1 after submits")
    q.submit(step("s2")); q.submit(gather)
    print(f"rank {q.rank}: {q.fence(b).result().sum()}", flush=True)
elif mode == "app_keyboard_interrupt":
    q.submit(step("s1")); q.submit(gather)
    if q.rank == 1:
        raise KeyboardInterrupt
    q.wait(barrier=True)
elif mode == "kernel_keyboard_interrupt":
    q.submit(step("kb", bad_rank=1, exc=KeyboardInterrupt)); q.submit(gather); q.wait()
elif mode == "kernel_system_exit":
    q.submit(step("se", bad_rank=1, exc=SystemExit)); q.submit(gather); q.wait()
elif mode == "reduction_kernel":
    t = cl.Buffer(np.zeros(1), name="t")
    def cgf(cgh):
        rd = cl.reduction(t, cgh, cl.plus)
        def k(ch, r):
            if q.rank == 0:
                raise ValueError("reduction kernel fails on rank 0")
            r.combine(1.0)
        cgh.parallel_for((n,), k, reductions=[rd], name="redk")
    q.submit(cgf); print(q.fence(t).result(), flush=True)
elif mode == "fence_after_failure":
    q.submit(step("bad", bad_rank=2)); q.submit(gather)
    try:
        q.fence(b).result()
    except cl.KernelError as exc:
        print(f"rank {q.rank}: caught {type(exc).__name__}", flush=True)
        raise
elif mode in ("waits", "waits_in_kernel"):
    q.submit(step("s1")); q.submit(gather)
    if mode == "waits_in_kernel":
        def slow(cgh):
            b.access(cgh, cl.one_to_one(), cl.read_write)
            def k(ch):
                print(f"rank {q.rank}: ready pid {os.getpid()}", flush=True)
                time.sleep(120)
            cgh.parallel_for((n,), k, name="slow")
        q.submit(slow)
        q.wait()
    else:
        print(f"rank {q.rank}: ready pid {os.getpid()}", flush=True)
        if q.rank == 0:
            time.sleep(120)
        q.wait(barrier=True)
q.shutdown()
print(f"rank {q.rank}: finished normally", flush=True)
"""


@needs_mpi
@pytest.mark.parametrize("mode,rank,words", [
    ("kernel_last_rank", 3, (r"KernelError: kernel 'bad' of task T2 failed on rank 3, chunk Box\(\[48\], \[64\]\)"
                             r".*ValueError: bad fails on rank 3")),
    ("master_host_task", 0, r"KernelError: host task 'mh' of task T1 failed on rank 0.*RuntimeError: master host task"),
    ("collective", 1, r"KernelError: host task 'coll' of task T1 failed on rank 1.*collective fails on rank 1"),
    ("app_exception", 1, r"RuntimeError: app bug on rank 1 after submits.*uncaught RuntimeError; aborting all ranks"),
    ("app_keyboard_interrupt", 1, r"KeyboardInterrupt\s.*celeritas rank 1: uncaught KeyboardInterrupt; aborting"),
    ("kernel_keyboard_interrupt", 1, r"KernelError: kernel 'kb' of task T1 failed on rank 1.*KeyboardInterrupt: kb"),
    ("kernel_system_exit", 1, r"KernelError: kernel 'se' of task T1 failed on rank 1.*SystemExit: se fails"),
    ("reduction_kernel", 0, r"KernelError: kernel 'redk' of task T1 failed on rank 0.*reduction kernel fails"),
    ("fence_after_failure", 2, r"KernelError: kernel 'bad' of task T1 failed on rank 2"),
])
def test_a_failure_on_one_rank_ends_the_whole_job_naming_the_rank(tmp_path, mode, rank, words):
    """4 ranks; one rank's kernel, master-node host task, collective host task, reduction
    kernel or application code raises (also KeyboardInterrupt and SystemExit inside a
    kernel) while the others wait for its data or at a collective.  Expected: the job ends
    promptly, non-zero, no rank finishes normally, and stderr names the rank, the task
    and kernel, and the original exception."""
    r = mpirun(4, _script(tmp_path, FAILURES), args=[mode], timeout=60)
    assert r.returncode != 0, _explain(r)
    assert "finished normally" not in r.stdout, _explain(r)
    assert re.search(words, r.stderr, re.DOTALL), _explain(r)
    assert f"celeritas rank {rank}: " in r.stderr, _explain(r)


def _rank_pids(proc: subprocess.Popen, ranks: int, timeout: float = 60) -> tuple[dict, list]:
    """Read the job's stdout until every rank printed 'rank R: ready pid P'."""
    seen, text, deadline = {}, [], time.monotonic() + timeout
    while len(seen) < ranks and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        text.append(line)
        for rank, pid in re.findall(r"rank (\d+): ready pid (\d+)", "".join(text)):
            seen[int(rank)] = int(pid)
    return seen, text


@needs_mpi
@pytest.mark.parametrize("mode", ["waits", "waits_in_kernel"])
@pytest.mark.parametrize("sig,to", [(signal.SIGINT, "job"), (signal.SIGTERM, "job"), (signal.SIGINT, "rank 1"),
                                    (signal.SIGTERM, "rank 1")])
def test_sigint_or_sigterm_ends_the_job_without_a_hang(tmp_path, mode, sig, to):
    """2 ranks, rank 0 asleep in the application (rank 1 in q.wait(barrier=True)), or both
    asleep inside a kernel; then SIGINT or SIGTERM to mpiexec, or to rank 1 alone.
    Expected: the whole job ends within seconds with a non-zero exit, no rank left behind;
    after SIGINT the interrupted rank reports its KeyboardInterrupt and aborts the others
    (a SIGINT to Open MPI's mpiexec reaches no rank: it ends them)."""
    script = _script(tmp_path, FAILURES)
    proc = subprocess.Popen([str(MPIEXEC), "-n", "2", sys.executable, str(script), str(tmp_path), mode], cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        pids, text = _rank_pids(proc, 2)
        assert set(pids) == {0, 1}, "".join(text)
        t0 = time.monotonic()
        os.kill(proc.pid if to == "job" else pids[1], sig)
        out, err = proc.communicate(timeout=30)
        seconds = time.monotonic() - t0
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"the job did not end within 30 s of the signal\nstdout:\n{out}\nstderr:\n{err[-4000:]}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
    explain = f"exit {proc.returncode} {seconds:.1f} s after the signal\nstdout:\n{out}\nstderr:\n{err[-4000:]}"
    assert proc.returncode != 0, explain
    assert "finished normally" not in out, explain
    if sig == signal.SIGINT and (to == "rank 1" or mpi_flavor() != "openmpi"):
        # (MPICH's Hydra hands a SIGINT to the ranks; Open MPI's launcher ends them itself,
        # before any could say a word, which the checks above and below still hold to)
        assert "uncaught KeyboardInterrupt; aborting all ranks" in err, explain
    assert not _left_behind(pids.values()), explain


def _left_behind(pids, patience: float = 20.0) -> list[int]:
    """Those of ``pids`` still running (not gone, not a zombie) after ``patience`` seconds:
    an aborted job's ranks may take a moment to be torn down after mpiexec returns."""
    deadline = time.monotonic() + patience
    while True:
        alive = []
        for pid in pids:
            try:
                if "zombie" not in Path(f"/proc/{pid}/status").read_text():
                    alive.append(pid)
            except OSError:
                pass
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.2)


@needs_mpi
def test_buffers_made_and_dropped_in_loops_barriers_and_a_second_queue(tmp_path):
    """4 ranks: 60 iterations each making two buffers of varying size, an all()-read
    kernel, a fence every third, a barrier every tenth, then dropping them (gc now and
    then); q.shutdown(); then a second cl.Queue() in the same process that runs a
    distributed kernel and a gather.  Expected: every value right on every rank."""
    script = _script(tmp_path, """
    import gc
    q = cl.Queue()
    got = []
    for i in range(60):
        n = 5 + i % 7
        a = cl.Buffer(np.arange(n, dtype=np.int64) + i, name=f"a{i}")
        c = cl.Buffer(shape=(n,), dtype=np.int64, name=f"c{i}")
        def cgf(cgh, a=a, c=c, n=n):
            r = a.access(cgh, cl.all(), cl.read)
            w = c.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((n,), lambda ch: w.__setitem__(ch, r[cl.Box((0,), (n,))].sum()), name="sumall")
        q.submit(cgf)
        if i % 10 == 0:
            q.wait(barrier=True)
        if i % 3 == 0:
            got.append(q.fence(c).result().tolist())
        del a, c
        if i % 5 == 0:
            gc.collect()
    want = [[int((np.arange(5 + i % 7) + i).sum())] * (5 + i % 7) for i in range(0, 60, 3)]
    print(f"rank {q.rank}: loop {got == want}", flush=True)
    q.wait(barrier=True)
    q.shutdown()
    q2 = cl.Queue()
    b = cl.Buffer(np.arange(9.0), name="b2")
    s = cl.Buffer(shape=(9,), dtype=np.float64, name="s2")
    def triple(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((9,), lambda ch: w.__setitem__(ch, w[ch] * 3), name="triple")
    def total(cgh):
        r = b.access(cgh, cl.all(), cl.read)
        w = s.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((9,), lambda ch: w.__setitem__(ch, r[cl.Box((0,), (9,))].sum()), name="total")
    q2.submit(triple)
    q2.submit(total)
    print(f"rank {q2.rank}: second {q2.fence(b).result().tolist()} {q2.fence(s).result().tolist()}", flush=True)
    q2.shutdown()
    print(f"rank {q2.rank}: ok", flush=True)
    """)
    r = mpirun(4, script, timeout=120)
    _ok(r, 4)
    assert r.stdout.count(": loop True") == 4, _explain(r)
    want = f"second {(np.arange(9.0) * 3).tolist()} {[108.0] * 9}"
    assert r.stdout.count(want) == 4, _explain(r)


@needs_mpi
@needs_rank_env
@pytest.mark.parametrize("var,value", [
    ("CELERITAS_DEVICES", "host:3"), ("CELERITAS_LOOKAHEAD", "none"), ("CELERITAS_LOOKAHEAD", "infinite"),
    ("CELERITAS_REPLAY", "off"), ("CELERITAS_RECORD", "1"), ("CELERITAS_DIAGNOSTICS", "error"),
    ("CELERITAS_ACCESSOR_CHECKS", "1"), ("CELERITAS_MPI_STRIDED", "staging"), ("CELERITAS_LOG_LEVEL", "error"),
])
def test_settings_that_may_differ_between_ranks(tmp_path, var, value):
    """mpiexec -n 1 python s.py : -n 1 -env VAR VALUE python s.py for the settings that only
    change how one rank works (its devices, lookahead, replay, records, checks, how
    strided boxes travel): the 30-step stencil equals numpy on both ranks."""
    r = mpirun_split(_script(tmp_path, STENCIL), {var: value}, timeout=60)
    _ok(r, 2, "finished")
    assert r.stdout.count("equal=True") == 2, _explain(r)


@needs_mpi
def test_graph_dumps_and_trace_under_mpiexec_are_complete_for_every_rank(tmp_path):
    """3 ranks with CELERITAS_PRINT_GRAPHS and CELERITAS_TRACE: the task graph once, the
    command graph with every rank's commands, one instruction graph per rank; the trace
    (written by rank 0) has one process per rank whose events are exactly that rank's
    instructions."""
    script = _script(tmp_path, """
    q = cl.Queue()
    a = cl.Buffer(np.arange(20.0), name="a")
    for i in range(6):
        def cgf(cgh):
            w = a.access(cgh, cl.one_to_one(), cl.read_write)
            a.access(cgh, cl.neighborhood((1,)), cl.read)
            cgh.parallel_for((20,), lambda ch: w.__setitem__(ch, w[ch] + 1), name="nb")
        q.submit(cgf)
    def g(cgh):
        a.access(cgh, cl.all(), cl.read)
        cgh.parallel_for((20,), lambda ch: None, name="gather")
    q.submit(g)
    print(f"rank {q.rank}: {q.fence(a).result().sum()}", flush=True)
    q.shutdown()
    print(f"rank {q.rank}: ok", flush=True)
    """)
    graphs, trace = tmp_path / "graphs", tmp_path / "trace.json"
    r = mpirun(3, script, env={"CELERITAS_PRINT_GRAPHS": str(graphs), "CELERITAS_TRACE": str(trace)})
    _ok(r, 3)
    assert r.stdout.count(f": {np.arange(20.0).sum() + 120}") == 3, _explain(r)
    names = sorted(p.name for p in graphs.iterdir())
    assert names == sorted(["task_graph.dot", "task_graph.json", "command_graph.dot", "command_graph.json"]
                           + [f"instruction_graph_rank{k}.{ext}" for k in range(3) for ext in ("dot", "json")])
    commands = json.loads((graphs / "command_graph.json").read_text())["commands"]
    assert sorted(commands) == ["0", "1", "2"] and all(commands.values())
    doc = json.loads(trace.read_text())
    events = doc["traceEvents"]
    ranks = {e["pid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "process_name"}
    assert sorted(ranks.values()) == ["rank 0", "rank 1", "rank 2"]
    for pid, name in ranks.items():
        k = int(name.split()[1])
        graph = json.loads((graphs / f"instruction_graph_rank{k}.json").read_text())
        want = sorted(i["id"] for i in graph["instructions"])
        got = sorted(e["args"]["instruction"] for e in events if e["ph"] == "X" and e["pid"] == pid)
        assert got == want, f"rank {k}: the trace's instructions differ from its instruction graph"
        kernels = [i for i in graph["instructions"] if i["kind"] == "device_kernel"]
        assert len(kernels) == 7, k
