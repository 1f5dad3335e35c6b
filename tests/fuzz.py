"""Run many differential programs across the configuration matrix and summarise the failures.

    python -m tests.fuzz --programs 10000 --jobs 2
    python -m tests.fuzz --programs 300 --groups reductions,cross_dtype --minimize
    python -m tests.fuzz --show 1234                 # one program: listing, configuration, outcome
    python -m tests.fuzz --show 1234 --minimize      # ... and its minimised form

Program ``seed`` is ``differential.generate(random.Random(seed), kind, groups, repeat)``;
its configuration (ranks 1-4, host devices 1-4, lookahead, oversubscription, staged or
direct transfers, ..., and ``repeat``: loops as generated or four times longer, so that
replay hits) is drawn from the seed too, unless ``--config`` pins it.  Each
failure is printed with its seed, configuration, feature set and the first line of
what differed; ``--minimize`` shrinks the first failing program of every failure tag
(tasks, reads, reductions, options, then the configuration) while it keeps failing
with the same tag, and prints what is left.  The exit status is 1 when a program failed.
"""
from __future__ import annotations

import argparse
import atexit
import copy
import logging
import multiprocessing
import os
import random
import shutil
import sys
import tempfile
import time
from collections import Counter
from concurrent.futures import ProcessPoolExecutor, as_completed
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, replace
from pathlib import Path

_TESTS = Path(__file__).resolve().parent
for _p in (_TESTS.parent, _TESTS):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

from differential import (BAD_TASK, GROUPS, KINDS, Config, Mismatch, Program, bad_mapper_outcome,  # noqa: E402
                          check_dry_run, chunks_possible, device_memory_batched, device_memory_for, generate, lifecycle,
                          overlap_expects_error, partial_raise_outcome, program_config, random_config,
                          run_and_check, split_caches_overflow, target_problem)


@dataclass
class Result:
    seed: int
    kind: str
    config: Config
    features: list[str]
    tag: str | None                 # None: matched
    message: str
    seconds: float


def config_for(seed: int, pinned: dict | None = None) -> Config:
    cfg = random_config(random.Random(seed * 7919 + 17))
    if not pinned:
        return cfg
    cfg = replace(cfg, **pinned)
    if cfg.backend in ("opencl", "cuda") and "transfers" not in pinned:
        cfg = replace(cfg, transfers="staged")   # device memory without a CUDA-aware MPI: direct is refused
    return cfg


def program_for(seed: int, kind: str | None, groups: tuple[str, ...], pinned: dict | None) -> tuple[Program, Config]:
    """Program ``seed`` and the configuration it runs on.  The configuration comes first: its
    ``repeat`` makes the program's loops longer."""
    base = config_for(seed, pinned)
    p = generate(random.Random(seed), kind=kind, groups=groups, repeat=base.repeat)
    return p, program_config(p, base)


def parse_config(text: str | None) -> dict | None:
    """``ranks=2,devices=1,lookahead=none,oversubscribe=3,transfers=direct,backend=opencl``."""
    if not text:
        return None
    out: dict = {}
    for item in text.split(","):
        k, _, v = item.partition("=")
        k = k.strip()
        if k not in Config.__dataclass_fields__:
            raise SystemExit(f"--config: unknown field {k!r}; use {', '.join(Config.__dataclass_fields__)}")
        out[k] = (int(v) if k in ("ranks", "devices", "oversubscribe", "horizon_step", "repeat")
                  else v in ("1", "True", "true", "on") if k == "accessor_checks"
                  else (None if v in ("None", "default") else int(v)) if k in ("ahead", "horizon_parallelism",
                                                                                "device_delay_us", "compile_after")
                  else (None if v == "None" else float(v)) if k in ("memory", "batch") else v)
    return out


def parse_groups(text: str) -> tuple[str, ...]:
    if text == "all":
        return GROUPS
    if text in ("", "none", "base"):
        return ()
    groups = tuple(g for g in text.split(",") if g)
    bad = [g for g in groups if g not in GROUPS]
    if bad:
        raise SystemExit(f"--groups: unknown {bad}; choose from {', '.join(GROUPS)}")
    return groups


def quiet_runtime_logs() -> None:
    """Failed programs make the runtime log their errors; the summary reports them instead."""
    lg = logging.getLogger("celeritas")
    lg.addHandler(logging.NullHandler())
    lg.propagate = False


def own_pocl_cache() -> None:
    """Every fuzz process compiles OpenCL programs into its own PoCL cache (a temporary folder,
    removed at exit), so that parallel jobs never share one."""
    if os.environ.get("CELERITAS_FUZZ_POCL_PID") == str(os.getpid()):
        return
    folder = tempfile.mkdtemp(prefix="celeritas-fuzz-pocl-")
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    os.environ["POCL_CACHE_DIR"] = folder
    os.environ["CELERITAS_FUZZ_POCL_PID"] = str(os.getpid())


_REPLAYS: list = []     # the Replay memos made by this worker's current run (see _keep_instances)
_EXECUTORS: list = []   # the executors made by this worker's current run (see _keep_instances)


def _keep_instances(cls, kept: list) -> None:
    """Make this worker append every ``cls`` the runtime makes to ``kept``, so that a run can
    report what it reached (``reached:`` features: the program's record does not say whether
    its steps repeated often enough for replay, or ran directly in the executor)."""
    init = cls.__init__
    if getattr(init, "kept_by_fuzz", False):
        return

    def keep(self, *a, **kw):
        init(self, *a, **kw)
        kept.append(self)
    keep.kept_by_fuzz = True
    cls.__init__ = keep


def run_one(seed: int, kind: str | None, groups: tuple[str, ...], pinned: dict | None, timeout: float) -> Result:
    quiet_runtime_logs()
    own_pocl_cache()
    from executor.executor import Executor
    from scheduler.replay import Replay
    _keep_instances(Replay, _REPLAYS)
    _REPLAYS.clear()
    _keep_instances(Executor, _EXECUTORS)       # (reached:executor:direct_horizon: a horizon run
    _EXECUTORS.clear()                           # straight from its batch)
    p, cfg = program_for(seed, kind, groups, pinned)
    t0 = time.perf_counter()
    tag, msg = None, ""
    dry = dry_run_checked(seed, p, cfg)
    try:
        run_and_check(p, cfg, timeout=timeout)
        if dry:
            check_dry_run(p, cfg, timeout=timeout)
    except Mismatch as exc:
        tag, msg = exc.tag, str(exc)
    except Exception as exc:  # noqa: BLE001 - a crash of the harness itself is a result too
        tag, msg = "harness", f"{type(exc).__name__}: {exc}"
    # (the configuration's dimensions go into the per-feature table beside the program's)
    dims = [f"config:replay:{cfg.replay}", f"config:memory:{cfg.memory if cfg.memory is not None else 'unbounded'}",
            f"config:ranks:{cfg.ranks}", f"config:devices:{cfg.devices}", f"config:lookahead:{cfg.lookahead}",
            f"config:ahead:{cfg.ahead if cfg.ahead is not None else 'default'}",
            f"config:huge:{cfg.huge if cfg.huge is not None else 'default'}",
            f"config:inline:{cfg.inline if cfg.inline is not None else 'default'}",
            f"config:pause:{cfg.pause if cfg.pause is not None else 'default'}",
            f"config:horizon_step:{cfg.horizon_step}",
            f"config:horizon_parallelism:{cfg.horizon_parallelism if cfg.horizon_parallelism is not None else 'default'}",
            f"config:accessor_checks:{'on' if cfg.accessor_checks else 'off'}", f"config:diagnostics:{cfg.diagnostics}",
            f"config:batch:{cfg.batch if cfg.batch is not None else 'none'}",
            f"config:ooc_overlap:{cfg.ooc_overlap if cfg.ooc_overlap is not None else 'default'}",
            f"config:backend:{cfg.backend}",
            f"config:compile_after:{cfg.compile_after if cfg.compile_after is not None else 'default'}",
            f"config:repeat:{cfg.repeat}"]
    if cfg.backend == "opencl" and any(t.source for t in p.tasks):
        dims.append("config:backend:opencl:source_kernels")
    dims += expected_outcome(p, cfg)
    if any(r.grouped for r in _REPLAYS):
        dims.append("reached:replay:grouped")    # (a task's commands replayed as one template)
    if any(r.grouped_reductions for r in _REPLAYS):
        dims.append("reached:replay:grouped:reduction")    # (the same, of a task with reductions of its own)
    if any(r.grouped_gathers for r in _REPLAYS):
        dims.append("reached:replay:grouped:gather")    # (the same, gathering an earlier task's pending reduction)
    if any(r.chained for r in _REPLAYS):
        dims.append("reached:replay:chain")     # (a template found along a chain from a horizon, no key)
    if any(r.chained_groups for r in _REPLAYS):
        dims.append("reached:replay:chain:grouped")     # (the same, of a task's commands together)
    _REPLAYS.clear()
    if any(e.direct_horizons for e in _EXECUTORS):
        dims.append("reached:executor:direct_horizon")      # (a horizon run without an engine node)
    _EXECUTORS.clear()
    if dry:
        dims.append("config:dry_run")
    if p.kind == "main" and split_caches_overflow(p):
        dims.append("expect:cache_eviction")     # (check_main required every rank's split caches cleared)
    return Result(seed, p.kind, cfg, sorted(p.features) + dims, tag, msg, time.perf_counter() - t0)


def dry_run_checked(seed: int, p: Program, cfg: Config) -> bool:
    """Whether program ``seed`` is also run as a dry run against a real one (``check_dry_run``):
    a quarter of the ``main`` programs of two or more ranks on the host backend without a
    ``CELERITAS_MAX_TASKS_AHEAD`` (``ahead``).  An application throttled by it flushes the
    commands held for lookahead when the executor is that far behind, which depends on
    timing (a dry run is never behind), so its instruction graph may allocate differently:
    seen in 5 of 159 such programs on a loaded machine, never without ``ahead``."""
    return (p.kind == "main" and cfg.ranks >= 2 and cfg.backend == "host" and cfg.ahead is None
            and seed % 4 == 3)


def expected_outcome(p: Program, cfg: Config) -> list[str]:
    """``expect:`` features: what the checks required of a diagnostic kind on its configuration."""
    if p.kind == "bad_mapper":
        # rank chunks (as before), then which check raises: the command graph's (a rank's chunk
        # outside the whole range's region), a rank's instruction graph (a local chunk outside
        # its rank's chunk: RangeMapperError on several ranks, DiagnosticError on one), or none
        try:
            oc = bad_mapper_outcome(p, cfg)
        except AssertionError:      # (outside the model: the run itself reported it, as "harness")
            return ["expect:bad_mapper:unmodelled"]
        out = ["expect:bad_mapper:" + ("single_chunk" if len(oc.chunks) < 2 else "multi_chunk")]
        if len(oc.chunks) >= 2:
            out.append("expect:bad_mapper:multi_chunk:" + ("diagnostic" if oc.outside else "none_outside"))
        if oc.case.startswith("local_outside"):
            out += ["expect:bad_mapper:local_outside", "expect:bad_mapper:" + oc.case]
        elif oc.local:
            out.append("expect:bad_mapper:local_outside:after_diagnostic")   # (the command graph raised first)
        if oc.case == "none":
            out.append("expect:bad_mapper:no_error")
        return out
    if p.kind == "misuse" and p.tasks[-1].misuse_form == "partial":
        # which graph raises: every rank's command graph (a rank's chunk), one rank's instruction
        # graph (a device chunk or part), or none
        failing, _chunk = partial_raise_outcome(p, cfg)
        return ["expect:misuse:partial:" + ("none" if not failing else "rank_chunk" if cfg.ranks > 1
                                            and len(failing) == cfg.ranks else "local_chunk")]
    if p.kind == "overlap":
        diagnosed = overlap_expects_error(p, chunks_possible(cfg))
        return ["expect:overlap:" + ("diagnostic" if diagnosed else "single_chunk")]
    if cfg.batch is not None and cfg.backend == "host":
        # (whether a chunk is cut depends on the split: below the footprint, the largest task's
        # chunk on one device would be)
        below = device_memory_batched(p, cfg.batch) < device_memory_for(p, 0.0)
        return ["expect:batching:" + ("capacity_below_footprint" if below else "capacity_holds_footprint")]
    return []


def _run_one_args(args):
    return run_one(*args)


WORKER_DIED = "worker-died"


def run_parallel(work: list[tuple], jobs: int, fn=_run_one_args, died: list | None = None):
    """``run_one`` over ``work`` in ``jobs`` worker processes, yielding results as they come.

    A worker that dies (a crash in native code, a signal, an ``os._exit`` deep in a
    program) must neither hang the run nor lose its seeds: ``multiprocessing.Pool``
    replaced such a worker and then waited forever for the result it never sent (seen
    once: a worker gone about 8 s into a two-job run).  A process pool breaks instead;
    the seeds it had not finished go to a fresh pool, and a seed lost that way a second
    time runs alone (``run_isolated``), where a death is its own result, with the exit code.
    ``fn(w)`` runs one work item; ``died``, where given, gets the seeds of every broken pool
    (a death that a rerun did not repeat still means something killed a worker)."""
    ctx = multiprocessing.get_context("spawn")
    lost: Counter = Counter()
    pending = list(work)
    while pending:
        retry = []
        with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
            futures = {pool.submit(fn, w): w for w in pending}
            for f in as_completed(futures):
                try:
                    yield f.result()
                except BrokenProcessPool:
                    retry.append(futures[f])
        if retry:
            if died is not None:
                died.extend(w[0] for w in retry)
            print(f"\na worker process died with {len(retry)} program(s) unfinished "
                  f"(seeds {_seed_list(w[0] for w in retry)}); running them again", flush=True)
        pending = []
        for w in sorted(retry, key=lambda w: w[0]):
            lost[w[0]] += 1
            if lost[w[0]] >= 2:
                yield run_isolated(w, fn)
            else:
                pending.append(w)


def _seed_list(seeds) -> str:
    seeds = sorted(seeds)
    return ", ".join(map(str, seeds[:8])) + (f" and {len(seeds) - 8} more" if len(seeds) > 8 else "")


def _isolated_child(fn, w: tuple, conn) -> None:
    conn.send(fn(w))
    conn.close()


def run_isolated(w: tuple, fn=_run_one_args) -> Result:
    """``fn(w)`` in a process of its own; its death is a failure of the seed (tag
    ``worker-died``, with the exit code or signal), and so is a process that neither
    answers nor exits within three times the program timeout."""
    seed, kind, groups, pinned, timeout = w
    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_isolated_child, args=(fn, w, send), daemon=True)
    t0 = time.perf_counter()
    proc.start()
    send.close()
    r = None
    try:
        if recv.poll(3 * timeout + 60):
            r = recv.recv()
    except EOFError:        # (the child died before it answered)
        pass
    finally:
        recv.close()
    proc.join(5 if r is not None else 0.5)
    if r is not None:
        return r
    if proc.exitcode is None:
        proc.kill()
        proc.join()
        what = f"did not answer within {3 * timeout + 60:.0f} s and was killed"
    elif proc.exitcode < 0:
        what = f"was killed by signal {-proc.exitcode}"
    else:
        what = f"exited with code {proc.exitcode} without a result"
    p, cfg = program_for(seed, kind, groups, pinned)
    return Result(seed, p.kind, cfg, sorted(p.features), WORKER_DIED,
                  f"the process running seed {seed} alone {what} (it had died in a worker pool before)",
                  time.perf_counter() - t0)


# ---- minimisation ------------------------------------------------------------------------------
def valid(p: Program) -> bool:
    """Targets are read, fenced or reduced without initialize_to_identity only once defined
    (``target_problem``: a point write over an empty range defines nothing);
    buffers and host objects are used only while they exist (and buffers made without data
    only once written: ``lifecycle``); the error kinds keep what makes them that kind."""
    if lifecycle(p)[0] is not None or target_problem(p) is not None:
        return False
    if p.kind == "fail" and not _markers_depend_on_failure(p):
        return False
    if p.kind == "bad_reduction" and not any(s.target == 0 for t in p.tasks for s in t.reds):
        return False
    if p.kind == "overlap" and not p.tasks:
        return False
    if p.kind == "bad_mapper" and not _keeps_bad_access(p):
        return False
    if p.kind == "misuse" and not (p.tasks and (p.tasks[-1].misuse or any(t.kind == "bad_cg" for t in p.tasks))):
        return False        # (the misuse task, last, is what the kind checks; a surviving misuse has steps after it)
    return True


def _keeps_bad_access(p: Program) -> bool:
    """One task reads through a bad mapper: the one named ``BAD_TASK``, which does not
    write the buffer it reads that way (its own chunks would race those reads)."""
    bad = [(t, rd) for t in p.tasks for rd in t.reads if rd.mapper == "bad"]
    if len(bad) != 1:
        return False
    t, rd = bad[0]
    return t.name == BAD_TASK and t.kind in ("kernel", "host") and not t.split2d and \
        not (t.write is not None and t.write.space == "data" and t.write.buffer == rd.buffer)


def _markers_depend_on_failure(p: Program) -> bool:
    """Every task that records that it ran must (transitively) depend on the failing one."""
    failing = [i for i, t in enumerate(p.tasks) if t.fail_at is not None]
    if not failing:
        return False
    tainted: set = set()
    log_tainted = False
    for i, t in enumerate(p.tasks):
        if i < failing[0]:
            continue
        reads = {rd.buffer for rd in t.reads if rd.space == "data"}
        side = t.kind == "master" or (t.kind == "host" and t.side_effect)
        depends = i == failing[0] or bool(reads & tainted) or (side and log_tainted)
        if t.marker and not depends:
            return False
        if depends:
            if t.write is not None and t.write.space == "data":
                tainted.add(t.write.buffer)
            if side:
                log_tainted = True
    return True


def _fails(p: Program, cfg: Config, tag: str, timeout: float) -> bool:
    if not valid(p):
        return False
    dry = tag == "dry_run" and p.kind == "main"      # (check_dry_run's failure, kept while minimising)
    try:
        run_and_check(p, cfg, timeout=timeout)
        if dry:
            check_dry_run(p, cfg, timeout=timeout)
    except Mismatch as exc:
        return exc.tag == tag
    except Exception:  # noqa: BLE001 - a different failure is not the one being minimised
        return False
    return False


def _task_variants(p: Program, i: int):
    """Simpler versions of task ``i`` (one change each)."""
    t = p.tasks[i]
    for j in range(len(t.reads)):
        q = copy.deepcopy(p)
        del q.tasks[i].reads[j]
        yield q
    if len(t.reds) > 1 or (t.reds and t.write is not None):
        for j in range(len(t.reds)):
            q = copy.deepcopy(p)
            del q.tasks[i].reds[j]
            yield q
    simpler = {"local_range": None, "split2d": False, "oversub": None, "c0": 0, "on_master": False,
               "fence_box": None, "barrier": False, "delay": 0.0, "side_effect": True, "comm": False,
               "hobj": None, "group": 0, "form": "" if t.kind == "master" else "attr" if t.kind == "collective"
               else t.form, "index": "box", "split1d": False, "gran": None}
    for attr, value in simpler.items():
        if getattr(t, attr) != value:
            q = copy.deepcopy(p)
            setattr(q.tasks[i], attr, value)
            yield q
    for j, spec in enumerate(t.reds):
        for attr, value in {"combine": "whole", "identity": False, "wide": False, "init": True}.items():
            if getattr(spec, attr) != value:
                q = copy.deepcopy(p)
                setattr(q.tasks[i].reds[j], attr, value)
                yield q
    if t.write is not None and t.write.mode != "discard_write":
        q = copy.deepcopy(p)
        q.tasks[i].write.mode = "discard_write"
        yield q


def _config_variants(cfg: Config):
    if cfg.ranks > 1:
        yield replace(cfg, ranks=1)
        if cfg.ranks > 2:
            yield replace(cfg, ranks=2)
    if cfg.devices > 1:
        yield replace(cfg, devices=1)
        if cfg.devices > 2:
            yield replace(cfg, devices=2)
    if cfg.oversubscribe > 1:
        yield replace(cfg, oversubscribe=1)
    if cfg.lookahead != "none":
        yield replace(cfg, lookahead="none")
    if cfg.transfers != "staged":
        yield replace(cfg, transfers="staged")
    if not cfg.accessor_checks:
        yield replace(cfg, accessor_checks=True)
    if cfg.diagnostics != "error":
        yield replace(cfg, diagnostics="error")
    if cfg.batch is not None:
        yield replace(cfg, batch=None)
    if cfg.ooc_overlap is not None:
        yield replace(cfg, ooc_overlap=None)


def _drop_unused(p: Program) -> Program:
    """Remove buffers and targets no task uses (renumbering the rest)."""
    used_d, used_t = set(), set()
    for t in p.tasks:
        for rd in t.reads:
            (used_d if rd.space == "data" else used_t).add(rd.buffer)
        if t.write is not None:
            (used_d if t.write.space == "data" else used_t).add(t.write.buffer)
        for s in t.reds:
            used_t.add(s.target)
        if t.kind == "fence":
            (used_d if t.fence_space == "data" else used_t).add(t.fence_index)
        if t.kind in ("create", "destroy"):
            used_d.add(t.fence_index)       # (a buffer only made or destroyed still tests its lifetime)
    if p.kind not in ("main", "bad_mapper"):
        return p
    dmap = {old: new for new, old in enumerate(sorted(used_d))}
    tmap = {old: new for new, old in enumerate(sorted(used_t))}
    q = copy.deepcopy(p)
    q.shapes = [s for k, s in enumerate(p.shapes) if k in dmap]
    q.dtypes = [s for k, s in enumerate(p.dtypes) if k in dmap]
    q.init = [s for k, s in enumerate(p.init) if k in dmap]
    q.targets = [s for k, s in enumerate(p.targets) if k in tmap]
    for t in q.tasks:
        for rd in t.reads:
            rd.buffer = (dmap if rd.space == "data" else tmap)[rd.buffer]
        if t.write is not None:
            t.write.buffer = (dmap if t.write.space == "data" else tmap)[t.write.buffer]
        for s in t.reds:
            s.target = tmap[s.target]
        if t.kind == "fence":
            t.fence_index = (dmap if t.fence_space == "data" else tmap)[t.fence_index]
        if t.kind in ("create", "destroy"):
            t.fence_index = dmap[t.fence_index]
    return q


def minimize(p: Program, cfg: Config, tag: str, timeout: float = 30.0, log=print) -> tuple[Program, Config]:
    """Shrink ``p`` and ``cfg`` while the program keeps failing with ``tag``."""
    changed = True
    while changed:
        changed = False
        for i in reversed(range(len(p.tasks))):
            if i >= len(p.tasks):
                continue
            q = copy.deepcopy(p)
            del q.tasks[i]
            if q.tasks and _fails(q, cfg, tag, timeout):
                p, changed = q, True
        for i in range(len(p.tasks)):
            for q in _task_variants(p, i):
                if _fails(q, cfg, tag, timeout):
                    p, changed = q, True
                    break
        for c in _config_variants(cfg):
            if _fails(p, c, tag, timeout):
                cfg, changed = c, True
                break
    q = _drop_unused(p)
    if q is not p and _fails(q, cfg, tag, timeout):
        p = q
    p.features = set()       # the generator's record no longer describes what is left
    return p, cfg


def _failure_reruns(p: Program, cfg: Config, tag: str, n: int, timeout: float) -> int:
    return sum(_fails(p, cfg, tag, timeout) for _ in range(n))


# ---- reporting -----------------------------------------------------------------------------------
NEWER_FAMILIES = ("index", "geometry", "split", "batching")


def summarize(results: list[Result], out=print) -> None:
    failed = [r for r in results if r.tag is not None]
    by_kind = Counter(r.kind for r in results)
    fail_kind = Counter(r.kind for r in failed)
    out(f"\n{len(results)} programs, {len(failed)} failed "
        f"({', '.join(f'{k}: {fail_kind[k]}/{by_kind[k]}' for k in KINDS if by_kind[k])}); "
        f"{sum(r.seconds for r in results):.0f} s of program time")
    present = Counter(f for r in results for f in r.features)
    # what the run reached (a clean run only counts for the features it exercised)
    families = Counter(fam for r in results
                       for fam in {f.split(":")[0] for f in r.features if not f.startswith(("config:", "expect:"))})
    out("\nprograms per feature family: " + ", ".join(f"{g} {n}" for g, n in sorted(families.items())))
    out("configurations: " + ", ".join(f"{f[7:]} {n}" for f, n in sorted(present.items())
                                      if f.startswith("config:")))
    # the features of the collectives / lifetimes / lookahead_steps groups, one by one
    extras = [(f, n) for f, n in sorted(present.items())
              if f.split(":")[0] in ("collective", "lifetime", "hobj", "lookahead") or f.startswith("master:")]
    if extras:
        out("collective, lifetime and lookahead features: " + ", ".join(f"{f} {n}" for f, n in extras))
    # the accessor index styles, kernel geometry, split controls and out-of-core batching, one by one
    newer = [(f, n) for f, n in sorted(present.items()) if f.split(":")[0] in NEWER_FAMILIES]
    if newer:
        out("index, geometry, split and batching features: " + ", ".join(f"{f} {n}" for f, n in newer))
    reached = [(f[8:], n) for f, n in sorted(present.items()) if f.startswith("reached:")]
    if reached:
        out("reached: " + ", ".join(f"{f} {n}" for f, n in reached))
    expected = [(f[7:], n) for f, n in sorted(present.items()) if f.startswith("expect:")]
    if expected:
        out("expected outcomes: " + ", ".join(f"{f} {n}" for f, n in expected))
    if not failed:
        return
    out("\nfailures by tag:")
    for tag, n in Counter(r.tag for r in failed).most_common():
        out(f"  {tag:24s} {n}")
    # features most over-represented among the failures (how to read: which feature to suspect)
    in_failed = Counter(f for r in failed for f in r.features)
    base = len(failed) / len(results)
    rows = []
    for f, n in present.items():
        if n >= 5:
            rate = in_failed[f] / n
            rows.append((rate, f, in_failed[f], n))
    rows.sort(reverse=True)
    out(f"\nfeatures by failure rate (overall {base:.0%}):")
    for rate, f, k, n in rows[:25]:
        out(f"  {rate:5.0%}  {k:4d}/{n:<5d} {f}")
    out("\nfailing programs:")
    for r in sorted(failed, key=lambda r: (r.tag, r.seed)):
        first = r.message.splitlines()[0] if r.message else ""
        out(f"  seed {r.seed} [{r.tag}] {r.kind} | {r.config.describe()}\n"
            f"      features: {', '.join(r.features)}\n      {first[:300]}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--programs", type=int, default=200)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=1, help="worker processes")
    ap.add_argument("--kind", choices=KINDS, default=None, help="only this program kind (default: a mix)")
    ap.add_argument("--groups", default="all", help=f"optional feature groups: all, none, or from {GROUPS}")
    ap.add_argument("--config", default=None, help="pin configuration fields, e.g. ranks=2,devices=1")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per program before it counts as hung")
    ap.add_argument("--show", type=int, default=None, help="run one seed and print its listing and outcome")
    ap.add_argument("--minimize", action="store_true", help="shrink the first failure of every tag")
    args = ap.parse_args(argv)
    quiet_runtime_logs()
    groups = parse_groups(args.groups)
    pinned = parse_config(args.config)

    if args.show is not None:
        r = run_one(args.show, args.kind, groups, pinned, args.timeout)
        p, _cfg = program_for(args.show, args.kind, groups, pinned)
        print(f"seed {args.show} | {r.config.describe()}\n{p.describe()}\n")
        print("matched the model" if r.tag is None else f"FAILED [{r.tag}]\n{r.message}")
        if r.tag is not None and args.minimize:
            _print_minimized(p, r.config, r.tag, args.timeout)
        return 0 if r.tag is None else 1

    seeds = range(args.first_seed, args.first_seed + args.programs)
    work = [(s, args.kind, groups, pinned, args.timeout) for s in seeds]
    results: list[Result] = []
    t0 = time.perf_counter()
    died: list[int] = []
    if args.jobs > 1:
        for r in run_parallel(work, args.jobs, died=died):
            results.append(r)
            _progress(results, args.programs, t0)
    else:
        for w in work:
            results.append(run_one(*w))
            _progress(results, args.programs, t0)
    print(f"\r{len(results)} programs in {time.perf_counter() - t0:.0f} s" + " " * 20)
    summarize(results)
    if args.minimize:
        firsts = {}
        for r in sorted(results, key=lambda r: r.seed):
            if r.tag is not None and r.tag not in firsts:
                firsts[r.tag] = r
        for tag, r in firsts.items():
            p, _cfg = program_for(r.seed, args.kind, groups, pinned)
            print(f"\n=== minimising seed {r.seed} [{tag}] on {r.config.describe()}")
            _print_minimized(p, r.config, tag, args.timeout)
    if died:
        print(f"\nworker processes died {len(set(died))} time(s) with seeds unfinished (seeds {_seed_list(set(died))}); "
              f"every seed was run again (a seed whose process died again is failed as {WORKER_DIED!r})")
    return 1 if died or any(r.tag is not None for r in results) else 0


def _print_minimized(p: Program, cfg: Config, tag: str, timeout: float) -> None:
    mp, mcfg = minimize(p, cfg, tag, timeout=min(timeout, 60.0))
    print(f"minimal [{tag}] on {mcfg.describe()} (fails {_failure_reruns(mp, mcfg, tag, 3, timeout)}/3 reruns):")
    print(mp.describe())
    try:
        run_and_check(mp, mcfg, timeout=timeout)
        print("(passed on the last rerun)")
    except Mismatch as exc:
        print(str(exc))


def _progress(results: list[Result], total: int, t0: float) -> None:
    if sys.stdout.isatty() or len(results) % 100 == 0 or len(results) == total:
        nf = sum(r.tag is not None for r in results)
        print(f"\r{len(results)}/{total} programs, {nf} failed, {time.perf_counter() - t0:.0f} s",
              end="" if sys.stdout.isatty() else "\n", flush=True)


if __name__ == "__main__":
    sys.exit(main())
