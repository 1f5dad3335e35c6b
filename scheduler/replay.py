"""Replay of repeating steps: lower a task the first time, replay the recording after.

Iterative programs submit the same steps again and again: the same kernels, mappers,
ranges and buffers, with the buffers in the same states every period.  Lowering is
a deterministic function of the task and of the generator state of the buffers it
touches, so each generator (task graph, command graph, instruction graph) memoizes
it:

* **State identity.**  A buffer's generator state is kept as an interned *shape*
  (a small int) plus a *base*: the shape is the state with every node id written
  relative to the base, the newest id the state names (``newest_named``; None where
  it names none).  The state fixes its base itself, so one state is one shape
  whenever it is taken, by a template's recording or at a later lookup.  Node ids
  only ever grow and the per-point state is collapsed onto the latest epoch at every
  horizon, so in a periodic program the relative states repeat exactly.
* **Key.**  The task's (or command's) signature: kind, geometry, split, hints, per
  access the buffer, mode and mapper (built-in mappers, and user functions that read
  only immutable values, are keyed by their parameters and shared across tasks, so the
  mapper object stands for the mapped regions of every chunk), the
  reductions, side effects and collective group; plus, per touched buffer, its
  shape and how far its base lies behind the current one; plus the ids (again
  relative) of the last side effect or collective task in play.  The epoch's id is
  in the key of a horizon that leaves the epoch where it is only (one that makes the
  previous horizon the epoch collapses the old one onto it, wherever it was; the
  command graph keys them so): another lowering reads it only when it hands a node
  with no true dependency the epoch dependency, and such a template is kept under
  the epoch's relative id as well (``Replay.find`` / ``keep``).  The command and
  instruction graphs' shapes write a state's references to the epoch symbolically
  (``relative_epoch``): a user allocation's data, and on several ranks what another
  rank writes, is last written by the epoch for as long as it is not rewritten here,
  and its distance made a new shape at every horizon (a template that depends on the
  epoch is kept under its distance, as above).
* **Hit.**  The recorded template is emitted with fresh ids (relative id + the
  current base): its dependencies bind to the same relative ids, which name the same
  nodes of the current state.  The touched buffers take the template's new state.
* **Miss.**  The task is lowered normally and a template is recorded by writing the
  output and the new state relative to the base.
* **A task's commands together.**  On several ranks a task gives each rank a few
  commands (the execution, pushes, await-pushes).  Their lowering together is a function
  of their signatures and of the union of the buffers they touch, so the instruction
  graph also keeps them as one template (recorded from lowering them one by one) and a
  repeating step replays them in one step (``InstructionReplayMixin.group_probe``); so
  are a step's own reductions (a residual reduced every step) and the commands that
  gather an earlier step's partial results (the template names the reduction as the
  task's, or as the one of the group's command that gathers it).

* **Chains.**  A horizon's key holds every buffer's state, the execution front, the
  last side effects and collectives and the epoch, so the whole state after its
  template is the template's, whatever came before; every later lowering is a template
  that the state and the task (or command) fix, and it fixes the state after it.  So
  the command and instruction graphs keep, from each horizon's template on, a chain of
  nodes: a node remembers per step (the signature's int; at the instruction level also
  how many task ids lie since the chain's last step) the template and the next node,
  and a repeating period finds its templates without computing a key (a key's shapes,
  parts and lookups were ~15 % of a no-op stencil step's scheduler instructions).
  Anything that changes the state outside a chain step (a lowering that is not a
  template, lookahead recording a need, a buffer or host object created or destroyed)
  ends the chain until the next horizon's template starts one.  A node keeps at most
  ``CHAIN_WIDTH`` steps and a generator's chains ``CHAIN_ENTRIES`` in all, past which
  they are forgotten and learnt anew (``Chains``).

Exactness: ids are compared only for equality and order by the generators, and a
relative encoding preserves both; everything else that a lowering reads is in the
key.  ``tests/test_replay.py`` compiles the golden and differential programs with
replay on and off and asserts identical graphs.  A task whose lowering would warn
(uninitialized reads, diagnostics) or uses a user mapper that sees mutable state (which
may change between submits) is lowered normally every time.

The memo is a ``BoundedCache`` of ``DEFAULT_TEMPLATES`` templates per generator and
rank (a stencil needs a handful: a template per step of the buffers' period, per
phase of the horizon period); ``CELERITAS_REPLAY=off`` disables it.
"""
from __future__ import annotations

from types import FunctionType

from .bounded_cache import BoundedCache

DEFAULT_TEMPLATES = 4096
# replays of a template before its builder is compiled (instruction templates: see
# ``InstructionReplayMixin._instantiate``; command templates: ``CommandReplayMixin._replay``);
# read at each replay before that, so that a test or the fuzzer may set it
COMPILE_AFTER = 8


_EPOCH_KEYED = ("epoch-keyed",)   # stored under a key whose templates are kept per epoch distance


class Replay:
    """One generator's memo of lowerings, with its hit counts."""

    __slots__ = ("templates", "hits", "misses", "bypassed", "first", "grouped", "grouped_reductions",
                 "grouped_gathers", "chained", "chained_groups", "_shapes", "_next_shape", "_seen")

    def __init__(self, limit: int = DEFAULT_TEMPLATES):
        self.templates = BoundedCache(limit)
        self.hits = 0          # lowerings replayed from a template
        self.misses = 0        # lowerings done normally and recorded
        self.bypassed = 0      # lowerings that cannot be replayed (user mappers, diagnostics, ...)
        self.first = 0         # first sightings of a signature: lowered without keying or recording
        self.grouped = 0       # hits of a template of a task's commands together (counted in hits too)
        self.grouped_reductions = 0   # those of tasks with reductions of their own (counted in grouped too)
        self.grouped_gathers = 0      # those that gather an earlier task's pending reduction (in grouped too)
        self.chained = 0       # hits found along a chain, without a key (counted in hits too)
        self.chained_groups = 0       # those of a task's commands together (counted in chained and grouped too)
        self._shapes = BoundedCache(4 * limit)
        self._next_shape = 0
        self._seen = BoundedCache(4 * limit)

    def signature(self, signature: tuple) -> int | None:
        """A small int standing for ``signature`` once it has been lowered before, None the
        first time (which remembers it).  A step that never repeats pays no replay cost: its
        buffers are not shaped and nothing is recorded until its signature comes round a
        second time.  Keys hold the int, so the signature tuple is hashed once per lowering."""
        sid = self._seen.get(signature)
        if sid is not None:
            return sid
        self._number(self._seen, signature)
        self.first += 1
        return None

    def identify(self, signature: tuple) -> int:
        """``signature``'s int, made now where it has none (no first sighting counted: for
        signatures whose parts were each seen before, see ``group_probe``)."""
        return self._number(self._seen, signature)

    def known(self, signature: tuple) -> int | None:
        """``signature``'s int where it has been lowered before, None otherwise (remembering
        nothing: a look that must not count as a sighting)."""
        return self._seen.get(signature)

    def intern(self, shape: tuple) -> int:
        """A small int standing for ``shape`` (equal shapes, equal ints), so that keys hash
        and compare in O(1) however large a buffer's state is.  Ints are never reused:
        a forgotten shape just gets a new one."""
        return self._number(self._shapes, shape)

    def _number(self, cache: BoundedCache, key: tuple) -> int:
        """``key``'s int in ``cache``, a new one where it has none (one counter for shapes and
        signatures: an int is never reused for anything else)."""
        n = cache.get(key)
        if n is None:
            n = self._next_shape
            self._next_shape += 1
            cache.put(key, n)
        return n

    def find(self, key: tuple, epoch_rel: int | None):
        """The template for ``key``, or None.  ``epoch_rel`` is where the epoch for new nodes
        lies relative to the lowering's base: it is not part of the key, because only a
        lowering that hands a node the epoch dependency (a node with no true dependency
        of its own) reads it, and such a template is kept under ``(key, epoch_rel)``
        (see ``keep``).  Keying every lowering by it made every task after an epoch miss
        until the second horizon had moved the epoch along (a stream of 17 tasks per
        window, re-lowered for three windows after each ``wait``)."""
        tpl = self.templates.get(key)
        if tpl is _EPOCH_KEYED:
            tpl = self.templates.get((key, epoch_rel))
        return tpl

    def keep(self, key: tuple, tpl: tuple, epoch_rel: int | None, used_epoch: bool) -> None:
        """Record ``tpl`` under ``key``, or under ``(key, epoch_rel)`` when the lowering gave
        a node the epoch dependency (``used_epoch``); whether it does is decided by the
        buffers' states, which the key holds, so a key's templates are all of one kind."""
        templates = self.templates
        if used_epoch:
            templates.put(key, _EPOCH_KEYED)
            templates.put((key, epoch_rel), tpl)
        else:
            templates.put(key, tpl)

    def stats(self) -> dict[str, int]:
        return {"hits": self.hits, "misses": self.misses, "bypassed": self.bypassed, "first": self.first,
                "grouped": self.grouped, "grouped_reductions": self.grouped_reductions,
                "grouped_gathers": self.grouped_gathers, "chained": self.chained,
                "chained_groups": self.chained_groups, "templates": len(self.templates)}


CHAIN_WIDTH = 64        # steps a chain's node remembers (see "Chains" above)
CHAIN_ENTRIES = 1 << 15     # steps all of a generator's chains remember before they start over


class Chains:
    """A generator's chains (see "Chains" above): learns their steps, and bounds them.  A
    node's steps are at most ``CHAIN_WIDTH``; all nodes' steps together at most
    ``CHAIN_ENTRIES``, past which every chain is forgotten (the horizons' templates drop
    their roots) and learnt anew: a program whose periods never repeat between horizons
    that do would otherwise keep a path per period, and the templates it names alive
    past the memo's bound."""

    __slots__ = ("entries", "starts", "_roots")

    def __init__(self) -> None:
        self.entries = 0
        self.starts = 0             # times every chain was forgotten
        self._roots: list = []      # (cell, index) of every root made since the last start-over

    def after(self, chain: dict | None, step, tpl: tuple, touched: tuple, cell: list, root: int,
              horizon: bool) -> dict | None:
        """The node after a lowering whose template ``tpl`` was found or recorded by its key
        (``step``: its step along ``chain``, the node the state was at; None: no chain): a
        horizon's template starts a chain at its own root (``cell[root]``, made at its first
        use), a step along a chain is learnt and leads to a new node; None where no chain
        goes on."""
        if horizon:
            nxt = cell[root]
            if nxt is None:
                nxt = cell[root] = {}
                self._roots.append((cell, root))
                self.entries += 1
        elif step is None:
            return None
        else:
            nxt = {}
        if step is not None and len(chain) < CHAIN_WIDTH:
            self.learn(chain, step, tpl, touched, nxt)
        elif not horizon:
            return None
        return nxt

    def learn(self, chain: dict, step, tpl: tuple, touched: tuple, nxt: dict) -> None:
        """``chain`` goes on by ``step`` with ``tpl`` to ``nxt``."""
        if self.entries >= CHAIN_ENTRIES:
            for c, i in self._roots:
                c[i] = None
            self._roots = []
            self.entries = 0
            self.starts += 1
        chain[step] = (tpl, touched, nxt)
        self.entries += 1


_NAMES = tuple(f"k{i}" for i in range(1024))     # (bind_value's names, made once)


def bind_value(ns: dict, v) -> str:
    """A compiled builder's source names every value it uses (``ns``: name -> value, the
    ``build`` function's globals), so templates of one structure share one compiled code
    object; None and booleans are written as themselves.  (A step's builder binds some 300
    values: half of writing its source was this function before its names were made once.)"""
    if v is None:
        return "None"
    if v is True:
        return "True"
    if v is False:
        return "False"
    n = len(ns)
    name = _NAMES[n] if n < 1024 else f"k{n}"
    ns[name] = v
    return name


def compiled_builder(src: str, filename: str, codes: BoundedCache, ns: dict):
    """The function ``src`` defines (``def build(...)``, naming ``ns``'s values as globals),
    its code compiled once per source (``codes``: source -> code object, a generator's own
    cache) and run with ``ns`` as its globals.

    Globals, not a closure's cells: ``compile()`` of the 128² stencil's step builder (242
    values) takes 0.55 against 0.90 ms (best of 20), binding a further template of the
    same source 1.3 against 5.0 µs, and a call is no slower (4.9-5.0 against 4.9-5.2 µs).
    Each template's function gets its own copy of the code (``code.replace()``): CPython
    specializes ``LOAD_GLOBAL`` per code object for one globals dict, and templates that
    alternate (a step's phases) on one shared code object would undo each other's
    specialization at every switch (12.6 against 9.9-10.1 µs for two phases' calls)."""
    code = codes.get(src)
    if code is None:
        scope: dict = {}
        exec(compile(src, filename, "exec"), scope)   # noqa: S102 - source built from names only
        code = codes.put(src, scope["build"].__code__)
    return FunctionType(code.replace(), ns)


def newest_named(access, top: int | None = None, skip: int | None = None) -> int | None:
    """The newest id (writer or reader) an access map of ``(writer, readers)`` values
    names, ``skip`` aside, or ``top`` if that is newer.  A shape's ids are relative to
    it: the state fixes its own base, so a state is one shape whenever it is taken (a
    base of the caller's, the command being lowered, made the same state two shapes
    before and after a horizon, and a key missed)."""
    for w, rs in access.values():
        if w is not None and w != skip and (top is None or w > top):
            top = w
        if rs:
            for r in rs:
                if r != skip and (top is None or r > top):
                    top = r
    return top


def relative_id(i: int | None, base: int) -> int | None:
    """An id (or None) relative to ``base``."""
    return None if i is None else i - base


def absolute_id(r: int | None, base: int) -> int | None:
    """The inverse of ``relative_id``."""
    return None if r is None else r + base


def own_base_shape(access, epoch: int | None = None) -> tuple[tuple, int | None]:
    """An access map's snapshot with its ids relative to the newest one it names, and that
    id (its base; None where it names none): a state is one shape whenever it is taken.
    With ``epoch``, references to it are written symbolically and it is no base
    (``relative_epoch``)."""
    top = newest_named(access, None, epoch)
    return access.snapshot(relative_epoch(0 if top is None else top, epoch)), top


EPOCH_ID = "epoch"   # a state's reference to the epoch for new nodes, in a shape


def relative_epoch(base: int, epoch: int | None):
    """``relative(base)`` with the epoch for new nodes written as ``EPOCH_ID``: everything
    older than the epoch is collapsed onto it, so a state that keeps the epoch (data not
    rewritten since it) would otherwise carry its distance, a new shape each time a
    horizon moves it and after every ``wait`` until the second horizon.  The shape
    stands for the epoch of whenever it is restored (``absolute_epoch``): a lowering
    that moves the epoch touches every buffer and leaves them new shapes."""
    if epoch is None:
        return relative(base)

    def rel(v: tuple) -> tuple:
        w, rs = v
        return (None if w is None else EPOCH_ID if w == epoch else w - base,
                frozenset([EPOCH_ID if r == epoch else r - base for r in rs]) if rs else rs)
    return rel


def absolute_epoch(base: int, epoch: int | None):
    """The inverse of ``relative_epoch(base, epoch)``."""
    def ab(v: tuple) -> tuple:
        w, rs = v
        return (None if w is None else epoch if w == EPOCH_ID else w + base,
                frozenset([epoch if r == EPOCH_ID else r + base for r in rs]) if rs else rs)
    return ab


def relative(base: int):
    """``(writer, readers)`` access values with ids written relative to ``base``."""
    def rel(v: tuple) -> tuple:
        w, rs = v
        return (None if w is None else w - base, frozenset([r - base for r in rs]) if rs else rs)
    return rel


def absolute(base: int):
    """The inverse of ``relative(base)``."""
    def ab(v: tuple) -> tuple:
        w, rs = v
        return (None if w is None else w + base, frozenset([r + base for r in rs]) if rs else rs)
    return ab
