"""Replay at the instruction-graph level (the design is in ``replay.py``).

A mixin of ``InstructionGraphGenerator``: it keys a command's lowering on the
command's signature and the shapes of the buffers it touches, records a template the
first time and emits it with fresh ids after.  Per buffer, the shape holds every
allocation (its box and per-point last writer / readers, instruction ids relative to
a base), the newest-data map, the pending receives (task ids relative to the
command's task), the lookahead's anticipated boxes and the allocation counters.
Allocation ids are long-lived and interleave with short-lived scratch allocations,
so they are not relative: the shape numbers a buffer's allocations in order and the
actual ids travel beside it (``_BufferShape.allocations``).

The user allocation's last writer and readers (the buffer's initial data, read once
by the first copies to the devices) are a shape of their own, beside the buffer's,
with a base of their own: most lowerings never touch that allocation, while those
old ids drift further from the command every step until a horizon collapses them,
and a key holding them missed at every step of a loop's start (the 128² stencil on
four devices replayed from its 17th task; now from its 10th).  A lowering that left
every user allocation's state as it was keys without them; one that changed one (it
read initial data never copied to that memory before) marks its key ``_USER_KEYED``
and is kept under the key with the user shapes added.  Whether a lowering touches the user
allocation follows from what the key holds (where the newest data is, what the
command accesses), never from those ids; a horizon, which collapses them, always
keys on them.
"""
from __future__ import annotations

from functools import partial
from typing import NamedTuple

from . import command_graph as cg
from . import replay as _replay_module
from .instruction_graph import (DEP_LAST_EPOCH, AccessAllocation, CloneCollectiveGroupInstruction, Pilot,
                                ReductionAllocation)
from .memory import Allocation
from .replay import absolute_epoch, bind_value, compiled_builder, newest_named, own_base_shape, relative_epoch
from .replay import absolute_id as _abs
from .replay import relative_id as _rel

_REPLAYABLE = frozenset((cg.EXECUTION, cg.PUSH, cg.AWAIT_PUSH, cg.REDUCTION, cg.HORIZON))

# what each instruction field holds, by name (the same name means the same kind of id in
# every instruction class); fields not named here are copied as they are
_ROLES = {"id": "iid", "deps": "deps", "allocation": "aid", "source": "aid", "dest": "aid",
          "task": "tid", "transfer": "transfer", "msg_id": "mid", "reduction": "rid",
          "accesses": "accesses", "reductions": "redallocs", "launcher": "launcher", "name": "name",
          "global_range": "global_range", "identity": "identity", "op": "op", "garbage": "garbage"}


_USER_KEYED = ("user-keyed",)   # stored under a key whose templates touch a user allocation (see above)
_GROUP = ("task group",)        # a signature of a task's commands together (see group_probe)


class GroupProbe(NamedTuple):
    """``group_probe``'s answer: the key of a task's commands as one template, the buffers
    they touch (sorted) with their shapes before, where the epoch lies relative to the
    lowering's base, and the template kept under the key (None: none yet)."""

    key: tuple
    touched: tuple
    shapes: list
    epoch_rel: int | None
    template: tuple | None
    # the commands, where one of them gathers an earlier task's pending reduction (else None):
    # what the template's instructions are made from in place of the first command
    commands: "_GroupCommands | None" = None
    # the group's step along the chain the state is at (None: no chain), and the node after it
    # where the chain knew the step (its template is then ``template``; see _chain_key)
    chain_key: tuple | None = None
    chain_next: dict | None = None


class _GroupCommands:
    """What a group template is instantiated from in place of one command, where one of its
    commands gathers an earlier task's pending reduction for a reader (a reduction command,
    pushes and await-pushes of partial results): the task, and each command, whose own
    reduction or transfer the instructions name (``("c", k)``, ``("x", k)``: command ``k``
    of the group, see ``_Env.group``)."""

    __slots__ = ("task", "kind", "cmds")

    def __init__(self, cmds: list):
        self.task = cmds[0].task
        self.kind = cmds[0].kind
        self.cmds = cmds


def _names_epoch(made: list, epoch: int | None) -> bool:
    """Whether a lowering gave an instruction a true dependency on the epoch (its template
    is then kept per epoch distance: ``Replay.keep``); the epoch dependency of an
    instruction without another is written symbolically (see _encode)."""
    return epoch is not None and any(d == epoch and o != DEP_LAST_EPOCH for ins in made for d, o in ins.deps)


class TemplateMismatch(Exception):
    """A lowering referenced something its key does not determine: it is not memoized."""


class InstructionReplayMixin:
    """Replay of ``InstructionGraphGenerator.compile`` (uses the generator's state)."""

    # ---- entry point -------------------------------------------------------------------
    def _compile_replayed(self, cmd: cg.Command) -> int | None:
        """Lower ``cmd``, by a template where one holds; the template's serial number, or None
        where it was lowered.  Along a chain (see ``_chain_key``) the template comes from
        the chain's node, without a key."""
        chain = self._chain
        ckey = None
        if chain is not None:
            ckey = self._chain_key(cmd)
            if ckey is not None:
                entry = chain.get(ckey)
                if entry is not None:
                    tpl, bids, nxt = entry
                    self._chain = nxt
                    self._chain_tid = cmd.task.id
                    replay = self.replay
                    replay.hits += 1
                    replay.chained += 1
                    return self._instantiate(cmd, bids, self._current_shapes(bids), tpl)
            self._chain = None
        serial, tpl, touched = self._compile_keyed(cmd)
        if tpl is not None:
            nxt = self._chains.after(chain, ckey, tpl, touched, tpl[8], 4, cmd.kind == cg.HORIZON)
            if nxt is not None:
                self._chain = nxt
                self._chain_tid = cmd.task.id
        return serial

    def _chain_key(self, cmd: cg.Command) -> tuple | None:
        """A command's step along a chain: its signature's int and how many task ids lie
        between it and the chain's previous command (the pending receives' task ids are
        keyed relative to the command's task); None where its lowering is not keyed.

        A chain starts at a horizon's template: a horizon's key holds every buffer's state,
        the execution front, the host objects' and collective groups' last instructions
        and the epoch (and the bounded memories' state), so the state after it is the
        template's whatever came before.  Every later command of the chain is lowered by a
        template that the state and the command fix, and it fixes the state after it: the
        state at each node is a function of the horizon's template and the steps since, and
        so is the template of the next step.  A node remembers, per step, the template
        and the next node, so a repeating period finds its templates without keying a
        command (the key's shapes and lookups were ~330 of a no-op stencil step's 3540
        scheduler opcodes).  Anything else that changes the state ends the chain (a lowering
        not replayed, lookahead recording a need, a buffer or host object created or
        destroyed) until the next horizon's template starts one."""
        kind = cmd.kind
        if kind == cg.EXECUTION:
            plans = self._plan_chunks(cmd)
            memo = cmd.memo
            sig_id = memo[2] if memo is not None and memo[1] is plans else None
            if sig_id is None:
                sig_id = self._signature_id(cmd, self.replay.known)[0]
        elif kind == cg.HORIZON:
            if self._garbage:
                return None
            sig_id = -1
        elif kind in _REPLAYABLE:
            sig_id = self._signature_id(cmd, self.replay.known)[0]
        else:
            return None
        if sig_id is None:
            return None
        return (sig_id, cmd.task.id - self._chain_tid)

    def _current_shapes(self, bids: tuple) -> list:
        """The buffers' shapes (``_BufferShape``), taken now where replay has none kept (a
        lowering done normally forgets those of the buffers it touched)."""
        store = self._shapes
        try:
            return [store[bid] for bid in bids]     # (all kept: along a chain, always)
        except KeyError:
            pass
        out = []
        for bid in bids:
            sh = store.get(bid)
            if sh is None:
                sh = store[bid] = self._shape_of(self._buffers[bid])
            out.append(sh)
        return out

    def _compile_keyed(self, cmd: cg.Command) -> tuple:
        """``_compile_replayed`` by the command's key: the template's serial number (None where
        lowered), the template that holds for this lowering from now on (found, or recorded
        now; None: none) and the buffers it touches."""
        replay = self.replay
        touched = self._touched_buffers(cmd)
        if cmd.kind == cg.HORIZON:
            touched = tuple(sorted(self._buffers))   # a horizon collapses every buffer's state
        shapes: list = []        # (the touched buffers' shapes, as the key takes them)
        key = self._replay_key(cmd, touched, shapes) if cmd.kind in _REPLAYABLE else None
        if key is None or len(key) == 1:
            if key is None:
                replay.bypassed += 1
            self._compile_now(cmd)
            self._forget_shapes(touched)
            return None, None, touched
        epoch = self._horizons.epoch
        epoch_rel = None if epoch is None else epoch - self._next_instr
        tpl = replay.find(key, epoch_rel)
        user_keyed = tpl is _USER_KEYED
        if user_keyed:
            key = (key, _user_parts(shapes, self._next_instr))
            tpl = replay.find(key, epoch_rel)
        if tpl is not None:
            replay.hits += 1
            return self._instantiate(cmd, touched, shapes, tpl), tpl, touched
        self._sync_buffers(touched)
        # whether the lowering changes a user allocation, where the key does not say so
        # already (a key marked _USER_KEYED, a horizon's: it holds the user shapes)
        detect = not user_keyed and cmd.kind != cg.HORIZON
        if detect:
            buffers = self._buffers
            users = [buffers[bid].user for bid in touched]
            users_before = [None if u is None else u.access.snapshot() for u in users]
        env = _Env(self, cmd, touched, shapes)
        n_out, n_pilots = len(self._out), len(self._pilots)
        self._warned = False
        evictions = self.memory_stats["evictions"]
        self._compile_now(cmd)
        if detect:
            user_keyed = any(u is not None and u.access.snapshot() != before
                             for u, before in zip(users, users_before))
            if user_keyed:
                replay.templates.put(key, _USER_KEYED)
                key = (key, _user_parts(shapes, env.ibase))
        if self._warned or self.memory_stats["evictions"] != evictions or (
                cmd.kind == cg.EXECUTION and cmd.task.collective_group is not None
                and any(type(ins) is CloneCollectiveGroupInstruction for ins in self._out[n_out:])):
            # (diagnostics are logged by every lowering; an eviction depends on every buffer
            # on the memory, which the key does not hold; a group's clone, once per group,
            # follows the clone before it, which the key does not hold either)
            replay.bypassed += 1
            self._forget_shapes(touched)
            return None, None, touched
        try:
            after = []
            for bid in touched:
                sh = self._shapes[bid] = self._shape_of(self._buffers[bid])
                after.append(sh)
            made = self._out[n_out:]
            tpl = self._template(cmd, env, made, self._pilots[n_pilots:], after,
                                 user_keyed or cmd.kind == cg.HORIZON)
        except TemplateMismatch:
            replay.bypassed += 1
            self._forget_shapes(touched)
            return None, None, touched
        replay.misses += 1
        # (a horizon's key holds the epoch itself: its lowering moves it)
        replay.keep(key, tpl, epoch_rel, cmd.kind != cg.HORIZON and _names_epoch(made, epoch))
        return None, tpl, touched

    # ---- a task's commands as one template ----------------------------------------------
    # A task on several ranks gives each rank a few commands: the execution, and a push
    # and an await-push per neighbour.  Replayed one by one, each pays a key, a lookup and
    # an instantiation (~600 opcodes of the scheduler thread per command on the ping-pong).
    # Together, their lowering is a function of their signatures and of the state of the
    # union of the buffers they touch: each command's own key is determined by it (the
    # state before it is the state before the task, changed by the commands before it,
    # which are determined the same way).  So the task's commands are also kept as one
    # template, recorded from what lowering them one by one gave (replayed or not: the
    # same instructions), and a task whose key finds it replays it in one step.
    def group_probe(self, cmds: list, anticipating: bool) -> "GroupProbe | None":
        """The key of ``cmds`` (this rank's commands of one task) as one template, and the
        template where one is kept (``GroupProbe``); None where the group does not qualify:
        collectives stay with the per-command path, as does a task any of whose commands
        was not lowered before.  Reductions qualify: a template refers to the task's own
        (a residual reduced every step) as the task's, which every command of the group
        shares, and to an earlier task's that its commands gather for a reader (a reduction
        command, pushes and await-pushes of partial results) as that of command ``k`` of
        the group (``_GroupCommands``), as a command's template refers to its own.  (The
        commands of a task that gather one buffer's pending reduction all name that one
        reduction: a buffer has one pending at a time.)  With bounded memories the key holds
        their state, as a command's does (a lowering that evicted is not recorded, as a
        command's is not: see ``record_group``).
        ``anticipating``: whether lookahead asks ``anticipate`` about every command (a
        template recorded so skips those questions: see ``record_group``)."""
        task = cmds[0].task
        if task.collective_group is not None:
            return None
        # (the group's signature, buffers and whether it gathers, as the execution command's
        # cell in its command template keeps them: the template makes the same commands every
        # time, and the cell's plans are the command's while its signature holds)
        cell = None
        for c in cmds:
            if c.kind == cg.EXECUTION:
                memo = c.memo
                if memo is not None and memo[1] is self._plan_chunks(c):
                    cell = memo
                    known_group = memo[3]
                    if known_group is not None and known_group[0] == anticipating and known_group[1] == len(cmds):
                        return self._probe_known(cmds, task, *known_group[2:])
                break
        replay = self.replay
        known = replay.known
        sigs = []
        bids: dict = {}     # (an ordered set: the commands' order, each one's own, see _touched_buffers)
        gathers = False
        for c in cmds:
            kind = c.kind
            sid = None
            if kind == cg.EXECUTION:
                bids.update(dict.fromkeys(self._touched_buffers(c)))     # (plans the command: its signature holds them)
                memo = c.memo                             # (_signature_id's hit, inline)
                if memo is not None and memo[1] is c.plans:
                    sid = memo[2]
            elif kind == cg.PUSH or kind == cg.AWAIT_PUSH:
                if c.transfer[2]:           # (partial results of an earlier task's reduction)
                    gathers = True
                bids[c.transfer[1]] = None
            elif kind == cg.REDUCTION:
                gathers = True
                bids[c.buffer] = None
            else:
                return None
            if sid is None:
                sid = self._signature_id(c, known)[0]
            if sid is None:
                return None
            sigs.append(sid)
        # (every command's signature was lowered before: the task has repeated, so its
        # group is keyed and recorded from this sighting on)
        gsig = replay.identify((_GROUP, anticipating, tuple(sigs)))
        touched = tuple(bids)
        if cell is not None:
            cell[3] = (anticipating, len(cmds), gsig, touched, gathers)
        return self._probe_known(cmds, task, gsig, touched, gathers)

    def _probe_known(self, cmds: list, task, gsig: int, touched: tuple, gathers: bool) -> GroupProbe:
        """``group_probe`` once the group's signature ``gsig`` and buffers ``touched`` are known:
        along a chain by its step, else by the group's key."""
        commands = _GroupCommands(cmds) if gathers else None
        chain = self._chain
        ckey = None
        if chain is not None:
            ckey = (gsig, task.id - self._chain_tid)
            entry = chain.get(ckey)
            if entry is not None:
                tpl, touched, nxt = entry
                return GroupProbe(None, touched, self._current_shapes(touched), None, tpl, commands, ckey, nxt)
        replay = self.replay
        ibase = self._next_instr
        shapes = self._current_shapes(touched)
        parts = self._shape_parts(shapes, ibase, task.id)
        epoch = self._horizons.epoch
        hos = self._host_objects
        extras = (epoch is None,
                  tuple([_rel(hos.get(ho), ibase) for ho in task.side_effects]) if task.side_effects else ())
        if self._capacity:
            extras = (extras, self._memory_state(ibase))
        key = (gsig, touched, tuple(parts), extras)
        epoch_rel = None if epoch is None else epoch - ibase
        return GroupProbe(key, touched, shapes, epoch_rel, replay.find(key, epoch_rel), commands, ckey)

    def _replay_group(self, probe: "GroupProbe", cmd: cg.Command) -> int:
        """``compile``'s lowering of a task's commands (``cmd`` the first) by the template
        ``group_probe`` found; the template's serial number."""
        replay = self.replay
        replay.hits += 1
        replay.grouped += 1
        if cmd.task.reductions:
            replay.grouped_reductions += 1
        commands = probe.commands      # (where the group gathers: what the template names, see _Env.group)
        if commands is not None:
            replay.grouped_gathers += 1
        # (the chain's step: known, or learnt now; the state is still the probe's)
        nxt = probe.chain_next
        if nxt is not None:
            replay.chained += 1
            replay.chained_groups += 1
        elif probe.chain_key is not None:     # (a group is no horizon: no root, ``cell`` unused)
            nxt = self._chains.after(self._chain, probe.chain_key, probe.template, probe.touched, None, 0, False)
        self._chain = nxt
        if nxt is not None:
            self._chain_tid = cmd.task.id
        return self._instantiate(cmd if commands is None else commands, probe.touched, probe.shapes, probe.template)

    def begin_group(self, probe: "GroupProbe", cmds: list) -> tuple:
        """What ``record_group`` needs of the state before the task's commands are lowered."""
        env = _Env(self, cmds[0], probe.touched, probe.shapes)
        if probe.commands is not None:
            env.group(probe.commands)
        return env, self.replay.bypassed, self._anticipation_misses

    def record_group(self, probe: "GroupProbe", mark: tuple, cmds: list, compiled: list) -> None:
        """Keep the template of a task's commands from what compiling them one by one gave
        (``compiled``: their ``compile`` results), unless a lowering was not memoizable
        (``bypassed`` moved), lookahead found a box not allocated (``anticipate`` recorded
        a need or had one: skipping it would not be the same), or a user allocation's
        state changed (a per-command template keys on it then).  (A lowering that evicted
        moved ``bypassed``: an eviction depends on buffers no key holds, see
        ``_compile_replayed``.)"""
        env, bypassed, anticipation_misses = mark
        if self.replay.bypassed != bypassed or self._anticipation_misses != anticipation_misses:
            return
        store = self._shapes
        after = []
        for bid, before in zip(probe.touched, probe.shapes):
            sh = store.get(bid)
            if sh is None:
                self._sync_buffers((bid,))
                sh = store[bid] = self._shape_of(self._buffers[bid])
            if sh.usid != before.usid or sh.ubase != before.ubase:
                return
            after.append(sh)
        made = [ins for instrs, _p, _t in compiled for ins in instrs]
        try:
            # (the execution command, where there is one, has the task's effects: see _template)
            tpl = self._template(next((c for c in cmds if c.kind == cg.EXECUTION), cmds[0]), env, made,
                                 [p for _i, ps, _t in compiled for p in ps], after, False)
        except TemplateMismatch:
            return
        self.replay.keep(probe.key, tpl, probe.epoch_rel, _names_epoch(made, self._horizons.epoch))

    def _forget_shapes(self, bids) -> None:
        shapes = self._shapes
        if bids is None:
            shapes.clear()
        else:
            for bid in bids:
                shapes.pop(bid, None)

    # ---- lazy state ----------------------------------------------------------------------
    # A replayed command leaves its buffers' state as the template's shape (``_stale``)
    # instead of rebuilding every allocation's access map: a step's commands replay one
    # after the other on the same buffers, and only a lowering done normally (a miss, a
    # horizon, lookahead that must record a need) reads the objects.  Every such entry
    # point syncs the buffers it touches first.
    def _sync_buffers(self, bids) -> None:
        stale = self._stale
        if not stale:
            return
        if bids is None:
            bids = list(stale)
        buffers = self._buffers
        for bid in bids:
            sh = stale.pop(bid, None)
            if sh is not None:
                b = buffers.get(bid)
                if b is not None:
                    self._restore(b, sh)

    def _allocated(self, bid: int, memory: int, box) -> bool:
        """``_find_alloc(...) is not None`` for the buffer's current state, stale or not
        (answered from the shape where there is one, memoized per interned shape)."""
        sh = self._shapes.get(bid)
        if sh is None:
            return self._find_alloc(self._buffers[bid], memory, box) is not None
        key = (sh.sid, memory, box)
        memo = self._allocated_memo
        hit = memo.get(key)
        if hit is None:
            hit = False
            for mem, lst in sh.shape[0]:
                if mem == memory:
                    for abox, _snap in lst:
                        if abox.contains_box(box):
                            hit = True
                            break
                    break
            memo.put(key, hit)
        return hit

    # ---- keys --------------------------------------------------------------------------
    def _touched_buffers(self, cmd: cg.Command) -> tuple | None:
        """The buffers whose state the command's lowering reads or changes (None: all)."""
        kind = cmd.kind
        if kind == cg.EXECUTION:
            plans = self._plan_chunks(cmd)
            reds = cmd.task.reductions
            if not reds:
                return plans.touch
            return tuple(dict.fromkeys(plans.touch + tuple([r.buffer for r in reds])))
        if kind in (cg.PUSH, cg.AWAIT_PUSH):
            return (cmd.transfer[1],)
        if kind == cg.REDUCTION:
            return (cmd.buffer,)
        if kind == cg.FENCE:
            b = cmd.task.fence_buffer
            return () if b is None else (b,)
        return None

    def _replay_key(self, cmd: cg.Command, bids: tuple, shapes_out: list) -> tuple | None:
        kind = cmd.kind
        task = cmd.task
        # (an execution command's template cell, peeked at first: _signature_id's hit, inline)
        memo = cmd.memo if kind == cg.EXECUTION else None
        sig_id = memo[2] if memo is not None and memo[1] is cmd.plans else None
        if sig_id is None:
            sig_id, sig = self._signature_id(cmd, self.replay.signature)
            if sig_id is None:
                # (None: lowered every time; a first sighting: lowered normally, nothing
                # shaped or recorded)
                return None if sig is None else (sig,)
        ibase = self._next_instr
        now = self._current_shapes(bids) if bids else []
        shapes_out.extend(now)
        parts = self._shape_parts(now, ibase, task.id)
        if kind == cg.HORIZON:   # (it collapses the user allocations' ids too)
            parts.append(_user_parts(now, ibase))
        epoch = self._horizons.epoch
        # (the epoch's distance is not in the key of what a command lowers to, see
        # Replay.find; a horizon's key holds it)
        if kind == cg.HORIZON:
            extras = None if epoch is None else epoch - ibase
        else:
            extras = epoch is None
        if kind == cg.EXECUTION:
            hos = self._host_objects
            extras = (extras,
                      tuple([_rel(hos.get(ho), ibase) for ho in task.side_effects]) if task.side_effects else (),
                      None if task.collective_group is None else
                      (task.collective_group in self._collective,
                       _rel(self._collective.get(task.collective_group), ibase)))
        elif kind == cg.HORIZON:
            extras = (extras, _rel(self._horizons.current_horizon, ibase),
                      tuple([f - ibase for f in sorted(self._horizons.front)]),
                      tuple([(k, _rel(v, ibase)) for k, v in sorted(self._host_objects.items())]),
                      tuple([(k, _rel(v, ibase)) for k, v in sorted(self._collective.items())]))
        if self._capacity:
            extras = (extras, self._memory_state(ibase))
        return (sig_id, bids, tuple(parts), extras)

    def _signature_id(self, cmd: cg.Command, look) -> tuple:
        """``(int, signature)`` of what a command's lowering depends on besides its buffers'
        states: the int ``look`` gives for the signature (``Replay.signature``, or
        ``Replay.known`` for a look that is no sighting), the signature itself None where
        the execution command's template cell held the int; ``(None, None)`` where the
        lowering is not memoized (a mapper that is no pure function, a horizon dropping
        user allocations).

        The template entry's cell of a replayed execution command (see _plan_chunks) holds
        the signature of the plans it holds; a command planned before the plan cache was
        dropped (held by lookahead while a buffer was created) has other plans than its
        cell, whose signature is then neither read nor written."""
        kind = cmd.kind
        if kind == cg.PUSH:     # (a task group's commands first: group_probe asks for each)
            sig = (kind, cmd.transfer[1], cmd.transfer[2] != 0, tuple(cmd.targets), cmd.contributes)
            return look(sig), sig
        if kind == cg.AWAIT_PUSH:
            sig = (kind, cmd.transfer[1], cmd.transfer[2] != 0, cmd.region)
            return look(sig), sig
        if kind == cg.EXECUTION:
            memo = cmd.memo
            if memo is not None:
                if memo[1] is cmd.plans:
                    if memo[2] is not None:
                        return memo[2], None
                else:
                    memo = None
            task = cmd.task
            for a in task.accesses:
                if not a.pure:
                    return None, None
            sig = (kind, cmd.plans, cmd.include_current_reductions,
                   tuple([(r.buffer, r.include_current, r.op) for r in task.reductions]) if task.reductions
                   else (), tuple(task.side_effects), task.collective_group)
            sig_id = look(sig)
            if sig_id is not None and memo is not None:
                memo[2] = sig_id
            return sig_id, sig
        if kind == cg.REDUCTION:
            sig = (kind, cmd.buffer, cmd.contributes, cmd.reduction.op)
        else:   # HORIZON
            if self._garbage:
                return None, None   # (user allocations to drop: rare, lowered normally)
            sig = (kind,)
        return look(sig), sig

    @staticmethod
    def _shape_parts(shapes: list, ibase: int, tid: int) -> list:
        """A key's part per buffer of ``shapes`` (``_current_shapes``): its interned shape and
        how far its bases lie behind the lowering's (instruction ids, task ids)."""
        parts = []
        for sh in shapes:
            ib, tb = sh.ibase, sh.tbase
            parts.append((sh.sid, None if ib is None else ib - ibase, None if tb is None else tb - tid))
        return parts

    def _memory_state(self, ibase: int) -> tuple:
        """What the lowering of anything that allocates depends on, per bounded memory: the
        bytes in use (whether an eviction is needed) and the allocation order's last
        allocation and frees since (its dependencies), ids relative to ``ibase``."""
        return tuple([(m, self._used[m], _rel(self._last_alloc.get(m), ibase),
                       tuple([f - ibase for f in self._frees_since[m]])) for m in sorted(self._capacity)])

    def _shape_of(self, b) -> "_BufferShape":
        """The buffer's state with its ids relative to bases the state fixes itself: the
        newest instruction it names, the epoch aside (written symbolically), and the
        newest task of a pending receive; None where it names none (``newest_named``)."""
        epoch = self._horizons.epoch
        top = None
        for lst in b.allocs.values():
            for a in lst:
                top = newest_named(a.access, top, epoch)
        ibase = top
        rel = relative_epoch(0 if top is None else top, epoch)
        tbase = max([p.transfer[0] for p in b.pending]) if b.pending else None
        mems = []
        ids = []
        for mem in sorted(b.allocs):
            lst = b.allocs[mem]
            if not lst:
                continue
            mems.append((mem, tuple([(a.box, a.access.snapshot(rel)) for a in lst])))
            ids.extend([a.id for a in lst])
        user = usid = ubase = ushape = None
        if b.user is not None:
            user = b.user.box
            ids.append(b.user.id)
            ushape, ubase = own_base_shape(b.user.access, epoch)   # (the user allocation's ids: a shape of their own)
            usid = self.replay.intern((_USER_KEYED, ushape))
        shape = (tuple(mems), user, b.newest.snapshot(),
                 tuple([(p.transfer[0] - tbase, p.transfer[1], p.transfer[2], p.region) for p in b.pending]),
                 tuple([(m, tuple(v)) for m, v in sorted(b.anticipated.items()) if v]),
                 tuple(sorted(b.alloc_counts.items())), b.warned)
        return _BufferShape(self.replay.intern(shape), ibase, tbase, tuple(ids), shape, usid, ubase, ushape)

    # ---- recording ---------------------------------------------------------------------
    def _template(self, cmd: cg.Command, env: "_Env", made: list, pilots: list, after: list,
                  user_keyed: bool) -> tuple:
        """The template of a lowering just done: its instructions ``made`` and ``pilots``, the
        touched buffers' new shapes ``after``, and ``cmd``'s effects (of its kind), all
        relative to ``env``.  ``user_keyed``: the key holds the user allocations' shapes, and
        the template their new ones; else they stay as they are (and the key does not hold
        them)."""
        instrs = tuple([_compact(_encode(ins, env)) for ins in made])
        pilots = tuple([(env.mid(p.msg_id), p.to, env.transfer(p.transfer), p.box) for p in pilots])
        post = tuple([(sh.sid, sh.shape, tuple([env.aid(a) for a in sh.allocations]),
                       _rel(sh.ibase, env.ibase), _rel(sh.tbase, env.tid),
                       (sh.usid, sh.ushape, _rel(sh.ubase, env.ibase)) if user_keyed else None)
                      for sh in after])
        effects = ()
        if cmd.kind == cg.EXECUTION:
            task = cmd.task
            hos = self._host_objects
            effects = (tuple([_rel(hos.get(ho), env.ibase) for ho in task.side_effects]),
                       None if task.collective_group is None else
                       _rel(self._collective.get(task.collective_group), env.ibase))
        elif cmd.kind == cg.HORIZON:
            ib = env.ibase
            effects = (tuple([(k, _rel(v, ib)) for k, v in self._host_objects.items()]),
                       tuple([(k, _rel(v, ib)) for k, v in self._collective.items()]),
                       _rel(self._horizons.current_horizon, ib), _rel(self._horizons.epoch, ib))
        memory = self._memory_state(env.ibase) if self._capacity else None
        return (instrs, pilots, self._next_instr - env.ibase, self._next_alloc - env.abase,
                self._next_msg - env.mbase, post, effects, memory,
                [None, 0, None, next(self._template_serials), None])

    # ---- instantiation -----------------------------------------------------------------
    def _instantiate(self, cmd: cg.Command, bids: tuple, shapes: list, tpl: tuple) -> int:
        """Make ``cmd``'s instructions from template ``tpl``; returns the template's serial number."""
        instrs, pilots, n_instr, n_alloc, n_msg, post, effects, memory, builder = tpl
        ibase, abase, mbase = self._next_instr, self._next_alloc, self._next_msg
        task = cmd.task
        tid = task.id
        epoch = self._horizons.epoch
        ctx = (ibase, abase, mbase, tid, shapes, cmd, epoch)
        build = builder[0]
        if build is None:
            # compiled at the template's COMPILE_AFTER-th replay, interpreted before: a
            # compile costs 80-530 us, what a template that replays a few times after a
            # wait, or during a short run's start, never earns back (the 128² stencil
            # compiled 5 builders in its first 500 steps, 2.6 ms; bench_mpi's stream
            # 100-130 per buffer, 8-10 ms per rank)
            # (builder: [compiled builder, replays so far, interpreter, serial number, a
            # horizon's chain root (see _chain_key)])
            builder[1] += 1
            if builder[1] >= _replay_module.COMPILE_AFTER:
                build = builder[0] = _builder(instrs, post, self._builder_code, self._makers)
                builder[2] = None
            else:
                build = builder[2]
                if build is None:
                    build = builder[2] = _Interpreted(instrs, post)
        made, kinds, after, ext, sinks = build(ibase, abase, mbase, tid, shapes, ctx, task)
        front = self._horizons.front
        if cmd.kind == cg.HORIZON:
            # (a horizon depends on the whole front, which is in its key: its ext is the
            # front, a few dozen ids in a wide step, popped one by one before)
            front.clear()
        else:
            # (from the smaller side: a step's ext names the whole previous step, a dozen ids
            # or more, of which the front holds the few sinks; see _summary)
            sym, ids = ext
            if sym:
                front.pop(epoch, None)
            if ids:             # (none for independent tasks: the front grows, nothing leaves it)
                if len(front) < len(ids):
                    for f in [f for f in front if f - ibase in ids]:
                        del front[f]
                else:
                    for d in ids:
                        front.pop(ibase + d, None)
        for r in sinks:
            front[ibase + r] = None
        self._out.extend(made)
        recorder = self.recorder
        if recorder is not None:
            for ins in made:
                recorder.record_instruction(ins)
        replayed = self._replayed_kinds
        replayed[kinds] = replayed.get(kinds, 0) + 1
        if pilots:
            for mrel, to, transfer, box in pilots:
                p = Pilot(mbase + mrel, to, _dec_transfer(transfer, ctx, None), box)
                self._pilots.append(p)
                if recorder is not None:
                    recorder.record_pilot(p)
        self._next_instr = ibase + n_instr
        self._next_alloc = abase + n_alloc
        self._next_msg = mbase + n_msg
        if memory is not None:
            for m, used, last, frees in memory:
                self._used[m] = used
                if last is not None:
                    self._last_alloc[m] = ibase + last
                self._frees_since[m] = [ibase + f for f in frees]
        shapes = self._shapes
        stale = self._stale
        for bid, sh in zip(bids, after):    # (the builder made the buffers' new shapes: see _post_shapes)
            shapes[bid] = stale[bid] = sh
        if cmd.kind == cg.HORIZON:
            hos, colls, cur, ep = effects
            # (a comprehension is a call in CPython 3.11: most programs have neither)
            self._host_objects = {k: _abs(v, ibase) for k, v in hos} if hos else {}
            self._collective = {k: _abs(v, ibase) for k, v in colls} if colls else {}
            self._horizons.current_horizon = _abs(cur, ibase)
            self._horizons.epoch = _abs(ep, ibase)
        elif effects:
            hos_rel, coll_rel = effects
            for ho, rel in zip(task.side_effects, hos_rel):
                if rel is not None:
                    self._host_objects[ho] = ibase + rel
            if coll_rel is not None:
                self._collective[task.collective_group] = ibase + coll_rel
        return builder[3]

    def _restore(self, b, sh: "_BufferShape") -> None:
        from .instruction_graph_generator import _PendingReceive
        mems, user, newest, pending, antic, counts, warned = sh.shape
        ids = sh.allocations
        epoch = self._horizons.epoch
        ab = absolute_epoch(sh.ibase or 0, epoch)
        tbase = sh.tbase or 0
        old = {a.id: a for lst in b.allocs.values() for a in lst}
        allocs = {}
        k = 0
        for mem, lst in mems:
            out = []
            for box, snap in lst:
                aid = ids[k]
                k += 1
                a = old.get(aid)
                if a is None:
                    a = Allocation(aid, mem, box, None, box.area * b.itemsize)
                a.access.restore(snap, ab)
                out.append(a)
            allocs[mem] = out
        b.allocs = allocs
        if user is not None:
            b.user.access.restore(sh.ushape, absolute_epoch(sh.ubase or 0, epoch))
        b.newest.restore(newest)
        b.pending = [_PendingReceive((t + tbase, bid, rid), region) for t, bid, rid, region in pending]
        b.anticipated = {m: list(v) for m, v in antic}
        b.alloc_counts = dict(counts)
        b.warned = warned


class _BufferShape(NamedTuple):
    """A buffer's interned shape, the bases its ids are relative to, its allocations' ids;
    the user allocation's access state beside it (``usid``, ``ushape``: interned and as
    it is, ids relative to ``ubase``; None without a user allocation).

    A tuple, so that a replay makes the touched buffers' new shapes with
    ``tuple.__new__`` (``_post_shapes``, and written out in a compiled builder): no
    ``__init__`` frame per buffer and replay.  Compared only by identity."""

    sid: int
    ibase: int | None
    tbase: int | None
    allocations: tuple
    shape: tuple
    usid: int | None = None
    ubase: int | None = None
    ushape: tuple | None = None


# where a compiled builder, which reads shapes by index, finds a _BufferShape's allocation ids and
# its user allocation's three fields (usid, ubase, ushape)
_ALLOCATIONS = _BufferShape._fields.index("allocations")
_USER = _BufferShape._fields.index("usid")
_new_shape = tuple.__new__


def _post_shapes(post: tuple, before: list, ib: int, tid: int, ids: tuple) -> tuple:
    """The touched buffers' shapes after a replay: the template's ``post`` (ids relative to
    the replay's bases), the allocations ``ids`` it now holds, and, where the lowering left
    a user allocation as it was, that part of the shape ``before`` it."""
    out = []
    for old, (sid, shape, _enc, ioff, toff, user), own in zip(before, post, ids):
        if user is None:
            usid, ubase, ushape = old.usid, old.ubase, old.ushape
        else:
            usid, ushape, uoff = user
            ubase = None if uoff is None else ib + uoff
        out.append(_new_shape(_BufferShape, (sid, None if ioff is None else ib + ioff,
                                             None if toff is None else tid + toff, own, shape,
                                             usid, ubase, ushape)))
    return tuple(out)


def _user_parts(shapes: list, ibase: int) -> tuple:
    """What a key adds for lowerings that touch a user allocation: per buffer its user
    shape and that shape's base relative to the lowering's."""
    return tuple([(sh.usid, None if sh.ubase is None else sh.ubase - ibase) for sh in shapes])


class _Env:
    """How ids of the lowering being recorded map to template references."""

    __slots__ = ("ibase", "abase", "mbase", "tid", "slot_of", "red_of", "task", "cmd")

    def __init__(self, igg, cmd: cg.Command, bids: tuple, shapes: list):
        self.ibase = igg._next_instr
        self.abase = igg._next_alloc
        self.mbase = igg._next_msg
        self.task = cmd.task
        self.cmd = cmd
        self.tid = cmd.task.id
        self.slot_of = {aid: (k, j) for k, sh in enumerate(shapes) for j, aid in enumerate(sh.allocations)}
        self.red_of = _reduction_refs(cmd.task, (cmd,), False)

    def group(self, commands: _GroupCommands) -> None:
        """Record a group template of ``commands``: the reductions its commands gather (of
        earlier tasks) are referred to as command ``k``'s own (``("c", k)``) or as its
        transfer's (``("x", k)``), the task's own ones as before."""
        self.cmd = commands
        self.red_of = _reduction_refs(commands.task, commands.cmds, True)

    def aid(self, a: int):
        s = self.slot_of.get(a)
        if s is not None:
            return ("s",) + s
        if a >= self.abase:
            return ("n", a - self.abase)
        raise TemplateMismatch(f"allocation A{a}")

    def mid(self, m: int) -> int:
        if m < self.mbase:
            raise TemplateMismatch(f"message {m}")
        return m - self.mbase

    def rid(self, r: int):
        if r == 0:
            return 0
        s = self.red_of.get(r)
        if s is None:
            raise TemplateMismatch(f"reduction {r}")
        return s

    def transfer(self, t: tuple) -> tuple:
        return (t[0] - self.tid, t[1], self.rid(t[2]))


def _reduction_refs(task, cmds, indexed: bool) -> dict:
    """How a template names the reductions of the lowering of ``cmds`` (one command, or a
    task's group of them: ``indexed``): the task's own as ``("t", i)``, a reduction
    command's as ``("c",)`` (``("c", k)``: command ``k`` of the group), and another that a
    transfer carries (partial results of an earlier task's) as ``("x",)`` / ``("x", k)``.
    A reduction command's is taken first: an instruction that needs the reduction itself,
    not only its id, finds it there, whichever command's lowering made it."""
    red_of = {r.id: ("t", i) for i, r in enumerate(task.reductions)}
    for k, c in enumerate(cmds):
        red = getattr(c, "reduction", None)
        if red is not None and red.id not in red_of:
            red_of[red.id] = ("c", k) if indexed else ("c",)
    for k, c in enumerate(cmds):
        transfer = getattr(c, "transfer", None)
        if transfer is not None and transfer[2] and transfer[2] not in red_of:
            red_of[transfer[2]] = ("x", k) if indexed else ("x",)
    return red_of


def _encode(ins, env: _Env) -> tuple:
    """An instruction as (class, ((field, role, value), ...)) with ids as references."""
    fields = []
    task = env.task
    for name in ins.__dataclass_fields__:
        v = getattr(ins, name)
        role = _ROLES.get(name)
        if role is None:
            fields.append((name, None, v))
            continue
        if role == "iid":
            v = v - env.ibase
        elif role == "deps":
            # the epoch dependency an instruction gets when it has no other (``_emit``) is
            # written symbolically (None: the epoch at replay), so that the template holds at
            # any distance from the epoch (a horizon's own dependencies stay relative: its key
            # holds the epoch)
            sym = env.cmd.kind != cg.HORIZON
            v = tuple([(None if sym and o == DEP_LAST_EPOCH else d - env.ibase, o) for d, o in v])
        elif role == "aid":
            v = None if v is None else env.aid(v)
        elif role == "tid":
            v = v - env.tid
        elif role == "transfer":
            v = env.transfer(v)
        elif role == "mid":
            v = env.mid(v)
        elif role == "rid":
            v = env.rid(v)
        elif role == "accesses":
            v = tuple([(a.buffer, None if a.allocation < 0 else env.aid(a.allocation), a.allocation_box, a.box,
                        a.region, a.mode) for a in v])
        elif role == "redallocs":
            v = tuple([(env.rid(r.reduction), r.buffer, env.aid(r.allocation), r.include_current) for r in v])
        elif role == "launcher":
            if v is not task.launcher:
                raise TemplateMismatch("launcher")
            v = None
        elif role == "name":
            if v != task.name:
                fields.append((name, None, v))
                continue
            v = None
        elif role == "global_range":
            if v != (task.geometry.global_range if task.geometry else ()):
                raise TemplateMismatch("global range")
            v = None
        elif role == "garbage":
            if v:
                raise TemplateMismatch("garbage")
            v = None
        elif role in ("identity", "op"):
            red = _reduction_of(ins, env)
            if getattr(red, role) is not v:
                raise TemplateMismatch(role)
            v = env.rid(ins.reduction)
        fields.append((name, role, v))
    return (type(ins), tuple(fields))


# patch codes of the common roles (the rest, but a kernel's accesses, go through ``_DECODE``)
_IID, _DEPS, _NEW_AID, _SLOT_AID, _TID, _MID, _LAUNCHER, _NAME, _OTHER = range(9)


def _compact(encoded: tuple) -> tuple:
    """(class, positional prototype, patches): replay copies the prototype and patches only
    the positions that hold ids or the task's own values, in field order."""
    cls, fields = encoded
    proto = []
    patches = []
    for pos, (name, role, val) in enumerate(fields):
        proto.append(val if role is None else None)
        if role is None:
            continue
        if role == "iid":
            patches.append((pos, _IID, val))
        elif role == "deps":
            patches.append((pos, _DEPS, val))
        elif role == "aid" and val is not None and val[0] == "n":
            patches.append((pos, _NEW_AID, val[1]))
        elif role == "aid" and val is not None:
            patches.append((pos, _SLOT_AID, (val[1], val[2])))
        elif role == "aid":
            continue   # (None stays None)
        elif role == "tid":
            patches.append((pos, _TID, val))
        elif role == "mid":
            patches.append((pos, _MID, val))
        elif role == "launcher":
            patches.append((pos, _LAUNCHER, None))
        elif role == "name":
            patches.append((pos, _NAME, None))
        else:
            patches.append((pos, _OTHER, (role, val)))
    return cls, tuple(proto), tuple(patches)


def _summary(instrs: tuple) -> tuple[tuple, tuple, tuple]:
    """A template's instruction counts per kind and the execution front's net change (see
    ``EpochTracker.add``, applied per instruction by a lowering): the dependencies outside
    the template leave the front (``ext``), and the template's instructions no later one
    of them depends on join it (``sinks``).  Ids relative to the template's base; ``ext``
    as ``(whether the symbolic epoch leaves, the ids as a frozenset)``, so a replay takes
    out of the front whichever side is the smaller, the front or ``ext``."""
    kinds: dict = {}
    own, needed = [], set()
    for cls, _proto, patches in instrs:
        kinds[cls.kind] = kinds.get(cls.kind, 0) + 1
        for _pos, code, val in patches:
            if code == _IID:
                own.append(val)
            elif code == _DEPS:
                needed.update(d for d, _o in val)
    # (None, the symbolic epoch, leaves the front too: first, as it sorts before every id)
    ext = needed.difference(own)
    sym = None in ext
    ext.discard(None)
    return (tuple(kinds.items()), (sym, frozenset(ext)),
            tuple(r for r in own if r not in needed))


class _Interpreted:
    """``_builder``'s function without the compile: the same instructions from the same
    prototypes and patches, interpreted at every call (a template's first replays)."""

    __slots__ = ("instrs", "kinds", "ids", "ext", "sinks", "post")

    def __init__(self, instrs: tuple, post: tuple):
        self.instrs = instrs
        self.kinds, self.ext, self.sinks = _summary(instrs)
        self.ids = tuple([tuple(p[2]) for p in post])
        self.post = post

    def __call__(self, ib, ab, mb, tid, shapes, ctx, task):
        made = []
        for cls, proto, patches in self.instrs:
            args = list(proto)
            for pos, code, val in patches:
                if code == _IID:
                    args[pos] = ib + val
                elif code == _DEPS:
                    args[pos] = [(ctx[6] if d is None else ib + d, o) for d, o in val]
                elif code == _NEW_AID:
                    args[pos] = ab + val
                elif code == _SLOT_AID:
                    args[pos] = shapes[val[0]].allocations[val[1]]
                elif code == _TID:
                    args[pos] = tid + val
                elif code == _MID:
                    args[pos] = mb + val
                elif code == _LAUNCHER:
                    args[pos] = task.launcher
                elif code == _NAME:
                    args[pos] = task.name
                elif val[0] == "accesses":
                    args[pos] = [AccessAllocation(buf, -1 if a is None else _dec_aid(a, ctx, None), abox, box,
                                                  region, mode) for buf, a, abox, box, region, mode in val[1]]
                elif val[0] == "redallocs" and not val[1]:
                    args[pos] = []
                else:
                    args[pos] = _DECODE[val[0]](val[1], ctx, None)
            made.append(cls(*args))
        ids = tuple([tuple([_dec_aid(a, ctx, None) for a in enc]) for enc in self.ids])
        return tuple(made), self.kinds, _post_shapes(self.post, shapes, ib, tid, ids), self.ext, self.sinks


def _builder(instrs: tuple, post: tuple, codes: dict, makers: dict):
    """A function that makes a template's instructions with fresh ids: the prototypes and
    patches written out as one expression per instruction (compiled once per template, at
    its ``COMPILE_AFTER``-th replay), instead of copying each prototype and interpreting
    its patches.  Every value, ids and offsets included, is a global name of the
    function, so the source is the template's structure only: templates of one
    structure (a step's phases, a stream's rows) share the compiled code (``codes``, the
    generator's: source -> code object), and each costs a copy of the code with its own
    globals instead of a ``compile`` (the 128² stencil's 5 builders have 2 structures; a
    stream window's 134 have 10; see ``compiled_builder``)."""
    ns: dict = {"_DECODE": _DECODE}
    used: set[int] = set()      # the buffers whose allocations the instructions name
    exprs = []

    def aid(a) -> str:   # (as _dec_aid decodes it)
        if a[0] == "n":
            return f"ab + {const(a[1])}"
        used.add(a[1])
        return f"s{a[1]}[{const(a[2])}]"

    const = partial(bind_value, ns)     # (value -> its name in the source)

    for i, (cls, proto, patches) in enumerate(instrs):
        args = [const(v) for v in proto]
        for pos, code, val in patches:
            if code == _IID:
                args[pos] = f"ib + {const(val)}"
            elif code == _DEPS:
                args[pos] = "[" + ", ".join(f"({'ctx[6]' if d is None else 'ib + ' + const(d)}, {const(o)})"
                                            for d, o in val) + "]"
            elif code == _NEW_AID:
                args[pos] = f"ab + {const(val)}"
            elif code == _SLOT_AID:
                used.add(val[0])
                args[pos] = f"s{val[0]}[{const(val[1])}]"
            elif code == _TID:
                args[pos] = f"tid + {const(val)}"
            elif code == _MID:
                args[pos] = f"mb + {const(val)}"
            elif code == _LAUNCHER:
                args[pos] = "task.launcher"
            elif code == _NAME:
                args[pos] = "task.name"
            elif val[0] == "accesses":   # (written out: a kernel's accesses are most of its fields)
                ns["AA"] = AccessAllocation
                accs = val[1]
                if not accs:    # (one list for every replay: see _remember_accesses)
                    args[pos] = const([])
                elif any(a is not None and a[0] == "n" for _b, a, *_r in accs):   # (new allocations: ids never repeat)
                    args[pos] = "[" + "".join(
                        f"AA({const(buf)}, {-1 if a is None else aid(a)}, {const(abox)}, {const(box)}, "
                        f"{const(region)}, {const(mode)}), " for buf, a, abox, box, region, mode in accs) + "]"
                else:
                    # the list of the last replay while the buffers' slots hold the same allocations
                    # (see _remember_accesses)
                    ns["REMEMBER"] = _remember_accesses
                    memo = const([None, None])
                    ids = "(" + "".join(f"{-1 if a is None else aid(a)}, " for _b, a, *_r in accs) + ")"
                    made = "[" + "".join(
                        f"AA({const(buf)}, _ids[{k}], {const(abox)}, {const(box)}, {const(region)}, {const(mode)}), "
                        for k, (buf, _a, abox, box, region, mode) in enumerate(accs)) + "]"
                    args[pos] = f"({memo}[1] if {memo}[0] == (_ids := {ids}) else REMEMBER({memo}, _ids, {made}))"
            elif val[0] == "redallocs" and not val[1]:
                args[pos] = "[]"
            else:
                args[pos] = f"_DECODE[{val[0]!r}]({const(val[1])}, ctx, None)"
        maker = makers.get(cls)
        if maker is None:
            maker = makers[cls] = _maker(cls)
        ns[f"C{i}"] = maker
        exprs.append(f"C{i}({', '.join(args)})")
    ns["KINDS"], ns["EXT"], ns["SINKS"] = _summary(instrs)
    # the touched buffers' shapes after the lowering (``_post_shapes`` written out)
    ns["BS"], ns["NEW"] = _BufferShape, _new_shape
    after = []
    for k, (sid, shape, enc, ioff, toff, user) in enumerate(post):
        ids = "(" + "".join(aid(a) + ", " for a in enc) + ")"
        if user is None:
            u = f"shapes[{k}][{_USER}], shapes[{k}][{_USER + 1}], shapes[{k}][{_USER + 2}]"
        else:
            usid, ushape, uoff = user
            u = f"{const(usid)}, {'None' if uoff is None else f'ib + {const(uoff)}'}, {const(ushape)}"
        after.append(f"NEW(BS, ({const(sid)}, {'None' if ioff is None else f'ib + {const(ioff)}'}, "
                     f"{'None' if toff is None else f'tid + {const(toff)}'}, {ids}, {const(shape)}, {u})), ")
    # (each buffer's allocation ids read once: s<k> = shapes[k].allocations)
    slots = "".join(f"    s{k} = shapes[{k}][{_ALLOCATIONS}]\n" for k in sorted(used))
    src = ("def build(ib, ab, mb, tid, shapes, ctx, task):\n"
           f"{slots}"
           f"    return ({''.join(e + ', ' for e in exprs)}), KINDS, ({''.join(after)}), EXT, SINKS\n")
    return compiled_builder(src, "<replay template>", codes, ns)


def _maker(cls):
    """A function that makes a ``cls`` from its fields in order, as the class's call does, but
    called from a builder as a Python function: CPython 3.11 runs a call of a Python
    function from Python code in the caller's evaluation loop, while a class's call enters
    ``__init__`` through C as a frame of its own (270 against 330 ns for a kernel's 14
    fields; setting them in the builder itself, 230 ns, made the stencil's builder source
    twice as long and its ``compile`` 0.4 ms slower).  Every field is an ``__init__``
    argument and none of the classes has a ``__post_init__``.  Made once per class and
    generator (``_builder``'s ``makers``, the generator's), when a builder first makes
    one: ~50 us each, for the classes it replays only."""
    names = tuple(cls.__dataclass_fields__)
    src = (f"def make({', '.join(names)}):\n    o = MAKE(C)\n"
           + "".join(f"    o.{n} = {n}\n" for n in names) + "    return o\n")
    ns = {"MAKE": object.__new__, "C": cls}
    exec(compile(src, f"<make {cls.__name__}>", "exec"), ns)   # noqa: S102 - field names only
    return ns["make"]


def _remember_accesses(memo: list, ids: tuple, accesses: list) -> list:
    """A compiled builder's memo of a kernel's accesses: as long as the allocations they
    name stay the same (a stencil's buffers keep theirs from step to step), each replay
    hands out the same list of the same ``AccessAllocation`` objects instead of making
    new ones, and the executor keeps the launch context it built for that list (see
    ``Executor._direct_kernel``).  Nothing changes an instruction's accesses once it
    is made."""
    memo[0] = ids
    memo[1] = accesses
    return accesses


def _reduction_of(ins, env: _Env):
    src = env.rid(ins.reduction)
    return _reduction_from(src, env.cmd)


def _reduction_from(src, cmd):
    if src[0] == "t":
        return cmd.task.reductions[src[1]]
    if src[0] == "c":
        return (cmd if len(src) == 1 else cmd.cmds[src[1]]).reduction   # (("c", k): a group's command k)
    raise TemplateMismatch("reduction object")


# ---- decoding: (value, ctx, fields decoded so far) -> field value ---------------------------
# ctx = (instruction base, allocation base, message base, task id, the touched buffers' _BufferShapes,
#        command, epoch)

def _dec_aid(a, ctx, _kw):
    if a is None:
        return None
    if a[0] == "n":
        return ctx[1] + a[1]
    return ctx[4][a[1]].allocations[a[2]]


def _dec_rid(r, ctx, _kw):
    if r == 0:
        return 0
    cmd = ctx[5]
    if r[0] == "t":
        return cmd.task.reductions[r[1]].id
    if len(r) > 1:      # (("c", k), ("x", k): command k of a group, see _Env.group)
        cmd = cmd.cmds[r[1]]
    if r[0] == "c":
        return cmd.reduction.id
    return cmd.transfer[2]


def _dec_transfer(t, ctx, _kw):
    return (ctx[3] + t[0], t[1], _dec_rid(t[2], ctx, None))


def _dec_redallocs(v, ctx, _kw):
    return [ReductionAllocation(_dec_rid(r, ctx, None), buf, _dec_aid(a, ctx, None), inc) for r, buf, a, inc in v]


def _dec_red_attr(attr):
    def dec(src, ctx, _args):
        # (``src`` is the encoded reduction id of the instruction: whose reduction it is)
        return getattr(_reduction_from(src, ctx[5]), attr)
    return dec


# the roles ``_builder`` does not write out itself (ids, dependencies, allocations, the task's
# launcher and name, and a kernel's accesses are)
_DECODE = {
    "transfer": _dec_transfer,
    "rid": _dec_rid,
    "redallocs": _dec_redallocs,
    "global_range": lambda _v, ctx, _kw: ctx[5].task.geometry.global_range if ctx[5].task.geometry else (),
    "identity": _dec_red_attr("identity"),
    "op": _dec_red_attr("op"),
    "garbage": lambda _v, _ctx, _kw: [],
}
