"""Ranks that submit different task streams and then wait at a fence (not an epoch).

No epoch is announced there, so the epoch comparison never runs; the ranks wait for
each other's data forever.  A rank stalled for a while shows its right neighbour the
tasks it submitted since its last epoch, and the neighbour compares them with its own
over the task ids both lists cover (executor/mpi/divergence.py).  These tests pin: the
comparison itself (``EpochCheck`` over an in-memory wire: prefixes, stretches after
different epochs, the digest limit, the entries resent), the error on 2 and 4 simulated
ranks and under a real ``mpiexec -n 2``, and that a rank that is merely late (longer
than the divergence timeout) is no divergence.
"""
from __future__ import annotations

import re
import subprocess
import sys
import time
from collections import defaultdict, deque

import numpy as np
import pytest
from jobs import (
    MPIEXEC,
    ROOT,
    clean_env,
    explain,
    job_or_none,
    needs_mpi,
)

import celeritas as cl
from celeritas.testing import run_cluster
from executor.mpi.divergence import EpochCheck
from scheduler.task_graph import (
    ACCESS_MODE_IDS,
    BUFFER_CREATED,
    DIGEST_LIMIT,
    DIGEST_MORE,
)

pytestmark = [pytest.mark.timeout(180), pytest.mark.usefixtures("clean_environment")]




# the parenthesis of a difference found from the pending tasks, or at the next epoch (a
# rank whose left neighbour is found out first may reach that epoch)
FOUND = (r"\((among T\d+\.\.T\d+, which both submitted since their last epoch, compared while a rank waited "
         r"at a fence or for data|after epoch T0, epoch #1)\)")


# ---------------------------------------------------------------- EpochCheck over a wire


class _Wire:
    """The ``isend``/``improbe`` calls EpochCheck makes, in memory, one queue per
    (sender, receiver); every message is kept in ``sent`` for inspection."""

    def __init__(self):
        self.queues: dict = defaultdict(deque)
        self.sent: list = []

    def endpoint(self, rank: int) -> _End:
        return _End(self, rank)


class _Msg:
    def __init__(self, payload=None):
        self.payload = payload

    def Test(self):
        return True

    def irecv(self):
        return self

    def test(self):
        return True, self.payload


class _End:
    def __init__(self, wire: _Wire, rank: int):
        self.wire, self.rank = wire, rank

    def isend(self, payload, dest, tag=0):
        self.wire.queues[(self.rank, dest)].append(payload)
        self.wire.sent.append((self.rank, dest, payload))
        return _Msg()

    def improbe(self, source, tag=0):
        q = self.wire.queues[(source, self.rank)]
        return _Msg(q.popleft()) if q else None


def _checks(pending: list[list], timeout: float = 2.0) -> tuple[_Wire, list[EpochCheck]]:
    """One EpochCheck per rank of a ring, ``pending[r]`` (a list the test may grow) as
    rank r's pending tasks, comparing and sending at every poll."""
    wire = _Wire()
    n = len(pending)
    checks = []
    for r in range(n):
        chk = EpochCheck(wire.endpoint(r), r, n, timeout)
        chk.PENDING_RECHECK = 0.0
        chk.pending_tasks = lambda after=None, _mine=pending[r]: list(_mine)
        checks.append(chk)
    return wire, checks


def _k(tid: int, name: str = "step", rng=(16,), acc=((0, "read_write"),)) -> tuple:
    """A kernel's digest entry; ``acc``: its accesses as (buffer id, mode name)."""
    return (tid, "device_compute", name, list(rng), tuple((b, ACCESS_MODE_IDS[m]) for b, m in acc))


RW0 = ((0, ACCESS_MODE_IDS["read_write"]),)     # _k's accesses, as the wire carries them


FENCE = "fence"


def _fence(tid: int) -> tuple:
    return (tid, FENCE, "fence", [])


def test_a_stalled_rank_sends_its_pending_tasks_once_past_the_stall_time_and_then_only_what_is_new():
    mine = [_k(1), _k(2)]
    wire, (c0, c1) = _checks([mine, []], timeout=2.0)
    c0.poll(stalled=0.4)                # (below timeout / 4)
    assert wire.sent == []
    c0.poll(stalled=0.5)
    assert wire.sent == [(0, 1, ("pending", 0, [(1, "device_compute", "step", (16,), RW0),
                                                (2, "device_compute", "step", (16,), RW0)]))]
    c0.poll(stalled=3.0)                # unchanged: nothing more
    assert len(wire.sent) == 1
    mine.append(_fence(3))
    c0.poll(stalled=4.0)
    assert wire.sent[1] == (0, 1, ("pending", 2, [(3, FENCE, "fence", (), ())]))
    c1.poll()
    assert c1._left_pending == [(1, "device_compute", "step", (16,), RW0), (2, "device_compute", "step", (16,), RW0),
                                (3, FENCE, "fence", (), ())]


def test_a_shorter_stream_is_no_divergence_however_it_grows():
    """The slower rank holds a prefix of the other's stream: no error, neither while it
    catches up nor after it went past the other's list."""
    fast, slow = [_k(1), _k(2), _k(3), _fence(4)], []
    _wire, (c0, c1) = _checks([fast, slow])
    c0.poll(stalled=10.0)
    for entry in [_k(1), _k(2), _k(3), _fence(4), _k(5), _k(6)]:
        slow.append(entry)
        c1.poll(stalled=10.0)
        c0.poll(stalled=10.0)
    assert not c0._failed and not c1._failed


@pytest.mark.parametrize("left_is", ["longer", "shorter"])
def test_a_different_task_inside_both_lists_is_a_divergence_naming_both_tasks(left_is):
    three = [_k(1), _k(2), _k(3), _fence(4)]
    two = [_k(1), _k(2), _fence(3)]
    wire, (c0, c1) = _checks([three, two] if left_is == "longer" else [two, three])
    c0.poll(stalled=10.0)
    with pytest.raises(cl.DivergenceError) as ei:
        c1.poll()
    l3, r3 = (("T3 (device_compute 'step', range [16])", "T3 (a fence)") if left_is == "longer"
              else ("T3 (a fence)", "T3 (device_compute 'step', range [16])"))
    assert str(ei.value) == (
        "ranks 0 and 1 submitted different task streams; the first differing task (among T1..T3, which both "
        "submitted since their last epoch, compared while a rank waited at a fence or for data): "
        f"rank 0 submitted {l3}; rank 1 submitted {r3}")
    c1.poll(stalled=10.0)       # (quiet after the error)
    assert [m for m in wire.sent if m[0] == 1] == []


def test_only_the_ids_both_lists_cover_are_compared():
    """The left rank is past an epoch at T4: its list starts at T5.  A difference at T2
    (the epoch comparison's business) is not compared; one at T6 is."""
    left = [_k(5), _k(6, "a"), _k(7)]
    right = [_k(1), _k(2, "other"), _k(3), (4, "device_compute", "not an epoch here", [16]), _k(5)]
    _wire, (c0, c1) = _checks([left, right])
    c0.poll(stalled=10.0)
    c1.poll()
    assert not c1._failed
    right.append(_k(6, "b"))
    with pytest.raises(cl.DivergenceError, match=re.escape(
            "(among T5..T6, which both submitted since their last epoch, compared while a rank waited at a fence "
            "or for data): rank 0 submitted T6 (device_compute 'a', range [16]); rank 1 submitted T6 "
            "(device_compute 'b', range [16])")):
        c1.poll()


def test_tasks_past_the_digest_limit_are_not_compared():
    """A digest keeps the first DIGEST_LIMIT entries: past its last real entry (the
    DIGEST_MORE marker) nothing is known, so a different T3 there is no error."""
    left = [_k(1), _k(2), (3, DIGEST_MORE, "", [])]
    right = [_k(1), _k(2), _k(3, "other"), _fence(4)]
    wire, (c0, c1) = _checks([left, right])
    c0.poll(stalled=10.0)
    assert wire.sent[0][2] == ("pending", 0, [(1, "device_compute", "step", (16,), RW0),
                                              (2, "device_compute", "step", (16,), RW0)])
    c1.poll()
    c1.poll(stalled=10.0)
    c0.poll()
    assert not c0._failed and not c1._failed


@pytest.mark.parametrize("other, said", [
    (((1, "read_write"),), "accesses B1 read_write"),
    (((0, "read"),), "accesses B0 read"),
    (((0, "read_write"), (1, "discard_write")), "accesses B0 read_write, B1 discard_write"),
    ((), "no buffer accesses")])
def test_a_task_accessing_other_buffers_or_modes_is_a_divergence_naming_its_accesses(other, said):
    """The same name and range, but other buffers or modes on rank 1: the entries differ
    in their accesses, and the message names them (only there: elsewhere it does not)."""
    left = [_k(1), _k(2), _fence(3)]
    right = [_k(1), _k(2, acc=other), _fence(3)]
    _wire, (c0, c1) = _checks([left, right])
    c0.poll(stalled=10.0)
    with pytest.raises(cl.DivergenceError) as ei:
        c1.poll()
    assert str(ei.value) == (
        "ranks 0 and 1 submitted different task streams; the first differing task (among T1..T3, which both "
        "submitted since their last epoch, compared while a rank waited at a fence or for data): "
        f"rank 0 submitted T2 (device_compute 'step', range [16], accesses B0 read_write); "
        f"rank 1 submitted T2 (device_compute 'step', range [16], {said})")


def test_fences_of_different_buffers_name_their_accesses():
    read = ACCESS_MODE_IDS["read"]
    left = [_k(1), (2, FENCE, "fence", [], ((0, read),))]
    right = [_k(1), (2, FENCE, "fence", [], ((1, read),))]
    _wire, (c0, c1) = _checks([left, right])
    c0.poll(stalled=10.0)
    with pytest.raises(cl.DivergenceError, match=re.escape(
            "rank 0 submitted T2 (a fence, accesses B0 read); rank 1 submitted T2 (a fence, accesses B1 read)")):
        c1.poll()


def test_a_pending_list_past_an_epoch_not_yet_announced_is_compared_up_to_what_both_cover():
    """Rank 0's application is past its epoch T3 (listed in its pending tasks, its executor
    not there yet); rank 1 submitted T3 as a kernel instead: found at T3.  Where both list
    the epoch, the tasks after it on one rank only are no divergence."""
    epoch = (3, "epoch", "none", [], ())
    left = [_k(1), _k(2), epoch, _k(4)]
    _wire, (c0, c1) = _checks([left, [_k(1), _k(2), epoch]])
    c0.poll(stalled=10.0)
    c1.poll(stalled=10.0)
    c0.poll()
    assert not c0._failed and not c1._failed
    _wire, (c0, c1) = _checks([left, [_k(1), _k(2), _k(3), _fence(4)]])
    c0.poll(stalled=10.0)
    with pytest.raises(cl.DivergenceError, match=re.escape(
            "rank 0 submitted T3 (epoch of q.wait()); rank 1 submitted T3 (device_compute 'step', range [16])")):
        c1.poll()


def test_a_buffer_made_on_one_rank_only_names_the_task_the_other_submitted_there():
    left = [(1, BUFFER_CREATED, "B1 float64", [4]), _k(1), _fence(2)]
    right = [_k(1), _fence(2)]
    _wire, (c0, c1) = _checks([left, right])
    c0.poll(stalled=10.0)
    with pytest.raises(cl.DivergenceError, match=re.escape(
            "rank 0 submitted buffer B1 float64 of shape (4,) (made before T1); rank 1 submitted T1 "
            "(device_compute 'step', range [16])")):
        c1.poll()


def test_in_a_ring_of_four_the_ranks_beside_the_odd_one_find_it():
    same = [_k(1), _k(2), _fence(3)]
    odd = [_k(1), _k(2, "other"), _fence(3)]
    _wire, checks = _checks([list(same), list(same), list(same), odd])
    found = {}
    for _ in range(2):      # (every rank stalled: each sends, then compares what came)
        for r in range(4):
            try:
                checks[r].poll(stalled=10.0)
            except cl.DivergenceError as exc:
                found[r] = str(exc)
    assert sorted(found) == [0, 3]      # rank 3 against its left (2), rank 0 against its left (3)
    assert "ranks 2 and 3 submitted different task streams" in found[3]
    assert "rank 2 submitted T2 (device_compute 'step', range [16]); rank 3 submitted T2 " \
           "(device_compute 'other', range [16])" in found[3]
    assert "rank 3 submitted T2 (device_compute 'other', range [16]); rank 0 submitted T2 " \
           "(device_compute 'step', range [16])" in found[0]


def test_checkpoints_that_differ_behind_the_listed_tasks_are_a_divergence_naming_where():
    """The pending tasks agree over T5..T7, but the stream hashes were folded to different
    values at T3 (past what the lists reach): the ranks differ at or before T3.  Where the
    checkpoints agree, or cover no common ids, that is no divergence."""
    left, right = [_k(5), _k(6), _k(7)], [_k(5), _k(6), _k(7), _fence(8)]

    def run(marks_left, marks_right):
        _wire, (c0, c1) = _checks([left, right])
        c0.stream_checkpoints = lambda: marks_left
        c1.stream_checkpoints = lambda: marks_right
        c0.poll(stalled=10.0)
        c1.poll()
        return c1

    assert not run((0, 7, [(0, 11), (3, 12)]), (0, 8, [(0, 11), (3, 12)]))._failed
    assert not run((4, 7, [(6, 13)]), (0, 3, [(0, 11), (3, 99)]))._failed     # (nothing both cover)
    for theirs in ([(0, 11), (3, 99)], [(0, 11), (2, 12)], [(0, 11)]):
        with pytest.raises(cl.DivergenceError, match=re.escape(
                "ranks 0 and 1 submitted different task streams; they differ at or before T" +
                ("2" if theirs[-1][0] == 2 else "3") + ", earlier than the tasks they still list")) as ei:
            run((0, 7, [(0, 11), (3, 12)]), (0, 8, theirs))
        assert str(ei.value).endswith("; the tasks both list, T5..T7, agree"), ei.value


def test_a_stalled_stretch_is_dropped_once_an_epoch_after_its_start_matched_and_a_new_one_is_kept():
    """The left rank stalled before epoch T3 and listed T1, T2.  Once both ranks' T3 epochs
    matched, that stretch is done with: later polls no longer read this rank's pending tasks
    to compare with it (they did once a second for the rest of the run).  A stretch the
    neighbour sends after the epoch, in the same batch of messages as the epoch, is kept."""
    from scheduler.instruction_graph import EpochInstruction

    def epoch(check):
        check.announce(EpochInstruction(id=7, task=3, stream_hash=1234, digest=[_k(1), _k(2)]))

    reads = [0]

    def counted(chk, entries):
        def pending(after=None):
            reads[0] += 1
            return list(entries)
        chk.pending_tasks = pending

    left = [_k(1), _k(2)]
    _wire, (c0, c1) = _checks([left, [_k(1)]])
    c0.poll(stalled=10.0)
    c1.poll()
    assert c1._left_pending == [(1, "device_compute", "step", (16,), RW0), (2, "device_compute", "step", (16,), RW0)]
    epoch(c0)
    epoch(c1)
    c1.poll()
    assert c1._verified == 0 and c1._left_pending is None and c1._left_marks is None
    counted(c1, [_k(4)])
    for _ in range(3):
        c1.poll()
    assert reads[0] == 0 and not c1._failed

    # the neighbour's epoch and its next stretch arrive together: the new stretch stays
    _wire, (c0, c1) = _checks([left, [_k(1)]])
    c0.poll(stalled=10.0)
    c1.poll()
    epoch(c0)
    left[:] = [_k(4), _k(5)]
    c0.poll(stalled=20.0)
    epoch(c1)
    c1.poll()
    assert c1._verified == 0
    assert c1._left_pending == [(4, "device_compute", "step", (16,), RW0), (5, "device_compute", "step", (16,), RW0)]
    counted(c1, [_k(4), _k(5, "other")])
    with pytest.raises(cl.DivergenceError, match=re.escape("rank 0 submitted T5 (device_compute 'step'")):
        c1.poll()


# ---------------------------------------------------------------- simulated clusters


def _touch(b, name="step", n=16):
    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((n,), lambda c: w.__setitem__(c, w[c] + 1), name=name)
    return cgf


def _sleeping_touch(b, name, seconds):
    """_touch whose chunk (on this rank) first sleeps ``seconds``."""
    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)

        def kernel(c):
            time.sleep(seconds)
            w[c] = w[c] + 1
        cgh.parallel_for((16,), kernel, name=name)
    return cgf


def _run_recording_stage(program, nodes: int, **env) -> tuple[BaseException, dict]:
    """run_cluster's error, and where each rank's program stood when it raised."""
    stages: dict = {}

    def wrapped(rank):
        stages[rank] = "start"
        try:
            return program(rank, stages)
        except BaseException:
            stages[rank] += " (raised)"
            raise

    with pytest.raises(cl.CeleritasError) as ei:
        run_cluster(wrapped, nodes=nodes, timeout=60, CELERITAS_DEVICES="host:1", **env)
    return ei.value, stages


@pytest.mark.parametrize("odd", [(3,), (2, 3)], ids=["rank3", "ranks2and3"])
def test_four_ranks_where_the_last_ones_submit_an_extra_kernel_before_a_fence(odd):
    """Input (4 simulated ranks, CELERITAS_DIVERGENCE_TIMEOUT=2): the ranks in ``odd``
    submit three kernels on b, the others two; all fence b.  Expected: a DivergenceError
    from a rank whose left neighbour differs, naming both ranks' T3, raised by the fence."""
    def program(rank, stages):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        for _ in range(3 if rank in odd else 2):
            q.submit(_touch(b))
        stages[rank] = "fence"
        return q.fence(b).result(timeout=30)

    err, stages = _run_recording_stage(program, 4, CELERITAS_DIVERGENCE_TIMEOUT="2")
    assert type(err) is cl.DivergenceError, err
    msg = str(err)
    m = re.match(r"ranks (\d) and (\d) submitted different task streams; the first differing task " + FOUND, msg)
    assert m, msg
    left, me = int(m.group(1)), int(m.group(2))
    assert me == (left + 1) % 4 and (left in odd) != (me in odd), msg
    extra, fence = "T3 (device_compute 'step', range [16])", "T3 (a fence)"
    assert (f"rank {left} submitted {extra if left in odd else fence}; "
            f"rank {me} submitted {extra if me in odd else fence}") in msg, msg
    assert stages[me] == "fence (raised)", stages


def test_a_kernel_renamed_on_one_rank_before_a_fence_is_found_while_the_fence_waits():
    """Input (2 simulated ranks, CELERITAS_DIVERGENCE_TIMEOUT=2): both submit two kernels
    on b, rank 1's second named 'other', whose chunk sleeps 4 s on rank 1; both fence b.
    (The same number of tasks: the transfers match, and only the slow kernel keeps the
    fence waiting.)  Expected: the fence raises DivergenceError naming 'step' on rank 0
    and 'other' on rank 1 at T2, before the kernel ends."""
    def program(rank, stages):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        q.submit(_touch(b))
        q.submit(_sleeping_touch(b, "other" if rank == 1 else "step", 4.0 if rank == 1 else 0.0))
        stages[rank] = "fence"
        return q.fence(b).result(timeout=30)

    err, stages = _run_recording_stage(program, 2, CELERITAS_DIVERGENCE_TIMEOUT="2")
    assert type(err) is cl.DivergenceError, err
    msg = str(err)
    assert re.search(r"submitted different task streams; the first differing task \(among T1\.\.T\d+, which both "
                     r"submitted since their last epoch", msg), msg
    assert "rank 0 submitted T2 (device_compute 'step', range [16])" in msg, msg
    assert "rank 1 submitted T2 (device_compute 'other', range [16])" in msg, msg
    assert "fence (raised)" in stages.values(), stages


@pytest.mark.parametrize("nodes", [2, 4])
def test_a_kernel_writing_another_buffer_on_one_rank_before_a_fence_is_a_divergence(nodes):
    """Input (2 or 4 simulated ranks, CELERITAS_DIVERGENCE_TIMEOUT=2): every rank makes b and
    c and submits the kernel 'step' over [16], which writes b on every rank but the last,
    where it writes c; all fence b.  The names and ranges agree: only the accesses differ.
    (Before the accesses were in the digest, the ranks waiting for the last one's part of b
    waited forever, the last rank's shutdown epoch timing out.)  Expected: a DivergenceError
    naming T1's accesses on both ranks of the pair, B0 read_write against B1 read_write."""
    odd = nodes - 1

    def program(rank, stages):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        c = cl.Buffer(np.arange(16.0), name="c")
        q.submit(_touch(c if rank == odd else b))
        stages[rank] = "fence"
        return q.fence(b).result(timeout=30)

    err, stages = _run_recording_stage(program, nodes, CELERITAS_DIVERGENCE_TIMEOUT="2")
    assert type(err) is cl.DivergenceError, err
    msg = str(err)
    m = re.match(r"ranks (\d) and (\d) submitted different task streams; the first differing task " + FOUND, msg)
    assert m, msg
    left, me = int(m.group(1)), int(m.group(2))
    assert me == (left + 1) % nodes and odd in (left, me), msg
    said = {r: f"T1 (device_compute 'step', range [16], accesses B{1 if r == odd else 0} read_write)"
            for r in (left, me)}
    assert f"rank {left} submitted {said[left]}; rank {me} submitted {said[me]}" in msg, msg


@pytest.mark.parametrize("nodes", [2, 4])
@pytest.mark.parametrize("late", ["before_submitting", "between_kernels", "in_a_host_task"])
def test_a_rank_late_longer_than_the_divergence_timeout_is_no_divergence(nodes, late):
    """Input (2 or 4 simulated ranks, CELERITAS_DIVERGENCE_TIMEOUT=1): the same three
    kernels and a fence of b on every rank, but the last rank sleeps 3 s before its first
    submit / between its first and second kernel / in its chunk of a host task on b
    between them, while the others wait at their fence (stalled, showing their pending tasks).
    Expected: every rank's fence gives arange(16) + 3, and a barrier after it passes."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        lazy = rank == nodes - 1
        if late == "before_submitting" and lazy:
            time.sleep(3.0)
        q.submit(_touch(b))
        if late == "between_kernels" and lazy:
            time.sleep(3.0)
        if late == "in_a_host_task":
            def nap(cgh):
                b.access(cgh, cl.one_to_one(), cl.read_write)
                cgh.host_task(lambda chunk: time.sleep(3.0) if lazy else None, range=(16,), name="nap")
            q.submit(nap)
        q.submit(_touch(b))
        q.submit(_touch(b))
        got = q.fence(b).result(timeout=60)
        q.wait(barrier=True)
        return got.tolist()

    results = run_cluster(program, nodes=nodes, timeout=90, CELERITAS_DEVICES="host:1",
                          CELERITAS_DIVERGENCE_TIMEOUT="1")
    assert results == [(np.arange(16.0) + 3).tolist()] * nodes


# ---------------------------------------------------------------- groups, host objects, reductions, host data


def _collective_reading(b, group):
    """A collective host task in ``group`` reading all of b, its partition joining the
    group's barrier (which never completes where the ranks chose different groups)."""
    def cgf(cgh):
        b.access(cgh, cl.all(), cl.read)
        cgh.host_task(lambda p: p.comm.barrier(), on=cl.collective(group), name="coll")
    return cgf


def test_ranks_in_different_collective_groups_before_a_fence_are_found_while_the_fence_waits():
    """Input (2 simulated ranks, CELERITAS_DIVERGENCE_TIMEOUT=2): both make groups g1 and
    g2; rank 0 runs a collective host task reading b in g1, rank 1 the same task in g2
    (both then wait in their group's barrier forever); both then touch and fence b.  The
    tasks agree in kind, name, range and accesses.  (Before, the stalled ranks' pending
    tasks agreed and the fence waited until its own timeout: only an epoch, never reached,
    compared the groups.)  Expected: the fence raises DivergenceError naming T1 in
    collective group 2 on rank 0 and 3 on rank 1 (group 1 is cl.collective's own)."""
    def program(rank, stages):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        groups = cl.CollectiveGroup(), cl.CollectiveGroup()
        q.submit(_collective_reading(b, groups[rank]))
        q.submit(_touch(b))
        stages[rank] = "fence"
        return q.fence(b).result(timeout=30)

    err, stages = _run_recording_stage(program, 2, CELERITAS_DIVERGENCE_TIMEOUT="2")
    assert type(err) is cl.DivergenceError, err
    msg = str(err)
    assert re.search(r"submitted different task streams; the first differing task " + FOUND, msg), msg
    for r in (0, 1):
        assert (f"rank {r} submitted T1 (collective 'coll', range [2], accesses B0 read, in collective group "
                f"{2 + r})") in msg, msg
    assert "fence (raised)" in stages.values(), stages


def test_a_reduction_on_one_rank_only_before_a_fence_is_found_while_the_fence_waits():
    """Input (2 simulated ranks, CELERITAS_DIVERGENCE_TIMEOUT=30): the kernel 'sum' over b
    reduces into c on rank 0 and reduces nothing on rank 1; both fence c (rank 0 waits for
    rank 1's partial sum).  (Before, the entries agreed, and rank 1's shutdown epoch timed
    out after 30 s naming no task.)  Expected: a DivergenceError within the timeout naming
    T1's reduction into B1 on rank 0 and none on rank 1."""
    def program(rank, stages):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        c = cl.Buffer(np.zeros(1), name="c")

        def cgf(cgh):
            r = b.access(cgh, cl.one_to_one(), cl.read)
            if rank == 0:
                red = cl.reduction(c, cgh, cl.plus)
                cgh.parallel_for((16,), lambda ch, s: s.combine(r[ch]), name="sum", reductions=[red])
            else:
                cgh.parallel_for((16,), lambda ch: None, name="sum")
        q.submit(cgf)
        stages[rank] = "fence"
        return q.fence(c).result(timeout=60)

    t0 = time.monotonic()
    err, _stages = _run_recording_stage(program, 2, CELERITAS_DIVERGENCE_TIMEOUT="30")
    assert type(err) is cl.DivergenceError, err
    assert time.monotonic() - t0 < 25, err
    msg = str(err)
    assert "rank 0 submitted T1 (device_compute 'sum', range [16], accesses B0 read, reduction into B1 " \
           "(its value included))" in msg, msg
    assert "rank 1 submitted T1 (device_compute 'sum', range [16], accesses B0 read)" in msg, msg


@pytest.mark.parametrize("differ", ["side_effect", "host_data"])
def test_a_side_effect_or_a_buffers_host_data_on_one_rank_only_is_a_divergence_naming_it(differ):
    """Input (2 simulated ranks): ``side_effect``: a host task on the master node with a
    side effect on host object H0 on rank 0 only (before, the stream hash left side effects
    out: the ranks finished without an error); ``host_data``: buffer c made from an array on
    rank 0, from a shape and dtype on rank 1 (before, named only as 'different collective
    groups or buffers initialized on one rank'); then q.wait().  Expected: a DivergenceError
    naming the task's side effect, or c with and without data, on both ranks."""
    def program(rank):
        q = cl.Queue()
        ho = cl.HostObject([])
        if differ == "host_data":
            c = cl.Buffer(np.zeros(4)) if rank == 0 else cl.Buffer(shape=(4,), dtype=np.float64)
            q.submit(_touch(c, n=4))
        else:
            def cgf(cgh):
                if rank == 0:
                    cl.side_effect(ho, cgh)
                cgh.host_task(lambda p: None, on=cl.on_master_node, name="note")
            q.submit(cgf)
        q.wait()

    with pytest.raises(cl.DivergenceError) as ei:
        run_cluster(program, nodes=2, timeout=60, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="10")
    msg = str(ei.value)
    said = ({0: "T1 (master_node 'note', range [], no buffer accesses, side effect on host object H0)",
             1: "T1 (master_node 'note', range [], no buffer accesses)"} if differ == "side_effect" else
            {0: "buffer B0 float64 of shape (4,), with data (made before T1)",
             1: "buffer B0 float64 of shape (4,), without data (made before T1)"})
    assert f"rank 0 submitted {said[0]}" in msg and f"rank 1 submitted {said[1]}" in msg, msg


def _quick_touch(b, name="step"):
    def cgf(cgh):
        b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((16,), lambda c: None, name=name)
    return cgf


def _read_all_on_master(b):
    """A master-node host task reading all of ``b``: it waits for every rank's part."""
    def cgf(cgh):
        b.access(cgh, cl.all(), cl.read)
        cgh.host_task(lambda p: None, on=cl.on_master_node, name="read_all")
    return cgf


@pytest.mark.parametrize("odd", [0, 1, 2])
def test_ranks_blocked_in_the_in_process_barrier_leave_the_divergence_to_be_found(odd):
    """Input (3 simulated ranks, no divergence timeout): every rank touches b; rank ``odd``
    then submits a kernel 'extra' and a master-node task reading all of b and fences b; the
    others wait at q.wait(barrier=True), and the one whose left neighbour matches blocks in
    the in-process barrier (a threading.Barrier, which does not poll the divergence check as
    MPI's barrier wait does).  That costs nothing: a rank enters the barrier only once its
    left neighbour's matching epoch arrived, its own announcement went out before, and its
    application, waiting in q.wait(), submits nothing the neighbours could need to see.
    Expected: a DivergenceError naming T2, the extra kernel against the barrier epoch, at once
    (before, the same: this pins it)."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        q.submit(_quick_touch(b))
        if rank != odd:
            q.wait(barrier=True)
            return None
        q.submit(_quick_touch(b, "extra"))
        q.submit(_read_all_on_master(b))
        return q.fence(b).result(timeout=30)

    t0 = time.monotonic()
    with pytest.raises(cl.DivergenceError) as ei:
        run_cluster(program, nodes=3, timeout=60, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="off")
    assert time.monotonic() - t0 < 20, ei.value
    assert re.search(r"rank \d submitted T2 \((barrier epoch of q.wait\(barrier=True\)|device_compute 'extra', "
                     r"range \[16\])\); rank \d submitted T2", str(ei.value)), ei.value


# ---------------------------------------------------------------- past the newest DIGEST_LIMIT tasks


LONG = DIGEST_LIMIT + 100       # tasks between epochs: more than the pending tasks list


def test_a_difference_behind_the_newest_listed_tasks_is_found_at_a_fence_by_hash():
    """Input (2 simulated ranks, no divergence timeout): rank 1 submits a kernel 'extra' on b
    first; then both submit DIGEST_LIMIT + 100 kernels 'step' on b and fence b (waiting for
    each other's part, their fences being different tasks).  The newest DIGEST_LIMIT tasks both
    list agree up to the fence.  (Before, the error named a task at the end as 'the first
    differing task'.)  Expected: a DivergenceError saying the ranks differ at or before the
    first stream-hash checkpoint (T1023, within the first 1024 tasks), before what they list."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        if rank == 1:
            q.submit(_quick_touch(b, "extra"))
        for _ in range(LONG):
            q.submit(_quick_touch(b))
        return q.fence(b).result(timeout=60)

    with pytest.raises(cl.DivergenceError) as ei:
        run_cluster(program, nodes=2, timeout=120, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="off")
    msg = str(ei.value)
    m = re.search(r"submitted different task streams; they differ at or before T(\d+), earlier than the tasks they "
                  r"still list", msg)
    assert m and int(m.group(1)) < 1024, msg


def test_a_rank_past_the_newest_listed_tasks_is_found_where_its_neighbours_barrier_epoch_lies():
    """Input (2 simulated ranks, no divergence timeout): both submit DIGEST_LIMIT + 100 kernels
    on b; rank 0 then waits at q.wait(barrier=True), rank 1 submits a kernel 'extra' and a
    master-node task reading all of b and fences b (waiting for rank 0's part).  Rank 1's
    pending tasks no longer start at the last epoch, so its stretch cannot be compared with
    rank 0's epoch by the tasks.  (Before, the job hung: rank 0 waited for rank 1's epoch, rank
    1 for rank 0's data.)  Expected: a DivergenceError saying the streams differ at or before
    rank 0's barrier epoch."""
    def program(rank):
        q = cl.Queue()
        b = cl.Buffer(np.arange(16.0), name="b")
        for _ in range(LONG):
            q.submit(_quick_touch(b))
        if rank == 0:
            q.wait(barrier=True)
            return None
        q.submit(_quick_touch(b, "extra"))
        q.submit(_read_all_on_master(b))
        return q.fence(b).result(timeout=60)

    with pytest.raises(cl.DivergenceError) as ei:
        run_cluster(program, nodes=2, timeout=120, CELERITAS_DEVICES="host:1", CELERITAS_DIVERGENCE_TIMEOUT="off")
    msg = str(ei.value)
    assert re.search(r"ranks 0 and 1 submitted different task streams; they differ at or before T(\d+), rank 0's "
                     r"barrier epoch of q.wait\(barrier=True\) \(epoch #1; compared by stream hash", msg), msg


# ---------------------------------------------------------------- a real mpiexec -n 2


_env = clean_env


def _job(argv: list, env: dict, timeout: float) -> subprocess.CompletedProcess | None:
    return job_or_none(argv, env, timeout, cwd=ROOT)


_explain = explain


SCRIPT = """\
import numpy as np
import celeritas as cl

q = cl.Queue()
b = cl.Buffer(np.arange(16.0), name="b")
for _ in range({counts}[q.rank]):
    def cgf(cgh):
        w = b.access(cgh, cl.one_to_one(), cl.read_write)
        cgh.parallel_for((16,), lambda c: w.__setitem__(c, w[c] + 1), name="step")
    q.submit(cgf)
total = q.fence(b).result().sum()
print(f"rank {{q.rank}} fence {{total}}", flush=True)   # (one write: the ranks share stdout)
"""


@needs_mpi
@pytest.mark.mpi
@pytest.mark.parametrize("counts, ends", [((3, 2), "divergence"), ((3, 3), "normally")])
def test_ranks_submitting_different_task_counts_before_a_fence_under_mpiexec(tmp_path, counts, ends):
    """Input: mpiexec -n 2 (CELERITAS_DIVERGENCE_TIMEOUT=2), rank 0 submits three kernels on
    b, rank 1 two, then both print their fence of b.  Expected: the job ends non-zero with
    the DivergenceError naming T3 on both ranks instead of hanging; with three kernels on
    both it prints both sums (120 + 3*16)."""
    script = tmp_path / "s.py"
    script.write_text(SCRIPT.format(counts=counts))
    r = _job([MPIEXEC, "-n", "2", sys.executable, script],
             _env({"CELERITAS_DEVICES": "host:1", "CELERITAS_DIVERGENCE_TIMEOUT": "2"}), timeout=90)
    assert r is not None, _explain(r)
    if ends == "normally":
        assert r.returncode == 0, _explain(r)
        assert "rank 0 fence 168.0" in r.stdout and "rank 1 fence 168.0" in r.stdout, _explain(r)
        return
    assert r.returncode != 0, _explain(r)
    assert "fence" not in r.stdout, _explain(r)
    assert "DivergenceError: ranks" in r.stderr and "submitted different task streams" in r.stderr, _explain(r)
    assert re.search(r"rank 0 submitted T3 \(device_compute 'step', range \[16\]\); rank 1 submitted T3 \(a fence\)"
                     r"|rank 1 submitted T3 \(a fence\); rank 0 submitted T3 \(device_compute 'step', range \[16\]\)",
                     r.stderr), _explain(r)


@needs_mpi
@pytest.mark.mpi
def test_a_rank_waiting_in_a_collective_groups_clone_past_its_epoch_is_found_under_mpiexec():
    """Input: mpiexec -n 2 mpi_scripts/diverge_in_collective_clone.py
    (CELERITAS_DIVERGENCE_TIMEOUT=5): rank 0's collective task waits for the Idup of a
    collective group rank 1 never clones, its application thread already at q.wait(); rank 1
    waits at a fence for rank 0's part of b.  (Once, the job hung: rank 0's executor itself
    waited in the Idup, its pending tasks were those after its q.wait() epoch, which it never
    reached, and it sent none from inside the wait.  Now the task's host lane waits for the
    clone, so the executor reaches the epoch, whose comparison may find the difference
    first.)  Expected: both ranks end with the DivergenceError naming T1, the collective task
    on rank 0 and the kernel on rank 1."""
    r = _job([MPIEXEC, "-n", "2", sys.executable, ROOT / "tests" / "mpi_scripts" / "diverge_in_collective_clone.py"],
             _env({"CELERITAS_DEVICES": "host:1", "CELERITAS_DIVERGENCE_TIMEOUT": "5"}), timeout=90)
    assert r is not None, _explain(r)
    assert r.returncode != 0 and "waited" not in r.stdout and "fence" not in r.stdout, _explain(r)
    assert re.search(r"DivergenceError: ranks [01] and [01] submitted different task streams; the first differing "
                     r"task \((among T1\.\.T2, which both submitted since their last epoch|after epoch T0, epoch #1\))",
                     r.stderr), _explain(r)
    assert re.search(r"rank 1 submitted T1 \(device_compute 'step', range \[16\]\); rank 0 submitted T1 "
                     r"\(collective 'step', range \[2\]\)|rank 0 submitted T1 \(collective 'step', range \[2\]\); "
                     r"rank 1 submitted T1 \(device_compute 'step', range \[16\]\)", r.stderr), _explain(r)
