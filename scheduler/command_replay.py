"""Replay at the command-graph level (the design is in ``replay.py``).

A mixin of ``CommandGraphGenerator``.  Per buffer, the shape holds the projection of
the data distribution this rank keeps (what it wrote and who holds it, what it
holds, what was never written), the per-point last writer and readers (command ids
relative to a base) and the participants of a pending reduction.  The pending
reduction object itself (another task's) is read from the buffer at replay time.
Horizons have templates of their own, keyed on every buffer's shape and the front.
"""
from __future__ import annotations

from functools import partial
from typing import Callable

from . import replay as _replay_module
from . import task_graph as tg
from .horizons import forget_before
from .replay import absolute_epoch, absolute_id, bind_value, compiled_builder, own_base_shape, relative_id

_REPLAYABLE = frozenset((tg.DEVICE_COMPUTE, tg.HOST_COMPUTE, tg.COLLECTIVE, tg.MASTER_NODE, tg.HORIZON))


class CommandReplayMixin:
    """Replay of ``CommandGraphGenerator.build`` (uses the generator's state)."""

    def _build_replayed(self, task, out: list) -> None:
        """``build`` by a template where one holds: along a chain of templates from the last
        horizon's (as the instruction graph's, see ``InstructionReplayMixin._chain_key``:
        a horizon's key holds every buffer, the front, the last side effects and
        collectives and the epoch), from the chain's node without a key; else by the
        task's key."""
        chain = self._chain
        sig_id = None
        if chain is not None:
            # (a step is the task graph's int for the task's signature, which the task carries:
            # no hash of the signature here; a horizon's is -1, no signature's)
            kind = task.kind
            if kind == tg.HORIZON:
                sig_id = -1
            elif kind in _REPLAYABLE:
                sig_id = task.replay_sig_id
            if sig_id is not None:
                entry = chain.get(sig_id)
                if entry is not None:
                    tpl, bids, nxt = entry
                    self._chain = nxt
                    replay = self.replay
                    replay.hits += 1
                    replay.chained += 1
                    self._replay(task, bids, tpl, out)
                    return
            self._chain = None
        tpl, bids = self._build_keyed(task, out)
        if tpl is not None:
            nxt = self._chains.after(chain, sig_id, tpl, bids, tpl[3], 2, task.kind == tg.HORIZON)
            if nxt is not None:
                self._chain = nxt

    def _build_keyed(self, task, out: list) -> tuple:
        """``_build_replayed`` by the task's key: the template that holds for this lowering from
        now on (found, or recorded now; None: none) and the buffers it touches."""
        replay = self.replay
        key = self._replay_key(task) if task.kind in _REPLAYABLE else None
        if key is None or len(key) == 1:
            if key is None:
                replay.bypassed += 1
            self._build_now(task, out)
            self._forget_shapes(None if task.kind in (tg.EPOCH, tg.HORIZON) else _touched(task))
            return None, None
        base = self._next_id
        epoch = self._horizons.epoch
        epoch_rel = None if epoch is None else epoch - base
        tpl = replay.find(key, epoch_rel)
        if tpl is not None:
            replay.hits += 1
            self._replay(task, key[1], tpl, out)
            return tpl, key[1]
        bids = key[1]
        self._sync_buffers(bids)
        pending = [self._buffers[bid].pending for bid in bids]
        self._warned = False
        self._epoch_merged = False
        self._build_now(task, out)
        if self._warned:
            replay.bypassed += 1     # diagnostics are logged by every lowering
            self._forget_shapes(bids)
            return None, None
        replay.misses += 1
        # (a horizon's key holds the epoch itself: its lowering moves it)
        tpl = self._record(task, bids, base, pending, out)
        replay.keep(key, tpl, epoch_rel, task.kind != tg.HORIZON and (self._epoch_merged or _names_epoch(out, epoch)))
        return tpl, bids

    def _forget_shapes(self, bids) -> None:
        if bids is None:
            self._sync_buffers(None)
            self._shapes.clear()
        else:
            self._sync_buffers(bids)
            for bid in bids:
                self._shapes.pop(bid, None)

    def _sync_buffers(self, bids) -> None:
        """Rebuild the objects of buffers that replay left as shapes (None: all)."""
        stale = self._stale
        if not stale:
            return
        epoch = self._horizons.epoch     # (what a shape's EPOCH_ID stands for: see _buffer_shape)
        for bid in list(stale) if bids is None else bids:
            rec = stale.pop(bid, None)
            if rec is not None:
                _restore_buffer(self._buffers[bid], rec[2], absolute_epoch(rec[1] or 0, epoch))

    # ---- keys ----------------------------------------------------------------------------
    def _replay_key(self, task) -> tuple | None:
        """What determines this rank's commands for ``task`` and its buffers' new state
        (None: lower every time, for user mappers and fences)."""
        kind = task.kind
        horizon = kind == tg.HORIZON
        if horizon:
            bids = tuple(sorted(self._buffers))
            sig = (kind,)
        else:
            sig = tg.replay_signature(task)
            if sig is None:
                return None
            bids = _touched(task)
        sig_id = self.replay.signature(sig)
        if sig_id is None:
            return (sig,)   # a first sighting: lowered normally, nothing shaped or recorded
        base = self._next_id
        shapes = self._shapes
        buffers = self._buffers
        parts = []
        for bid in bids:
            rec = shapes.get(bid)
            if rec is None:
                shape, top = _buffer_shape(buffers[bid], self._horizons.epoch)
                rec = shapes[bid] = (self.replay.intern(shape), top, shape)
            parts.append(rec[0])
            parts.append(None if rec[1] is None else rec[1] - base)
        live = self._live
        horizons = self._horizons
        epoch = None if horizons.epoch is None else horizons.epoch - base
        if horizon:
            # (the epoch's distance only where the horizon leaves the epoch where it is, which its
            # template then names: otherwise the previous horizon becomes the epoch and everything
            # older, the old epoch included (written symbolically in the shapes), collapses onto
            # it, whatever its distance was: the first horizon after the initial epoch and the
            # later ones, which follow a horizon, lowered alike)
            cur = horizons.current_horizon
            extras = (epoch if cur is None else None, None if cur is None else cur - base,
                      tuple([f - base for f in sorted(horizons.front)]),
                      tuple([(k, _rel_command(v, base, live)) for k, v in sorted(self._last_side_effect.items())]),
                      tuple([(k, _rel_command(v, base, live)) for k, v in sorted(self._last_collective.items())]))
        else:   # (the epoch's distance is not in the key: see Replay.find)
            extras = (epoch is None,
                      tuple([_rel_command(self._last_side_effect.get(ho), base, live) for ho in task.side_effects])
                      if task.side_effects else (),
                      None if task.collective_group is None else
                      _rel_command(self._last_collective.get(task.collective_group), base, live))
        return (sig_id, bids, tuple(parts), extras)

    # ---- recording ---------------------------------------------------------------------
    def _record(self, task, bids: tuple, base: int, pending_before: list, out: list) -> tuple:
        """The template of the lowering just done: the commands (ids relative to ``base``),
        then per buffer its new state and what became of its pending reduction."""
        from .command_graph import AWAIT_PUSH, EXECUTION, PUSH, REDUCTION
        cmds = []
        # a command's epoch dependency (it has no true one) is written symbolically (None:
        # whichever command is the epoch at replay), so that the template holds at any
        # distance from the epoch, unless it merged with an anti-dependency on the epoch
        # itself, whose relative id is the state's (the template is then kept per distance)
        symbolic = task.kind != tg.HORIZON and not self._epoch_merged
        for c in out:
            deps = tuple([(None if symbolic and kd[1] == tg.ORIGIN_LAST_EPOCH else d - base, kd)
                          for d, kd in c.deps.items()])
            kind = c.kind
            if kind == EXECUTION:
                fields = (c.box, c.include_current_reductions, [None, None, None, None])
            elif kind == PUSH:
                fields = (c.transfer[1], c.transfer[2] != 0, tuple(c.targets), c.contributes)
            elif kind == AWAIT_PUSH:
                fields = (c.transfer[1], c.transfer[2] != 0, c.region)
            elif kind == REDUCTION:   # always of the pending reduction of ``buffer``
                fields = (c.buffer, c.contributes)
            else:
                fields = ()
            cmds.append((type(c), c.id - base, deps, fields))
        post = []
        epoch = self._horizons.epoch
        for bid, old in zip(bids, pending_before):
            st = self._buffers[bid]
            shape, top = _buffer_shape(st, epoch)
            sid = self.replay.intern(shape)
            self._shapes[bid] = (sid, top, shape)
            p = st.pending
            if p is None:
                pend = None
            elif p is old:
                pend = "kept"
            else:
                pend = (task.reductions.index(p[0]), p[1])
            post.append((bid, sid, shape, pend, relative_id(top, base)))
        live = self._live
        if task.kind == tg.HORIZON:
            h = self._horizons
            effects = (tuple([(k, _rel_command(v, base, live)) for k, v in self._last_side_effect.items()]),
                       tuple([(k, _rel_command(v, base, live)) for k, v in self._last_collective.items()]),
                       None if h.current_horizon is None else h.current_horizon - base,
                       None if h.epoch is None else h.epoch - base)
        else:
            effects = (tuple([_rel_command(self._last_side_effect.get(ho), base, live) for ho in task.side_effects]),
                       None if task.collective_group is None else
                       _rel_command(self._last_collective.get(task.collective_group), base, live))
            if not effects[0] and effects[1] is None:
                effects = None      # (most tasks: nothing for a replay to apply)
        # (builder: [compiled builder, replays so far, a horizon's chain root]; see _replay and
        # _build_replayed)
        return tuple(cmds), tuple(post), effects, [None, 0, None]

    # ---- replay ------------------------------------------------------------------------
    def _replay(self, task, bids: tuple, tpl: tuple, out: list) -> None:
        cmds, post, effects, builder = tpl
        build = builder[0]
        if build is None and task.kind != tg.HORIZON:
            # compiled at the template's COMPILE_AFTER-th replay, as instruction templates are
            # (a horizon's template is interpreted: it replays once per horizon step and
            # moves the epoch)
            builder[1] += 1
            if builder[1] >= _replay_module.COMPILE_AFTER:
                build = builder[0] = _command_builder(cmds, post, self._COMMAND_CLASSES, self._builder_code)
        if build is None:
            self._replay_interpreted(task, cmds, post, effects, out)
            return
        base = self._next_id
        n = len(cmds)
        self._next_id = base + n
        made = build(base, self._horizons.epoch, task, task.id, self._buffers, self._live, self._horizons.front,
                     out, self._shapes, self._stale)
        self.num_commands += n
        recorder = self.recorder
        if recorder is not None:
            for c in made:
                recorder.record_command(c)
        if effects is not None:
            self._replay_effects(task, effects, base)

    def _replay_interpreted(self, task, cmds: tuple, post: tuple, effects: tuple, out: list) -> None:
        AwaitPushCommand, ExecutionCommand, PushCommand, ReductionCommand = self._COMMAND_CLASSES
        base = self._next_id
        buffers = self._buffers
        live = self._live
        tid = task.id
        made = []
        epoch = self._horizons.epoch
        for cls, rel, deps, fields in cmds:
            cid = base + rel
            # (the epoch's entry comes last, as _commit adds it: where it meets an anti-dependency
            # on the same command, the dict keeps that position and the epoch's kind and origin)
            dd = {}
            for d, kd in deps:      # (a loop, not a comprehension: that is a call in CPython 3.11)
                dd[epoch if d is None else base + d] = kd
            if cls is ExecutionCommand:
                c = ExecutionCommand(cid, task, dd, fields[0], fields[1], None, fields[2])
            elif cls is PushCommand:
                bid, pend, targets, contributes = fields
                c = PushCommand(cid, task, dd, (tid, bid, buffers[bid].pending[0].id if pend else 0),
                                list(targets), contributes)
            elif cls is AwaitPushCommand:
                bid, pend, region = fields
                c = AwaitPushCommand(cid, task, dd, (tid, bid, buffers[bid].pending[0].id if pend else 0), region)
            elif cls is ReductionCommand:
                bid, contributes = fields
                red = buffers[bid].pending[0]
                c = ReductionCommand(cid, task, dd, red, bid, (tid, bid, red.id), contributes)
            else:
                c = cls(cid, task, dd)
            made.append(c)
        self._next_id = base + len(cmds)
        horizons = self._horizons
        if task.kind == tg.HORIZON:
            (c,) = made
            horizons.front.clear()
            horizons.front[c.id] = c
            self._register(out, c)
        else:
            for c in made:
                horizons.add(c.id, c.deps, c)
                self._register(out, c)
        shapes = self._shapes
        stale = self._stale
        for bid, sid, shape, pend, top in post:
            if pend is None:
                buffers[bid].pending = None
            elif pend != "kept":
                buffers[bid].pending = (task.reductions[pend[0]], pend[1])
            shapes[bid] = stale[bid] = (sid, absolute_id(top, base), shape)
        if task.kind == tg.HORIZON:
            se, coll, cur, ep = effects
            # (a comprehension is a call in CPython 3.11: most programs have neither)
            self._last_side_effect = {k: live[base + v] for k, v in se} if se else {}
            self._last_collective = {k: live[base + v] for k, v in coll} if coll else {}
            old_epoch = horizons.epoch
            horizons.current_horizon = None if cur is None else base + cur
            horizons.epoch = None if ep is None else base + ep
            if horizons.epoch != old_epoch and horizons.epoch is not None:
                eid = horizons.epoch
                # (as _set_epoch forgets them; ids were registered in increasing order)
                forget_before(live, eid)
        elif effects is not None:
            self._replay_effects(task, effects, base)

    def _replay_effects(self, task, effects: tuple, base: int) -> None:
        """A (non-horizon) template's side effect and collective commands become the last ones
        (a template without either keeps None)."""
        se, coll = effects
        live = self._live
        for ho, rel in zip(task.side_effects, se):
            if rel is not None:
                self._last_side_effect[ho] = live[base + rel]
        if coll is not None:
            self._last_collective[task.collective_group] = live[base + coll]


def _command_builder(cmds: tuple, post: tuple, classes: tuple, codes) -> Callable:
    """A function that replays a (non-horizon) command template: ``_replay_interpreted``
    written out for this template's commands and buffers, compiled once per template (at
    its ``COMPILE_AFTER``-th replay).  Each command is one constructor call with its
    dependencies as a dict display, then its execution-front update and registration,
    in the interpreted order; then the buffers' new states.  Every value is a global name
    of the function, so templates of one structure share the compiled code (``codes``:
    source -> code object), as instruction templates' builders do (``_builder`` in
    ``instruction_replay``).  Returns the commands made."""
    AwaitPushCommand, ExecutionCommand, PushCommand, ReductionCommand = classes
    ns: dict = {}

    const = partial(bind_value, ns)     # (value -> its name in the source)

    lines = []
    names = []
    dep_keys = []       # per command, its dependencies' id expressions (the dict's, then the pops')
    for i, (cls, rel, deps, fields) in enumerate(cmds):
        cid = f"base + {const(rel)}"
        keys = ["epoch" if d is None else f"base + {const(d)}" for d, _kd in deps]
        dep_keys.append(keys)
        dd = "{" + "".join(f"{k}: {const(kd)}, " for k, (_d, kd) in zip(keys, deps)) + "}"
        ns[f"C{i}"] = cls
        if cls is ExecutionCommand:
            box, include, memo = fields
            call = f"C{i}({cid}, task, {dd}, {const(box)}, {const(include)}, None, {const(memo)})"
        elif cls is PushCommand or cls is AwaitPushCommand:
            b, pend = const(fields[0]), fields[1]
            transfer = f"(tid, {b}, {f'buffers[{b}].pending[0].id' if pend else '0'})"
            if cls is PushCommand:
                call = f"C{i}({cid}, task, {dd}, {transfer}, [*{const(fields[2])}], {const(fields[3])})"
            else:
                call = f"C{i}({cid}, task, {dd}, {transfer}, {const(fields[2])})"
        elif cls is ReductionCommand:
            bid, contributes = fields
            b = const(bid)
            call = f"C{i}({cid}, task, {dd}, (_r := buffers[{b}].pending[0]), {b}, (tid, {b}, _r.id), {const(contributes)})"
        else:
            call = f"C{i}({cid}, task, {dd})"
        lines.append(f"    c{i} = {call}")
        names.append(f"c{i}")
    for i, keys in enumerate(dep_keys):
        # (EpochTracker.add, then CommandGraphGenerator._register less its count and recorder)
        for k in keys:
            lines.append(f"    pop({k}, None)")
        lines.append(f"    front[c{i}.id] = live[c{i}.id] = c{i}")
    for bid, sid, shape, pend, top in post:
        b = const(bid)
        if pend is None:
            lines.append(f"    buffers[{b}].pending = None")
        elif pend != "kept":
            lines.append(f"    buffers[{b}].pending = (task.reductions[{const(pend[0])}], {const(pend[1])})")
        at = "None" if top is None else f"base + {const(top)}"
        lines.append(f"    shapes[{b}] = stale[{b}] = ({const(sid)}, {at}, {const(shape)})")
    made = "(" + "".join(f"{c}, " for c in names) + ")"
    src = ("def build(base, epoch, task, tid, buffers, live, front, out, shapes, stale):\n"
           "    pop = front.pop\n"
           + "\n".join(lines) + "\n"
           f"    made = {made}\n"
           "    out += made\n"
           "    return made\n")
    return compiled_builder(src, "<command template>", codes, ns)


def _names_epoch(out: list, epoch: int | None) -> bool:
    """Whether a lowering gave a command a dependency on the epoch other than the epoch
    dependency of a command without a true one (a read of data the epoch stands for, last
    written before it): the template is then kept per epoch distance (``Replay.keep``),
    since shapes write the epoch symbolically and the key does not say how far it is."""
    return epoch is not None and any(d == epoch and kd[1] != tg.ORIGIN_LAST_EPOCH
                                     for c in out for d, kd in c.deps.items())


def _touched(task) -> tuple:
    return task.buffer_ids


def _rel_command(c, base: int, live: dict) -> int | None:
    """A command's id relative to ``base``; None for none (or one already forgotten)."""
    return None if c is None or c.id not in live else c.id - base


def _buffer_shape(st, epoch: int | None) -> tuple[tuple, int | None]:
    """A buffer's distribution and access state, and the base its command ids are
    relative to (the newest command it names, the epoch aside; see ``own_base_shape``).
    References to the epoch for new commands are written symbolically
    (``relative_epoch``), as the instruction graph's shapes write them: what another
    rank writes keeps this rank's epoch as its last writer, at a distance that differed
    between the first horizon period and the later ones, so a multi-rank step was
    lowered anew for a whole period more.  The pending reduction by its participants
    only: the reduction object is the producing task's, and the lowering uses nothing
    else of it."""
    access, top = own_base_shape(st.access, epoch)
    p = st.pending
    return (st.mine.snapshot(), st.mine_bb, st.held, st.uninit, access, None if p is None else p[1]), top


def _restore_buffer(st, shape: tuple, absolute_ids) -> None:
    mine, mine_bb, held, uninit, access, _pending = shape
    st.mine.restore(mine)
    st.mine_bb = mine_bb
    st.held = held          # (regions are immutable: the template's objects are shared)
    st.uninit = uninit
    st.access.restore(access, absolute_ids)
