"""Random programs must give what a sequential numpy run gives, on every configuration.

``differential.py`` generates the programs and interprets them; ``tests/fuzz.py`` runs
campaigns of thousands and minimises failures.  Here hypothesis draws program seeds and
configurations: ranks 1-4 x host devices 1-4 x lookahead none/auto/infinite x
oversubscription 1/3 x staged/direct transfers.  A seed is not a size, so shrinking it
means nothing: the shrink phase is off and every failure names the command that shows
and minimises that program on that configuration.
"""
import os
import random

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from differential import (GROUPS, HUGE_CHOICES, INLINE_CHOICES, MEMORY_CHOICES, PAUSE_CHOICES, REPLAY_CHOICES, Config,
                          Mismatch, generate, run_and_check)

EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_EXAMPLES", "200"))
GROUP_EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_GROUP_EXAMPLES", "40"))
KIND_EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_KIND_EXAMPLES", "30"))
OPENCL_EXAMPLES = int(os.environ.get("CELERITAS_DIFFERENTIAL_OPENCL_EXAMPLES", "25"))

NO_SHRINK = [Phase.explicit, Phase.reuse, Phase.generate]
configs = st.builds(Config, ranks=st.integers(1, 4), devices=st.integers(1, 4),
                    lookahead=st.sampled_from(["none", "auto", "infinite"]), oversubscribe=st.sampled_from([1, 3]),
                    transfers=st.sampled_from(["staged", "direct"]), replay=st.sampled_from(REPLAY_CHOICES),
                    memory=st.sampled_from(MEMORY_CHOICES), huge=st.sampled_from(HUGE_CHOICES),
                    inline=st.sampled_from(INLINE_CHOICES), pause=st.sampled_from(PAUSE_CHOICES))


def _check(seed: int, cfg: Config, kind=None, groups=GROUPS) -> None:
    prog = generate(random.Random(seed), kind=kind, groups=groups)
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
}


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("focus", sorted(FOCUS))
def test_feature_group_matches_numpy(focus):
    @settings(max_examples=GROUP_EXAMPLES, deadline=None, phases=NO_SHRINK, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(seed=st.integers(0, 2**31 - 1), cfg=configs)
    def run(seed, cfg):
        _check(seed, cfg, kind="main", groups=FOCUS[focus])
    run()


@pytest.mark.timeout(1800)
@pytest.mark.parametrize("kind", ["fail", "bad_reduction", "overlap"])
def test_error_kinds(kind):
    """fail: a KernelError at the next sync and no dependent ran; bad_reduction: an error
    naming the target and both dtypes; overlap: a DiagnosticError whenever chunks overlap."""
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
                   "fail:kernel", "fail:host_task", "overlap:all", "dtype:float32", "red:target_0d"]:
        assert needle in seen, needle
    kinds = {generate(random.Random(s)).kind for s in range(400)}
    assert kinds == {"main", "fail", "bad_reduction", "overlap"}


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
