"""Random programs must give what a sequential numpy run gives, on every configuration.

``differential.py`` generates the programs and interprets them; ``tests/fuzz.py`` runs
campaigns of thousands and minimises failures.  Here hypothesis draws program seeds and
configurations: ranks 1-4 x host devices 1-4 x lookahead none/auto/infinite x
oversubscription 1/3 x staged/direct transfers.  A seed is not a size, so shrinking it
means nothing: the shrink phase is off and every failure names the command that shows
and minimises that program on that configuration.
"""
import copy
import os
from dataclasses import replace
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

import celeritas as cl
from differential import (BAD_TASK, BATCH_CHOICES, comm_op, DIAGNOSTICS_CHOICES, GROUPS, HORIZON_PARALLELISM_CHOICES,
                          HORIZON_STEP_CHOICES, HUGE_CHOICES, INDEX_STYLES, INLINE_CHOICES, MEMORY_CHOICES, MOD,
                          OOC_OVERLAP_CHOICES, PAUSE_CHOICES, REPLAY_CHOICES, Config, Mismatch, Program, Read, Task,
                          Write, bad_access, bad_mapper_outcome, bad_rows, check, device_memory_batched,
                          device_memory_for, even_split_rows, generate, lifecycle, program_config, random_config,
                          row_working_set, run_and_check, run_model, run_on_cluster, split_granularity, task_box,
                          MISUSE_FORMS, _misuse_read, misuse_error, misuse_task)

EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_EXAMPLES", "200"))
GROUP_EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_GROUP_EXAMPLES", "40"))
KIND_EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_KIND_EXAMPLES", "30"))
OPENCL_EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_OPENCL_EXAMPLES", "25"))

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
configs = st.builds(Config, ranks=st.integers(1, 4), devices=st.integers(1, 4),
                    lookahead=st.sampled_from(["none", "auto", "infinite"]), oversubscribe=st.sampled_from([1, 3]),
                    transfers=st.sampled_from(["staged", "direct"]), replay=st.sampled_from(REPLAY_CHOICES),
                    memory=st.sampled_from(MEMORY_CHOICES), huge=st.sampled_from(HUGE_CHOICES),
                    inline=st.sampled_from(INLINE_CHOICES), pause=st.sampled_from(PAUSE_CHOICES),
                    horizon_step=st.sampled_from(HORIZON_STEP_CHOICES),
                    horizon_parallelism=st.sampled_from(HORIZON_PARALLELISM_CHOICES),
                    accessor_checks=st.booleans())
# main programs also run under diagnostics warn / off and with the capacity that cuts chunks into batches
main_configs = st.tuples(configs, st.sampled_from(DIAGNOSTICS_CHOICES), st.sampled_from(BATCH_CHOICES),
                         st.sampled_from(OOC_OVERLAP_CHOICES)).map(
    lambda c: replace(c[0], diagnostics=c[1], batch=c[2], ooc_overlap=c[3]))


def _check(seed: int, cfg: Config, kind=None, groups=GROUPS) -> None:
    prog = generate(random.Random(seed), kind=kind, groups=groups)
    cfg = program_config(prog, cfg)     # (misuse outside: accessor checks on; a no-op for the others here)
    try:
        run_and_check(prog, cfg)
    except Mismatch as exc:
        fields = cfg.fields()
        raise AssertionError(
            f"program {seed} ({prog.kind}) on {cfg.describe()} differs from the model:\n{exc}\n\n"
            f"reproduce and minimise: python -m tests.fuzz --show {seed}"
            f"{f' --kind {kind}' if kind else ''} --groups {','.join(groups) or 'none'} "
            f"--config {fields} --minimize\n\n{prog.describe()}") from None


@pytest.mark.timeout(1800)
@settings(max_examples=EXAMPLES, deadline=None, phases=NO_SHRINK,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**31 - 1), cfg=configs)
def test_random_programs_match_numpy(seed, cfg):
    """Every program kind, every feature group."""
    _check(seed, cfg)


# One group at a time (with the groups it builds on): which feature a failure belongs to.
FOCUS = {
    "base": (),
    "dtypes": ("dtypes",),
    "reductions": ("reductions",),
    "int_wrap": ("reductions", "int_wrap"),
    "remote_target": ("reductions", "remote_target"),
    "cross_dtype": ("reductions", "cross_dtype", "int_wrap"),
    "local_range": ("local_range",),
    "custom_mappers": ("custom_mappers",),
    "stencils": ("stencils", "loops"),
    "host_range": ("host_range",),
    "host_object_fence": ("host_object_fence", "host_range"),
    "epochs": ("epochs", "loops", "timing"),
    "collectives": ("collectives", "loops", "reductions"),
    "lifetimes": ("lifetimes", "host_range", "epochs", "timing"),
    "lookahead_steps": ("lookahead_steps", "loops", "epochs"),
}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("focus", sorted(FOCUS))
def test_feature_group_matches_numpy(focus):
    @settings(max_examples=GROUP_EXAMPLES, deadline=None, phases=NO_SHRINK, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(seed=st.integers(0, 2**31 - 1), cfg=main_configs)
    def run(seed, cfg):
        _check(seed, cfg, kind="main", groups=FOCUS[focus])
    run()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("kind", ["fail", "bad_reduction", "overlap", "bad_mapper", "misuse"])
def test_error_kinds(kind):
    """fail: a KernelError at the next sync and no dependent ran; bad_reduction: an error
    naming the target and both dtypes; overlap: a DiagnosticError whenever chunks overlap;
    bad_mapper: the error the split calls for (``bad_mapper_outcome``: a rank's chunk outside
    the whole range's region, or a local chunk outside its rank's chunk's), else the model's
    result."""
    @settings(max_examples=KIND_EXAMPLES, deadline=None, phases=NO_SHRINK, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(seed=st.integers(0, 2**31 - 1), cfg=configs)
    def run(seed, cfg):
        _check(seed, cfg, kind=kind)
    run()


def test_generator_reaches_every_feature_group():
    """The campaign is only as good as what it generates: each group shows up in the feature sets."""
    seen: set = set()
    for seed in range(400):
        seen |= generate(random.Random(seed)).features
    for needle in ["red:no_init_remote_value", "red:cross_dtype", "red:int_wraps", "red:multi", "local_range",
                   "write:custom_mirror", "write:custom_shift", "write:custom_point", "read:custom_shift",
                   "write:target_by_point_mapper", "host:range", "host:oversubscribe", "host:no_side_effect",
                   "fence:host_object", "wait", "wait:barrier", "split_2d:stencil", "stencil_loop",
                   "read:neighborhood:along_axes", "red:consumed_by_master_only", "loop", "timing:slow_chunk",
                   "fail:kernel", "fail:host_task", "overlap:all", "dtype:float32", "red:target_0d",
                   "bad_mapper:offset_eq", "bad_mapper:next_block", "bad_mapper:prev_block",
                   "bad_mapper:first_only", "bad_mapper:host", "bad_mapper:kernel",
                   "collective", "collective:group", "collective:default:attr", "collective:default:call",
                   "collective:comm", "collective:hobj", "collective:loop", "collective:loop:groups",
                   "master:once", "master:default", "master:hobj", "hobj:second", "hobj:side_effect", "hobj:fence",
                   "hobj:destroy", "hobj:create", "lifetime:uninit", "lifetime:create", "lifetime:create_uninit",
                   "lifetime:create_after_tasks", "lifetime:create_after_wait", "lifetime:destroy",
                   "lifetime:fence_then_destroy", "lifetime:destroy_after_write", "lifetime:first_write_host",
                   "lifetime:first_write_kernel", "lookahead:flush", "lookahead:set:none", "lookahead:set:auto",
                   "lookahead:set:infinite"]:
        assert needle in seen, needle
    kinds = {generate(random.Random(s)).kind for s in range(400)}
    assert kinds == {"main", "fail", "bad_reduction", "overlap", "bad_mapper", "misuse"}


# bad_mapper programs on fixed configurations: (seed, configuration, what the split makes of
# the bad task, its number of rank chunks, the part of the error message that names the
# chunk mapped outside).  Cases (``BadMapperOutcome.case``):
#   rank_outside            the command graph: several rank chunks, one mapped outside the
#                           whole range's region; a DiagnosticError on every rank (or aborted)
#   local_outside:one_rank  the instruction graph on one rank: a device chunk or oversubscribed
#                           part mapped outside the rank's chunk's region; a DiagnosticError
#   local_outside:ranks     the same on several ranks: a RangeMapperError on that rank; the
#                           others are aborted (these programs' bad task writes a buffer that
#                           every rank fences at the end, so they wait for that rank's part)
#   none                    no error: the model's data, and the bad reads the model's data
BAD_MAPPER_CASES = [
    (27, Config(ranks=3, devices=2), "rank_outside", 3,                       # kernel, offset_eq
     "maps rank 1's chunk Box([1, 0, 0], [2, 3, 2]) to Region([[1, 0], [2, 6]])"),
    (20, Config(ranks=3, devices=1, lookahead="none"), "rank_outside", 2,     # host task, offset_eq
     "maps rank 1's chunk Box([1, 0], [2, 6]) to Region([[1, 0, 0], [2, 1, 4]])"),
    (6, Config(ranks=2, devices=3, replay="off"), "rank_outside", 2,          # kernel, next_block; rank 0's
     "maps rank 0's chunk Box([0], [2]) to Region([[2, 0], [4, 1]])"),        # device 0 is outside too
    (27, Config(ranks=1, devices=4, oversubscribe=3), "local_outside:one_rank", 1,   # kernel: a device chunk
     "maps device 1's chunk Box([1, 0, 0], [2, 3, 2]) of rank 0 to Region([[1, 0], [2, 6]])"),
    (12, Config(ranks=1, devices=1, oversubscribe=3), "local_outside:one_rank", 1,   # host task: a part
     "maps the chunk Box([0], [2]) of rank 0 to Region([[2], [7]])"),
    (10, Config(ranks=3, devices=1, oversubscribe=3), "local_outside:ranks", 3,      # kernel, on rank 1
     "maps device 0's chunk Box([4, 0], [5, 1]) of rank 1 to Region([[4], [5]])"),
    (16, Config(ranks=2, devices=1, oversubscribe=3), "local_outside:ranks", 2,      # host task, on rank 0
     "maps the chunk Box([0, 0], [2, 5]) of rank 0 to Region([[2, 0], [4, 8]])"),
    (0, Config(ranks=4, devices=2), "none", 1, None),           # host task on the master node, reads rows 6-8
    (50, Config(ranks=3, devices=2, oversubscribe=3), "none", 1, None),   # kernel whose work group is its
                                                                          # whole range (never cut), rows 3-5
    (1, Config(ranks=2, devices=2, oversubscribe=3), "none", 2, None),    # several chunks, all mapped past
                                                                          # the buffer's end (nothing)
]


def _aborted(e) -> bool:
    return isinstance(e, cl.CeleritasError) and ("cluster aborted" in str(e) or "collective aborted" in str(e))


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,case,nchunks,where", BAD_MAPPER_CASES)
def test_bad_mapper_fixed_seeds(seed, cfg, case, nchunks, where):
    p = generate(random.Random(seed), kind="bad_mapper")
    oc = bad_mapper_outcome(p, cfg)
    assert p.kind == "bad_mapper" and (oc.case, len(oc.chunks)) == (case, nchunks), (oc, p.describe())
    _idx, t, rd = bad_access(p)
    m = p.shapes[rd.buffer][0]
    result = run_on_cluster(p, cfg)
    assert all(o is not None for o in result["ranks"]), result["cluster_error"]
    errors = [o["error"] for o in result["ranks"]]
    if case == "none":
        assert errors == [None] * cfg.ranks, errors
        # one chunk reads rows of the buffer (compared with the model); several read nothing
        rows = bad_rows(rd.form, rd.k, 0, t.range_shape[0], m)
        assert (rows[0] < rows[1]) == (nchunks == 1), rows
    else:
        cls = cl.RangeMapperError if case == "local_outside:ranks" else cl.DiagnosticError
        own = [r for r, e in enumerate(errors) if type(e) is cls]
        assert own, errors
        for r in own:
            msg = str(errors[r])
            assert re.match(r'T\d+ "%s": the range mapper of its access to buffer B\d+ "b%d" %s' % (
                BAD_TASK, rd.buffer, re.escape(where)), msg), msg
        if case == "rank_outside":
            # every rank's command graph raises it, unless another rank's error aborted the cluster first
            assert all(r in own or _aborted(e) for r, e in enumerate(errors)), errors
        else:
            failing = int(re.search(r"of rank (\d+)", where).group(1))
            assert own == [failing], errors
            if cfg.ranks > 1:
                assert t.write is not None     # (why the others cannot finish: they fence its output)
                assert all(_aborted(e) for r, e in enumerate(errors) if r != failing), errors
    check(p, run_model(p), result, cfg)     # and the harness's verdict agrees


@pytest.mark.parametrize("seed,cfg", [(27, Config(ranks=3, devices=2)),                        # rank_outside
                                      (27, Config(ranks=1, devices=4, oversubscribe=3))])      # one rank
def test_bad_mapper_check_fails_when_the_diagnostic_is_missing(monkeypatch, seed, cfg):
    """With diagnostics only warning, the diagnostics of a rank's chunk outside the whole range,
    and of a device chunk outside its rank's chunk on one rank, let the program run through:
    the check says so."""
    env = Config.env
    monkeypatch.setattr(Config, "env", lambda self: {**env(self), "CELERITAS_DIAGNOSTICS": "warn"})
    p = generate(random.Random(seed), kind="bad_mapper")
    assert bad_mapper_outcome(p, cfg).case in ("rank_outside", "local_outside:one_rank")
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "bad_mapper:missed", str(info.value)


@pytest.mark.parametrize("diagnostics", ["off", "warn"])
def test_bad_mapper_local_chunk_on_several_ranks_fails_whatever_the_setting(monkeypatch, diagnostics):
    """A device chunk mapped outside its rank's chunk on several ranks is a RangeMapperError
    under every diagnostics setting: the check (made for ``error``) passes under the others."""
    env = Config.env
    monkeypatch.setattr(Config, "env", lambda self: {**env(self), "CELERITAS_DIAGNOSTICS": diagnostics})
    p = generate(random.Random(10), kind="bad_mapper")
    cfg = Config(ranks=3, devices=1, oversubscribe=3)
    assert bad_mapper_outcome(p, cfg).case == "local_outside:ranks"
    run_and_check(p, cfg)


@pytest.mark.parametrize("seed,cfg", [(50, Config(ranks=1, devices=4, oversubscribe=3)),    # kernel
                                      (0, Config(ranks=2, devices=2))])                     # master-node task
def test_bad_mapper_check_fails_on_stale_reads(monkeypatch, seed, cfg):
    """The chunks' reads through the bad mapper are compared with the model: a model that
    expects other data makes a run without error (whose chunk reads rows) fail."""
    import differential
    p = generate(random.Random(seed), kind="bad_mapper")
    oc = bad_mapper_outcome(p, cfg)
    _idx, t, rd = bad_access(p)
    rows = bad_rows(rd.form, rd.k, 0, t.range_shape[0], p.shapes[rd.buffer][0])
    assert oc.case == "none" and len(oc.chunks) == 1 and rows[0] < rows[1]
    run_and_check(p, cfg)       # (right as it is)
    before = differential.bad_mapper_before

    def off_by_one(q):
        a = before(q)
        return ~a if a.dtype == bool else (a + 1).astype(a.dtype)
    monkeypatch.setattr(differential, "bad_mapper_before", off_by_one)
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "bad_mapper:stale_read", str(info.value)


def _outcome(*errors, obs=None):
    """A made-up ``run_on_cluster`` result: per rank an error (or None: finished, with ``obs``)."""
    return {"ranks": [{"error": e, "stage": "run"} if e is not None else {"error": None, "obs": obs}
                      for e in errors], "cluster_error": None, "ran": []}


def _tag(p, result, cfg, want=None):
    try:
        check(p, want, result, cfg)
    except Mismatch as exc:
        return exc.tag
    return None


def test_bad_mapper_check_judges_the_diagnostic():
    """Outcomes made up for a command-graph case: the check accepts only the diagnostic that
    names the task, the buffer and the first rank whose chunk is mapped outside, and ranks
    that raise it or are aborted."""
    p = generate(random.Random(27), kind="bad_mapper")
    cfg = Config(ranks=3, devices=2)
    assert bad_mapper_outcome(p, cfg).case == "rank_outside"

    def diag(task=BAD_TASK, buffer="b2", rank=1, cls=cl.DiagnosticError):
        return cls(f'T5 "{task}": the range mapper of its access to buffer B2 "{buffer}" maps rank {rank}\'s chunk '
                   f'Box([{rank}, 0, 0], [{rank + 1}, 3, 2]) to Region([[{rank}, 0], [{rank + 1}, 6]]), which is not '
                   f'inside what it maps the whole range Box([0, 0, 0], [3, 3, 2]) to (Region()); a range mapper '
                   f'must map a part of the range into what it maps the whole range to')
    aborted = cl.CeleritasError("rank 1: internal error: CommunicatorError: rank 1: cluster aborted")
    assert _tag(p, _outcome(diag(), aborted, diag()), cfg) is None
    assert _tag(p, _outcome(diag(), diag(), diag()), cfg) is None
    assert _tag(p, _outcome(diag(buffer="b9"), diag(), diag()), cfg) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(diag(task="kernel_T3"), aborted, aborted), cfg) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(diag(rank=2), aborted, aborted), cfg) == "bad_mapper:wrong_error"  # (inside)
    assert _tag(p, _outcome(diag(cls=cl.RangeMapperError), aborted, aborted), cfg) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(aborted, aborted, aborted), cfg) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(diag(), cl.CeleritasError("other"), diag()), cfg) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(diag(), None, diag()), cfg) == "bad_mapper:rank_finished"
    assert _tag(p, _outcome(diag(), ValueError("boom"), diag()), cfg) == "crash"
    assert _tag(p, _outcome(None, None, None), cfg) == "bad_mapper:missed"
    # one rank: one chunk, cut into three (one row each) that the device check accepts
    # only as its own DiagnosticError; a command-graph diagnostic there is wrong
    one = Config(ranks=1, devices=3)
    assert bad_mapper_outcome(p, one).case == "local_outside:one_rank"
    assert _tag(p, _outcome(diag()), one) == "bad_mapper:wrong_error"
    # and no chunk of a single device: the diagnostic is spurious
    assert bad_mapper_outcome(p, Config(ranks=1, devices=1)).case == "none"
    assert _tag(p, _outcome(diag()), Config(ranks=1, devices=1)) == "bad_mapper:spurious"


def test_bad_mapper_check_judges_the_local_error():
    """Outcomes made up for an instruction-graph case on two ranks (rank 0's first part is
    outside): the check wants that RangeMapperError from rank 0, and rank 1 aborted or
    finished with the model's data."""
    import numpy as np
    p = generate(random.Random(16), kind="bad_mapper")
    cfg = Config(ranks=2, devices=1, oversubscribe=3)
    assert bad_mapper_outcome(p, cfg).case == "local_outside:ranks"
    want = run_model(p)

    def err(part="the chunk Box([0, 0], [2, 5])", rank=0, cls=cl.RangeMapperError):
        return cls(f'T3 "{BAD_TASK}": the range mapper of its access to buffer B1 "b1" maps {part} of rank {rank} to '
                   f'Region([[2, 0], [4, 8]]), which is not inside what it maps the rank\'s chunk Box([0, 0], [4, 5]) '
                   f'to (Region()); a range mapper must map a part of a chunk into what it maps the chunk to (data '
                   f'moves between ranks by the rank\'s chunk: the part would read data that never arrived)')
    aborted = cl.CeleritasError("rank 1: internal error: CommunicatorError: rank 1: cluster aborted")
    obs = {"fences": want["fences"], "buffers": want["buffers"], "targets": want["targets"], "log": [],
           "log_fences": [[] for _ in want["log_fences"]], "violations": [], "plain": [], "wait_snapshots": [],
           "partitions": [], "bad_reads": []}
    assert _tag(p, _outcome(err(), aborted), cfg, want) is None
    assert _tag(p, _outcome(err(), None, obs=obs), cfg, want) is None      # rank 1 finished, right data
    wrong = dict(obs, buffers=[b.copy() for b in obs["buffers"]])
    wrong["buffers"][0].reshape(-1)[0] += np.ones((), wrong["buffers"][0].dtype)
    assert _tag(p, _outcome(err(), None, obs=wrong), cfg, want) == "buffer"
    assert _tag(p, _outcome(err(), None, obs=dict(obs, bad_reads=[(3, 1, "Box", "Box", "differ")])), cfg,
                want) == "bad_mapper:stale_read"
    assert _tag(p, _outcome(err(cls=cl.DiagnosticError), aborted), cfg, want) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(err(part="the chunk Box([2, 0], [4, 5])"), aborted), cfg, want) == \
        "bad_mapper:wrong_error"
    assert _tag(p, _outcome(err(part="device 0's chunk Box([0, 0], [2, 5])"), aborted), cfg, want) == \
        "bad_mapper:wrong_error"
    assert _tag(p, _outcome(aborted, err(rank=1)), cfg, want) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(aborted, aborted), cfg, want) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(err(), cl.CeleritasError("rank 1: other")), cfg, want) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(err(), ValueError("boom")), cfg, want) == "crash"
    assert _tag(p, _outcome(None, aborted, obs=obs), cfg, want) == "bad_mapper:rank_finished"
    assert _tag(p, _outcome(None, None, obs=obs), cfg, want) == "bad_mapper:missed"
    # on one rank the whole range (8 rows) is cut into three parts (3, 3, 2 rows), and the
    # first is outside: a DiagnosticError, not a RangeMapperError
    one = Config(ranks=1, devices=1, oversubscribe=3)
    oc = bad_mapper_outcome(p, one)
    assert oc.case == "local_outside:one_rank" and oc.local == {0: (0, 3, None)}
    rme = cl.RangeMapperError(f'T3 "{BAD_TASK}": the range mapper of its access to buffer B1 "b1" maps the chunk '
                              f'Box([0, 0], [3, 5]) of rank 0 to Region([[3, 0], [4, 8]]), which is not inside what '
                              f'it maps the rank\'s chunk Box([0, 0], [8, 5]) to (Region()); a range mapper must map '
                              f'a part of a chunk into what it maps the chunk to')
    assert _tag(p, _outcome(rme), one, want) == "bad_mapper:wrong_error"
    assert _tag(p, _outcome(cl.DiagnosticError(str(rme))), one, want) is None


def test_model_pins_the_reduction_cast_rule():
    """The model's own semantics on hand-computed values (a model bug must not hide a runtime one)."""
    import numpy as np

    from differential import RedSpec, reduce_model
    # int32 values into an int64 target: cast first, then sum without a 32-bit wrap
    got = reduce_model(np.full(4, 996), RedSpec(0, "plus", "int32", True, wide=True), "int64", None)
    assert got.dtype == np.int64 and got[0] == 4 * (996 * 2**21 + 996)
    # int64 values into an int32 target: every value wraps, then the sum wraps in int32
    got = reduce_model(np.array([10, 20]), RedSpec(0, "plus", "int64", True, wide=True), "int32", None)
    assert got.dtype == np.int32 and got[0] == (10 * 2**27 + 10) + (20 * 2**27 + 20 - 2**32)
    # without initialize_to_identity the current value takes part
    assert reduce_model(np.array([1, 2, 3]), RedSpec(0, "plus", "int64", False), "int64", 42)[0] == 48
    assert reduce_model(np.array([1, 2]), RedSpec(0, "maximum", "float32", False), "float64", 1e9)[0] == 1e9
    # float products are of +-1: exact whatever the split
    assert reduce_model(np.array([1, 2, 3]), RedSpec(0, "multiplies", "float32", True), "float32", None)[0] == 1.0


def _have_opencl() -> bool:
    try:
        from executor.backends.opencl import opencl_devices
        opencl_devices()
        return True
    except Exception:  # noqa: BLE001 - no PyOpenCL or no device that builds kernels
        return False


@pytest.mark.timeout(1800)
@pytest.mark.skipif(not _have_opencl(), reason="no OpenCL device (apt-get install pocl-opencl-icd)")
@settings(max_examples=OPENCL_EXAMPLES, deadline=None, phases=NO_SHRINK,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(seed=st.integers(0, 2**31 - 1), ranks=st.integers(1, 3), lookahead=st.sampled_from(["none", "auto"]),
       huge=st.sampled_from(HUGE_CHOICES))
def test_random_programs_match_numpy_on_opencl(seed, ranks, lookahead, huge):
    _check(seed, Config(ranks=ranks, devices=2, lookahead=lookahead, backend="opencl", huge=huge), kind="main")


def _source_launches(monkeypatch):
    """The names of the source kernels the OpenCL backend launches (every rank, every chunk)."""
    from executor.backends.opencl import OpenCLBackend
    launched = []
    launch = OpenCLBackend.launch_source_kernel

    def counting(self, kernel, ctx, args, local_range):
        launched.append(kernel.name)
        return launch(self, kernel, ctx, args, local_range)
    monkeypatch.setattr(OpenCLBackend, "launch_source_kernel", counting)
    return launched


@pytest.mark.timeout(600)
@pytest.mark.skipif(not _have_opencl(), reason="no OpenCL device (apt-get install pocl-opencl-icd)")
@pytest.mark.parametrize("seed,cfg", [
    (104, Config(ranks=2, devices=2, backend="opencl")),                   # offset=; local_range (1, 1), write
    (184, Config(ranks=1, devices=3, backend="opencl", lookahead="none")),  # 3-D, int16, local_range (5, 5, 1)
    (97, Config(ranks=3, devices=1, backend="opencl", replay="off")),       # uint8, three reads
    (88, Config(ranks=2, devices=1, backend="opencl", oversubscribe=3)),    # 30 of a wide front's rows
    (204, Config(ranks=1, devices=2, backend="opencl", huge="0")),          # 1-D float64, write
    (529, Config(ranks=2, devices=2, backend="opencl")),                   # a bool buffer written (as uchar)
])
def test_source_kernels_on_opencl_fixed_seeds(monkeypatch, seed, cfg):
    """Kernels drawn as cl.Kernel OpenCL C source run as such on the opencl backend (launched
    there, chunk by chunk) and give the model's buffers, as the same kernels in Python do on
    host devices."""
    p = generate(random.Random(seed), kind="main")
    assert "source:kernel" in p.features
    launched = _source_launches(monkeypatch)
    run_and_check(p, cfg)
    assert launched and set(launched) == {"fuzz_kernel"}
    assert len(launched) >= sum(t.source for t in p.tasks)
    launched.clear()
    run_and_check(p, replace(cfg, backend="host", transfers="staged"))
    assert not launched


def test_source_kernel_text():
    """The OpenCL C of a 2-D read_write kernel at an offset: the model's element values, the
    accessor order (reads, the write, then c0)."""
    from differential import source_kernel
    t = Task("kernel", (2, 3), [Read("data", 0, "one_to_one")], Write("data", 1, "one_to_one", "read_write"),
             c0=4, offset=(1, 0))
    p = _hand_program([t], shapes=((4, 3), (4, 3)))
    src = source_kernel(p, t).source["opencl"]
    assert "ACCESSOR(long, r0), ACCESSOR(long, w), long c0" in src
    assert "long v = (c0 + (long)AT2(r0, g0, g1) + g0 * 1 + g1 * 7) % 997;" in src
    assert "AT2(w, g0, g1) = (long)((v + (long)AT2(w, g0, g1)) % 997);" in src
    assert source_kernel(p, t) is source_kernel(p, t)       # (one cl.Kernel per text)


@pytest.mark.timeout(600)
@pytest.mark.skipif(not _have_opencl(), reason="no OpenCL device (apt-get install pocl-opencl-icd)")
@pytest.mark.parametrize("wrong", ["weights", "mode"])
def test_source_kernel_check_fails(monkeypatch, wrong):
    """A source kernel that computes other values (weights of the index swapped, or every
    mode taken as discard) is caught: buffers or fences differ."""
    import differential
    p = generate(random.Random(104), kind="main")
    orig = differential.source_kernel

    def broken(p, t):
        k = orig(p, t)
        src = k.source["opencl"]
        src = src.replace("g0 * 1 +", "g0 * 7 +") if wrong == "weights" else \
            src.replace("if ((g0 + g1) % 2 == 0) ", "").replace("(v + (long)AT2(w, g0, g1)) % 997", "v")
        return cl.Kernel(source={"opencl": src}, name=k.name)
    monkeypatch.setattr(differential, "source_kernel", broken)
    with pytest.raises(Mismatch) as err:
        run_and_check(p, Config(ranks=2, devices=2, backend="opencl"))
    # (what reads the wrong values, a collective task say, may be reported first)
    assert {"buffer", "fence"} & {tag for tag, _msg in err.value.problems}, err.value


def test_random_config_draws_opencl():
    """About 4% of configurations (drawn last: every earlier field is what the seed gave before)
    run on the opencl backend where it is there: staged transfers, no host device capacity."""
    from differential import opencl_available
    cfgs = [random_config(random.Random(s * 7919 + 17)) for s in range(2000)]
    ocl = [c for c in cfgs if c.backend == "opencl"]
    if not opencl_available():
        assert not ocl
        return
    assert 40 <= len(ocl) <= 130
    assert all(c.transfers == "staged" and c.memory is None and c.batch is None for c in ocl)
    assert all(c.env()["CELERITAS_DEVICES"] == "opencl:" + ",".join(["0:0"] * c.devices) for c in ocl)


def test_random_config_draws_the_cuda_backend_on_the_stand_in():
    """About 4% of the other configurations run the CUDA backend on tests/fake_cupy (staged
    transfers, no host device capacity), each with one of the stand-in's device delays; the
    stand-in is in place only while a program runs."""
    import executor.backends.cuda as cuda_backend
    import fake_cupy
    from differential import CUDA_DRIVER_CHOICES, DEVICE_DELAY_CHOICES
    cfgs = [random_config(random.Random(s * 7919 + 17)) for s in range(2000)]
    gpu = [c for c in cfgs if c.backend == "cuda"]
    assert 40 <= len(gpu) <= 130
    assert all(c.transfers == "staged" and c.memory is None and c.batch is None for c in gpu)
    assert all(c.env()["CELERITAS_DEVICES"] == "cuda:" + ",".join(["0"] * c.devices) for c in gpu)
    assert {c.device_delay_us for c in gpu} == set(DEVICE_DELAY_CHOICES)
    assert {c.cuda_driver for c in gpu} == set(CUDA_DRIVER_CHOICES)
    assert all(c.device_delay_us is None and c.cuda_driver is None for c in cfgs if c.backend != "cuda")
    before = cuda_backend.cupy, cuda_backend.load_driver
    with fake_cupy.stand_in(300) as fake:
        assert cuda_backend.cupy is fake and fake.delay_ns == 300_000 and cuda_backend.cuda_device_count() == 1
        assert isinstance(cuda_backend.load_driver(), fake_cupy.FakeDriver)
    with fake_cupy.stand_in(300, driver=False):
        assert cuda_backend.load_driver() is None
    assert (cuda_backend.cupy, cuda_backend.load_driver) == before


# ---- collective host tasks ------------------------------------------------------------------------
def _run_clean(p, cfg):
    """Run ``p`` on ``cfg``; every rank's observations (no rank may have raised)."""
    result = run_on_cluster(p, cfg)
    assert all(o is not None and o["error"] is None for o in result["ranks"]), (result["cluster_error"], [
        o and o["error"] for o in result["ranks"]])
    return result, [o["obs"] for o in result["ranks"]]


# (seed, configuration): main programs whose collective tasks of two or three groups repeat in a loop
COLLECTIVE_CASES = [
    (1453, Config(ranks=3, devices=2)),                         # groups 0 (cl.collective) and 1, scan, exscan
    (1453, Config(ranks=1, devices=2, lookahead="none")),       # one rank: comm of size 1
    (665, Config(ranks=2, devices=1, horizon_step=1)),          # groups 2 and 3, x3, one scans
    (2875, Config(ranks=4, devices=1, lookahead="none", replay="off")),   # groups 0 (cl.collective(), rank 0
                                                                          # slow) and 3 (allreduce); two host objects
    (3187, Config(ranks=3, devices=1)),                         # reduce (to the last rank), exscan, allreduce
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg", COLLECTIVE_CASES)
def test_collective_host_tasks_record_per_group_and_rank(seed, cfg):
    """Every rank runs its part of every collective task, with partition [rank, rank + 1) of
    (ranks,); each group's parts run in submission order on every rank; every rank's part
    computes the same value from what it reads (and adds its rank), the reduction through
    the group's communicator (``comm_op``: allreduce, reduce to the last rank, scan, exscan)
    sums the ranks' values in rank order; all of it as the model says."""
    p = generate(random.Random(seed), kind="main")
    colls = [(i, t) for i, t in enumerate(p.tasks) if t.kind == "collective"]
    groups = sorted({t.group for _i, t in colls})
    assert len(groups) >= 2 and "collective:loop" in p.features, p.describe()
    want = run_model(p)
    model_value = {i: v for i, _g, v, _c in want["coll"]}
    result, obs = _run_clean(p, cfg)
    n = cfg.ranks
    for g in groups:
        idxs = [i for i, t in colls if t.group == g]
        assert len(idxs) >= 2      # (repeated by the loop)
        recs = []
        for r, o in enumerate(obs):
            mine = [e for e in o["coll"] if e[2] == g]
            assert [e[1] for e in mine] == idxs, (r, g, mine)          # submission order within the group
            for e in mine:
                assert e[3:7] == (r, (r,), (r + 1,), (n,)), e          # rank, partition box, global range
            recs.append(mine)
        for j, i in enumerate(idxs):
            values = {recs[r][j][7] - r for r in range(n)}
            assert values == {model_value[i]}, (i, values, model_value[i])
            vals = [model_value[i] + r for r in range(n)]
            for r in range(n):
                want_tot = {"allreduce": sum(vals), "reduce": sum(vals) if r == n - 1 else None,
                            "scan": sum(vals[:r + 1]), "exscan": sum(vals[:r]) if r else None}
                assert recs[r][j][8:] == ((want_tot[comm_op(p.tasks[i])], (r, n)) if p.tasks[i].comm
                                          else (None, None)), recs[r][j]
    if seed == 1453:
        # by hand: T1 and T3 (group 0) read b1[0, 2:4] and r1 (29), c0 2 (scan); T2 and T4
        # (group 1, rank 0 slow) read b0[3:6, 2:4] (booleans), c0 3 (exscan: the last rank
        # gets the sum over the ranks before it); nothing writes b0, b1 or r1
        s1 = (2 + int(p.init[1][0, 2:4].sum()) % MOD + 29) % MOD
        s2 = (3 + int(p.init[0][3:6, 2:4].astype(np.int64).sum()) % MOD) % MOD
        assert [e[1:3] + (e[7],) for e in obs[0]["coll"] if e[1] in (1, 3)] == [(1, 0, s1), (3, 0, s1)]
        assert [e[7:9] for e in obs[-1]["coll"] if e[1] in (2, 4)] == [(s2 + n - 1, sum(s2 + r for r in range(n - 1))
                                                                        if n > 1 else None)] * 2
        assert [e[8] for e in obs[0]["coll"] if e[1] in (1, 3)] == [s1] * 2       # (scan on rank 0: its own)
    check(p, want, result, cfg)


def _clean_two_rank_run(seed: int):
    """Main program ``seed`` run cleanly on 2 ranks × 1 device (its check passes): the
    program, configuration, model, result and ``tampered(fn, rank)``, the check's tag
    after ``fn`` changed that rank's observations."""
    p = generate(random.Random(seed), kind="main")
    cfg = Config(ranks=2, devices=1)
    want = run_model(p)
    result, _obs = _run_clean(p, cfg)
    assert _tag(p, result, cfg, want) is None

    def tampered(fn, rank):
        res = copy.deepcopy(result)
        fn(res["ranks"][rank]["obs"])
        return _tag(p, res, cfg, want)
    return p, cfg, want, result, tampered


def test_collective_check_fails_on_wrong_order_values_or_records():
    """The check of the collective records fails on two records of one group swapped (or the
    model's order of a group changed), on a wrong value or a missing record, and accepts
    records of different groups in any interleaving (the groups are not ordered)."""
    p, cfg, want, result, run = _clean_two_rank_run(1453)

    def tampered(fn, rank=1):
        return run(lambda obs: fn(obs["coll"]), rank)

    def positions(coll, g):
        return [k for k, e in enumerate(coll) if e[2] == g]

    def swap_in_group(coll):
        a, b = positions(coll, 0)[:2]
        coll[a], coll[b] = coll[b], coll[a]

    def regroup(coll):                  # every group-1 record first: another interleaving
        coll.sort(key=lambda e: e[2] != 1)

    def off_by_one(coll):
        e = coll[-1]
        coll[-1] = e[:7] + (e[7] + 1,) + e[8:]

    assert tampered(swap_in_group) == "collective"
    assert tampered(swap_in_group, rank=0) == "collective"
    assert tampered(regroup) is None
    assert tampered(off_by_one) == "collective"
    assert tampered(lambda coll: coll.pop()) == "collective"
    assert tampered(lambda coll: coll.append(coll[0])) == "collective"
    # the model's order of one group reversed
    bad = dict(want, coll=[c for c in want["coll"] if c[1] != 0] + [c for c in want["coll"] if c[1] == 0][::-1])
    with pytest.raises(Mismatch) as info:
        check(p, bad, result, cfg)
    assert info.value.tag == "collective", str(info.value)


# ---- buffer and host-object lifetimes --------------------------------------------------------------
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg", [(2513, Config(ranks=3, devices=2, lookahead="infinite")),
                                      (2513, Config(ranks=1, devices=1, memory=0.3)),
                                      (315, Config(ranks=2, devices=2, oversubscribe=3))])
def test_buffer_lifetimes(seed, cfg, monkeypatch):
    """A buffer fenced and then destroyed (maybe while a writer runs): the fence holds its
    data, it is not observed at the end, the rest runs on; a buffer made by a task after
    others ran (after a wait) and one made without data, both written in full in a discard
    mode before anything reads them: the model's values, here also computed by hand."""
    import differential
    # (the values by hand are those of the programs as drawn before the disjoint-row reads)
    monkeypatch.setattr(differential, "DISJOINT_READ_DRAWS", False)
    p = generate(random.Random(seed), kind="main")
    destroyed = [t.fence_index for t in p.tasks if t.kind == "destroy"]
    uninit = [k for k, a in enumerate(p.init) if a is None]
    assert destroyed and uninit, p.describe()
    want = run_model(p)
    result, obs = _run_clean(p, cfg)
    fences = [t.fence_index for t in p.tasks if t.kind == "fence"]
    for o in obs:
        for b in destroyed:
            assert o["buffers"][b] is None
            j = fences.index(b)
            assert (o["fences"][j] == want["fences"][j]).all()
        for b in uninit:
            assert (o["buffers"][b] == want["buffers"][b]).all()
    if seed == 2513:
        # T1 fences b1 (never written: its data) and T2 destroys it; T3 makes b3 (no data)
        # after tasks ran and T4 (a host task) writes it from sum(b0), c0 5; T6 makes b4 (no
        # data) after a wait, T7 writes it: (4 + i) % MOD
        assert [t.kind for t in p.tasks[1:8]] == ["fence", "destroy", "create", "host", "wait", "create", "kernel"]
        b3 = (5 + int(p.init[0].sum()) % MOD) % MOD
        for o in obs:
            assert (o["fences"][0] == p.init[1]).all()
            assert o["buffers"][1] is None
            assert o["buffers"][3].tolist() == [[b3]]
            assert o["buffers"][4].tolist() == list(range(4, 12))
    if seed == 315:
        # b2 is made without data; T0 discard_read_writes it from b0[3, 2, 0]
        b2 = (8 + int(p.init[0][3, 2, 0]) + np.arange(5)) % MOD
        for o in obs:
            assert o["buffers"][2].tolist() == b2.tolist()
    check(p, want, result, cfg)


def test_buffer_lifetime_check_fails():
    """A wrong fence of a buffer before its destruction, a wrong buffer made later, a
    destroyed buffer that shows up at the end: each is reported."""
    p = generate(random.Random(2513), kind="main")
    cfg = Config(ranks=2, devices=1)
    want = run_model(p)
    result, _obs = _run_clean(p, cfg)
    assert _tag(p, result, cfg, want) is None

    def tampered(fn):
        res = copy.deepcopy(result)
        fn(res["ranks"][1]["obs"])
        return _tag(p, res, cfg, want)

    def flip(a):
        return ~a if a.dtype == bool else (a + 1).astype(a.dtype)
    assert tampered(lambda o: o["fences"].__setitem__(0, flip(o["fences"][0]))) == "fence"
    assert tampered(lambda o: o["buffers"].__setitem__(4, flip(o["buffers"][4]))) == "buffer"
    assert tampered(lambda o: o["buffers"].__setitem__(1, p.init[1].copy())) == "buffer"
    # and a model that forgot the destruction
    with pytest.raises(Mismatch) as info:
        check(p, dict(want, buffers=[b if b is not None else p.init[k] for k, b in enumerate(want["buffers"])]),
              result, cfg)
    assert info.value.tag == "buffer"


def test_lifecycle_rejects_misuse():
    """Programs that use a buffer or host object outside its lifetime, or read a buffer made
    without data before a full write, are not valid (the generator asserts it; the minimiser
    skips them)."""
    p = generate(random.Random(2513), kind="main")
    assert lifecycle(p)[0] is None
    q = copy.deepcopy(p)
    q.tasks[6], q.tasks[7] = q.tasks[7], q.tasks[6]     # T7 writes b4 before it is made
    assert "writes b4, which is new" in lifecycle(q)[0]
    q = copy.deepcopy(p)
    del q.tasks[7]                          # b4 (made without data by T6) fenced unwritten
    q.tasks.append(copy.deepcopy(q.tasks[1]))
    q.tasks[-1].fence_index = 4
    assert "reads b4, which is not written yet" in lifecycle(q)[0]
    q = copy.deepcopy(p)
    q.tasks[7].write.mode = "write"         # the first write of b4 keeps unspecified values
    assert "does not discard" in lifecycle(q)[0]
    q = copy.deepcopy(p)
    q.tasks.insert(3, copy.deepcopy(q.tasks[1]))      # a fence of b1 after its destroy
    assert "reads b1, which is dead" in lifecycle(q)[0]
    q = copy.deepcopy(p)
    q.tasks.append(copy.deepcopy(q.tasks[2]))         # destroyed twice
    assert "destroy of b1, which is dead" in lifecycle(q)[0]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg", [(1830, Config(ranks=3, devices=2)), (1830, Config(ranks=1, devices=1)),
                                      (921, Config(ranks=2, devices=2, lookahead="none")),
                                      (5642, Config(ranks=3, devices=1, oversubscribe=3))])
def test_extra_host_objects(seed, cfg):
    """A second host object with side effects of collective and master-node tasks: each rank's
    object holds its own collective records and (rank 0) the master's, in submission order;
    a fence of it is a snapshot; destroy() after the fence leaves what ran in the object; one
    made by a task after others ran works like the first."""
    p = generate(random.Random(seed), kind="main")
    assert [t for t in p.tasks if t.hobj is not None], p.describe()
    want = run_model(p)
    result, obs = _run_clean(p, cfg)
    for r, o in enumerate(obs):
        for k, lst in enumerate(o["hobjs"]):
            mine = [i for i, t in enumerate(p.tasks) if t.hobj == k and (t.kind == "collective" or r == 0)]
            assert [e[1] for e in lst] == mine, (r, k, lst)
            assert all(e[3] == r for e in lst if e[0] == "c")
    if seed == 1830:
        # T0 makes h0; T1 (collective, group 2) reads b3 whole and b3[0:3, 4, 2:4], c0 6; T3
        # (master, slow) sums b1; nothing writes b1 or b3
        assert p.tasks[0].kind == "hcreate"
        b3 = p.init[3].astype(np.int64)
        s1 = (6 + int(b3.sum()) % MOD + int(b3[0:3, 4:5, 2:4].sum()) % MOD) % MOD
        for r, o in enumerate(obs):
            assert [e[:3] + (e[7],) if e[0] == "c" else e for e in o["hobjs"][0]] == [("c", 1, 2, s1 + r)] + \
                ([("m", 3, int(p.init[1].sum()))] if r == 0 else [])
    if seed == 921:
        # h1: T2 (master) only; T5 fences it, T6 destroys it: rank 0 holds one entry, the others none
        assert [t.kind for t in p.tasks[5:7]] == ["hfence", "hdestroy"]
        for r, o in enumerate(obs):
            assert o["hfences"] == [o["hobjs"][1]] and len(o["hobjs"][1]) == (r == 0)
    if seed == 5642:
        # T4 fences h0 before T6, T9 (collective) and T10 (master) use it: the snapshot is empty
        for r, o in enumerate(obs):
            assert o["hfences"] == [[]] and [e[1] for e in o["hobjs"][0]] == [6, 9] + ([10] if r == 0 else [])
    check(p, want, result, cfg)


def test_extra_host_object_check_fails():
    p, cfg, want, result, run = _clean_two_rank_run(5642)

    def tampered(fn, rank=0):
        return run(fn, rank)
    assert tampered(lambda o: o["hobjs"][0].reverse()) == "host_object"
    assert tampered(lambda o: o["hobjs"][0].pop()) == "host_object"
    # a fence that handed out the live object instead of a snapshot
    assert tampered(lambda o: o["hfences"][0].extend(o["hobjs"][0])) == "host_object"
    assert tampered(lambda o: o["hobjs"][0].append(o["hobjs"][0][-1]), rank=1) == "host_object"
    # a master-node task placed by cl.once / by nothing: its partition is checked too
    q = generate(random.Random(2150), kind="main")
    qwant = run_model(q)
    res, _ = _run_clean(q, cfg)
    assert _tag(q, res, cfg, qwant) is None and res["ranks"][0]["obs"]["geometry"]
    res["ranks"][0]["obs"]["geometry"][0] = (1, (), (), ())
    assert _tag(q, res, cfg, qwant) == "master"


# ---- lookahead changes during a run ----------------------------------------------------------------
@pytest.mark.timeout(600)
@pytest.mark.parametrize("cfg", [Config(ranks=2, devices=2, lookahead="auto"),
                                 Config(ranks=3, devices=1, lookahead="none", horizon_step=1),
                                 Config(ranks=1, devices=3, lookahead="infinite", replay="off")])
def test_lookahead_changes_during_a_run(cfg):
    """``q.set_lookahead`` and ``q.flush`` between tasks change nothing: the program gives the
    model's values, and exactly what it gives with those steps taken out."""
    p = generate(random.Random(2489), kind="main")
    steps = [t.kind for t in p.tasks if t.kind in ("lookahead", "flush")]
    assert steps.count("lookahead") >= 2 and "flush" in steps, p.describe()
    want = run_model(p)
    result, obs = _run_clean(p, cfg)
    check(p, want, result, cfg)
    plain = copy.deepcopy(p)
    plain.tasks = [t for t in p.tasks if t.kind not in ("lookahead", "flush")]
    _res, plain_obs = _run_clean(plain, cfg)
    for o, po in zip(obs, plain_obs):
        assert [b.tolist() for b in o["buffers"]] == [b.tolist() for b in po["buffers"]]
        assert [b.tolist() for b in o["targets"] if b is not None] == \
            [b.tolist() for b in po["targets"] if b is not None]
    assert [b.tolist() for b in obs[0]["buffers"]] == [b.tolist() for b in want["buffers"]]


# ---- horizon settings ------------------------------------------------------------------------------
def test_random_config_draws_the_horizon_settings():
    """Every horizon step and max parallelism is drawn, and reaches the environment; the other
    fields are drawn first, as before these existed (the same configuration per seed)."""
    cfgs = [random_config(random.Random(s * 7919 + 17)) for s in range(300)]
    assert {c.horizon_step for c in cfgs} == set(HORIZON_STEP_CHOICES)
    assert {c.horizon_parallelism for c in cfgs} == set(HORIZON_PARALLELISM_CHOICES)
    for c in cfgs[:20]:
        env = c.env()
        assert env["CELERITAS_HORIZON_STEP"] == str(c.horizon_step)
        assert env.get("CELERITAS_HORIZON_MAX_PARALLELISM") == \
            (str(c.horizon_parallelism) if c.horizon_parallelism is not None else None)
    # seed 0's configuration as it was before (ranks, devices, lookahead, ... pause)
    c0 = cfgs[0]
    rng = random.Random(17)
    assert (c0.ranks, c0.devices, c0.lookahead) == (rng.randint(1, 4), rng.randint(1, 4),
                                                    rng.choice(["none", "auto", "infinite"]))


@pytest.mark.timeout(600)
def test_horizon_settings_take_effect_and_keep_results():
    """The step and the max parallelism reach the runtime (horizon tasks in the task graph:
    many with step 1, none with 7 in this short program, many again with max parallelism 1),
    and results stay the model's under each."""
    import celeritas as cl
    from celeritas.testing import run_cluster
    from differential import _Run
    p = generate(random.Random(1453), kind="main")

    def horizons(cfg):
        def program(rank):
            q = cl.Queue(record=True)
            run = _Run(p, q, 1, None)
            for idx, t in enumerate(p.tasks):
                run.submit(idx, t)
            run.observe()
            q.wait()
            return sum(t["kind"] == "horizon" for t in q.graphs()["tasks"])
        return run_cluster(program, nodes=1, **cfg.env())[0]
    step1 = horizons(Config(horizon_step=1))
    step7 = horizons(Config(horizon_step=7))
    narrow = horizons(Config(horizon_step=7, horizon_parallelism=1))
    assert step7 == 0 and step1 >= 5 and narrow >= 5, (step1, step7, narrow)
    for cfg in (Config(ranks=2, devices=2, horizon_step=1, horizon_parallelism=1),
                Config(ranks=3, devices=1, horizon_step=7, horizon_parallelism=2),
                Config(ranks=2, devices=3, horizon_step=4, horizon_parallelism=3)):
        run_and_check(p, cfg)


# ---- checking modes and accessor index styles ----------------------------------------------------
def test_random_config_draws_the_checking_modes():
    """About 40% of configurations run without accessor checks; warn and off are drawn; they reach
    the environment; the other fields are drawn first (the same configuration per seed); the
    error kinds always run under diagnostics=error."""
    cfgs = [random_config(random.Random(s * 7919 + 17)) for s in range(500)]
    off = sum(not c.accessor_checks for c in cfgs)
    assert 150 <= off <= 250, off
    assert {c.diagnostics for c in cfgs} == set(DIAGNOSTICS_CHOICES) == {"error", "warn", "off"}
    for c in cfgs[:30]:
        env = c.env()
        assert env["CELERITAS_ACCESSOR_CHECKS"] == ("1" if c.accessor_checks else "0")
        assert env["CELERITAS_DIAGNOSTICS"] == c.diagnostics
    c0 = cfgs[0]
    rng = random.Random(17)
    assert (c0.ranks, c0.devices, c0.lookahead) == (rng.randint(1, 4), rng.randint(1, 4),
                                                    rng.choice(["none", "auto", "infinite"]))
    warn = Config(diagnostics="warn", accessor_checks=False)
    for kind in ("fail", "bad_reduction", "overlap", "bad_mapper"):
        p = generate(random.Random(3), kind=kind)
        assert program_config(p, warn) == Config(diagnostics="error", accessor_checks=False)
        with pytest.raises(AssertionError, match="DIAGNOSTICS=error only"):
            run_and_check(p, warn)
    assert program_config(generate(random.Random(3), kind="main"), warn) is warn
    # --config round-trips the new fields
    from fuzz import parse_config
    assert Config(**parse_config(warn.fields())) == warn


def test_generator_draws_every_index_style():
    seen = set()
    for seed in range(60):
        p = generate(random.Random(seed))
        seen |= {t.index for t in p.tasks if t.kind in ("kernel", "host")}
        assert all(t.index == "box" for t in p.tasks if t.kind not in ("kernel", "host"))
    assert seen == set(INDEX_STYLES)


def _accessor_calls(monkeypatch):
    """Count the keys that reach the accessor fast paths (checks off): two bounded slices on a
    2-D accessor (``__getitem__``'s inline path), ``_plain``'s hits (2-D slices / box / chunk)
    and ``_local``'s fast-path tuples (slices and ints, any dimensionality)."""
    from collections import Counter
    from celeritas.accessor import Accessor
    calls = Counter()
    get, plain, local = Accessor.__getitem__, Accessor._plain, Accessor._local

    def counting_get(self, key):
        if self._plain2 and type(key) is tuple and len(key) == 2 and all(
                type(k) is slice and k.start is not None and k.stop is not None for k in key):
            calls["inline"] += 1
        return get(self, key)

    def counting_plain(self, key):
        got = plain(self, key)
        if got is not None:
            calls["plain:" + ("slices" if type(key) is tuple else "box" if type(key) is cl.Box else "chunk")] += 1
        return got

    def counting_local(self, key):
        if not self._checks and type(key) is tuple and len(key) == self.dims:
            kinds = {type(k) for k in key}
            calls[f"local:{self.dims}d:" + ("ints" if kinds == {int} else "slices")] += 1
        if key is Ellipsis:
            calls["ellipsis"] += 1
        return local(self, key)
    monkeypatch.setattr(Accessor, "__getitem__", counting_get)
    monkeypatch.setattr(Accessor, "_plain", counting_plain)
    monkeypatch.setattr(Accessor, "_local", counting_local)
    return calls


@pytest.mark.parametrize("seed,cfg,reached", [
    # 2-D kernels indexing by slices, chunk, box, ints and ...: the inline path and _plain
    (115, Config(ranks=2, devices=2, accessor_checks=False), {"inline", "plain:slices", "plain:box", "plain:chunk",
                                                              "local:2d:ints", "ellipsis"}),
    (115, Config(ranks=1, devices=3, accessor_checks=False, diagnostics="warn", replay="off"),
     {"inline", "plain:chunk"}),
    # 1-D and 3-D: _local's fast path for slices (1-tuples too) and integer indices
    (29, Config(ranks=3, devices=1, accessor_checks=False, oversubscribe=3, diagnostics="off"),
     {"local:3d:slices", "local:3d:ints", "local:1d:ints", "ellipsis"}),
    (365, Config(ranks=2, devices=2, accessor_checks=False), {"local:1d:slices", "local:3d:ints"}),   # (249: fancy)
])
def test_index_styles_without_checks_reach_the_fast_paths(monkeypatch, seed, cfg, reached):
    calls = _accessor_calls(monkeypatch)
    p = generate(random.Random(seed), kind="main")
    run_and_check(p, cfg)
    assert reached <= set(calls), dict(calls)
    # with checks on, the same keys take the checked path: none of the fast ones
    calls.clear()
    run_and_check(p, replace(cfg, accessor_checks=True))
    assert set(calls) <= {"ellipsis"}, dict(calls)


def _reversed_rows(orig):
    """A broken fast path: the rows of what it returns reversed (reads and writes)."""
    def broken(self, key):
        got = orig(self, key)
        if got is None or self._checks:
            return got
        arr, idx = got
        if type(idx) is not tuple or not idx or type(idx[0]) is not slice:
            return got
        return arr[idx[0]][::-1], (slice(None),) + tuple(idx[1:])
    return broken


@pytest.mark.parametrize("seed,cfg,path", [
    (115, Config(ranks=2, devices=2, accessor_checks=False), "_plain"),
    (29, Config(ranks=2, devices=1, accessor_checks=False), "_local"),
])
def test_index_style_check_fails_on_a_broken_fast_path(monkeypatch, seed, cfg, path):
    from celeritas.accessor import Accessor
    p = generate(random.Random(seed), kind="main")
    monkeypatch.setattr(Accessor, path, _reversed_rows(getattr(Accessor, path)))
    with pytest.raises(Mismatch):
        run_and_check(p, cfg)
    run_and_check(p, replace(cfg, accessor_checks=True))     # (the checked path is not broken)


# ---- kernel geometry: offset=, ranges that are no buffer's shape, size 1, empty ------------------
def _geometry_tasks(p):
    return [(i, t) for i, t in enumerate(p.tasks) if t.kind == "kernel"
            and (t.offset is not None or task_box(t) != cl.Box.full(t.range_shape) or 0 in t.range_shape
                 or t.range_shape not in p.shapes)]


@pytest.mark.parametrize("seed,cfg,features", [
    # a point write from a 7x5 kernel at offset (3, 4); a one_to_one write of rows 0-4, cols 3-7
    (41, Config(ranks=2, devices=2), {"geometry:free_range:offset", "geometry:offset", "geometry:size1"}),
    (41, Config(ranks=3, devices=1, oversubscribe=3, accessor_checks=False, replay="off"), set()),
    # a 1x1 kernel at (1, 1), and an empty (2, 0) range writing a buffer: nothing runs or changes
    (343, Config(ranks=2, devices=3, lookahead="none"), {"geometry:empty", "geometry:size1"}),
    # a reduction over range (2,) at offset (4,), a one_to_one write with a local range
    (98, Config(ranks=1, devices=4, oversubscribe=3, memory=0.3), {"geometry:free_range:offset",
                                                                 "geometry:offset:local_range"}),
    # a 1x1x1 point-writing kernel at (6, 0, 5) and a sub-range write at (1, 0, 0)
    (29, Config(ranks=4, devices=2, lookahead="infinite", horizon_step=1), {"geometry:free_range:offset"}),
])
def test_kernel_geometry_fixed_seeds(seed, cfg, features):
    p = generate(random.Random(seed), kind="main")
    assert features <= p.features
    assert _geometry_tasks(p)
    run_and_check(p, cfg)
    # the model depends on the geometry: without the offsets (and with the empty ranges made
    # non-empty again) it gives other buffers
    q = copy.deepcopy(p)
    for _i, t in _geometry_tasks(q):
        t.offset = None
        t.range_shape = tuple(max(1, e) for e in t.range_shape)
        if t.write is not None and t.write.mapper == "point":
            t.write.point = tuple(min(a, e - 1) for a, e in zip(t.write.point, t.range_shape))
    want, other = run_model(p), run_model(q)
    assert any(not np.array_equal(a, b) for a, b in zip(want["buffers"], other["buffers"]) if a is not None) or \
        any(not np.array_equal(a, b) for a, b in zip(want["targets"], other["targets"]) if a is not None)


def _hand_program(tasks, shapes=((9,), (9,)), init=True):
    rng = np.random.default_rng(5)
    return Program("main", list(shapes), ["int64"] * len(shapes),
                   [rng.integers(0, 50, size=s) if init else None for s in shapes], [], tasks)


def test_kernel_offset_with_local_range_and_empty_range_by_hand():
    """An offset kernel's work groups are aligned to the offset (chunks of 2 from 3); a size-1
    kernel writes one element; an empty range writes nothing, even in discard mode; the
    chunks report the task's global range and offset."""
    tasks = [Task("kernel", (6,), [Read("data", 0, "one_to_one")], Write("data", 1, "one_to_one", "discard_write"),
                  c0=3, offset=(3,), local_range=(2,)),
             Task("kernel", (1,), [Read("data", 1, "all")], Write("data", 0, "one_to_one", "read_write"),
                  c0=1, offset=(8,)),
             Task("kernel", (0,), [], Write("data", 1, "one_to_one", "discard_write"), c0=2, offset=(4,)),
             Task("kernel", (0,), [], Write("data", 0, "one_to_one", "discard_write"), c0=2)]
    p = _hand_program(tasks)
    want = run_model(p)
    b1 = p.init[1].copy()
    b1[3:9] = (p.init[0][3:9] + 3 + np.arange(3, 9)) % MOD
    assert want["buffers"][1].tolist() == b1.tolist()
    b0 = p.init[0].copy()
    b0[8] = ((b1.sum() % MOD + 1 + 8) % MOD + p.init[0][8]) % MOD     # (read_write adds the old value)
    assert want["buffers"][0].tolist() == b0.tolist()
    for cfg in (Config(ranks=1, devices=3), Config(ranks=3, devices=2, oversubscribe=3),
                Config(ranks=2, devices=1, accessor_checks=False, replay="off")):
        run_and_check(p, cfg)


@pytest.mark.parametrize("break_it,tag", [("offset", "geometry"), ("range", "geometry"), ("ignore", None)])
def test_kernel_geometry_check_fails(monkeypatch, break_it, tag):
    """Chunks that report another global offset or range are caught (``geometry``); a kernel run
    without its offset writes elsewhere (values differ)."""
    import celeritas.handler as h
    p = generate(random.Random(41), kind="main")
    cfg = Config(ranks=2, devices=2)
    if break_it == "ignore":
        q = copy.deepcopy(p)
        for t in q.tasks:
            if t.kind == "kernel" and t.write is not None and t.write.mapper == "one_to_one" and t.offset:
                t.offset = None
        with pytest.raises(Mismatch) as err:
            check(p, run_model(p), run_on_cluster(q, cfg), cfg)
        assert err.value.tag in ("buffer", "fence", "reduction"), err.value
        return
    init = h.Chunk.__init__

    def wrong(self, box, xp, device, global_range, global_offset):
        if break_it == "offset":
            global_offset = (0,) * len(global_offset)
        else:
            global_range = tuple(r + 1 for r in global_range)
        init(self, box, xp, device, global_range, global_offset)
    monkeypatch.setattr(h.Chunk, "__init__", wrong)
    with pytest.raises(Mismatch) as err:
        run_and_check(p, cfg)
    assert err.value.tag == tag, err.value


# ---- empty index spaces with reductions, and host tasks over empty ranges (``_draw_empty``) --------
def _empty_tasks(p):
    return [(i, t) for i, t in enumerate(p.tasks) if t.kind in ("kernel", "host") and 0 in t.range_shape]


@pytest.mark.parametrize("seed,cfg,features", [
    # (6, 0): a plus reduction (initialize_to_identity) beside a read of b0 and a write of b1
    (50, Config(ranks=2, devices=2), {"geometry:empty:reduction:initialize_to_identity",
                                      "geometry:empty:reduction:with_write"}),
    # (3, 0, 1): a bit_or folding in the current value of r0, written by the kernels before, beside a write
    (201, Config(ranks=3, devices=1, oversubscribe=3, replay="off"), {"geometry:empty:reduction:include_current",
                                                                      "geometry:empty:reduction:with_write"}),
    # (0, 2, 5) at an offset: both kinds of reduction beside three reads; later (0, 8): minimum into r1
    (398, Config(ranks=4, devices=2, lookahead="infinite", horizon_step=1),
     {"geometry:empty:reduction:offset", "geometry:empty:reduction:include_current",
      "geometry:empty:reduction:initialize_to_identity", "geometry:empty:reduction:with_reads"}),
    # a host task over (0,) with three reads
    (310, Config(ranks=2, devices=2, lookahead="none"), {"geometry:empty:host"}),
])
def test_empty_ranges_fixed_seeds(seed, cfg, features):
    """The programs reach their empty index spaces and match the model; the model gives every
    empty reduction's target the identity (initialize_to_identity) or keeps its value."""
    p = generate(random.Random(seed), kind="main")
    assert features <= p.features
    assert _empty_tasks(p)
    run_and_check(p, cfg)


def test_empty_reductions_by_hand():
    """Reductions over an empty index space (two shapes, one at an offset), beside a read and a
    data write: ``initialize_to_identity`` gives the identity (minimum's is inf), otherwise the
    current value stays (5 for plus, False for logical_and, 7 for bit_and), and a kernel reading
    the result sees it; the data write writes nothing.  On one and several ranks and devices."""
    p = _empty_reductions_program()
    want = run_model(p)
    assert [t.tolist() for t in want["targets"]] == [[5], float("inf"), [False], [7]]
    assert want["fences"][0] == np.float32(np.inf)
    b1 = (p.init[1] + 1 + 5 + np.arange(9)) % MOD      # (read_write adds the old value; r0 is still 5)
    assert want["buffers"][1].tolist() == b1.tolist()
    for cfg in (Config(ranks=1, devices=1), Config(ranks=2, devices=1),
                Config(ranks=3, devices=2, oversubscribe=3, replay="off"),
                Config(ranks=2, devices=3, lookahead="none", accessor_checks=False)):
        run_and_check(p, cfg)


def _empty_reductions_program():
    from differential import RedSpec, TargetSpec
    tasks = [Task("kernel", (0,), [Read("data", 0, "one_to_one")], Write("data", 1, "one_to_one", "discard_write"),
                  offset=(2,), reds=[RedSpec(0, "plus", "int64", False), RedSpec(1, "minimum", "float32", True),
                                     RedSpec(2, "logical_and", "bool", False), RedSpec(3, "bit_and", "int32", False)]),
             Task("kernel", (3, 0), [], None, reds=[RedSpec(0, "maximum", "int64", False, combine="halves")]),
             Task("fence", fence_space="target", fence_index=1),
             Task("kernel", (9,), [Read("target", 0, "all")], Write("data", 1, "one_to_one", "read_write"), c0=1)]
    p = _hand_program(tasks)
    p.targets = [TargetSpec("int64", (1,), 5), TargetSpec("float32", (), 3), TargetSpec("bool", (1,), False),
                 TargetSpec("int32", (1,), 7)]
    return p


def _empty_then_reduce():
    from differential import RedSpec, TargetSpec
    tasks = [Task("kernel", (3, 0, 4), [], None, c0=0, reds=[RedSpec(0, "plus", "float32", True)]),
             Task("kernel", (3, 4, 4), [], None, c0=0, reds=[RedSpec(0, "plus", "float32", True)])]
    p = _hand_program(tasks, shapes=((3, 4, 4),))
    p.targets = [TargetSpec("float32", (1,), None)]
    return p


@pytest.mark.parametrize("cfg", [Config(ranks=1, devices=1, lookahead="none"), Config(ranks=1, devices=2),
                                 Config(ranks=2, devices=1)])
def test_reduction_after_an_empty_one(cfg):
    """An empty reduction with initialize_to_identity, then one over (3, 4, 4) into the same
    target: the second's result (fuzz seed 469, minimised; wrong on one rank before main 31098ca)."""
    p = _empty_then_reduce()
    assert run_model(p)["targets"][0].tolist() == [2784.0]     # (the weighted indices mod 997, summed)
    run_and_check(p, cfg)


@pytest.mark.parametrize("wrong", ["ignore_current", "no_identity"])
def test_empty_reduction_check_fails(monkeypatch, wrong):
    """A runtime that dropped the current value of an empty reduction (what main did on several
    ranks before 85dc22e), or left the old value under initialize_to_identity (on one rank) is
    caught as a ``reduction`` mismatch: here the model is made to expect that instead, and the
    correct runtime disagrees with it."""
    import differential
    orig = differential.reduce_model

    def broken(vals, spec, tdtype, current):
        if np.asarray(vals).size == 0:
            if wrong == "ignore_current":
                spec = replace(spec, init=True)
            elif current is not None:
                return np.asarray(current, dtype=tdtype).reshape(1)
        return orig(vals, spec, tdtype, current)
    p = _empty_reductions_program()
    cfg = Config(ranks=2, devices=2)
    run_and_check(p, cfg)
    monkeypatch.setattr(differential, "reduce_model", broken)
    with pytest.raises(Mismatch) as err:
        run_and_check(p, cfg)
    assert err.value.tag == "reduction", err.value


def _empty_host_program(on_master: bool):
    tasks = [Task("host", (6,), [Read("data", 0, "all")], Write("data", 1, "one_to_one", "read_write"), c0=2,
                  side_effect=False, oversub=2),
             Task("host", (0, 3), [Read("data", 1, "all")], Write("data", 2, "one_to_one", "discard_write"), c0=1,
                  on_master=on_master, index="slices"),
             Task("kernel", (6,), [Read("data", 2, "all")], Write("data", 0, "one_to_one", "read_write"), c0=3)]
    return _hand_program(tasks, shapes=((6,), (6,), (2, 3)))


def test_empty_host_partition_check_fails(monkeypatch):
    """Host-task partitions that report another global range than the task's are a
    ``geometry`` mismatch (the check that also catches a partition of an empty range)."""
    import celeritas.handler as h
    p = _empty_host_program(on_master=False)
    cfg = Config(ranks=2, devices=1)
    run_and_check(p, cfg)
    init = h.Partition.__init__

    def wrong(self, box, global_range, comm, rank):
        init(self, box, tuple(r + 1 for r in global_range), comm, rank)
    monkeypatch.setattr(h.Partition, "__init__", wrong)
    with pytest.raises(Mismatch) as err:
        run_and_check(p, cfg)
    assert err.value.tag == "geometry", err.value


@pytest.mark.parametrize("cfg", [Config(ranks=2, devices=1), Config(ranks=1, devices=2, accessor_checks=False)])
def test_empty_host_task_on_master_runs_nothing(cfg):
    """A host task over the empty range (0, 3) on the master node runs no partition, as a kernel
    or a host task elsewhere over it runs none (fuzz seeds 596 and 869; fixed in main 31098ca)."""
    run_and_check(_empty_host_program(on_master=True), cfg)


# ---- empty kernels whose point write would define a target (``_draw_empty_target``) ----------------
def _empty_target_writes(p):
    return [(i, t) for i, t in enumerate(p.tasks)
            if t.kind == "kernel" and t.write is not None and t.write.space == "target" and task_box(t).empty]


@pytest.mark.parametrize("seed,cfg,features,kept", [
    # T8 over (0, 2), constrain_split(3): r0 (int32) keeps its host value 44, then a reduction folds it in
    (69, Config(ranks=2, devices=2), {"keeps_init", "then_reduced_no_init"}, [44]),
    # T1 over (0, 1), oversubscribe(2): r0 keeps the 45 an earlier point write left, folded in next
    (31, Config(ranks=3, devices=1, lookahead="none"), {"keeps_point_write", "then_reduced_no_init"}, [45]),
    # T3 over (0, 2, 1): r0 (float32) keeps a reduction's 1.0
    (65, Config(ranks=2, devices=1, replay="off"), {"keeps_reduction", "then_reduced_no_init"}, [[1.0]]),
    # T3 over (4, 3, 0) at offset (2, 1, 4): r0 keeps 7.0, the value fenced at the end
    (155, Config(ranks=4, devices=2, accessor_checks=False), {"keeps_init", "offset", "then_end"}, [[7.0]]),
    # T0 over (0, 4, 2): r1 keeps 40.0, then a kernel reads it
    (296, Config(ranks=2, devices=3, oversubscribe=3), {"keeps_init", "then_read"}, [[40.0]]),
    # T1 over (1, 0, 2): r0 stays undefined (nothing fences or reads it) until a reduction initializes it
    (30, Config(ranks=2, devices=2), {"undefined", "then_reduced_init"}, [None]),
])
def test_empty_target_writes_fixed_seeds(seed, cfg, features, kept):
    """A kernel over an empty range whose point write would define a reduction target writes
    nothing: the model keeps the target's value (host data, a reduction's result, an earlier
    point write's), or leaves it undefined, and the runtime agrees on every rank."""
    from differential import _prefix
    p = generate(random.Random(seed))
    assert p.kind == "main"
    assert {"geometry:empty:target_write:" + f for f in features} <= p.features
    empties = _empty_target_writes(p)
    assert len(empties) == len(kept)
    for (i, t), value in zip(empties, kept):
        k = t.write.buffer
        before = run_model(_prefix(p, i))["targets"][k]
        after = run_model(_prefix(p, i + 1))["targets"][k]
        assert (None if after is None else after.tolist()) == (None if before is None else before.tolist()) \
            == value
    run_and_check(p, cfg)


def _writing_anyway(p):
    """``p`` with every empty target-writing kernel over a range that holds its point (what a
    runtime that ran the point's chunk of an empty range would do)."""
    q = copy.deepcopy(p)
    for _i, t in _empty_target_writes(q):
        lo = task_box(t).min
        t.range_shape = tuple(max(e, pt - o + 1) for e, pt, o in zip(t.range_shape, t.write.point, lo))
    return q


@pytest.mark.parametrize("seed", [69, 155, 31])
def test_empty_target_write_check_fails(seed):
    """A run whose empty kernel wrote its point anyway (the model's program keeps it empty) is
    caught: the target's value differs (``reduction``; or a fence or buffer that read it)."""
    p = generate(random.Random(seed))
    assert p.kind == "main"
    cfg = Config(ranks=2, devices=1)
    q = _writing_anyway(p)
    assert not _empty_target_writes(q)
    with pytest.raises(Mismatch) as err:
        check(p, run_model(p), run_on_cluster(q, cfg), cfg)
    assert {"reduction", "fence", "buffer"} & {tag for tag, _msg in err.value.problems}, err.value


def test_empty_target_write_defines_nothing():
    """``target_problem``: a target whose only point write is over an empty range is undefined
    for a later fence (the generator keeps such a kernel's range; the minimiser drops the
    program), and the end of the program does not fence it."""
    from differential import TargetSpec, fenced_at_end, target_problem
    w = Write("target", 0, "point", point=(1,), dest=(0,))
    tasks = [Task("kernel", (0,), [], w), Task("fence", fence_space="target", fence_index=0)]
    p = _hand_program(tasks)
    p.targets = [TargetSpec("int64", (1,), None)]
    assert target_problem(p) == "T1 fences r0, which nothing defined yet"
    p.tasks = tasks[:1]
    assert target_problem(p) is None and fenced_at_end(p) == [False]
    p.tasks[0] = Task("kernel", (3,), [], w)
    assert fenced_at_end(p) == [True]


# ---- long programs: a stencil loop of 100-200 steps, a front of 65-96 independent kernels ----------
def _horizons_and_replays(monkeypatch):
    """Counts of horizons the task graph made because its front was wider than
    ``horizon_max_parallelism`` (``width``), and every Replay memo made (their hits)."""
    from scheduler import replay, task_graph
    seen = {"width": 0, "replays": []}
    maybe = task_graph.TaskManager._maybe_horizon

    def counting(self):
        if len(self._horizons.front) > self.horizon_max_parallelism:
            seen["width"] += 1
        maybe(self)
    init = replay.Replay.__init__

    def keep(self, *a, **kw):
        init(self, *a, **kw)
        seen["replays"].append(self)
    monkeypatch.setattr(task_graph.TaskManager, "_maybe_horizon", counting)
    monkeypatch.setattr(replay.Replay, "__init__", keep)
    return seen


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,feature", [
    (1688, Config(ranks=2, devices=2, horizon_step=4), "long:stencil"),                  # 100+ steps, replayed
    (25, Config(ranks=3, devices=1, lookahead="none", replay="off", accessor_checks=False), "long:stencil"),
    (88, Config(ranks=2, devices=2), "long:wide"),                                      # 65+ independent rows
    (259, Config(ranks=3, devices=1, lookahead="infinite", horizon_step=7), "long:wide:join"),
])
def test_long_programs_fixed_seeds(monkeypatch, seed, cfg, feature):
    """Long programs match the model; a stencil loop's steps are replayed from one template
    (every rank's task, command and instruction levels: at least 100 hits together), and a
    front of more than 64 independent kernels makes the task graph place horizons by width."""
    p = generate(random.Random(seed), kind="main")
    assert feature in p.features
    seen = _horizons_and_replays(monkeypatch)
    run_and_check(p, cfg)
    if feature == "long:stencil":
        assert sum(t.kind == "kernel" and t.name == "stencil" for t in p.tasks) >= 100
        if cfg.replay == "on":
            assert sum(r.hits for r in seen["replays"]) >= 100, [r.stats() for r in seen["replays"]]
            # (on two ranks a step is several commands per rank: replayed as one template)
            assert sum(r.grouped for r in seen["replays"]) >= 10, [r.stats() for r in seen["replays"]]
    else:
        rows = [t for t in p.tasks if t.name == "wide"]
        assert len(rows) > 64 and cfg.horizon_parallelism is None
        assert seen["width"] >= cfg.ranks, seen["width"]      # (every rank's task graph)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,feature", [
    (19, Config(ranks=2, devices=2), "loop:step:host"),                     # then all rows, then a host task
    (53, Config(ranks=3, devices=1, lookahead="none"), "loop:step:shift"),
    (3, Config(ranks=4, devices=1, horizon_step=1), "loop:step:mirror"),
    (14, Config(ranks=2, devices=1, lookahead="infinite"), "loop:step:stencil"),
])
def test_step_loops_fixed_seeds(monkeypatch, seed, cfg, feature):
    """A step of one to three tasks over new buffers repeated 10-30 times (``_draw_step_loop``)
    matches the model, and on several ranks each rank replays its commands of a step's task
    (the execution, pushes and await-pushes) as one template: the fuzzer's programs reach
    ``reached:replay:grouped`` through it, not only through the rare long stencils."""
    p = generate(random.Random(seed), kind="main")
    assert {"loop:step", feature} <= p.features
    assert sum(t.name == "step_stencil" for t in p.tasks) >= 10
    seen = _horizons_and_replays(monkeypatch)
    run_and_check(p, cfg)
    grouped = [r.grouped for r in seen["replays"] if r.grouped]
    assert len(grouped) >= cfg.ranks and min(grouped) >= 10, [r.stats() for r in seen["replays"]]


def test_a_step_loop_that_lost_a_step_is_caught():
    """A run of a step-loop program without one of its steps (the model's with it) differs."""
    p = generate(random.Random(19), kind="main")
    q = copy.deepcopy(p)
    steps = [i for i, t in enumerate(q.tasks) if t.name == "step_stencil"]
    del q.tasks[steps[len(steps) // 2]]
    cfg = Config(ranks=2, devices=1)
    with pytest.raises(Mismatch) as err:
        check(p, run_model(p), run_on_cluster(q, cfg), cfg)
    assert {"buffer", "fence", "host_range"} & {tag for tag, _msg in err.value.problems}, err.value


@pytest.mark.parametrize("seed,feature", [(1688, "long:stencil"), (88, "long:wide")])
def test_long_program_check_fails(seed, feature):
    """A run that lost one step of the long part (the run's program without it, the model's
    with it) is caught: buffers or fences differ."""
    p = generate(random.Random(seed), kind="main")
    q = copy.deepcopy(p)
    name = "stencil" if feature == "long:stencil" else "wide"
    steps = [i for i, t in enumerate(q.tasks) if t.name == name]
    del q.tasks[steps[len(steps) // 2]]
    cfg = Config(ranks=2, devices=1)
    with pytest.raises(Mismatch) as err:
        check(p, run_model(p), run_on_cluster(q, cfg), cfg)
    # (the later tasks' indices shift too, so host-task records may differ first)
    assert {"buffer", "fence"} & {tag for tag, _msg in err.value.problems}, err.value


# ---- a front of more index spaces than the split caches hold (``_draw_many``) ----------------------
@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg", [
    (1206, Config(ranks=2, devices=2)),                                      # 298 rows, then a join
    (2665, Config(ranks=3, devices=1, replay="off", lookahead="none")),
    (1557, Config(ranks=1, devices=3, oversubscribe=3, accessor_checks=False)),
])
def test_split_cache_eviction_fixed_seeds(seed, cfg):
    """260-300 row kernels with distinct index spaces: the model says every rank's command graph
    must clear its 256-entry per-split caches; the run counts at least one clear per rank (of
    caches of that size) and its results are exact."""
    from differential import SPLIT_CACHE_ENTRIES, split_caches_overflow
    p = generate(random.Random(seed))
    assert "long:many" in p.features and split_caches_overflow(p)
    rows = [t for t in p.tasks if t.name == "many"]
    assert len({task_box(t) for t in rows}) == len(rows) > SPLIT_CACHE_ENTRIES
    result = run_on_cluster(p, cfg)
    check(p, run_model(p), result, cfg)
    assert result["cache_clears"].get(SPLIT_CACHE_ENTRIES, 0) >= cfg.ranks, result["cache_clears"]


def test_long_stencils_fit_the_caches():
    """A 100-200 step stencil loop repeats a few keys: no cache of the scheduler overflows (the
    model says none must), so ``long:stencil`` programs exercise replay, not eviction."""
    from differential import count_cache_clears, split_caches_overflow
    p = generate(random.Random(1688), kind="main")
    assert "long:stencil" in p.features and not split_caches_overflow(p)
    cfg = Config(ranks=2, devices=2)
    with count_cache_clears() as watch:
        result = run_on_cluster(p, cfg)
    check(p, run_model(p), result, cfg)
    assert "cache_clears" not in result and not watch.clears, watch.clears


def test_split_cache_eviction_check_fails():
    """A run in which no cache was cleared (``cache_eviction``), and one that lost a row kernel of
    the front (buffers differ), are caught."""
    p = generate(random.Random(1206))
    cfg = Config(ranks=2, devices=1)
    result = run_on_cluster(p, cfg)
    want = run_model(p)
    check(p, want, result, cfg)
    result["cache_clears"] = {}
    with pytest.raises(Mismatch) as err:
        check(p, want, result, cfg)
    assert err.value.tag == "cache_eviction", err.value
    q = copy.deepcopy(p)
    rows = [i for i, t in enumerate(q.tasks) if t.name == "many"]
    del q.tasks[rows[len(rows) // 2]]
    with pytest.raises(Mismatch) as err:
        check(p, want, run_on_cluster(q, cfg), cfg)
    assert {"buffer", "fence"} & {tag for tag, _msg in err.value.problems}, err.value


# ---- split controls: oversubscribe(k), split_1d, constrain_split, host hints, even_split ---------
def _split_calls(monkeypatch):
    """Count the per-chunk split checks that ran (and so could fail)."""
    from collections import Counter
    import differential
    calls = Counter()
    check_split, check_even = differential._Run._check_split, differential._Run._check_even_split

    def counting_split(self, idx, t, box):
        calls[f"split:{t.kind}" + (":1d" if t.split1d else "") + (":gran" if t.gran is not None else "")] += 1
        return check_split(self, idx, t, box)

    def counting_even(self, idx, box, rd, acc):
        calls["even_split" + (":granularity" if rd.k else "")] += 1
        return check_even(self, idx, box, rd, acc)
    monkeypatch.setattr(differential._Run, "_check_split", counting_split)
    monkeypatch.setattr(differential._Run, "_check_even_split", counting_even)
    return calls


@pytest.mark.parametrize("seed,cfg,features,checked", [
    # per-kernel oversubscribe 2 and 5, split_1d, constrain_split int and per dimension, even_split
    (71, Config(ranks=2, devices=3), {"split:oversubscribe:5", "split:constrain:dims", "split:even_split:granularity"},
     {"split:kernel:1d:gran", "split:kernel:gran", "even_split", "even_split:granularity"}),
    (71, Config(ranks=1, devices=4, oversubscribe=3, accessor_checks=False, replay="off"), set(),
     {"split:kernel:gran", "even_split"}),
    # a host task with split_1d and constrain_split, an even_split read with granularity
    (51, Config(ranks=3, devices=2), {"split:host:split_1d", "split:constrain:host"},
     {"split:host:1d", "split:host:gran", "even_split:granularity"}),
    # host tasks with split_2d (oversubscribed 3) next to a kernel with constrain_split
    (163, Config(ranks=4, devices=1, lookahead="none"), {"split:host:split_2d", "split:constrain:int"},
     {"split:kernel:gran"}),
    # constrain_split with a local range, oversubscribe(3), split_1d, even_split
    (36, Config(ranks=2, devices=2, memory=0.6), {"split:constrain:local_range", "split:oversubscribe:3"},
     {"split:kernel:1d:gran", "even_split"}),
])
def test_split_controls_fixed_seeds(monkeypatch, seed, cfg, features, checked):
    calls = _split_calls(monkeypatch)
    p = generate(random.Random(seed), kind="main")
    assert features <= p.features
    run_and_check(p, cfg)
    assert checked <= set(calls), dict(calls)


def test_split_controls_by_hand():
    """constrain_split(3) over 9 rows on 3 devices x oversubscribe(2): every cut at a multiple of
    3; per-dimension (1, 2) on a 2-D kernel with split_1d; even_split(2) of a 7-row buffer, each
    chunk granted its share (``even_split_rows``) and the model's data; explicit oversubscribe(1)."""
    assert even_split_rows(7, 2, (0, 3), 9) == (0, 6) and even_split_rows(7, 2, (3, 9), 9) == (6, 7)
    assert even_split_rows(7, 0, (0, 9), 9) == (0, 7) and even_split_rows(8, 1, (2, 4), 8) == (2, 4)
    assert split_granularity(Task("kernel", (9, 4), gran=3)) == (3, 1)
    assert split_granularity(Task("kernel", (8, 4), gran=(2, 3), local_range=(4, 2))) == (4, 6)
    tasks = [Task("kernel", (9,), [Read("data", 0, "one_to_one"), Read("data", 2, "even_split", k=2)],
                  Write("data", 1, "one_to_one", "discard_write"), c0=2, gran=3, oversub=2),
             Task("kernel", (6, 4), [Read("data", 0, "all"), Read("data", 2, "even_split")],
                  Write("data", 3, "one_to_one", "read_write"), c0=1, gran=(1, 2), split1d=True, oversub=5),
             Task("kernel", (9,), [Read("data", 1, "one_to_one")], Write("data", 0, "one_to_one", "write"),
                  oversub=1, gran=2, offset=None),
             Task("host", (6, 4), [Read("data", 3, "one_to_one")], None, split2d=True, gran=(2, 2), oversub=2)]
    p = _hand_program(tasks, shapes=((9,), (9,), (7, 2), (6, 4)))
    for cfg in (Config(ranks=1, devices=3), Config(ranks=2, devices=2, oversubscribe=3),
                Config(ranks=3, devices=1, accessor_checks=False)):
        run_and_check(p, cfg)


@pytest.mark.parametrize("break_it", ["even_rows", "granularity", "split_1d", "constrain_split"])
def test_split_check_fails(monkeypatch, break_it):
    """A wrong even_split grant or data, chunks not cut at the granularity, a split_1d kernel
    cut in two dimensions: each a ``split`` mismatch."""
    import differential
    tasks = [Task("kernel", (9,), [Read("data", 0, "one_to_one"), Read("data", 2, "even_split", k=2)],
                  Write("data", 1, "one_to_one", "discard_write"), c0=2, gran=3),
             Task("kernel", (6, 4), [Read("data", 0, "all")], Write("data", 3, "one_to_one", "read_write"),
                  split1d=True)]
    p = _hand_program(tasks, shapes=((9,), (9,), (7, 2), (6, 4)))
    cfg = Config(ranks=2, devices=2)
    if break_it == "even_rows":
        rows = differential.even_split_rows
        monkeypatch.setattr(differential, "even_split_rows", lambda *a: tuple(min(7, x + 1) for x in rows(*a)))
    elif break_it == "granularity":
        monkeypatch.setattr(differential, "split_granularity", lambda t: (4,) * len(t.range_shape))
    elif break_it == "split_1d":
        monkeypatch.setattr(cl, "split_1d", cl.split_2d)       # the runtime is asked for a 2-D split
        cfg = Config(ranks=4, devices=1)                        # (a 2 x 2 grid of rank chunks)
    else:
        monkeypatch.setattr(cl, "constrain_split", lambda cgh, g: None)    # never reaches the runtime
    with pytest.raises(Mismatch) as err:
        run_and_check(p, cfg)
    assert err.value.tag == "split", err.value


# ---- out-of-core batching ------------------------------------------------------------------------
def test_random_config_draws_batching():
    """batch and the out-of-core overlap are drawn (after every other field), reach the
    environment, and only main programs keep batch (bad_mapper's model needs unbatched chunks)."""
    cfgs = [random_config(random.Random(s * 7919 + 17)) for s in range(400)]
    assert {c.batch for c in cfgs} == set(BATCH_CHOICES)
    assert {c.ooc_overlap for c in cfgs} == set(OOC_OVERLAP_CHOICES)
    # (drawn last: the fields before are those the seed gave before)
    c0, rng = cfgs[0], random.Random(17)
    assert (c0.ranks, c0.devices) == (rng.randint(1, 4), rng.randint(1, 4))
    c = Config(batch=0.0, ooc_overlap="off")
    assert c.env()["CELERITAS_OUT_OF_CORE_OVERLAP"] == "off"
    for kind in ("fail", "bad_reduction", "overlap", "bad_mapper"):
        assert program_config(generate(random.Random(3), kind=kind), c).batch is None
    from fuzz import parse_config
    assert Config(**parse_config(c.fields())) == c


def _count_batches(monkeypatch):
    from collections import Counter
    from scheduler.device_chunks import ChunkPlanning
    cuts = Counter()
    orig = ChunkPlanning._batches

    def counting(self, plan, cmd, live=0):
        parts = orig(self, plan, cmd, live)
        if len(parts) > 1:
            cuts[cmd.task.label] += 1
        return parts
    monkeypatch.setattr(ChunkPlanning, "_batches", counting)
    return cuts


@pytest.mark.parametrize("seed,cfg", [
    (20, Config(ranks=1, devices=1, batch=0.0)),
    (20, Config(ranks=2, devices=1, batch=0.0, ooc_overlap="off", replay="off")),
    (38, Config(ranks=1, devices=2, batch=0.0, ooc_overlap="on", lookahead="none")),
    (5, Config(ranks=1, devices=1, batch=0.0, ooc_overlap="off", accessor_checks=False, horizon_step=1)),
])
def test_batching_fixed_seeds(monkeypatch, seed, cfg):
    """The capacity (between the largest one-row working set and the largest footprint) cuts
    chunks into batches, and the values stay the model's, with overlap on or off."""
    p = generate(random.Random(seed), kind="main")
    row = max(row_working_set(p, t) for t in p.tasks)
    cap = device_memory_batched(p, cfg.batch)
    assert row <= cap < device_memory_for(p, 0.0)
    cuts = _count_batches(monkeypatch)
    run_and_check(p, cfg)
    assert cuts, "no chunk was cut into batches"


def test_row_working_set_is_the_runtime_limit_by_hand():
    """``row_working_set`` takes granules as the runtime cuts them (9 rows in units of 6: one
    unit), and for one_to_one accesses it is exact: a capacity of one row's working set runs in
    batches with the model's values, one byte less is ``cl.OutOfMemoryError``."""
    from celeritas.testing import run_cluster
    t = Task("kernel", (9, 7), [Read("data", 0, "one_to_one")], Write("data", 1, "one_to_one", "discard_write"),
             gran=6)
    p = _hand_program([t], shapes=((9, 7), (9, 7)))
    assert row_working_set(p, t) == 2 * 9 * 7 * 8
    t = Task("kernel", (10, 7), [Read("data", 0, "one_to_one")], Write("data", 1, "one_to_one", "discard_write"))
    p = _hand_program([t], shapes=((10, 7), (10, 7)))
    assert row_working_set(p, t) == 2 * 7 * 8
    want = run_model(p)["buffers"][1]

    def run(cap):
        def program(rank):
            from differential import _Run
            q = cl.Queue()
            r = _Run(p, q, 1, None)
            r.submit(0, p.tasks[0])
            return q.fence(r.bufs[1]).result()
        try:
            return run_cluster(program, nodes=1, **Config().env(), CELERITAS_HOST_DEVICE_MEMORY=str(cap))[0]
        except Exception as exc:    # noqa: BLE001 - judged below
            return exc
    got = run(2 * 7 * 8)
    assert isinstance(got, np.ndarray) and got.tolist() == want.tolist(), got
    assert isinstance(run(2 * 7 * 8 - 1), cl.OutOfMemoryError)


def test_batching_check_fails_on_a_lost_batch(monkeypatch):
    from scheduler.device_chunks import ChunkPlanning
    orig = ChunkPlanning._batches

    def lose_last(self, plan, cmd, live=0):
        parts = orig(self, plan, cmd, live)
        if len(parts) > 1:
            parts = parts[:-1]
            for i, q in enumerate(parts):
                q.batch = (i, len(parts))
        return parts
    monkeypatch.setattr(ChunkPlanning, "_batches", lose_last)
    p = generate(random.Random(20), kind="main")
    with pytest.raises(Mismatch) as ei:
        run_and_check(p, Config(ranks=1, devices=1, batch=0.0))
    assert "[crash]" not in str(ei.value)     # (the lost batch's data, not a broken patch)


# misuse programs (``_gen_misuse``): the API misused in one task; (seed, configuration, the misuse,
# its sub-form, the error class).  Kernel-time misuses (outside, write_read) fail on the rank
# holding the misbehaving chunk; the others on every rank, at the submit.  (Seeds 79, 7, 18, 9 and 44 moved
# to 91, 28, 5, 39 and 57 when ``_draw_misuse_more`` turned them into the misuses after it; seed 61 became
# a mixed region with ``_draw_mixed_region``, and the plain region case moved to 103.)
MISUSE_CASES = [
    (21, Config(ranks=2, devices=1), "outside", "", cl.AccessError),                 # kernel, wait
    (29, Config(ranks=3, devices=2, oversubscribe=3), "outside", "", cl.AccessError),  # kernel, fence
    (6, Config(ranks=2, devices=2, accessor_checks=False), "outside", "", cl.AccessError),   # host; checks forced on
    (91, Config(ranks=3, devices=2, accessor_checks=False), "write_read", "", cl.AccessError),  # host, fence
    (28, Config(ranks=4, devices=2), "write_read", "", cl.AccessError),              # kernel, wait
    (45, Config(ranks=2, devices=2), "outside_kernel", "cgf", cl.AccessError),
    (5, Config(ranks=3, devices=1), "outside_kernel", "after", cl.AccessError),
    (12, Config(ranks=2, devices=1), "buffer", "shape", cl.BufferError),
    (101, Config(ranks=1, devices=2), "buffer", "dtype", cl.BufferError),
    (47, Config(ranks=2, devices=1), "buffer", "not_dtype", cl.BufferError),
    (49, Config(ranks=3, devices=1), "buffer", "cast", cl.BufferError),
    (501, Config(ranks=1, devices=1), "buffer", "ndim", cl.BufferError),
    (136, Config(ranks=2, devices=2), "buffer", "negative", cl.BufferError),
    (17, Config(ranks=2, devices=2), "mapper_raises", "", cl.RangeMapperError),      # kernel
    (25, Config(ranks=3, devices=1), "mapper_raises", "", cl.RangeMapperError),      # host task
    (39, Config(ranks=2, devices=2), "mapper_dims", "box", cl.RangeMapperError),
    (2, Config(ranks=3, devices=1), "mapper_dims", "subrange", cl.RangeMapperError),
    (103, Config(ranks=2, devices=1), "mapper_dims", "region", cl.RangeMapperError),
    (61, Config(ranks=2, devices=1), "mapper_dims", "mixed", cl.RangeMapperError),   # (a GeometryError inside)
    (57, Config(ranks=2, devices=3), "mapper_dims", "type", cl.RangeMapperError),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,form,sub,cls", MISUSE_CASES)
def test_misuse_fixed_seeds(seed, cfg, form, sub, cls):
    """The program reaches its misuse, and the run raises exactly the modelled error: class,
    the whole message (buffer, task, rank, chunk, mapper), where, by the ranks at fault."""
    p = generate(random.Random(seed), kind="misuse")
    cfg = program_config(p, cfg)
    idx, t = misuse_task(p)
    assert (t.misuse, t.misuse_form) == (form, sub)
    oc = misuse_error(p, cfg)
    assert oc.cls is cls
    if form in ("outside", "write_read"):
        assert len(oc.failing) == 1 and "rank %d, chunk" % oc.failing[0] in oc.pattern.replace("\\", "")
        assert cfg.accessor_checks or form == "write_read"
    else:
        assert oc.failing == list(range(cfg.ranks))
    if form != "buffer":
        assert re.search(r'B\\d\+ "b%d"' % _misuse_read(t).buffer, oc.pattern)
    result = run_on_cluster(p, cfg)
    check(p, None, result, cfg)
    raised = [o["error"] for o in result["ranks"] if o["error"] is not None and type(o["error"]) is cls]
    assert raised and all(re.fullmatch(oc.pattern, str(e)) for e in raised)


def test_misuse_share_of_the_mix():
    """misuse programs are drawn in the default mix (3%, taken from main)."""
    kinds = [generate(random.Random(s)).kind for s in range(1000)]
    assert 10 <= kinds.count("misuse") <= 60
    forms = {misuse_task(generate(random.Random(s), kind="misuse"))[1].misuse for s in range(200)}
    assert forms == set(MISUSE_FORMS) | {"config", "diverge", "cg_handler", "cg_call", "fence_region"}


def test_misuse_check_fails_when_the_error_is_missing(monkeypatch):
    """The runs stop misusing the API: every case is reported as missed."""
    import differential
    p = generate(random.Random(21), kind="misuse")
    cfg = Config(ranks=2, devices=1)
    monkeypatch.setattr(differential._Run, "_misuse", lambda self, idx, box, acc: None)
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:missed", str(info.value)
    monkeypatch.undo()
    p = generate(random.Random(12), kind="misuse")
    monkeypatch.setattr(differential, "make_bad_buffer", lambda form, shape, dtype: cl.Buffer(shape=shape))
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:missed", str(info.value)
    monkeypatch.undo()
    p = generate(random.Random(17), kind="misuse")
    monkeypatch.setattr(differential, "raising_mapper", lambda chunk, shape: cl.Subrange((0,) * len(shape), shape))
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    # (the kernel then runs, and its chunks fail on the mapper the model does not interpret)
    assert info.value.tag in ("misuse:missed", "misuse:wrong_error"), str(info.value)


def test_misuse_check_judges_the_outcome():
    """Made-up outcomes: the wrong class, a message naming another rank, chunk or buffer, a
    missing cause, a peer that finished a fence it cannot have, a rank not aborted, a hang."""
    p = generate(random.Random(29), kind="misuse")          # kernel outside, fence
    cfg = program_config(p, Config(ranks=3, devices=2, oversubscribe=3))
    oc = misuse_error(p, cfg)
    r = oc.failing[0]
    good = cl.AccessError(_fill(oc.pattern))
    assert re.fullmatch(oc.pattern, str(good))
    abort = cl.CeleritasError("rank 1: internal error: CommunicatorError: cluster aborted")

    def outcome(errs, stage="sync fence"):
        res = _outcome(*errs)
        for o in res["ranks"]:
            o["stage"] = stage
        return res
    errs = [abort] * 3
    errs[r] = good
    assert _tag(p, outcome(errs), cfg) is None
    errs2 = list(errs)
    errs2[r] = cl.KernelError(str(good))
    assert _tag(p, outcome(errs2), cfg) == "misuse:wrong_error"
    errs2[r] = cl.AccessError(str(good).replace(f"rank {r},", f"rank {(r + 1) % 3},"))
    assert _tag(p, outcome(errs2), cfg) == "misuse:wrong_error"
    errs2[r] = cl.AccessError(str(good).replace('"b', '"c'))
    assert _tag(p, outcome(errs2), cfg) == "misuse:wrong_error"
    errs2 = list(errs)
    errs2[(r + 1) % 3] = None
    assert _tag(p, outcome(errs2), cfg) == "misuse:peer_finished"
    errs2[(r + 1) % 3] = cl.AccessError("some other error")
    assert _tag(p, outcome(errs2), cfg) == "misuse:wrong_error"
    assert _tag(p, outcome(errs, stage="setup"), cfg) == "misuse:wrong_stage"
    res = outcome(errs)
    res["ranks"][(r + 2) % 3] = None
    assert _tag(p, res, cfg) == "hang"
    # every rank at fault: each raises or is aborted, none finishes; the cause is checked
    p = generate(random.Random(17), kind="misuse")          # mapper_raises
    cfg = Config(ranks=2, devices=2)
    oc = misuse_error(p, cfg)
    idx, _t = misuse_task(p)
    e = cl.RangeMapperError(_fill(oc.pattern))
    try:
        raise e from ValueError("x")
    except cl.RangeMapperError:
        pass
    stage = f"submit T{idx}"
    assert _tag(p, outcome([e, abort], stage), cfg) is None
    assert _tag(p, outcome([abort, abort], stage), cfg) == "misuse:wrong_error"
    assert _tag(p, outcome([e, None], stage), cfg) == "misuse:rank_finished"
    bare = cl.RangeMapperError(str(e))
    assert _tag(p, outcome([bare, e], stage), cfg) == "misuse:wrong_error"


# misuse mapper_raises with a mapper that raises for part of the range only (``_draw_partial_raise``):
# (seed, configuration, form, k, the ranks that raise, the chunk (offset, rows) the error names)
PARTIAL_RAISE_CASES = [
    # kernel (9, 5): rank chunks [0, 3) [3, 6) [6, 9); the one holding 8 raises in every rank's command graph
    (56, Config(ranks=3, devices=1), "holding", 8, [0, 1, 2], (6, 3)),
    # kernel (9, 5): rank chunks [0, 5) [5, 9); rank 1's device chunk [7, 9) raises in its instruction
    # graph alone; rank 0 cannot finish its fence of the written buffer
    (82, Config(ranks=2, devices=2), "offset_eq", 7, [1], (7, 2)),
    # kernel (5,) on 4 ranks: rank chunks at 0, 2, 3, 4: the one at 2 (an opaque mapper)
    (94, Config(ranks=4, devices=2, lookahead="none"), "offset_eq", 2, [0, 1, 2, 3], (2, 1)),
    # ... on 2 ranks: no chunk at 2 (rank chunks at 0 and 3, one device each): no error
    (94, Config(ranks=2, devices=1), "offset_eq", 2, [], None),
    # host task (8,) on one rank, oversubscribe(3): its part [3, 6) holds 5 (opaque), shutdown
    (10, Config(ranks=1, devices=1, oversubscribe=3), "holding", 5, [0], (3, 3)),
    # kernel (3, 2, 4) on one rank, 3 devices: device 1's chunk at 1, replay off
    (113, Config(ranks=1, devices=3, replay="off"), "offset_eq", 1, [0], (1, 1)),
    # a master-node host task is never split: no chunk raises on any configuration
    (76, Config(ranks=2, devices=2, oversubscribe=3), "offset_eq", 4, [], None),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,form,k,failing,chunk", PARTIAL_RAISE_CASES)
def test_partially_raising_mapper_fixed_seeds(seed, cfg, form, k, failing, chunk):
    """A mapper that raises for one chunk only: a ``cl.RangeMapperError`` naming the task, the
    buffer and that chunk, its cause the mapper's ValueError, raised at the sync (not at the
    submit: the whole range maps) by the ranks that map that chunk; no error where no chunk raises."""
    from differential import partial_raise_outcome
    p = generate(random.Random(seed), kind="misuse")
    cfg = program_config(p, cfg)
    _idx, t = misuse_task(p)
    rd = _misuse_read(t)
    assert (t.misuse, t.misuse_form, rd.form, rd.k) == ("mapper_raises", "partial", form, k)
    assert partial_raise_outcome(p, cfg) == (failing, chunk)
    oc = misuse_error(p, cfg)
    assert oc.failing == failing
    result = run_on_cluster(p, cfg)
    check(p, None, result, cfg)
    raised = {r: o for r, o in enumerate(result["ranks"]) if o["error"] is not None}
    if not failing:
        assert not raised
        return
    primary = {r: o for r, o in raised.items() if type(o["error"]) is cl.RangeMapperError}
    assert primary and set(primary) <= set(failing)
    for o in primary.values():
        e = o["error"]
        assert re.fullmatch(oc.pattern, str(e)) and isinstance(e.__cause__, ValueError)
        assert f"chunk Subrange(offset=({chunk[0]}," in str(e) and "'misuse'" in str(e) and f'"b{rd.buffer}"' in str(e)
        assert o["stage"].startswith("sync ") or o["stage"] == "final wait"     # (not at the submit)
        assert "submitted at" not in str(e)         # (docs/api.md: found after submit returned)


def test_partially_raising_mapper_check_fails(monkeypatch):
    """The mapper stops raising (``misuse:missed``); a mapper that raises where the model says no
    chunk does (``misuse:spurious``); made-up outcomes: the wrong rank or chunk named, or the
    cause missing (``misuse:wrong_error``), the rank at fault finishing (``misuse:rank_finished``)."""
    import differential
    p = generate(random.Random(56), kind="misuse")
    cfg = Config(ranks=3, devices=1)
    orig = differential.partial_raising_mapper
    monkeypatch.setattr(differential, "partial_raising_mapper", lambda form, k: orig(form, 10 ** 6))
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:missed", str(info.value)
    p = generate(random.Random(94), kind="misuse")
    monkeypatch.setattr(differential, "partial_raising_mapper", lambda form, k: orig("holding", 0))
    with pytest.raises(Mismatch) as info:
        run_and_check(p, Config(ranks=2, devices=1))
    assert info.value.tag == "misuse:spurious", str(info.value)
    monkeypatch.undo()
    p = generate(random.Random(82), kind="misuse")         # rank 1 fails, at the fence
    cfg = Config(ranks=2, devices=2)
    oc = misuse_error(p, cfg)
    good = cl.RangeMapperError(_fill(oc.pattern))
    try:
        raise good from ValueError("x")
    except cl.RangeMapperError:
        pass
    abort = cl.CeleritasError("rank 0: internal error: CommunicatorError: cluster aborted")

    def outcome(errs):
        res = _outcome(*errs)
        for o in res["ranks"]:
            o["stage"] = "sync fence"
        return res
    assert _tag(p, outcome([abort, good]), cfg) is None
    assert _tag(p, outcome([good, abort]), cfg) == "misuse:wrong_error"        # the wrong rank
    other = cl.RangeMapperError(str(good).replace("offset=(7,", "offset=(5,"))
    other.__cause__ = ValueError("x")
    assert _tag(p, outcome([abort, other]), cfg) == "misuse:wrong_error"       # another chunk
    assert _tag(p, outcome([abort, cl.RangeMapperError(str(good))]), cfg) == "misuse:wrong_error"   # no cause
    assert _tag(p, outcome([abort, None]), cfg) == "misuse:rank_finished"


# misuse config (``_draw_config``): (seed, configuration, form, the setting, the invalid value, stage)
CONFIG_CASES = [
    (33, Config(ranks=2, devices=1), "env", "CELERITAS_LOOKAHEAD", "sometimes", "setup"),
    (317, Config(ranks=3, devices=2), "env", "CELERITAS_DEVICES", "host:0", "setup"),
    (2012, Config(ranks=1, devices=1), "env", "CELERITAS_HORIZON_MAX_PARALLELISM", "1.5", "setup"),
    (771, Config(ranks=2, devices=1), "env", "CELERITAS_HOST_ALLOCATOR", "jemalloc", "setup"),
    (1724, Config(ranks=2, devices=2), "env", "CELERITAS_HOST_DEVICE_MEMORY", "-5", "setup"),
    # (a memory configuration sets the same variable: the invalid value must win, seed 7715)
    (7715, Config(ranks=3, devices=3, memory=1.0), "env", "CELERITAS_HOST_DEVICE_MEMORY", "-5", "setup"),
    (70, Config(ranks=2, devices=1), "env", "CELERITAS_ACCESSOR_CHECKS", "2", "setup"),
    (23, Config(ranks=1, devices=3), "env", "CELERITAS_WAIT_WARNING", "soon", "setup"),
    (105, Config(ranks=2, devices=1), "queue_arg", "devices", "gpu", "setup"),
    (59, Config(ranks=3, devices=1), "queue_arg", "lookahead", "sometimes", "setup"),
    (450, Config(ranks=2, devices=2), "set_lookahead", "lookahead", "", "submit"),
    (157, Config(ranks=1, devices=1), "set_lookahead", "lookahead", "always", "submit"),
    (51, Config(ranks=3, devices=2), "second_queue", "devices", None, "submit"),
    (148, Config(ranks=2, devices=1), "second_queue", "lookahead", "sometimes", "submit"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,form,setting,value,stage", CONFIG_CASES)
def test_config_errors_fixed_seeds(seed, cfg, form, setting, value, stage):
    """An invalid setting: a cl.ConfigError (exactly: not a subclass nor a parent) on every rank
    (or aborted by another's), naming the setting and the value, at the first cl.Queue() or
    where the misuse task stands; no rank finishes."""
    from differential import config_setting
    p = generate(random.Random(seed), kind="misuse")
    idx, t = misuse_task(p)
    assert (t.misuse, t.misuse_form, config_setting(t)) == ("config", form, (setting, value))
    oc = misuse_error(p, cfg)
    assert oc.cls is cl.ConfigError and oc.failing == list(range(cfg.ranks))
    result = run_on_cluster(p, cfg)
    check(p, None, result, cfg)
    raised = [o for o in result["ranks"] if type(o["error"]) is cl.ConfigError]
    assert raised
    for o in raised:
        assert setting in str(o["error"]) and repr(value if value is not None else f"host:{cfg.devices + 1}") \
            in str(o["error"])
        assert o["stage"] == ("setup" if stage == "setup" else f"submit T{idx}")


@pytest.mark.parametrize("seed,cfg", [(20, Config(ranks=2, devices=1)),          # cl.Queue(devices=2)
                                      (897, Config(ranks=1, devices=2))])        # DEVICE_MEMORY_LIMIT=1.5
def test_config_errors_found(seed, cfg):
    """Settings whose error was not the documented one (found by these draws, fixed in main 31098ca)."""
    p = generate(random.Random(seed), kind="misuse")
    assert misuse_task(p)[1].misuse == "config"
    run_and_check(p, cfg)


def test_config_check_fails(monkeypatch):
    """A setting that is taken (the variable not passed on: ``misuse:missed``), another class
    than ConfigError or a message naming another value (``misuse:wrong_error``), the error at
    the wrong place (``misuse:wrong_stage``)."""
    import differential
    p = generate(random.Random(33), kind="misuse")
    cfg = Config(ranks=2, devices=1)
    monkeypatch.setattr(differential, "config_env", lambda p: {})
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:missed", str(info.value)
    monkeypatch.undo()
    oc = misuse_error(p, cfg)
    good = cl.ConfigError(_fill(oc.pattern))

    def outcome(errs, stage="setup"):
        res = _outcome(*errs)
        for o in res["ranks"]:
            o["stage"] = stage
        return res
    assert _tag(p, outcome([good, good]), cfg) is None
    assert _tag(p, outcome([cl.CeleritasError(str(good)), good]), cfg) == "misuse:wrong_error"
    assert _tag(p, outcome([ValueError(str(good)), good]), cfg) == "crash"
    assert _tag(p, outcome([cl.ConfigError(str(good).replace("sometimes", "other")), good]), cfg) == \
        "misuse:wrong_error"
    assert _tag(p, outcome([good, good], stage="submit T1"), cfg) == "misuse:wrong_stage"
    assert _tag(p, outcome([good, None]), cfg) == "misuse:rank_finished"


# misuse config drawn after _draw_config (``_draw_config_start``): an output folder that cannot be made,
# a device that does not exist.  (seed, configuration, form, the variable, its value ({file}: the
# regular file ``not_a_folder``), what the message says past "VAR=value: " or "VAR: ")
CONFIG_START_CASES = [
    (90, Config(ranks=2, devices=1), "output", "CELERITAS_PRINT_GRAPHS", "{file}/graphs",
     "cannot create the folder '{file}/graphs' (Not a directory)"),
    (175, Config(ranks=3, devices=2), "output", "CELERITAS_PRINT_GRAPHS", "{file}",
     "cannot create the folder '{file}' (File exists)"),
    (529, Config(ranks=1, devices=1), "output", "CELERITAS_TRACE", "{file}/sub/trace.json",
     "cannot create the folder '{file}/sub' (Not a directory)"),
    (249, Config(ranks=2, devices=2), "output", "CELERITAS_TRACE", "{file}/trace.json",
     "cannot create the folder '{file}' (File exists)"),
    (917, Config(ranks=2, devices=1), "device", "CELERITAS_DEVICES", "opencl:99", "is not a device list"),
    (374, Config(ranks=2, devices=2), "device", "CELERITAS_DEVICES", "opencl:0:99", None),
    (399, Config(ranks=3, devices=1), "device", "CELERITAS_DEVICES", "opencl:99:0", None),
    (69, Config(ranks=2, devices=1), "device", "CELERITAS_DEVICES", "cuda:99", None),
]


def _device_message(value: str) -> str:
    """What the runtime says of a device that does not exist on this machine (by hand)."""
    from differential import _cuda_gpus, _opencl_platforms
    if value.startswith("cuda"):
        why, n = _cuda_gpus()
        return "the CUDA backend needs CuPy" if why else "no CUDA GPU is visible" if n == 0 else "CUDA device 99"
    why, platforms = _opencl_platforms()
    if why:
        return why
    if value == "opencl:99:0":
        return f"OpenCL platform 99 does not exist; this machine has {len(platforms)} platform"
    return f"OpenCL platform 0 {platforms[0][0]!r} has no device 99; this machine has: platform 0 "


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,form,setting,value,says", CONFIG_START_CASES)
def test_config_start_errors_fixed_seeds(seed, cfg, form, setting, value, says):
    """An output folder under (or at) a regular file, a device that does not exist: a
    cl.ConfigError on every rank (or aborted by another's) at the first cl.Queue(), naming the
    variable and the value; no rank finishes."""
    from differential import config_setting, not_a_folder
    file = not_a_folder()
    value = value.format(file=file)
    p = generate(random.Random(seed), kind="misuse")
    idx, t = misuse_task(p)
    assert (t.misuse, t.misuse_form, config_setting(t)) == ("config", form, (setting, value))
    assert f"misuse:config:{form}" in p.features
    oc = misuse_error(p, cfg)
    assert oc.cls is cl.ConfigError and oc.failing == list(range(cfg.ranks)) and oc.stage == "setup"
    result = run_on_cluster(p, cfg)
    check(p, None, result, cfg)
    raised = [o for o in result["ranks"] if type(o["error"]) is cl.ConfigError]
    assert raised
    says = says.format(file=file) if says is not None else _device_message(value)
    for o in raised:
        text = str(o["error"])
        assert text.startswith(f"{setting}={value!r} " if value == "opencl:99" else f"{setting}={value!r}: "
                               if form == "device" else f"{setting}: "), text
        assert says in text and o["stage"] == "setup", text


def test_config_start_check_fails(monkeypatch, tmp_path):
    """An output folder that can be made after all (``not_a_folder`` a folder: the run finishes,
    ``misuse:missed``); another errno, or a device error of another class than ConfigError
    (what CELERITAS_DEVICES=cuda:99 gave where CuPy sees GPUs before the runtime checked the ids:
    the backend's BackendError) or one naming another device (``misuse:wrong_error``)."""
    import differential
    from executor.backends.backend import BackendError
    cfg = Config(ranks=2, devices=1)
    p = generate(random.Random(90), kind="misuse")
    monkeypatch.setattr(differential, "not_a_folder", lambda: str(tmp_path))
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:missed", str(info.value)
    assert (tmp_path / "graphs").is_dir()       # (the run wrote its graphs there)
    monkeypatch.undo()

    def outcome(*errs):
        res = _outcome(*errs)
        for o in res["ranks"]:
            o["stage"] = "setup"
        return res
    oc = misuse_error(p, cfg)
    good = cl.ConfigError(_fill(oc.pattern))
    assert _tag(p, outcome(good, good), cfg) is None
    assert _tag(p, outcome(cl.ConfigError(str(good).replace("Not a directory", "File exists")), good), cfg) == \
        "misuse:wrong_error"
    p = generate(random.Random(69), kind="misuse")
    oc = misuse_error(p, cfg)
    good = cl.ConfigError(_fill(oc.pattern))
    assert _tag(p, outcome(good, good), cfg) is None
    assert _tag(p, outcome(BackendError(str(good)), good), cfg) == "misuse:wrong_error"
    assert _tag(p, outcome(cl.ConfigError(str(good).replace("99", "98")), good), cfg) == "misuse:wrong_error"


def _fill(pattern: str) -> str:
    """A message the regex ``pattern`` of ``misuse_error`` matches (its wildcards filled in)."""
    text = re.sub(r"\(\?:([^|()]*)\|[^()]*\)", r"\1", pattern)     # (an alternative: the first)
    text = text.replace(r"\w+", "w")
    text = text.replace(r"\d+", "7").replace(r"[^()]*", "x.py:1").replace(".+", "m")
    return re.sub(r"\\(.)", r"\1", text)


# misuse diverge (``_draw_misuse_more``): one rank's task stream differs.  (seed, configuration, form,
# the rank at fault, what that rank's entry says, what the other ranks' says; program_config runs it
# on 2 ranks at least)
DIVERGE_CASES = [
    (9, Config(ranks=2, devices=1), "name", 0, "'misuse_v2'", "'misuse'"),
    (71, Config(ranks=3, devices=2), "mode", 0, " write)", " discard_write)"),  # host task; the accesses alone
    (275, Config(ranks=4, devices=1), "mode", 2, " write)", " discard_write)"),  # after a q.wait(); at a fence
    (78, Config(ranks=3, devices=1), "range", 2, "range [", "range ["),
    (36, Config(ranks=3, devices=1), "extra", 0, "'misuse_extra'", "'misuse'"),    # at a fence (sync fence_shutdown)
    (669, Config(ranks=2, devices=2, ahead=2), "extra", 0, "(host_compute 'misuse_extra'", "'misuse'"),  # throttled;
                                                                                    # at a fence
    (724, Config(ranks=2, devices=1), "extra", 1, "'misuse_extra'", "'misuse'"),   # at q.shutdown()
    (270, Config(ranks=1, devices=1), "buffer_shape", 0, "buffer B", "buffer B"),          # 1 rank: run on 2
    (132, Config(ranks=4, devices=2, lookahead="none"), "buffer_dtype", 3, "buffer B", "buffer B"),
    (65, Config(ranks=4, devices=2, lookahead="none"), "host_data", 3, ", with data", ", without data"),
    (85, Config(ranks=2, devices=1), "side_effect", 0, ", side effect on host object H0)", " discard_write)"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,form,fault,says,other", DIVERGE_CASES)
def test_divergence_fixed_seeds(seed, cfg, form, fault, says, other):
    """Ranks whose task streams differ: a cl.DivergenceError (exactly) from the rank at fault and its
    right neighbour (or aborted by the other's), naming the first differing task or buffer of both
    ranks by the same task id; quickly (CELERITAS_DIVERGENCE_TIMEOUT), never run_cluster's timeout."""
    import time
    from differential import divergence_pattern
    p = generate(random.Random(seed), kind="misuse")
    cfg = program_config(p, cfg)
    idx, t = misuse_task(p)
    assert (t.misuse, t.misuse_form, t.kind) == ("diverge", form, "diverge")
    assert {"misuse:diverge", f"misuse:diverge:{form}"} <= p.features
    n = cfg.ranks
    assert n >= 2 and t.fence_index % n == fault
    oc = misuse_error(p, cfg)
    assert oc.cls is cl.DivergenceError and oc.failing == sorted({fault, (fault + 1) % n})
    t0 = time.monotonic()
    result = run_on_cluster(p, cfg, timeout=60)
    assert time.monotonic() - t0 < 30
    check(p, None, result, cfg)
    raised = {r: o for r, o in enumerate(result["ranks"]) if type(o["error"]) is cl.DivergenceError}
    assert raised and set(raised) <= set(oc.failing)
    for r, o in raised.items():
        text = str(o["error"])
        assert re.fullmatch(divergence_pattern(p, (r - 1) % n, r, fault), text)
        left = (r - 1) % n
        assert text.startswith(f"ranks {left} and {r} submitted different task streams; the first differing task")
        theirs, mine = text.split(f"rank {left} submitted ", 1)[1].split(f"; rank {r} submitted ")
        assert says in (mine if r == fault else theirs) and other in (theirs if r == fault else mine)
        made = r"(buffer B\d+ \w+ of shape \(.*\)(?:, with(?:out)? data)? \(made before )?T(\d+)"
        assert re.match(made, mine).group(2) == re.match(made, theirs).group(2)
        if "(among T" not in text:   # (else found from a stalled rank's pending tasks, before any epoch)
            assert f"epoch #{1 + sum(x.kind == 'wait' for x in p.tasks[:idx])})" in text
    assert (p.sync == "fence_shutdown") == (seed in (36, 669, 71, 275)) == ("misuse:diverge:at_fence" in p.features)


def test_divergence_check_fails():
    """Ranks that agree after all (the run finishes: ``misuse:missed``); made-up outcomes: a rank
    naming the other's entry as its own, another task id on one side, another range, a rank at fault
    with another error (``misuse:wrong_error``); a rank that hangs."""
    import differential
    from differential import MISUSE_TASK
    p = generate(random.Random(36), kind="misuse")       # extra, rank 0 at fault on 3 ranks
    cfg = Config(ranks=3, devices=1)
    orig = differential._Run._diverge

    def agree(self, t):
        self.q.submit(self._poison_cgf(t, MISUSE_TASK, tuple(t.misuse_arg["range"]), t.misuse_arg["host"]))
    differential._Run._diverge = agree
    try:
        with pytest.raises(Mismatch) as info:
            run_and_check(p, cfg)
    finally:
        differential._Run._diverge = orig
    assert info.value.tag == "misuse:missed", str(info.value)
    oc = misuse_error(p, cfg)
    assert oc.failing == [0, 1]
    good = {r: cl.DivergenceError(_fill(oc.patterns[r].replace("(?P<t>\\d+)", "\\d+").replace("(?P=t)", "\\d+")))
            for r in (0, 1)}
    abort = cl.CeleritasError("rank 2: internal error: CommunicatorError: rank 2: cluster aborted")

    def outcome(errs, stage="sync shutdown"):
        res = _outcome(*errs)
        for o in res["ranks"]:
            o["stage"] = stage
        return res
    assert _tag(p, outcome([good[0], good[1], abort]), cfg) is None
    assert _tag(p, outcome([good[0], abort, None]), cfg) is None       # (rank 1 aborted, rank 2 finished)
    assert _tag(p, outcome([good[0], None, None]), cfg) is None        # (rank 1 found rank 0 out from pending)
    assert _tag(p, outcome([good[1], good[1], abort]), cfg) == "misuse:wrong_error"
    assert _tag(p, outcome([good[0], cl.DivergenceError(str(good[1]).replace("T7 (device_compute 'misuse_extra'",
                                                                                "T8 (device_compute 'misuse_extra'",
                                                                                1)), abort]), cfg) \
        == "misuse:wrong_error"
    assert _tag(p, outcome([cl.DivergenceError(str(good[0]).replace("range [", "range [1, ")), good[1], abort]),
                cfg) == "misuse:wrong_error"
    assert _tag(p, outcome([cl.CeleritasError(str(good[0])), good[1], abort]), cfg) == "misuse:wrong_error"
    assert _tag(p, outcome([None, None, None]), cfg) == "misuse:missed"
    assert _tag(p, outcome([good[0], good[1], abort], stage="setup"), cfg) == "misuse:wrong_stage"
    res = outcome([good[0], good[1], abort])
    res["ranks"][2] = None
    assert _tag(p, res, cfg) == "hang"


# command-group misuse the runtime survives (``_draw_misuse_more``): (seed, configuration, form, sub-form,
# the class, what the message says)
CG_CASES = [
    (7, Config(ranks=2, devices=1), "cg_handler", "access:none", cl.CeleritasError,
     'Buffer.access of buffer B2 "b2" takes the command group handler'),
    (282, Config(ranks=3, devices=2), "cg_handler", "access:stale", cl.CeleritasError,
     "this cgh belongs to a command group that was already submitted"),
    (121, Config(ranks=1, devices=2), "cg_handler", "reduction:none", cl.CeleritasError,
     "cl.reduction takes the command group handler"),
    (83, Config(ranks=2, devices=2), "cg_handler", "reduction:stale", cl.CeleritasError, "cl.reduction: this cgh"),
    (38, Config(ranks=2, devices=1), "cg_handler", "side_effect:none", cl.CeleritasError,
     "cl.side_effect takes the command group handler"),
    (232, Config(ranks=3, devices=1), "cg_handler", "side_effect:stale", cl.CeleritasError,
     "cl.side_effect: this cgh"),
    (115, Config(ranks=2, devices=2), "cg_handler", "hint:none", cl.CeleritasError, "cl.hint takes the command"),
    (120, Config(ranks=1, devices=1), "cg_handler", "hint:stale", cl.CeleritasError, "cl.hint: this cgh"),
    (125, Config(ranks=4, devices=1), "cg_handler", "constrain_split:none", cl.CeleritasError,
     "cl.constrain_split takes the command"),
    (123, Config(ranks=2, devices=3), "cg_handler", "constrain_split:stale", cl.CeleritasError,
     "cl.constrain_split: this cgh"),
    (467, Config(ranks=2, devices=1), "cg_call", "reduction_target", cl.CeleritasError,
     "cl.reduction takes a cl.Buffer as its target, got "),
    (37, Config(ranks=3, devices=2), "cg_call", "side_effect_kernel", cl.CeleritasError,
     "kernel 'misuse': cl.side_effect orders host tasks only"),
    (18, Config(ranks=2, devices=1), "cg_call", "host_range_once", cl.CeleritasError,
     "host_task(on=cl.once) runs once; range="),
    (134, Config(ranks=2, devices=2), "cg_call", "host_range_collective", cl.CeleritasError,
     "host_task(on=cl.collective) runs once per rank; range="),
    (413, Config(ranks=3, devices=1), "cg_call", "host_range_collective_call", cl.CeleritasError,
     "host_task(on=cl.collective) runs once per rank; range="),       # (129 is now collective_bad_group)
    (129, Config(ranks=3, devices=1), "cg_call", "collective_bad_group", cl.CeleritasError,
     "cl.collective(group) takes a cl.CollectiveGroup(), got str"),
    (197, Config(ranks=2, devices=2), "cg_call", "placement_called_master", cl.CeleritasError,
     "cl.on_master_node is a placement, not a function: write on=cl.on_master_node (without parentheses)"),
    (381, Config(ranks=1, devices=1), "cg_call", "placement_called_once", cl.CeleritasError,
     "cl.once is a placement, not a function"),
    (44, Config(ranks=2, devices=3), "cg_call", "no_init_read", cl.AccessError,
     "no_init=True discards the old contents, which a cl.read access reads"),
    (191, Config(ranks=1, devices=2), "cg_call", "name_type", cl.CeleritasError,
     "a kernel's or host task's name= is a str, got "),            # (112 is now hint_split_1d_2d)
    (112, Config(ranks=2, devices=2), "cg_call", "hint_split_1d_2d", cl.CeleritasError,
     "cl.hint(cl.split_2d()): this command group already has the hint cl.split_1d(); cl.split_1d() and "
     "cl.split_2d() cannot be combined"),
    (929, Config(ranks=1, devices=2), "cg_call", "hint_twice_oversubscribe", cl.CeleritasError,
     "cl.hint(cl.oversubscribe(3)): this command group already has the hint cl.oversubscribe(2); give each "
     "kind of hint once"),
    (74, Config(ranks=2, devices=1), "cg_call", "submit_noncallable", cl.CeleritasError,
     "q.submit takes a command group function cgf(cgh), got "),
    (72, Config(ranks=2, devices=2), "cg_call", "generator_kernel", cl.CeleritasError,
     "parallel_for 'misuse': the function is a generator (it yields)"),
    (252, Config(ranks=3, devices=1), "cg_call", "async_kernel", cl.CeleritasError,
     "parallel_for 'misuse': the function is a coroutine (async def)"),
    (79, Config(ranks=2, devices=1, oversubscribe=3), "cg_call", "generator_host", cl.CeleritasError,
     "host_task 'misuse': the function is a generator (it yields)"),
    (269, Config(ranks=2, devices=2), "cg_call", "async_host", cl.CeleritasError,
     "host_task 'misuse': the function is a coroutine (async def)"),
    (151, Config(ranks=4, devices=1), "cg_call", "async_gen_host", cl.CeleritasError,
     "host_task 'misuse': the function is a coroutine (async def)"),
    (8, Config(ranks=2, devices=2), "fence_region", "2_boxes", cl.CeleritasError,
     "a fence returns one array, so it takes a cl.Subrange or cl.Box, not a region of 2 boxes"),
    (532, Config(ranks=3, devices=1), "fence_region", "3_boxes", cl.CeleritasError,
     "not a region of 3 boxes"),
]


@pytest.mark.timeout(600)
@pytest.mark.parametrize("seed,cfg,form,sub,cls,says", CG_CASES)
def test_cg_misuse_fixed_seeds(seed, cfg, form, sub, cls, says):
    """A command group (or q.submit, q.fence) misused: exactly the modelled error, on every rank, at that
    submit; the program goes on and every later result is the model's (the submit made no task)."""
    from differential import cg_misuse_error, recovers
    p = generate(random.Random(seed), kind="misuse")
    cfg = program_config(p, cfg)
    idx, t = misuse_task(p)
    assert (t.misuse, t.misuse_form, t.kind) == (form, sub, "bad_cg")
    assert recovers(p) and idx < len(p.tasks) - 1 and "misuse:continues" in p.features
    assert f"misuse:{form}:{sub}" in p.features
    got_cls, text = cg_misuse_error(p, t)
    assert got_cls is cls and says in text
    run_and_check(p, cfg)
    result = run_on_cluster(p, cfg)
    for o in result["ranks"]:
        errs = dict(o["obs"]["cg_errors"])
        assert type(errs[idx]) is cls and str(errs[idx]) == text


def test_cg_misuse_check_fails(monkeypatch):
    """The misuse not done (the submit returns: ``misuse:missed``); a message naming something else
    (``misuse:wrong_error``); a runtime that raised, but made the task anyway (its kernel writes
    POISON: ``buffer`` or ``fence``); a later step that fails (``crash``)."""
    import differential
    p = generate(random.Random(7), kind="misuse")           # access(None, ...) in a kernel's command group
    cfg = Config(ranks=2, devices=1)
    orig = differential._Run._bad_cg

    def proper(self, t):     # the same command group with its own cgh: the poison kernel runs
        a = t.misuse_arg
        self.q.submit(self._poison_cgf(t, "misuse", tuple(a["range"]), False))
    monkeypatch.setattr(differential._Run, "_bad_cg", proper)
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:missed", str(info.value)

    def made_anyway(self, t):
        proper(self, t)
        orig(self, t)
    monkeypatch.setattr(differential._Run, "_bad_cg", made_anyway)
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag in ("buffer", "fence"), str(info.value)

    def other_text(self, t):
        try:
            orig(self, t)
        except cl.CeleritasError as exc:
            raise cl.CeleritasError(str(exc).replace('"b2"', '"b1"')) from None
    monkeypatch.setattr(differential._Run, "_bad_cg", other_text)
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:wrong_error", str(info.value)

    def other_class(self, t):
        try:
            orig(self, t)
        except cl.CeleritasError as exc:
            raise cl.AccessError(str(exc)) from None
    monkeypatch.setattr(differential._Run, "_bad_cg", other_class)
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:wrong_error", str(info.value)
    monkeypatch.undo()
    p = generate(random.Random(8), kind="misuse")           # fence_region: a fence of a wrong region
    monkeypatch.setattr(differential, "fence_region_boxes",
                        lambda p, t: [cl.Box((0,) * len(p.shapes[t.misuse_arg["b"]]), p.shapes[t.misuse_arg["b"]])])
    with pytest.raises(Mismatch) as info:
        run_and_check(p, cfg)
    assert info.value.tag == "misuse:missed", str(info.value)


@pytest.mark.parametrize("seed,form", [(17, "region_split"), (95, "region"), (71, "region_split")])
def test_region_fences(seed, form):
    """A subrange fence given as a cl.Region of its one box (or of two halves the region merges)
    returns that box's array, as the model says."""
    p = generate(random.Random(seed), kind="main")
    assert f"fence:subrange:{form}" in p.features
    assert any(t.kind == "fence" and t.misuse_arg == form for t in p.tasks)
    run_and_check(p, Config(ranks=2, devices=2))


def test_region_fences_check_fails(monkeypatch):
    """A region_split fence whose region loses its second half: the fence's array differs (``fence``)."""
    from scheduler.geometry import Region
    p = generate(random.Random(17), kind="main")
    import differential
    monkeypatch.setattr(differential, "fence_region", lambda boxes: Region([boxes[0]]))
    with pytest.raises(Mismatch) as info:
        run_and_check(p, Config(ranks=2, devices=2))
    assert info.value.tag == "fence", str(info.value)


@pytest.mark.parametrize("seed,cfg", [(1, Config(ranks=2, devices=2)), (11, Config(ranks=1, devices=1)),
                                      (14, Config(ranks=3, devices=1))])
def test_byte_order_fixed_seeds(seed, cfg):
    """Data buffers in the non-native byte order (``_draw_byte_order``) compute, move and fence the
    model's values, in their own dtype (the checker compares dtypes too)."""
    p = generate(random.Random(seed), kind="main")
    assert "dtype:byte_order" in p.features
    swapped = [k for k, dt in enumerate(p.dtypes) if not np.dtype(dt).isnative]
    assert swapped and all(p.init[k] is None or not p.init[k].dtype.isnative for k in swapped)
    run_and_check(p, cfg)


def test_byte_order_check_fails(monkeypatch):
    """A run whose host-initialized buffer lost the non-native byte order (made from the data in
    the native order): its fence has the wrong dtype (``fence``, "dtype")."""
    import differential
    real = differential._Run._make_buffer

    def native(self, k):
        a = self.p.init[k]
        if a is not None and not a.dtype.isnative:
            return cl.Buffer(a.astype(a.dtype.newbyteorder("=")), name=f"b{k}")
        return real(self, k)
    monkeypatch.setattr(differential._Run, "_make_buffer", native)
    p = generate(random.Random(11), kind="main")         # (b0: host-initialized, swapped, fenced)
    assert not np.dtype(p.dtypes[0]).isnative and p.init[0] is not None
    with pytest.raises(Mismatch) as info:
        run_and_check(p, Config(ranks=1, devices=1))
    assert "dtype" in str(info.value), str(info.value)


# ---- dry runs against real runs (the fuzzer's check_dry_run) -------------------------------------
@pytest.mark.parametrize("seed", [3, 11, 19])
def test_a_dry_run_builds_rank_0s_graphs_of_the_real_run(seed):
    """A main program on 2 or 3 ranks, run for real and as a dry run of as many nodes: the
    dry run records exactly rank 0's tasks, commands, instructions and pilots, runs nothing,
    and a fence of a host object holding a lock fails that fence alone."""
    from differential import check_dry_run, random_config
    p = generate(random.Random(seed), kind="main")
    cfg = program_config(p, replace(random_config(random.Random(seed)), ranks=2 + seed % 2, backend="host",
                                    ahead=None))
    check_dry_run(p, cfg, timeout=120)


def test_the_dry_run_check_fails_where_a_dry_run_fence_of_an_uncopyable_host_object_stops_the_runtime(
        monkeypatch):
    """The check against the defect it was written for: the dry run's stand-in executor
    copying a fenced host object unguarded (as before the fix), so that the lock's TypeError
    stopped the runtime.  Expected: the check fails, naming the dry run and the error."""
    import copy as _copy

    import executor.dry_run as dr
    from differential import check_dry_run, random_config
    monkeypatch.setattr(dr, "snapshot_host_object", lambda obj, hoid, task, copier: _copy.deepcopy(obj))
    p = generate(random.Random(3), kind="main")
    cfg = program_config(p, replace(random_config(random.Random(3)), ranks=2, backend="host", ahead=None))
    with pytest.raises(Mismatch, match=r"\[dry_run\] the dry run failed: .*cannot pickle '_thread.lock'"):
        check_dry_run(p, cfg, timeout=120)


@pytest.mark.timeout(600)
def test_random_config_compiles_replay_builders_at_once_and_repeats_loops_in_a_third_of_the_runs(monkeypatch):
    """A third of the configurations (drawn last: every other field is what the seed gave
    before) compile a replay template's builder at its first replay, so that the fuzzer's
    short programs run compiled builders (and the accesses lists they keep, which direct
    kernel runs keep their launch contexts for); the setting holds while the program runs
    and is put back after, and the results stay the model's."""
    import scheduler.command_replay as cr
    import scheduler.instruction_replay as ir
    import scheduler.replay as rp
    from differential import COMPILE_AFTER_CHOICES
    cfgs = [random_config(random.Random(s * 7919 + 17)) for s in range(600)]
    assert {c.compile_after for c in cfgs} == set(COMPILE_AFTER_CHOICES)
    assert 140 <= sum(c.compile_after == 1 for c in cfgs) <= 260
    default = rp.COMPILE_AFTER
    built = []
    commands_built = []
    real, real_commands = ir._builder, cr._command_builder

    def builder(*a):
        built.append(rp.COMPILE_AFTER)
        return real(*a)

    def command_builder(*a):
        commands_built.append(rp.COMPILE_AFTER)
        return real_commands(*a)

    monkeypatch.setattr(ir, "_builder", builder)
    monkeypatch.setattr(cr, "_command_builder", command_builder)
    # (a third of the configurations make the program's loops four times longer: there
    # steps replay and hit, and compiled builders run)
    from differential import REPEAT_CHOICES
    assert {c.repeat for c in cfgs} == set(REPEAT_CHOICES)
    assert 140 <= sum(c.repeat == 4 for c in cfgs) <= 260
    p = generate(random.Random(1453), kind="main", repeat=4)
    run_and_check(p, Config(devices=2, inline="1000000", compile_after=1))
    assert len(built) >= 3 and set(built) == {1}
    assert len(commands_built) >= 3 and set(commands_built) == {1}     # (command templates too)
    assert rp.COMPILE_AFTER == default
    built.clear()
    commands_built.clear()
    run_and_check(p, Config(devices=2, inline="1000000"))
    assert not built and not commands_built
