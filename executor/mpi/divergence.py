"""The divergence check: ranks must submit the same task stream.

Every rank sends ``(epoch number, task-stream hash, digest)`` to its right
neighbour in a ring as soon as the executor receives an epoch, and compares what
its left neighbour sent.  Any difference between any two ranks shows up between
some pair of neighbours, so one message per rank and epoch suffices.  Shutdown
and barrier epochs wait (with a timeout) until the neighbour's matching epoch
arrived.

Fences are not epochs: ranks that submitted different tasks and then fence wait
for each other's data forever, no epoch ever being announced.  So a rank whose
executor has been stalled for a while (work outstanding, nothing completing) also
shows its right neighbour the tasks it submitted since its last epoch (its
"pending" tasks), and the neighbour compares them with its own pending tasks
over the task ids both lists cover.  Streams grow by appending only, so two
snapshots taken at any times must agree wherever both reach: a rank that is
merely slower holds a prefix of the other's stream, which is no error, and no
timeout is involved (a rank may be slow for as long as it likes).

A stretch longer than DIGEST_LIMIT tasks lists only its newest entries; a
difference behind them is found by the stream hash's checkpoints, sent with the
pending tasks (TaskManager.stream_checkpoints: where the hash was folded, and to
what; equal streams fold at the same tasks to the same values), and reported as
lying at or before the first checkpoint that differs.  (Not an order-independent
sum over per-entry hashes: that costs a hash per task on the application thread,
where the folds cost nothing per task, and tells no more.)
"""
from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable

from scheduler.errors import DivergenceError
from scheduler.instruction_graph import EpochInstruction
from scheduler.task_graph import ACCESS_MODE_IDS, BUFFER_CREATED, DIGEST_LIMIT, DIGEST_MORE, EFFECT_IDS, HOST_DATA

from ..communicator import DEFAULT_DIVERGENCE_TIMEOUT  # noqa: F401 - (re-exported: executor.mpi)
from .wire import EPOCH_TAG

log = logging.getLogger("celeritas.mpi")

_PENDING = "pending"     # the first item of a pending-task message (an epoch message starts with its number)


@dataclass(slots=True)
class _EpochInfo:
    seq: int
    task: int
    action: str
    stream_hash: int
    digest: list


def _norm_entry(e: Any) -> tuple:
    """A digest entry (task_graph's DIGEST entries) as ``(id, kind, name, range, accesses)``
    of ints, strings and tuples (an entry without accesses gets ()).  The task graph makes
    them so: those pass as they are (0.07 instead of 1.3 us; 3-4 per task at every epoch)."""
    if len(e) == 5 and type(e[3]) is tuple and type(e[4]) is tuple:
        return e
    tid, kind, name, rng = e[:4]
    acc = tuple([(int(b), int(m)) for b, m in e[4]]) if len(e) > 4 else ()
    return int(tid), str(kind), str(name), tuple([int(x) for x in rng]), acc


_MODE_NAMES = {v: k for k, v in ACCESS_MODE_IDS.items()}
_EFFECT_WORDS = {EFFECT_IDS["collective_group"]: "in collective group {}",
                 EFFECT_IDS["side_effect"]: "side effect on host object H{}",
                 EFFECT_IDS["reduce"]: "reduction into B{}",
                 EFFECT_IDS["reduce_into"]: "reduction into B{} (its value included)"}


_EPOCH_WORDS = {"none": "epoch of q.wait()", "barrier": "barrier epoch of q.wait(barrier=True)",
                "shutdown": "shutdown epoch of q.shutdown() or the program's end", "init": "initial epoch"}


def _describe(e: tuple | None, accesses: bool = False) -> str:
    """An entry in words; ``accesses``: with its buffer accesses (where two entries differ
    in nothing else)."""
    if e is None:
        return "no further task"
    tid, kind, name, rng, acc = e
    if kind == DIGEST_MORE:
        return f"T{tid} and the tasks after it (compared by hash only: the digest lists the first tasks after an epoch)"
    if kind == "epoch":
        return f"T{tid} ({_EPOCH_WORDS.get(name, f'epoch {name!r}')})"
    if kind == BUFFER_CREATED:
        data = ""
        if accesses:        # (the same buffer, made with data on one rank only)
            data = ", with data" if any(m == HOST_DATA for _b, m in acc) else ", without data"
        return f"buffer {name} of shape {tuple(rng)}{data} (made before T{tid})"
    more = f", {_describe_accesses(acc)}" if accesses else ""
    if kind == "fence" and not rng:
        return f"T{tid} (a fence{more})" if name in ("", "fence") else f"T{tid} (fence {name!r}{more})"
    return f"T{tid} ({kind} {name!r}, range {list(rng)}{more})"


def _describe_accesses(acc: tuple) -> str:
    """A task's buffer accesses, then its collective group, side effects and reductions
    (task_graph's EFFECT_IDS)."""
    buffers = [f"B{b} {_MODE_NAMES.get(m, f'mode #{m}')}" for b, m in acc if m not in _EFFECT_WORDS]
    effects = [_EFFECT_WORDS[m].format(i) for i, m in acc if m in _EFFECT_WORDS]
    return ", ".join([("accesses " + ", ".join(buffers)) if buffers else "no buffer accesses"] + effects)


def _describe_pair(ea: tuple | None, eb: tuple | None) -> tuple[str, str]:
    """Two differing entries in words, their accesses named where nothing else differs."""
    acc = ea is not None and eb is not None and ea[:4] == eb[:4]
    return _describe(ea, acc), _describe(eb, acc)


def _stretch(info: _EpochInfo) -> list[tuple]:
    """The tasks of the stretch that ``info``'s epoch closes, the epoch itself last."""
    return info.digest + [(info.task, "epoch", info.action, (), ())]


def _order(e: tuple) -> tuple:
    """Where an entry lies in the stream: a task by its id; a buffer made before task
    ``id`` before that task, by its buffer id (the name starts with it)."""
    if e[1] == BUFFER_CREATED:
        return e[0], 0, int(e[2].split()[0][1:])
    return e[0], 1, 0


def _first_difference(mine: list[tuple], theirs: list[tuple]) -> tuple[tuple | None, tuple | None] | None:
    """(my entry, their entry) of the first task id where the streams differ, or None.

    Compared by task id, since ids are handed out in submission order on every
    rank: a task only one rank submitted, or submitted under another name, kind
    or range, shows up as the first id whose entries differ (one of them may be
    the other rank's epoch, or missing where one stream ends first)."""
    if mine == theirs:      # (the common case, without an _order per entry)
        return None
    a = {_order(e): e for e in mine}
    b = {_order(e): e for e in theirs}
    for tid in sorted(a.keys() | b.keys()):
        ea, eb = a.get(tid), b.get(tid)
        if ea != eb:
            return ea, eb
    return None


def _upto(entries: list[tuple], end: tuple) -> list[tuple]:
    """``entries`` up to ``end`` (an ``_order``) inclusive: they are in stream order, so
    sorted by ``_order``, and only the ones past ``end`` at the back need a look."""
    n = len(entries)
    while n and _order(entries[n - 1]) > end:
        n -= 1
    return entries if n == len(entries) else entries[:n]


def _first_fold_difference(mine: tuple | None, theirs: tuple | None) -> int | None:
    """The first task id, over those both checkpoint lists cover, where one rank folded its
    stream hash and the other did not, or both did to different hashes (the streams differ
    at or before it: TaskManager.stream_checkpoints), or None."""
    if mine is None or theirs is None:
        return None
    lo, hi = max(mine[0], theirs[0]), min(mine[1], theirs[1])
    a = {t: h for t, h in mine[2] if lo <= t <= hi}
    b = {t: h for t, h in theirs[2] if lo <= t <= hi}
    for t in sorted(a.keys() | b.keys()):
        if a.get(t) != b.get(t):
            return t
    return None


class EpochCheck:
    """Compares this rank's task stream with its left neighbour's at every epoch.

    Driven from the executor thread only: ``announce`` when an epoch
    instruction arrives, ``poll`` from the executor loop (and from the
    communicator's own wait loops), ``verified`` before an epoch completes.
    Errors are raised once as ``DivergenceError``; after that the check is quiet
    (the runtime aborts the job).

    ``pending_tasks(after)`` (set by the runtime) returns the digest entries of the tasks
    this rank submitted since its epoch ``after`` (the last one announced here: an epoch
    the application submitted since, which this thread has not seen yet, is listed in
    between), or since its last epoch where it cannot say.  While the neighbour is
    an epoch ahead, they are compared with the neighbour's stretch: a rank that
    submitted a task the neighbour did not, and then blocks (at a fence, on data
    that never comes) before its own epoch, is reported at once and by the task,
    instead of the neighbour timing out knowing nothing of it.
    """

    WAIT_ACTIONS = ("shutdown", "barrier")
    PENDING_RECHECK = 1.0       # s between comparisons of the growing pending tasks, and between sends
    STALL_REPORT = 1.0          # s stalled before a rank sends its pending tasks (at most timeout / 4)

    def __init__(self, comm: Any, rank: int, size: int, timeout: float | None, *,
                 timeout_hint: str | None = None, quick_probe: Callable[[int, int], bool] | None = None):
        self._comm = comm
        # whether a message waits, without giving the GIL away (``progress.QuickProbe``): the
        # executor looks once a millisecond, and a message comes once an epoch
        self._quick_probe = quick_probe
        self._timeout_hint = timeout_hint    # where users set the timeout, named in the timeout error
        self.rank = rank
        self.size = size
        self._left = (rank - 1) % size
        self._right = (rank + 1) % size
        self._timeout = timeout
        self._seq = 0
        self._seq_of_task: dict[int, int] = {}
        self._mine: dict[int, _EpochInfo] = {}
        self._theirs: dict[int, _EpochInfo] = {}
        self._verified = -1               # every epoch up to here matched
        self._last_verified_task: int | None = None
        self._last_announced_task: int | None = None
        self._sends: deque = deque()
        self._recv: Any = None            # irecv of a matched (probed) message
        self._failed = False
        self._wait_started: dict[int, float] = {}
        self._next_pending_check = 0.0
        self.pending_tasks: Callable[[int | None], list] | None = None
        # (set by the runtime) TaskManager.stream_checkpoints: where the stream hash was folded,
        # sent with the pending tasks, so a difference behind the newest DIGEST_LIMIT entries
        # (a long stretch between epochs) is still found at a fence, if only by where it lies
        self.stream_checkpoints: Callable[[], tuple] | None = None
        self._left_marks: tuple | None = None     # the left neighbour's checkpoints, as sent
        # the pending-task exchange (see the module docstring): what this rank last sent its
        # right neighbour (the stretch's first entry, how many entries), and what the left
        # neighbour sent (extended by later sends of the same stretch)
        self._stall_report = self.STALL_REPORT if timeout is None else min(self.STALL_REPORT, timeout / 4)
        self._next_pending_send = 0.0
        self._sent_first: tuple | None = None
        self._sent_count = 0
        self._left_pending: list[tuple] | None = None
        self._left_compared: tuple | None = None   # (my first entry, my count, their count) last compared
        self._mine_cache: list[tuple] = []        # my pending tasks, normalized (see _my_pending)

    @property
    def enabled(self) -> bool:
        return self.size > 1

    # ---- executor hooks
    def announce(self, instr: EpochInstruction) -> None:
        if not self.enabled or instr.task in self._seq_of_task:
            return
        seq = self._seq
        self._seq += 1
        self._seq_of_task[instr.task] = seq
        self._last_announced_task = instr.task
        digest = [_norm_entry(e) for e in instr.digest]
        info = _EpochInfo(seq, instr.task, instr.action, int(instr.stream_hash), digest)
        self._mine[seq] = info
        payload = (seq, instr.task, instr.action, int(instr.stream_hash), digest)
        self._sends.append(self._comm.isend(payload, dest=self._right, tag=EPOCH_TAG))
        self._compare()

    def poll(self, stalled: float = 0.0) -> None:
        """Take in the neighbour's messages and compare.  ``stalled``: for how long (s) the
        executor has had work outstanding and made no progress; past ``STALL_REPORT``
        this rank shows its right neighbour its pending tasks."""
        if not self.enabled or self._failed:
            return
        while self._sends and self._sends[0].Test():
            self._sends.popleft()
        got = False
        quick = self._quick_probe
        while True:
            if self._recv is None:
                if quick is not None and not quick(self._left, EPOCH_TAG):
                    break
                msg = self._comm.improbe(source=self._left, tag=EPOCH_TAG)
                if msg is None:
                    break
                self._recv = msg.irecv()
            flag, payload = self._recv.test()
            if not flag:
                break
            self._recv = None
            if payload[0] == _PENDING:
                self._take_left_pending(payload[1], payload[2], payload[3] if len(payload) > 3 else None)
                got = True
                continue
            seq, task, action, h, digest = payload
            self._theirs[seq] = _EpochInfo(seq, task, action, h, [_norm_entry(e) for e in digest])
            got = True
        if got:
            self._compare()
        if self.pending_tasks is None:
            return
        now = time.monotonic()
        if stalled >= self._stall_report and now >= self._next_pending_send:
            # (sent before comparing: where this rank finds a difference, its right neighbour
            # gets the same chance to, as with epochs, whichever rank's error ends the job)
            self._next_pending_send = now + self.PENDING_RECHECK
            self._send_pending()
        if got or now >= self._next_pending_check:
            self._next_pending_check = now + self.PENDING_RECHECK
            self._compare_pending()
            self._compare_left_pending()

    def verified(self, instr: EpochInstruction) -> bool:
        """True once this epoch may complete: always for plain epochs (checked in the
        background), for shutdown/barrier epochs once the neighbour's matching epoch
        arrived and matched.  Raises DivergenceError on a mismatch or a timeout."""
        if not self.enabled or self._failed or instr.action not in self.WAIT_ACTIONS:
            return True
        seq = self._seq_of_task.get(instr.task)
        if seq is None:
            self.announce(instr)
            seq = self._seq_of_task[instr.task]
        self.poll()
        if seq <= self._verified:
            self._wait_started.pop(seq, None)
            return True
        now = time.monotonic()
        t0 = self._wait_started.setdefault(seq, now)
        waited = now - t0
        if self._timeout is not None and waited >= self._timeout:
            self._failed = True
            hint = f" ({self._timeout_hint} sets the timeout)" if self._timeout_hint else ""
            mine = self._mine.get(seq)
            last = (f"the last epoch both reached is T{self._last_verified_task}"
                    if self._last_verified_task is not None else "no epoch has been compared yet")
            raise DivergenceError(
                f"rank {self.rank} reached epoch #{seq} (T{instr.task}, {instr.action}) but rank {self._left} "
                f"did not submit a matching epoch within {self._timeout:g} s: the ranks submitted different "
                f"work (a different number of epochs, or rank {self._left} is blocked waiting for data "
                f"that this rank's task stream never produces); {last}. Since then this rank submitted "
                f"{self._digest_summary(mine)}{hint}")
        return False

    def pending_wait(self) -> bool:
        return bool(self._wait_started)

    def describe_wait(self, instr: EpochInstruction) -> str | None:
        """What epoch ``instr`` waits for, while it waits for the neighbour's matching epoch."""
        seq = self._seq_of_task.get(instr.task)
        if seq is None or seq <= self._verified or self._failed:
            return None
        return (f"rank {self._left} to reach its epoch matching T{instr.task} ({instr.action}, epoch #{seq}): "
                f"the ranks compare their task streams there")

    # ---- comparison
    def _compare(self) -> None:
        while not self._failed:
            seq = self._verified + 1
            mine = self._mine.get(seq)
            theirs = self._theirs.get(seq)
            if mine is None or theirs is None:
                return
            if mine.stream_hash != theirs.stream_hash or mine.action != theirs.action:
                self._failed = True
                raise DivergenceError(self._mismatch_message(mine, theirs))
            self._verified = seq
            self._last_verified_task = mine.task
            del self._mine[seq]
            del self._theirs[seq]
            left = self._left_pending
            if left and left[0][0] <= mine.task:
                # the neighbour's stalled stretch began before this epoch, which both streams
                # now agree on up to its task: done with.  (Held on, it was compared again once
                # a second for the rest of the run; a neighbour still stalled sends the
                # stretch after the epoch anew, from its first entry.)
                self._left_pending = self._left_marks = self._left_compared = None

    def _compare_pending(self) -> None:
        """The neighbour announced the next epoch and this rank has not: compare what this
        rank submitted since its last epoch with the neighbour's stretch up to there."""
        seq = self._verified + 1
        theirs = self._theirs.get(seq)
        if self._failed or theirs is None or seq in self._mine or self._seq != seq:
            return                     # (self._seq != seq: an epoch of mine is announced but not compared)
        last = self._last_announced_task
        try:
            pending = [_norm_entry(e) for e in self.pending_tasks(last)]
        except Exception:  # noqa: BLE001 - a diagnostic aid; the epoch comparison still runs
            log.debug("reading the pending tasks failed", exc_info=True)
            return
        if not pending or last is None or pending[0][0] != last + 1:
            # not the stretch after this rank's last announced epoch (or past DIGEST_LIMIT
            # entries, its newest only): this rank's stream hash where the neighbour's epoch lies
            self._compare_epoch_hash(theirs)
            return
        stretch = _stretch(theirs)
        end = min(_order(pending[-1]), _order(stretch[-1]))    # (over what both lists cover)
        diff = _first_difference(_upto(pending, end), _upto(stretch, end))
        if diff is None:
            self._compare_epoch_hash(theirs)
        else:
            self._failed = True
            da, db = _describe_pair(*diff)
            raise DivergenceError(
                f"ranks {self._left} and {self.rank} submitted different task streams; the first differing task "
                f"({self._since()}, epoch #{seq}): rank {self._left} submitted {db}; rank {self.rank} "
                f"submitted {da}")

    def _compare_epoch_hash(self, theirs: _EpochInfo) -> None:
        """Where this rank's application has submitted past the task id of the neighbour's
        epoch, its stream hash must have been folded there, to the epoch's hash."""
        marks = self._my_marks()
        if self._failed or marks is None or not marks[0] <= theirs.task <= marks[1]:
            return
        if dict(marks[2]).get(theirs.task) != theirs.stream_hash:
            self._failed = True
            raise DivergenceError(
                f"ranks {self._left} and {self.rank} submitted different task streams; they differ at or before "
                f"T{theirs.task}, rank {self._left}'s {_EPOCH_WORDS.get(theirs.action, 'epoch')} (epoch #{theirs.seq}; "
                f"compared by stream hash, {self._since()}, past the first {DIGEST_LIMIT} tasks that are listed, "
                f"while rank {self.rank} waited at a fence or for data)")

    # ---- the pending-task exchange (stalled ranks; see the module docstring)
    def _my_pending(self) -> list[tuple] | None:
        """This rank's pending tasks, normalized, without the DIGEST_MORE marker (a digest
        keeps its first DIGEST_LIMIT entries, so it is complete up to its last real entry,
        marker or not; past that nothing is known, and nothing is compared).  Only the
        entries new since the last call are normalized: the list only grows until the next
        epoch starts another."""
        try:
            raw = self.pending_tasks(self._last_announced_task)
        except Exception:  # noqa: BLE001 - a diagnostic aid; the epoch comparison still runs
            log.debug("reading the pending tasks failed", exc_info=True)
            return None
        raw = [e for e in raw if e[1] != DIGEST_MORE]
        cached = self._mine_cache
        if cached and raw and len(raw) >= len(cached) and _norm_entry(raw[0]) == cached[0]:
            cached.extend(map(_norm_entry, raw[len(cached):]))
        else:
            cached = self._mine_cache = [_norm_entry(e) for e in raw]
        return list(cached)

    def _send_pending(self) -> None:
        """Send the right neighbour this rank's pending tasks: whole when the stretch is new
        to it, else only the entries appended since the last send (nothing if none)."""
        mine = self._my_pending()
        if not mine:
            return
        if mine[0] == self._sent_first:
            if len(mine) <= self._sent_count:
                return
            index = self._sent_count
        else:
            index = 0
        log.debug("rank %d stalled: sending rank %d its pending tasks T%d.. (%d entries from %d)", self.rank,
                  self._right, mine[0][0], len(mine) - index, index)
        payload = (_PENDING, index, mine[index:])
        marks = self._my_marks()
        if marks is not None:
            payload += (marks,)
        self._sends.append(self._comm.isend(payload, dest=self._right, tag=EPOCH_TAG))
        self._sent_first, self._sent_count = mine[0], len(mine)

    def _my_marks(self) -> tuple | None:
        """This rank's stream checkpoints ``(lo, hi, [(task id, hash), ...])`` (see
        TaskManager.stream_checkpoints), or None where there are none to read."""
        if self.stream_checkpoints is None:
            return None
        try:
            lo, hi, folds = self.stream_checkpoints()
        except Exception:  # noqa: BLE001 - a diagnostic aid; the epoch comparison still runs
            log.debug("reading the stream checkpoints failed", exc_info=True)
            return None
        return int(lo), int(hi), [(int(t), int(h)) for t, h in folds]

    def _take_left_pending(self, index: int, entries: list, marks: tuple | None = None) -> None:
        self._left_marks = marks
        entries = [_norm_entry(e) for e in entries]
        if index == 0:
            self._left_pending = entries
        elif self._left_pending is not None and len(self._left_pending) == index:
            self._left_pending.extend(entries)
        else:          # (cannot happen: one channel, in order; ignore rather than compare wrongly)
            log.debug("rank %d: pending tasks of rank %d from entry %d do not extend the %s held", self.rank,
                      self._left, index, len(self._left_pending) if self._left_pending is not None else "none")
            self._left_pending = None
        self._left_compared = None

    def _compare_left_pending(self) -> None:
        """Compare the left neighbour's pending tasks with this rank's over the ids both
        cover: from the later first id to the earlier last entry (a buffer entry sorts
        before the task it was made before).  Each list is complete over its own range, so
        a missing or different entry inside both ranges is a divergence; a list that ends
        earlier (a slower rank) or starts later (a rank past another epoch) is not."""
        theirs = self._left_pending
        if self._failed or not theirs:
            return
        mine = self._my_pending()
        if not mine:
            # (this rank past an epoch, submitting nothing since: its checkpoints still compare,
            # behind the tasks the neighbour lists; a difference among those is found from them)
            behind = _first_fold_difference(self._my_marks(), self._left_marks)
            if behind is not None and behind < theirs[0][0]:
                self._failed = True
                raise DivergenceError(
                    f"ranks {self._left} and {self.rank} submitted different task streams; they differ at or "
                    f"before T{behind}, earlier than the tasks rank {self._left} still lists (more than "
                    f"{DIGEST_LIMIT} since its last epoch: compared by hash, while a rank waited at a fence or "
                    f"for data)")
            return
        key = (mine[0], len(mine), len(theirs))
        if key == self._left_compared:
            return
        self._left_compared = key
        lo = (max(mine[0][0], theirs[0][0]), 0, 0)
        hi = min(_order(mine[-1]), _order(theirs[-1]))
        diff = None
        if lo <= hi:
            a = [e for e in mine if lo <= _order(e) <= hi]
            b = [e for e in theirs if lo <= _order(e) <= hi]
            diff = _first_difference(a, b)
        behind = _first_fold_difference(self._my_marks(), self._left_marks)
        if behind is not None and behind < lo[0]:
            # (a difference before the entries both list: a long stretch since the last epoch)
            self._failed = True
            listed = ("the tasks they list do not overlap" if lo > hi else
                      f"the tasks both list, T{lo[0]}..T{hi[0]}, agree" if diff is None else
                      f"among the tasks both list, T{lo[0]}..T{hi[0]}, {self._pair_words(diff, mine, theirs)}")
            raise DivergenceError(
                f"ranks {self._left} and {self.rank} submitted different task streams; they differ at or before "
                f"T{behind}, earlier than the tasks they still list (more than {DIGEST_LIMIT} since their last "
                f"epoch: compared by hash, while a rank waited at a fence or for data); {listed}")
        if diff is None:
            return
        self._failed = True
        raise DivergenceError(
            f"ranks {self._left} and {self.rank} submitted different task streams; the first differing task "
            f"(among T{lo[0]}..T{hi[0]}, which both submitted since their last epoch, compared while a rank "
            f"waited at a fence or for data): {self._pair_words(diff, mine, theirs)}")

    def _pair_words(self, diff: tuple, mine: list, theirs: list) -> str:
        """A difference among the pending tasks in words, the left neighbour's first."""
        ea, eb = diff
        at = _order(ea if ea is not None else eb)
        if ea is None:      # (name what this rank has there instead: its next entry)
            ea = next((e for e in mine if _order(e) > at), None)
        if eb is None:
            eb = next((e for e in theirs if _order(e) > at), None)
        da, db = _describe_pair(ea, eb)
        return f"rank {self._left} submitted {db}; rank {self.rank} submitted {da}"

    def _since(self) -> str:
        return (f"after epoch T{self._last_verified_task}" if self._last_verified_task is not None
                else "from the start")

    def _mismatch_message(self, mine: _EpochInfo, theirs: _EpochInfo) -> str:
        a, b = _stretch(mine), _stretch(theirs)
        diff = _first_difference(a, b)
        if diff is not None:
            da, db = _describe_pair(*diff)
            return (f"ranks {self._left} and {self.rank} submitted different task streams; the first "
                    f"differing task ({self._since()}, epoch #{mine.seq}): rank {self._left} submitted "
                    f"{db}; rank {self.rank} submitted {da}")
        more = [e for e in a if e[1] == DIGEST_MORE]
        if more:
            return (f"ranks {self._left} and {self.rank} submitted different task streams {self._since()} (epoch "
                    f"#{mine.seq}, T{mine.task}): the tasks listed agree; the difference lies in "
                    f"{_describe(more[0])}")
        # (the digest lists all the stream hashes: its entries agreeing, the hashes should too)
        return (f"ranks {self._left} and {self.rank} submitted different task streams {self._since()} (epoch "
                f"#{mine.seq}, T{mine.task}): their hashes differ, though the tasks and buffers listed agree; "
                f"the first task of that stretch is {_describe(a[0])}")

    @staticmethod
    def _digest_summary(info: _EpochInfo | None) -> str:
        if info is None:
            return "unknown tasks"
        d = info.digest
        if not d:
            return "nothing but this epoch"
        shown = ", ".join(_describe(e) for e in d[:3])
        return shown + (f", … ({len(d)} tasks)" if len(d) > 3 else "")

    def close(self, timeout: float = 5.0) -> None:
        deadline = time.monotonic() + timeout
        while self._sends and time.monotonic() < deadline:
            if self._sends[0].Test():
                self._sends.popleft()
            else:
                time.sleep(1e-4)
        if self._recv is not None:
            # a matched message is already ours: complete it rather than leaving it posted
            while time.monotonic() < deadline and not self._recv.test()[0]:
                time.sleep(1e-4)
            self._recv = None
