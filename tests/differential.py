"""Random celeritas programs and their sequential numpy interpretation.

A program is data (``Program``); ``run_celeritas`` submits it through the public
API, ``run_model`` interprets the same kernels over whole buffers with numpy, and
``check`` compares what every rank observed with the model.  Kernels compute
integers per element from what their range mappers grant (``element_values``,
shared by kernels and model), so any split across ranks, devices and
oversubscription must give identical buffers, fence results, host-task
observations and reductions.

Every optional feature belongs to a *group* (``GROUPS``) that ``generate`` may be
told to leave out, and every program lists the features it uses
(``Program.features``), so a failure can be attributed and minimised.

Program kinds:

* ``main``: buffers of several dtypes, kernels and host tasks with built-in and
  custom range mappers, reductions (several per kernel, with or without
  ``initialize_to_identity``, across dtypes), fences of buffers and host
  objects, epochs.  Must match the model exactly on every rank.
* ``fail``: one kernel (or host task) raises on the chunk holding one point;
  tasks that truly depend on it record (outside the runtime) if they ever run.
  Expected: a ``cl.KernelError`` at the next synchronization, no dependent ran.
* ``bad_reduction``: a reduction whose values cannot be cast ``same_kind`` into
  the target's dtype.  Expected: a ``cl.CeleritasError`` naming the buffer and
  both dtypes.
* ``overlap``: chunks of one kernel write overlapping regions, diagnostics set
  to ``error``.  Expected: a ``cl.DiagnosticError`` naming the buffer whenever
  the kernel is split into two or more chunks; otherwise the model's result.
* ``bad_mapper``: ordinary tasks around one kernel or host task (named
  ``bad_mapper``) that reads a buffer through a range mapper whose result for a
  chunk is not inside its result for the whole range (``BAD_FORMS``).  Expected
  (``bad_mapper_outcome``, ``check_bad_mapper``): with the task split over two or
  more ranks and some rank's chunk mapped outside the whole range's region, a
  ``cl.DiagnosticError`` from the command graph naming that task, that buffer and
  the first such rank; else, where a rank's chunk is cut into local chunks
  (devices, oversubscription) and one is mapped outside the rank chunk's region,
  that rank's instruction graph raises (``cl.RangeMapperError`` on several ranks,
  ``cl.DiagnosticError`` on one) naming task, buffer, local chunk and rank, and
  the other ranks are aborted or finish with the model's data; otherwise
  everything ``main`` checks, and the task's chunks (on every device) read the
  data their mapper names as it was when the task was submitted.
* ``misuse`` (3% of the mix, taken from ``main``): ordinary steps, then one task that
  misuses the API (``MISUSE_FORMS``): an access outside what a ``cl.fixed`` mapper grants
  (accessor checks forced on) or an assignment through a ``cl.read`` accessor in the chunk
  holding one index (``cl.AccessError`` on that chunk's rank, naming buffer, task, rank and
  chunk); an accessor indexed outside its kernel; a ``cl.Buffer`` whose data, shape and dtype
  do not fit (``cl.BufferError``); a user mapper that raises or returns another dimensionality
  (``cl.RangeMapperError`` from submit naming task, buffer and chunk).  Expected
  (``misuse_error``, ``check_misuse``): exactly that class and message, where it is raised,
  no hang; peers aborted or finished as ``check_bad_mapper`` allows.  Most mapper_raises
  programs' mappers raise for part of the range only (``PARTIAL_RAISE_FORMS``,
  ``partial_raise_outcome``): the error then comes from the scheduler thread at the sync,
  on every rank (a rank's chunk) or on one (a device chunk or part), or not at all.
  Most buffer programs misconfigure instead (``CONFIG_FORMS``, ``_draw_config``): an invalid
  ``CELERITAS_*`` value or ``cl.Queue`` argument (a ``cl.ConfigError`` naming the setting and
  the value, exactly, on every rank at the first ``cl.Queue()``), an invalid
  ``q.set_lookahead`` mode or a second ``cl.Queue`` asking for other devices (at that step);
  a third of those then name instead (``CONFIG_START_FORMS``, ``_draw_config_start``) an output
  folder of ``CELERITAS_PRINT_GRAPHS`` / ``CELERITAS_TRACE`` that cannot be made (under or at a
  regular file) or a ``CELERITAS_DEVICES`` device that does not exist (``opencl:P:D``, ``cuda:99``;
  the message as this machine's OpenCL platforms and CuPy make it: ``device_error_pattern``).
  Most write_read, outside_kernel and mapper_dims programs become instead (``_draw_misuse_more``):
  ``diverge`` (2+ ranks): one rank's misuse kernel has another name or range, an extra task comes
  before it, or a buffer of another shape or dtype is made before it: a ``cl.DivergenceError``
  from that rank and its right neighbour, each naming both ranks' first differing entry
  (``divergence_pattern``); or a command group that passes None or an old cgh (``cg_handler``),
  misuses a call (``cg_call``) or fences a region of 2-3 boxes (``fence_region``): the exact
  error at that submit on every rank (``cg_misuse_error``), then ordinary steps, all checked
  as ``main`` (``check_cg_misuse``: the failed submit made no task).

Besides data, ``main`` programs check: host-task partitions (their records,
unioned over ranks, and that a side-effect-free host task with
``cl.oversubscribe(k)`` runs as k partitions per rank chunk, as Celerity splits
it); that kernel chunks consist of whole work groups of ``local_range``; that
every chunk submitted before a ``q.wait()`` had run when it returned; and that
side-effect host tasks ran in submission order.

``main`` programs also draw (groups ``collectives``, ``lifetimes``, ``lookahead_steps``):

* collective host tasks (``on=cl.collective``, ``cl.collective()``, ``cl.collective(group)``
  of 2-3 ``cl.CollectiveGroup``s), alone and in loops, whose part on every rank sums what it
  reads (``all`` / ``fixed``), adds its rank and maybe reduces that through
  ``partition.comm`` (``allreduce``, ``reduce`` to the last rank, ``scan``, ``exscan``);
  every rank's records per group must be the model's, in the group's submission order
  (``collective_record``, ``_collective_problems``);
* master-node tasks placed by ``cl.once`` or by nothing (partition checked);
* data buffers made without data, or made by a task later (after tasks, after a wait), and
  destroyed in the middle (``Buffer.destroy()``, or the last reference dropped, here or on another
  thread: ``_draw_releases``; maybe right after a fence or a writer);
  extra host objects with side effects of collective and master-node tasks, fenced, made
  later and destroyed (``HostObject.destroy()``); ``lifecycle`` is the rule they follow;
* ``q.set_lookahead(mode)`` and ``q.flush()`` between tasks (no effect on the model).

``Config`` also sets ``CELERITAS_HORIZON_STEP`` (1, 2, 4, 7) and
``CELERITAS_HORIZON_MAX_PARALLELISM`` (1, 2, 3 or the default).

Drawn after the whole program (so that every seed keeps the program it gave before):

* how each kernel and host task indexes its accessors (``INDEX_STYLES``: boxes, the chunk,
  bounded slices, integer indices, ``...``, mixed, and, drawn last, integer index arrays
  and lists; ``acc_get`` / ``acc_set``); ``Config``
  turns accessor checks off in about 40% of configurations (the fast paths
  ``Accessor._plain2`` / ``_plain`` / ``_local``'s tuples) and ``main`` programs run under
  ``CELERITAS_DIAGNOSTICS`` warn or off too (``program_config``);
* ``main``: kernels with ``offset=`` over a sub-range of the buffer they write, ranges that
  are no buffer's shape, size 1 and empty ranges (``_draw_geometry``, ``task_box``; chunks
  checked against the index space, ``_check_geometry``);
* ``main``: split controls (``_draw_splits``): per-kernel ``cl.oversubscribe(k)``,
  ``cl.split_1d()``, ``cl.constrain_split`` (cuts checked, ``split_granularity``), split
  hints on host tasks, reads through ``cl.even_split`` (granted rows and data checked per
  chunk, ``even_split_rows``);
* ``main``: empty ranges of kernels whose point write into a reduction target would define it
  (``_draw_empty_target``): nothing is written, the target keeps its value or stays undefined
  (``target_problem``);
* ``main``: rarely a front of 260-300 row kernels (``_draw_many``, ``long:many``): more index spaces
  than the command graph's per-split caches hold, so that every rank must clear them
  (``split_caches_overflow``); the run counts the clears (``count_cache_clears``: the runtime
  exposes no counter) and ``check_main`` requires them (``cache_eviction``) besides exact results;
* ``main``: a pair of kernels over larger buffers (``_draw_ooc``); ``Config.batch`` sets the
  capacity between the largest one-row working set and the largest footprint
  (``device_memory_batched``), so that chunks are cut into batches, and
  ``CELERITAS_OUT_OF_CORE_OVERLAP`` is drawn.

Semantics the model pins (API.md): a reduction casts the values with numpy's
``same_kind`` rule into the target dtype, then reduces in the target dtype
(integers wrap), and combines with the target's current value unless
``initialize_to_identity``; the result never depends on the split.  A fence of
a host object returns the object as it was when the fence ran.
"""
from __future__ import annotations

import contextlib
import copy
import errno
import functools
import itertools
import math
import os
import random
import re
import tempfile
import threading
import time
import traceback
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable

import numpy as np

import celeritas as cl
import fake_cupy
from celeritas.testing import run_cluster
from scheduler.geometry import Box, Region
from scheduler.split import split_1d

MOD = 997
WEIGHTS = (1, 7, 31)          # position term of element values: misplaced data shows
DATA_DTYPES = ("int64", "int32", "float32", "float64", "int16", "uint8", "bool")
TARGET_DTYPES = ("int64", "int32", "float32", "float64", "bool")
INT_OPS = ("plus", "multiplies", "minimum", "maximum", "bit_and", "bit_or", "bit_xor")
FLOAT_OPS = ("plus", "multiplies", "minimum", "maximum")
BOOL_OPS = ("logical_and", "logical_or")
OPS = {"plus": cl.plus, "multiplies": cl.multiplies, "minimum": cl.minimum, "maximum": cl.maximum,
       "bit_and": cl.bit_and, "bit_or": cl.bit_or, "bit_xor": cl.bit_xor,
       "logical_and": cl.logical_and, "logical_or": cl.logical_or}
MODES = ("discard_write", "write", "read_write", "discard_read_write")

# Optional feature groups (``generate(groups=...)``); "base" features are always on.
GROUPS = ("dtypes", "reductions", "int_wrap", "remote_target", "cross_dtype", "local_range", "custom_mappers",
          "stencils", "host_range", "host_object_fence", "epochs", "loops", "timing",
          "collectives", "lifetimes", "lookahead_steps")
# (the last three: ``main`` only; see ``_gen_extra``.  A program of any other kind draws
# exactly what it drew before they existed.)
LOOKAHEAD_MODES = ("none", "auto", "infinite")
HORIZON_STEP_CHOICES = (1, 2, 4, 7)                     # CELERITAS_HORIZON_STEP
HORIZON_PARALLELISM_CHOICES = (1, 2, 3, None)           # CELERITAS_HORIZON_MAX_PARALLELISM (None: default 64)
KINDS = ("main", "fail", "bad_reduction", "overlap", "bad_mapper", "misuse")
MAIN_LIKE = ("main", "bad_mapper")     # run by run_celeritas and compared with run_model (unless an error is due)
FAIL_KERNEL = "fail_here"
BAD_TASK = "bad_mapper"     # the name of a bad_mapper program's task with the bad access
# Range mappers of the bad_mapper kind (``bad_rows``), along dim 0 of the kernel and the buffer:
#   offset_eq    the chunk whose offset is k reads row k (``chunk.offset == k`` where "the chunk
#                holds k" was meant: the whole range, at offset 0, maps to nothing)
#   next_block   the chunk reads the block of its own size after it (the whole range: past the end)
#   prev_block   the chunk reads the block of its own size before it (the whole range: before 0)
#   first_only   only the chunk at offset 0 maps anything: the rows after it
BAD_FORMS = ("offset_eq", "next_block", "prev_block", "first_only")
# How a kernel or host task indexes its accessors (``acc_get`` / ``acc_set``): ``acc[box]``; the
# chunk or partition itself (``acc[chunk]``, a Box otherwise); bounded slices (1-D: a bare slice or
# a 1-tuple); one integer index per element; ``acc[...]`` or ``acc.array`` (the allocation,
# shifted by ``acc.offset``); or a different one of those per access.  Without accessor checks 2-D
# slices, boxes and chunks take the fast paths (``Accessor._plain2`` / ``_plain``) and tuples of
# slices or ints ``_local``'s.
INDEX_STYLES = ("box", "chunk", "slices", "ints", "ellipsis", "mixed", "fancy")
INDEX_DRAW = ("box", "box", "chunk", "slices", "slices", "ints", "ellipsis", "mixed")
OOC_DRAWS = True            # main: a pair of kernels over larger buffers, for out-of-core batching
SPLIT_DRAWS = True          # main: per-kernel oversubscribe, split_1d, constrain_split, host hints, even_split
GEOMETRY_DRAWS = True       # main: kernels with offset=, ranges that are no buffer's shape, size 1 and empty
EMPTY_DRAWS = True          # main: empty ranges of kernels with reductions and of host tasks (``_draw_empty``)
LONG_DRAWS = True           # main: a long stencil loop or a wide front of independent tasks (``_draw_long``)
SOURCE_DRAWS = True         # main: kernels that are cl.Kernel OpenCL C source on the opencl backend (``_draw_source``)
EMPTY_TARGET_DRAWS = True   # main: empty ranges of kernels whose point write defines a target (``_draw_empty_target``)
MANY_DRAWS = True           # main: a front of 260-300 row kernels, more index spaces than the split caches hold
MANY_SHARE = 0.004          # of main programs (``_draw_many``)
REGION_FENCE_DRAWS = True   # main: some subrange fences given as a cl.Region of their box (``_draw_region_fences``)
BYTE_ORDER_DRAWS = True     # main: data buffers in the non-native byte order (``_draw_byte_order``)
DISJOINT_READ_DRAWS = True  # main: reads of a buffer's first and last rows in one task (``_draw_disjoint_reads``)
DISJOINT_READ_SHARE = 0.2   # of main programs
RELEASE_DRAWS = True        # main: buffers and host objects released by dropping them (``_draw_releases``)
FANCY_DRAWS = True          # main: some kernels and host tasks index with integer arrays / lists (``_draw_fancy``)
REPLACE_DRAWS = True        # main: extra host objects replaced by the host tasks that record there (``_draw_replacements``)
STEP_LOOP_DRAWS = True      # main: a step of 1-3 kernels over new buffers repeated 10-30 times (``_draw_step_loop``)
RESIDUAL_DRAWS = True       # main: the step loop's stencil steps also reduce into a new target (``_draw_step_residual``)
STEP_LOOP_SHARE = 0.25      # of main programs
RELEASE_FORMS = ("drop", "thread")   # the last reference dropped on the application thread / another thread
SPLIT_CACHE_ENTRIES = 256   # scheduler/command_graph.py: BoundedCache(256) of _regions_cache and _mine_cache,
                            # an entry per split (and mapper) a rank's command graph has seen
OPENCL_SHARE = 0.04         # of configurations (random_config): the opencl backend (PoCL), where it is there
CUDA_SHARE = 0.04           # of the others: the cuda backend on the CuPy stand-in (fake_cupy.stand_in)
LONG_STENCIL_SHARE = 0.004  # of main programs: 100-200 ping-pong stencil steps
WIDE_SHARE = 0.01           # of main programs: 65-96 independent row kernels (a front wider than 64)
MISUSE_TASK = "misuse"      # the name of a misuse program's task that misuses the API
# misuse kind (``_gen_misuse``): what the program does wrong (``misuse_error`` models the error)
#   outside         a chunk reads an element outside what its (cl.fixed) mapper grants: cl.AccessError
#                   in the kernel / host task (accessor checks forced on: program_config)
#   write_read      a chunk assigns through a ``cl.read`` accessor: cl.AccessError (with or without checks)
#   outside_kernel  an accessor indexed in the command group ("cgf") or after the submit ("after"):
#                   cl.AccessError on the application thread
#   buffer          ``cl.Buffer`` with data, shape and dtype that do not fit (BUFFER_FORMS): cl.BufferError
#   mapper_raises   a user mapper that raises: cl.RangeMapperError from submit, its cause the exception
#   mapper_dims     a user mapper whose result has the wrong dimensionality or type (MAPPER_DIMS_FORMS),
#                   or a cl.Region of boxes of two dimensionalities ("mixed", ``_draw_mixed_region``)
MISUSE_FORMS = ("outside", "write_read", "outside_kernel", "buffer", "mapper_raises", "mapper_dims")
BUFFER_FORMS = ("shape", "dtype", "not_dtype", "cast", "ndim", "negative")
MAPPER_DIMS_FORMS = ("box", "subrange", "region", "type")
RAISING_MAPPER_MSG = "raising_mapper refuses every chunk"
# misuse mapper_raises, drawn after the whole program (``_draw_partial_raise``): a user mapper that
# raises for part of the range only (else it maps the whole buffer), so the error comes from the
# command graph (a rank's chunk: every rank) or one rank's instruction graph (a device chunk or an
# oversubscribed part), or from no chunk at all (``partial_raise_outcome``):
#   holding     raises for a chunk that holds row k of the index space and is not the whole range
#   offset_eq   raises for a chunk whose offset is k (k >= 1)
PARTIAL_RAISE_FORMS = ("holding", "offset_eq")
PARTIAL_RAISING_MSG = "partial_raising refuses the chunk"
# misuse config (``_draw_config``, drawn after the whole program from buffer misuses): an invalid setting,
# a cl.ConfigError naming it (the messages of celeritas/config.py and runtime.py, restated):
#   env            a CELERITAS_* variable with an invalid value (CONFIG_ENV_CASES): at the first cl.Queue()
#   queue_arg      cl.Queue(devices=... | lookahead=...) with an invalid value (CONFIG_QUEUE_CASES): there too
#   set_lookahead  q.set_lookahead(<invalid>) where the misuse task stands
#   second_queue   cl.Queue(devices=<other devices> | lookahead=<invalid>) once the runtime runs, there too
CONFIG_FORMS = ("env", "queue_arg", "set_lookahead", "second_queue")
_CHOICE = "{var}={raw!r}; use one of {choices}"
CONFIG_ENV_CASES = (    # (variable, invalid value, message)
    ("CELERITAS_DEVICES", "host:0", "{var}={raw!r}: host:N needs 1 <= N <= 64"),
    ("CELERITAS_DEVICES", "host:65", "{var}={raw!r}: host:N needs 1 <= N <= 64"),
    ("CELERITAS_DEVICES", "gpu:1", "{var}={raw!r} is not a device list; use host:N, cuda, cuda:0,1, opencl or "
                                   "opencl:P:D,..."),
    ("CELERITAS_LOOKAHEAD", "sometimes", _CHOICE.replace("{choices}", "none, auto, infinite")),
    ("CELERITAS_HORIZON_STEP", "0", "{var}={raw!r} must be >= 1"),
    ("CELERITAS_HORIZON_STEP", "two", "{var}={raw!r} is not an integer"),
    ("CELERITAS_HORIZON_MAX_PARALLELISM", "0", "{var}={raw!r} must be >= 1"),
    ("CELERITAS_HORIZON_MAX_PARALLELISM", "1.5", "{var}={raw!r} is not an integer"),
    ("CELERITAS_MAX_TASKS_AHEAD", "1", "{var}={raw!r} must be >= 2"),
    ("CELERITAS_PAUSE_AHEAD", "-1", "{var}={raw!r} must be >= 0"),
    ("CELERITAS_DEVICE_MEMORY_LIMIT", "lots", "{var}={raw!r} is neither a number of bytes (e.g. 2G) nor a "
                                              "fraction such as 0.8"),
    ("CELERITAS_DEVICE_MEMORY_LIMIT", "0", "{var}={raw!r} must be at least 1 byte"),
    ("CELERITAS_DEVICE_MEMORY_LIMIT", "1.5", "{var}={raw!r}: a fraction of the device memory must be in (0, 1]"),
    ("CELERITAS_HOST_DEVICE_MEMORY", "-5", "{var}={raw!r} must be >= 1"),
    ("CELERITAS_DIAGNOSTICS", "loud", _CHOICE.replace("{choices}", "off, warn, error")),
    ("CELERITAS_ACCESSOR_CHECKS", "2", "{var}={raw!r}; use 1 or 0"),
    ("CELERITAS_RECORD", "maybe", "{var}={raw!r}; use 1 or 0"),
    ("CELERITAS_LOG_LEVEL", "verbose", _CHOICE.replace("{choices}", "debug, info, warning, error")),
    ("CELERITAS_REPLAY", "sometimes", _CHOICE.replace("{choices}", "on, off")),
    ("CELERITAS_OUT_OF_CORE_OVERLAP", "yes", _CHOICE.replace("{choices}", "on, off")),
    ("CELERITAS_HUGE_PAGES", "big", "{var}={raw!r}; use on, off or a size in bytes"),
    ("CELERITAS_INLINE_US", "-1", "{var}={raw!r} must be a finite number >= 0"),
    ("CELERITAS_WAIT_WARNING", "soon", "{var}={raw!r} is not a number of seconds (or 'none')"),
    ("CELERITAS_GC", "never", _CHOICE.replace("{choices}", "tuned, default")),
    ("CELERITAS_HOST_ALLOCATOR", "jemalloc", _CHOICE.replace("{choices}", "tuned, default")),
    ("CELERITAS_MPI_DEVICE_MEMORY", "gpu", _CHOICE.replace("{choices}", "auto, direct, staged")),
    ("CELERITAS_DIVERGENCE_TIMEOUT", "-3", "{var}={raw!r} must be > 0 (or 'none')"),
)
CONFIG_QUEUE_CASES = (  # (argument, invalid value, message: a regex)
    ("devices", "host:0", re.escape("devices='host:0': host:N needs 1 <= N <= 64")),
    ("devices", "gpu", re.escape("devices='gpu' is not a device list; use host:N, cuda, cuda:0,1, opencl or "
                                 "opencl:P:D,...")),
    ("devices", 2, r"devices=2\b.*"),       # (not a string at all: named, whatever the rest says)
    ("lookahead", "sometimes", re.escape("lookahead='sometimes'; use one of none, auto, infinite")),
    ("lookahead", 3, re.escape("lookahead=3; use one of none, auto, infinite")),
)


# misuse config, drawn after ``_draw_config`` (``_draw_config_start``): settings that are well formed but
# cannot be honoured when the runtime starts, a cl.ConfigError at the first cl.Queue() on every rank:
#   output   CELERITAS_PRINT_GRAPHS / CELERITAS_TRACE naming a folder that cannot be made: one under a
#            regular file (``not_a_folder``; the fuzzer may run as root, so permission bits would not
#            stop it) or the file itself (CONFIG_OUTPUT_CASES: variable, value, the folder the runtime
#            makes, its errno)
#   device   CELERITAS_DEVICES naming a device that does not exist (CONFIG_DEVICE_CASES; the message
#            depends on the machine: ``device_error_pattern``)
CONFIG_START_FORMS = ("output", "device")
CONFIG_OUTPUT_CASES = (
    ("CELERITAS_PRINT_GRAPHS", "{file}/graphs", "{file}/graphs", errno.ENOTDIR),
    ("CELERITAS_PRINT_GRAPHS", "{file}", "{file}", errno.EEXIST),
    ("CELERITAS_TRACE", "{file}/sub/trace.json", "{file}/sub", errno.ENOTDIR),
    ("CELERITAS_TRACE", "{file}/trace.json", "{file}", errno.EEXIST),
)
CONFIG_DEVICE_CASES = ("opencl:99", "opencl:0:99", "opencl:99:0", "cuda:99")


# misuse drawn after ``_draw_config_start`` (``_draw_misuse_more``), from most write_read, outside_kernel and
# mapper_dims programs (so that every other program is what its seed gave before):
#   diverge        ranks >= 2 (``program_config``): one rank's task stream differs (DIVERGE_FORMS): its misuse
#                  kernel (or host task) under another name or over another range, an extra task before it, or
#                  a buffer of another shape or dtype made before it (``fence_index`` % ranks: that rank), or
#                  (drawn from half the range / buffer_dtype ones) a side effect on the log host object in its
#                  misuse host task, or that buffer made with data, there only (side_effect, host_data); then
#                  q.shutdown() (``extra``: half of them fence the misuse task's buffer first, sync
#                  ``fence_shutdown``).  A cl.DivergenceError naming the first differing task or buffer on both
#                  ranks (``divergence_pattern``), from the rank at fault and its right neighbour in the ring
#                  (CELERITAS_DIVERGENCE_TIMEOUT: DIVERGENCE_TIMEOUT)
#   cg_handler     a command group passes None or the cgh of an earlier submit to one of CG_HANDLER_TARGETS
#   cg_call        a command group (or q.submit) misuses a call (CG_CALLS; CG_PLACEMENTS, CG_HINTS drawn last)
#   fence_region   q.fence(buffer, cl.Region of 2 or 3 boxes)
# the last three raise a cl.CeleritasError (cl.AccessError: no_init_read) at the submit on every rank
# (``cg_misuse_error``); the submit makes no task, and the program goes on (ordinary steps after it):
# the run must then match the model exactly, as ``main`` does (``check_cg_misuse``).
DIVERGE_FORMS = ("name", "range", "extra", "buffer_shape", "buffer_dtype")   # (and "mode": half the "name";
#                                         "side_effect": half the host "range"; "host_data": half the "buffer_dtype")
DIVERGE_RENAMED = "misuse_v2"       # diverge name: the kernel's name on the rank at fault
DIVERGE_EXTRA = "misuse_extra"      # diverge extra: the extra task's name
DIVERGENCE_TIMEOUT = "10"           # CELERITAS_DIVERGENCE_TIMEOUT of diverge programs (s)
CG_HANDLER_TARGETS = ("access", "reduction", "side_effect", "hint", "constrain_split")
CG_CALLS = ("reduction_target", "side_effect_kernel", "host_range_once", "host_range_collective",
            "host_range_collective_call", "no_init_read", "name_type", "submit_noncallable", "generator_kernel",
            "async_kernel", "generator_host", "async_host", "async_gen_host")
# cg_call, drawn last from host_range_* programs: cl.on_master_node() / cl.once() called, or
# cl.collective(group) with a str for the group
CG_PLACEMENTS = ("placement_called_master", "placement_called_once", "collective_bad_group")
# cg_call, drawn last from name_type programs: two cl.hint calls Celerity refuses together (a hint kind
# twice, or both split hints), as (first, second) hints
CG_HINTS = {"hint_twice_split_1d": (("split_1d",), ("split_1d",)),
            "hint_twice_split_2d": (("split_2d",), ("split_2d",)),
            "hint_twice_oversubscribe": (("oversubscribe", 2), ("oversubscribe", 3)),
            "hint_split_1d_2d": (("split_1d",), ("split_2d",)),
            "hint_split_2d_1d": (("split_2d",), ("split_1d",))}
CG_NAMES = (5, b"misuse", ("misuse",))          # cg_call name_type: name= that is no str
CG_NONCALLABLES = (None, 5, "cgf")              # cg_call submit_noncallable: what q.submit gets
CG_TARGETS = ("ndarray", "HostObject", "int")   # cg_call reduction_target: what cl.reduction gets
POISON = 1002       # what a misuse command group's kernel would write (a task the failed submit made shows)


# ---- programs as data -------------------------------------------------------------------
@dataclass
class Read:
    space: str                  # "data" | "target"
    buffer: int
    mapper: str                 # one_to_one | all | fixed | slice | neighborhood | transposed | mirror | shift
                                # | bad (bad_mapper kind only)
    fixed_box: tuple = ()       # (min, max) for fixed
    dim: int = 0                # slice / mirror / shift
    extent: tuple = ()          # neighborhood
    shape: str = "bounding_box"  # neighborhood
    shift: int = 0
    opaque: bool = False        # custom mappers: close over this record (never keyed) instead of values
    form: str = ""              # bad: one of BAD_FORMS
    k: int = 0                  # bad offset_eq: the offset (and row) it tests for


@dataclass
class Write:
    space: str                  # "data" | "target"
    buffer: int
    mapper: str                 # one_to_one | mirror | shift | point; overlap kind: all | fixed | neighborhood
    mode: str = "discard_write"
    dim: int = 0
    shift: int = 0
    point: tuple = ()           # the kernel index whose chunk writes (point)
    dest: tuple = ()            # the element it writes (point)
    fixed_box: tuple = ()
    opaque: bool = False        # custom mappers: close over this record (never keyed) instead of values


@dataclass
class RedSpec:
    target: int
    op: str
    vdtype: str                 # dtype of the values handed to combine
    init: bool                  # initialize_to_identity
    combine: str = "whole"      # whole | halves | elements
    identity: bool = False      # pass identity= explicitly
    wide: bool = False          # integer values scaled so that partial results wrap around


@dataclass
class Task:
    # kernel | host | master | fence | fence_log | wait
    # | collective                     a host task on every rank (``on=cl.collective`` / ``cl.collective(group)``)
    # | create | destroy               data buffer ``fence_index`` made / ``Buffer.destroy()``ed here
    # | hcreate | hfence | hdestroy    extra host object ``fence_index``: made / fenced / ``destroy()``ed here
    # | lookahead | flush              ``q.set_lookahead(mode)`` / ``q.flush()`` (no effect on any result)
    kind: str
    range_shape: tuple = ()
    reads: list[Read] = field(default_factory=list)
    write: Write | None = None
    reds: list[RedSpec] = field(default_factory=list)
    c0: int = 1
    local_range: tuple | None = None
    split2d: bool = False
    oversub: int | None = None
    on_master: bool = False     # host task with a range, on the master node
    fence_space: str = "data"   # fence
    fence_index: int = 0
    fence_box: tuple | None = None   # (offset, range) of a subrange fence
    barrier: bool = False       # wait
    fail_at: tuple | None = None     # fail kind: raise on the chunk holding this index
    marker: bool = False        # fail kind: record that this task ran
    side_effect: bool = True    # host tasks: order through the log host object
    delay: float = 0.0          # seconds the chunk holding the range's first index sleeps (timing)
    name: str | None = None     # kernel name shared by a loop's repetitions of one task (default:
                                # one per task), so that their measured cost lets them run inline
    group: int = 0              # collective: 0 the default group, k >= 1 the program's k-th CollectiveGroup
    form: str = ""              # collective group 0: "attr" (on=cl.collective) | "call" (cl.collective());
                                # master: "" (on_master_node) | "once" (on=cl.once) | "default" (no range, no on)
    comm: bool = False          # collective: also reduce the recorded value through partition.comm (comm_op)
    hobj: int | None = None     # collective / master: side effect on the extra host object hobj (records there)
    hobj_replace: bool = False  # master: records by replacing hobj's list (h.obj = h.obj + [rec]) instead of appending
    mode: str = ""              # lookahead: the mode set
    index: str = "box"          # kernels / host tasks: how they index their accessors (INDEX_STYLES)
    offset: tuple | None = None  # kernels: parallel_for(range_shape, offset=offset); index space task_box(t)
    split1d: bool = False       # kernels / host tasks: cl.hint(cgh, cl.split_1d()) (host tasks: split2d too)
    gran: Any = None            # kernels / host tasks: cl.constrain_split(cgh, gran) (an int or a tuple)
    misuse: str = ""            # misuse kind: the task that misuses the API (MISUSE_FORMS), else ""
    misuse_form: str = ""       # misuse: outside_kernel "cgf" | "after"; buffer BUFFER_FORMS;
                                # mapper_raises "partial" (the mapper's Read has form and k);
                                # mapper_dims MAPPER_DIMS_FORMS
    misuse_at: tuple | None = None   # misuse outside / write_read: the chunk holding this index misbehaves
    misuse_elem: tuple = ()     # misuse outside / write_read / outside_kernel: the element of the read
                                # buffer it indexes
    source: bool = False        # kernels: a cl.Kernel of OpenCL C source on the opencl backend (the same
                                # values as the Python kernel it is elsewhere: ``source_kernel``)
    release: str = ""           # destroy / hdestroy: "" destroy(), else how the last reference goes
                                # (RELEASE_FORMS: ``_draw_releases``)
    misuse_arg: Any = None      # misuse diverge / cg_handler / cg_call / fence_region: what the step does
                                # (a dict: ``_draw_misuse_more``); fence: "region" / "region_split" (a
                                # subrange fence given as a cl.Region: ``_draw_region_fences``)


@dataclass
class TargetSpec:
    dtype: str
    shape: tuple                # () or (1,)
    init: Any = None            # host-initialized value, None: uninitialized


@dataclass
class Program:
    kind: str
    shapes: list[tuple[int, ...]]
    dtypes: list[str]
    init: list[np.ndarray | None]   # None: made without data (``cl.Buffer(shape=, dtype=)``), written in full
                                    # by a discard-mode task before anything reads it (``lifecycle_problem``)
    targets: list[TargetSpec]
    tasks: list[Task]
    features: set[str] = field(default_factory=set)
    sync: str = "end"           # fail / bad_reduction / overlap: wait | fence | shutdown | fence_log;
                                # misuse diverge: shutdown | fence_shutdown
                                # (main / bad_mapper: "end", every live, written buffer is fenced at the end)
    ngroups: int = 0            # cl.CollectiveGroup()s made at the start (collective tasks' groups 1..ngroups)
    hobjs: int = 0              # extra host objects (besides the log); made at the start unless an
                                # ``hcreate`` task makes them later

    def describe(self) -> str:
        """A readable listing (for failure reports and minimisation)."""
        lines = [f"kind={self.kind} sync={self.sync}" + (f" features={sorted(self.features)}" if self.features else "")]
        late = {t.fence_index for t in self.tasks if t.kind == "create"}
        for k, (s, d) in enumerate(zip(self.shapes, self.dtypes)):
            lines.append(f"  b{k}: shape {s} {d}" + (" uninitialized" if self.init[k] is None else "")
                         + (" (made by a task)" if k in late else ""))
        if self.ngroups or self.hobjs:
            lines.append(f"  {self.ngroups} collective group(s), {self.hobjs} extra host object(s)")
        for k, t in enumerate(self.targets):
            lines.append(f"  r{k}: shape {t.shape} {t.dtype} init={t.init}")
        for k, t in enumerate(self.tasks):
            lines.append(f"  T{k}: {_describe_task(t)}")
        return "\n".join(lines)


def _describe_task(t: Task) -> str:
    if t.kind == "fence":
        return f"fence {'b' if t.fence_space == 'data' else 'r'}{t.fence_index}" + \
            (f" subrange {t.fence_box}" if t.fence_box else "") + (f" as {t.misuse_arg}" if t.misuse_arg else "")
    if t.kind == "fence_log":
        return "fence(log host object)"
    if t.kind == "wait":
        return f"q.wait(barrier={t.barrier})"
    gone = {"": "destroy()", "drop": "last reference dropped", "thread": "last reference dropped on another thread"}
    if t.kind in ("create", "destroy"):
        return f"{'cl.Buffer(...)' if t.kind == 'create' else gone[t.release]} b{t.fence_index}"
    if t.kind in ("hcreate", "hfence", "hdestroy"):
        return {"hcreate": "cl.HostObject([])", "hfence": "fence", "hdestroy": gone[t.release]}[t.kind] + \
            f" h{t.fence_index}"
    if t.kind == "lookahead":
        return f"q.set_lookahead({t.mode!r})"
    if t.kind == "bad_buffer":
        return f"cl.Buffer(...) for b{t.fence_index} that does not fit ({t.misuse_form})"
    if t.kind == "bad_config":
        setting, value = config_setting(t)
        return {"env": f"{setting}={value!r} in the environment", "output": f"{setting}={value!r} in the environment",
                "device": f"{setting}={value!r} in the environment", "queue_arg": f"cl.Queue({setting}={value!r})",
                "set_lookahead": f"q.set_lookahead({value!r})",
                "second_queue": f"cl.Queue({setting}={value!r}) once the runtime runs"}[t.misuse_form] + \
            " MISUSE config"
    if t.kind == "flush":
        return "q.flush()"
    if t.kind == "bad_cg":
        a = t.misuse_arg
        if t.misuse == "fence_region":
            return f"q.fence(b{a['b']}, cl.Region of {len(a['at'])} boxes: dim {a['dim']} at {a['at']}) MISUSE"
        return (f"{'host task' if _cg_host(t) else 'kernel'} range={tuple(a['range'])} discard_write "
                f"b{a['w']} MISUSE {t.misuse}({t.misuse_form})" + (f" b{a['b']}" if "access" in t.misuse_form
                                                                    or "no_init" in t.misuse_form else "")
                + (f" r{a['r']}" if t.misuse_form.startswith("reduction:") else "")
                + (f" value #{a['v']}" if t.misuse_form in ("name_type", "submit_noncallable",
                                                             "reduction_target") else ""))
    if t.kind == "diverge":
        a = t.misuse_arg
        return (f"{'host task' if a['host'] else 'kernel'} range={tuple(a['range'])} discard_write b{a['w']} "
                f"MISUSE diverge({t.misuse_form}) on rank {t.fence_index} % ranks"
                + (f": range {a['other']}" if "other" in a and t.misuse_form == "range" else "")
                + (": a side effect on the log there" if t.misuse_form == "side_effect" else "")
                + (f": cl.Buffer {a['buffer'][:2]}, there {a['buffer'][2:]}" if "buffer" in a else "")
                + (" made from an array" if t.misuse_form == "host_data" else ""))
    parts = [t.kind] + ([f"range={t.range_shape}" + (f" offset={t.offset}" if t.offset is not None else "")]
                        if t.kind != "collective" else
                        [f"group {t.group}" + (f" ({t.form})" if t.form else "")]) + [f"c0={t.c0}"]
    if t.kind == "master" and t.form:
        parts[0] = f"master(on={t.form})"
    for rd in t.reads:
        name = ("b" if rd.space == "data" else "r") + str(rd.buffer)
        extra = {"fixed": f" {rd.fixed_box}", "slice": f"({rd.dim})", "mirror": f"(dim {rd.dim})",
                 "shift": f"(dim {rd.dim}, by {rd.shift})",
                 "neighborhood": f"({rd.extent}, {rd.shape})",
                 "even_split": f"(granularity {rd.k or None})",
         "raising": f" (raises{f' for the {rd.form} chunk, k={rd.k}' if rd.form else ''})",
                 "wrong_dims": " (wrong dimensionality or type)",
                 "bad": f" {rd.form}" + (f"(k={rd.k})" if rd.form == "offset_eq" else "")
                 + (" opaque" if rd.opaque else "")}.get(rd.mapper, "")
        parts.append(f"read {name} {rd.mapper}{extra}")
    if t.write is not None:
        w = t.write
        name = ("b" if w.space == "data" else "r") + str(w.buffer)
        extra = {"mirror": f"(dim {w.dim})", "shift": f"(dim {w.dim}, by {w.shift})",
                 "point": f"(chunk of {w.point} writes {w.dest})", "fixed": f" {w.fixed_box}"}.get(w.mapper, "")
        parts.append(f"{w.mode} {name} {w.mapper}{extra}")
    for r in t.reds:
        parts.append(f"reduce r{r.target} {r.op} values {r.vdtype}{' (wide)' if r.wide else ''}"
                     f"{'' if r.init else ' (no init)'}{' identity=' if r.identity else ''} combine={r.combine}")
    if t.local_range:
        parts.append(f"local_range={t.local_range}")
    if t.index != "box":
        parts.append(f"index={t.index}")
    if t.source:
        parts.append("source (cl.Kernel on opencl)")
    if t.split2d:
        parts.append("split_2d")
    if t.split1d:
        parts.append("split_1d")
    if t.gran is not None:
        parts.append(f"constrain_split({t.gran})")
    if t.oversub:
        parts.append(f"oversubscribe({t.oversub})")
    if t.on_master:
        parts.append("on_master_node")
    if not t.side_effect:
        parts.append("no side_effect")
    if t.delay:
        parts.append(f"{'rank 0' if t.kind == 'collective' else 'first chunk'} sleeps {t.delay * 1000:.0f} ms")
    if t.fail_at is not None:
        parts.append(f"RAISES on chunk holding {t.fail_at}")
    if t.marker:
        parts.append("marker")
    if t.comm:
        parts.append(comm_op(t))
    if t.hobj is not None:
        parts.append(f"side_effect h{t.hobj}")
    if t.misuse:
        parts.append(f"MISUSE {t.misuse}" + (f"({t.misuse_form})" if t.misuse_form else "")
                     + (f" on the chunk holding {t.misuse_at}" if t.misuse_at is not None else "")
                     + (f" at element {t.misuse_elem}" if t.misuse_elem else ""))
    return " ".join(parts)


# ---- value semantics shared by kernels and model -------------------------------------------
def store(vals: np.ndarray, dtype) -> np.ndarray:
    """Element values (int64) as stored in a buffer of ``dtype`` (exact for floats; ints wrap)."""
    dtype = np.dtype(dtype)
    if dtype.kind == "b":
        return np.asarray(vals % 2 == 0)
    return np.asarray(vals).astype(dtype)


def as_int(a) -> np.ndarray:
    with np.errstate(invalid="ignore"):     # garbage from a faulty run must compare, not warn
        return np.asarray(a).astype(np.int64)


def write_mask(dest: Box) -> np.ndarray:
    """``write`` mode writes only every other element (by destination index): the rest keeps its value."""
    return (np.indices(dest.range).sum(axis=0) + sum(dest.min)) % 2 == 0


def apply_mode(mode: str, vals: np.ndarray, old: np.ndarray, dest: Box, dtype) -> np.ndarray:
    if mode == "read_write":
        return store((vals + as_int(old)) % MOD, dtype)
    if mode == "write":
        return np.where(write_mask(dest), store(vals, dtype), old).astype(dtype)
    return store(vals, dtype)


def red_values(vals: np.ndarray, spec: RedSpec, tdtype: str) -> np.ndarray:
    """The values a kernel hands to ``combine`` for ``spec``, in the values' dtype.

    Chosen so every allowed reduction is exact and split-independent: integer values
    are scaled so partial sums overflow 32 bits (wrap-around must follow the target
    dtype, not the values' dtype); float values are small integers whose sums stay far
    below 2**24 (a dozen reductions of a few hundred values below 997) and whose
    products are +-1.
    """
    v = np.asarray(vals).astype(np.int64)
    vd, td = np.dtype(spec.vdtype), np.dtype(tdtype)
    if vd.kind == "b":
        return np.asarray((v % 50 != 0) if spec.op == "logical_and" else
                          (v % 50 == 0) if spec.op == "logical_or" else (v % 3 == 0))
    if spec.op == "multiplies":
        # products of +-1 stay exact after any number of reductions; wide: odd ints that wrap
        x = 2 * v + 1 if spec.wide else 1 - 2 * (v % 2)
        return x.astype(vd)
    if vd.kind in "iu" and td.kind in "iu" and spec.wide:
        scale = 1 << 21 if vd.itemsize == 4 else (1 << 27 if td.itemsize == 4 else 1 << 40)
        return (v * scale + v).astype(vd)
    return v.astype(vd)


def reduce_model(vals: np.ndarray, spec: RedSpec, tdtype: str, current) -> np.ndarray:
    """Cast ``same_kind`` into the target dtype, reduce there, combine with the current value."""
    td = np.dtype(tdtype)
    op = OPS[spec.op]
    with np.errstate(all="ignore"):
        tv = np.asarray(red_values(vals, spec, tdtype)).reshape(-1).astype(td)
        if not tv.size:     # an empty range: the identity (minimum and maximum have none in numpy)
            red = np.asarray([_identity(spec.op, tdtype)], dtype=td)
        else:
            red = np.asarray([op.reduce(tv, dtype=td)], dtype=td) if td.kind != "b" else \
                np.asarray([op.reduce(tv)], dtype=td)
        if not spec.init:
            red = op(np.asarray(current, dtype=td).reshape(1), red).astype(td)
    return red


def _weighted_index(box: Box) -> np.ndarray:
    idx = np.zeros(box.range, dtype=np.int64)
    for d, g in enumerate(np.indices(box.range)):
        idx += (g + box.min[d]) * WEIGHTS[d]
    return idx


def perm_pieces(kind: str, a: int, b: int, n: int, s: int = 0) -> list[tuple[int, int, int, int, bool]]:
    """Pieces ``(ka, kb, ba, bb, flipped)`` of the 1-D map ``[a, b) -> buffer`` along one dimension.

    mirror: i -> n-1-i; shift: i -> (i+s) mod n (wrapping gives two pieces).
    """
    b = min(b, n)
    if a >= b:
        return []
    if kind == "mirror":
        return [(a, b, n - b, n - a, True)]
    split = n - s
    out = []
    if a < split:
        e = min(b, split)
        out.append((a, e, a + s, e + s, False))
    if b > split:
        st = max(a, split)
        out.append((st, b, st - split, b - split, False))
    return out


def _with_dim(box_min, box_max, d, lo, hi) -> Box:
    mn, mx = list(box_min), list(box_max)
    mn[d], mx[d] = lo, hi
    return Box(tuple(mn), tuple(mx), len(mn))


def neighborhood_offsets(extent: tuple, shape: str) -> list[tuple[int, ...]]:
    n = len(extent)
    if shape == "bounding_box" or n == 1:
        return list(itertools.product(*[range(-e, e + 1) for e in extent]))
    out = [(0,) * n]
    for d, e in enumerate(extent):
        for s in range(1, e + 1):
            for sg in (-s, s):
                out.append(tuple(sg if i == d else 0 for i in range(n)))
    return out


def _clip(box: Box, shape) -> Box:
    return box & Box.full(shape)


def _place(out: np.ndarray, chunk: Box, part: Box, values) -> None:
    if part.empty:
        return
    out[part.slices_in(chunk)] += values


def contribution(rd: Read, chunk: Box, shape, get: Callable[[Box], np.ndarray]):
    """What ``rd`` adds to every element of ``chunk``; ``get(box)`` reads the buffer (int64) in global coordinates."""
    cs = chunk.range
    if rd.mapper == "all":
        return int(get(Box.full(shape)).sum()) % MOD
    if rd.mapper == "fixed":
        lo, hi = rd.fixed_box
        return int(get(Box(lo, hi, len(lo))).sum()) % MOD
    out = np.zeros(cs, dtype=np.int64)
    if rd.mapper == "one_to_one":
        _place(out, chunk, _clip(chunk, shape), get(_clip(chunk, shape)) if not _clip(chunk, shape).empty else 0)
        return out
    if rd.mapper == "transposed":
        rev = Box(tuple(reversed(chunk.min)), tuple(reversed(chunk.max)), chunk.dims)
        part = _clip(rev, shape)
        if not part.empty:
            vals = get(part).transpose(tuple(reversed(range(len(cs)))))
            back = Box(tuple(reversed(part.min)), tuple(reversed(part.max)), chunk.dims)
            _place(out, chunk, back, vals)
        return out
    if rd.mapper == "slice":
        d = rd.dim
        part = _clip(_with_dim(chunk.min, chunk.max, d, 0, shape[d]), shape)
        if part.empty:
            return out
        sums = get(part).sum(axis=d, keepdims=True)
        target = _with_dim(part.min, part.max, d, chunk.min[d], chunk.max[d])
        _place(out, chunk, target, np.broadcast_to(sums, target.range))
        return out
    if rd.mapper == "neighborhood":
        for sh in neighborhood_offsets(rd.extent, rd.shape):
            src = Box(tuple(a + s for a, s in zip(chunk.min, sh)), tuple(a + s for a, s in zip(chunk.max, sh)),
                      chunk.dims)
            part = _clip(src, shape)
            if part.empty:
                continue
            dst = Box(tuple(a - s for a, s in zip(part.min, sh)), tuple(a - s for a, s in zip(part.max, sh)),
                      chunk.dims)
            _place(out, chunk, dst, get(part))
        return out
    if rd.mapper in ("mirror", "shift"):
        d = rd.dim
        inner = _clip(chunk, tuple(shape[i] if i != d else max(shape[d], chunk.max[d]) for i in range(len(shape))))
        if inner.empty:
            return out
        for ka, kb, ba, bb, flip in perm_pieces(rd.mapper, chunk.min[d], chunk.max[d], shape[d], rd.shift):
            kbox = _with_dim(inner.min, inner.max, d, ka, kb)
            bbox = _with_dim(inner.min, inner.max, d, ba, bb)
            vals = get(bbox)
            if flip:
                vals = np.flip(vals, d)
            _place(out, chunk, kbox, vals)
        return out
    raise AssertionError(rd.mapper)


def element_values(t: Task, chunk: Box, shape_of: Callable[[Read], tuple], getters: dict) -> np.ndarray:
    out = np.full(chunk.range, t.c0, dtype=np.int64)
    for rd in t.reads:
        if rd.mapper in ("bad", "even_split", "raising"):
            # what a bad or even_split mapper grants depends on the split: its data is checked
            # against the model's buffer instead (``_Run._check_bad_reads`` / ``_check_even_split``)
            # and adds nothing to the values (nor does a partially raising mapper's, where it grants)
            continue
        out = out + contribution(rd, chunk, shape_of(rd), getters[(rd.space, rd.buffer)])
    return (out + _weighted_index(chunk)) % MOD


def write_pieces(w: Write, chunk: Box, shape) -> list[tuple[Box, Box, bool]]:
    """``(source box in the kernel range, destination box in the buffer, flipped)`` for one chunk."""
    if w.mapper == "one_to_one":
        return [(chunk, chunk, False)]
    if w.mapper == "point":
        if not chunk.contains(w.point):
            return []
        src = Box(w.point, tuple(p + 1 for p in w.point), len(w.point))
        return [(src, Box(w.dest, tuple(p + 1 for p in w.dest), len(w.dest)), False)]
    d = w.dim
    return [(_with_dim(chunk.min, chunk.max, d, ka, kb), _with_dim(chunk.min, chunk.max, d, ba, bb), flip)
            for ka, kb, ba, bb, flip in perm_pieces(w.mapper, chunk.min[d], chunk.max[d], shape[d], w.shift)]


# ---- range mappers for the custom features ------------------------------------------------
def make_write_mapper(w: Write, shape):
    m = _make_write_mapper(w, shape)
    return _opaque(m, w) if w.opaque else m


def _make_write_mapper(w: Write, shape):
    if w.mapper == "one_to_one":
        return cl.one_to_one()
    if w.mapper == "all":
        return cl.all()
    if w.mapper == "fixed":
        lo, hi = w.fixed_box
        return cl.fixed(cl.Subrange(lo, tuple(h - l for l, h in zip(lo, hi))))
    if w.mapper == "neighborhood":
        return cl.neighborhood(*(1,) * len(shape))
    # closures over plain values: the runtime keys them (and replays their steps)
    kind, dim, shift, point, dest = w.mapper, w.dim, w.shift, tuple(w.point), tuple(w.dest)
    if kind == "point":
        dims = len(dest)

        def point_mapper(chunk, buffer_shape):
            box = Box.from_subrange(chunk.offset, chunk.range)
            if box.contains(point):
                return cl.Subrange(dest, (1,) * dims)
            return cl.Region([])
        return point_mapper

    def perm_mapper(chunk, buffer_shape):
        lo = tuple(chunk.offset)
        hi = tuple(o + r for o, r in zip(chunk.offset, chunk.range))
        boxes = [_with_dim(lo, hi, dim, ba, bb)
                 for _ka, _kb, ba, bb, _f in perm_pieces(kind, lo[dim], hi[dim], buffer_shape[dim], shift)]
        if kind == "mirror" and boxes:     # a Subrange result; shift (and an empty chunk) a Region
            return cl.Subrange(boxes[0].offset, boxes[0].range)
        return cl.Region(boxes)
    return perm_mapper


def _opaque(mapper, record):
    """``mapper`` seen through a mutable record: the runtime cannot key it (the record may
    change between submits), so every task using it is lowered afresh."""
    def opaque(chunk, buffer_shape):
        _ = record
        return mapper(chunk, buffer_shape)
    return opaque


def make_bad_buffer(form: str, shape: tuple, dtype: str) -> None:
    """misuse buffer: a ``cl.Buffer`` whose data, shape and dtype do not fit (raises)."""
    if form == "shape":
        cl.Buffer(np.zeros(shape, dtype=dtype), shape=bad_buffer_shape(form, shape), name="bad")
    elif form == "dtype":
        cl.Buffer(shape=shape, dtype="U3", name="bad")
    elif form == "not_dtype":
        cl.Buffer(shape=shape, dtype="no_such_dtype", name="bad")
    elif form == "cast":
        cl.Buffer(np.zeros(shape, dtype="float64"), dtype="int64" if dtype != "int64" else "int32", name="bad")
    else:
        cl.Buffer(shape=bad_buffer_shape(form, shape), dtype=dtype, name="bad")


def bad_buffer_shape(form: str, shape: tuple) -> tuple:
    if form == "shape":
        return (shape[0] + 1,) + tuple(shape[1:])
    if form == "ndim":
        return tuple(shape) + (1,) * (4 - len(shape))
    return (-1,) + tuple(shape[1:])     # negative


def make_read_mapper(rd: Read):
    m = _make_read_mapper(rd)
    return _opaque(m, rd) if rd.opaque else m


def raising_mapper(chunk, buffer_shape):
    """misuse mapper_raises: a user mapper that raises for every chunk."""
    raise ValueError(RAISING_MAPPER_MSG)


def partial_raising_mapper(form: str, k: int):
    """misuse mapper_raises (``PARTIAL_RAISE_FORMS``): a user mapper that raises for the chunks
    ``partial_raises`` names, and maps every other chunk to the whole buffer."""
    def partial_raising(chunk, buffer_shape):
        if partial_raises(form, k, chunk.offset[0], chunk.range[0], chunk.global_range[0]):
            raise ValueError(f"{PARTIAL_RAISING_MSG} {form} {k}")
        return cl.Subrange((0,) * len(buffer_shape), tuple(buffer_shape))
    return partial_raising


def partial_raises(form: str, k: int, o: int, r: int, n: int) -> bool:
    """Whether the partially raising mapper ``form`` raises for the chunk of rows ``[o, o + r)``
    of an index space of ``n`` rows (never for the whole range)."""
    if form == "holding":
        return o <= k < o + r and r < n
    return o == k and k >= 1


def wrong_dims_mapper(form: str):
    """misuse mapper_dims: a user mapper whose result is of another dimensionality (a box,
    subrange or region of ``wrong_dims``) or no region at all (a tuple)."""
    def wrong_dims(chunk, buffer_shape):
        k = wrong_dims_of(len(buffer_shape))
        if form == "box":
            return cl.Box((0,) * k, (1,) * k)
        if form == "subrange":
            return cl.Subrange((0,) * k, (1,) * k)
        if form == "region":
            return cl.Region([cl.Box((0,) * k, (1,) * k)])
        if form == "mixed":     # (cl.Region raises: a GeometryError out of the mapper)
            d = len(buffer_shape)
            return cl.Region([cl.Box((0,) * d, (1,) * d), cl.Box((0,) * k, (1,) * k)])
        return (0,) * len(buffer_shape)
    return wrong_dims


def wrong_dims_of(dims: int) -> int:
    return dims + 1 if dims < 3 else dims - 1


def _make_read_mapper(rd: Read):
    if rd.mapper == "raising":
        return partial_raising_mapper(rd.form, rd.k) if rd.form else raising_mapper
    if rd.mapper == "wrong_dims":
        return wrong_dims_mapper(rd.form)
    if rd.mapper == "bad":
        form, k = rd.form, rd.k     # (plain values: the runtime keys the mapper, unless opaque)

        def bad_read(chunk, buffer_shape):
            lo, hi = bad_rows(form, k, chunk.offset[0], chunk.range[0], buffer_shape[0])
            return cl.Subrange((lo,) + (0,) * (len(buffer_shape) - 1), (hi - lo,) + tuple(buffer_shape[1:]))
        return bad_read
    if rd.mapper == "fixed":
        lo, hi = rd.fixed_box
        return cl.fixed(cl.Subrange(lo, tuple(h - l for l, h in zip(lo, hi))))
    if rd.mapper == "even_split":
        return cl.even_split(rd.k) if rd.k else cl.even_split()
    if rd.mapper == "slice":
        return cl.slice(rd.dim)
    if rd.mapper == "neighborhood":
        return cl.neighborhood(rd.extent, shape=rd.shape)
    if rd.mapper in ("mirror", "shift"):
        kind, dim, shift = rd.mapper, rd.dim, rd.shift

        def perm_read(chunk, buffer_shape):
            lo = tuple(chunk.offset)
            hi = tuple(o + r for o, r in zip(chunk.offset, chunk.range))
            return cl.Region([_with_dim(lo, hi, dim, ba, bb)
                              for _ka, _kb, ba, bb, _f in perm_pieces(kind, lo[dim], hi[dim],
                                                                      buffer_shape[dim], shift)])
        return perm_read
    return {"one_to_one": cl.one_to_one, "all": cl.all, "transposed": cl.transposed}[rd.mapper]()


def bad_rows(form: str, k: int, o: int, r: int, m: int) -> tuple[int, int]:
    """The rows ``[lo, hi)`` of a buffer with ``m`` rows that the bad mapper ``form``
    (``BAD_FORMS``) maps the kernel rows ``[o, o + r)`` to, clipped to the buffer;
    ``(0, 0)`` for nothing.  (All other buffer dimensions are mapped whole.)"""
    if form == "offset_eq":
        lo, hi = (k, k + 1) if o == k else (0, 0)
    elif form == "next_block":
        lo, hi = o + r, o + 2 * r
    elif form == "prev_block":
        lo, hi = o - r, o
    elif form == "first_only":
        lo, hi = (r, m) if o == 0 else (0, 0)
    else:
        raise AssertionError(form)
    lo, hi = max(lo, 0), min(hi, m)
    return (lo, hi) if lo < hi else (0, 0)


def bad_box(rows: tuple[int, int], shape) -> Box | None:
    """``bad_rows``' result as a box of the buffer (None: nothing)."""
    lo, hi = rows
    if lo >= hi:
        return None
    return Box((lo,) + (0,) * (len(shape) - 1), (hi,) + tuple(shape[1:]), len(shape))


# ---- generator ----------------------------------------------------------------------------
class _Gen:
    """State while generating one program: what is defined, which features were used."""

    def __init__(self, rng: random.Random, groups: frozenset[str], repeat: int = 1):
        self.rng = rng
        self.groups = groups
        self.repeat = repeat    # loops and stencil loops this many times longer (replay's exactness)
        self.features: set[str] = set()
        self.extras = False     # main: _gen_step may draw collective, lookahead and extra host-object
                                # steps (off for the other kinds, which keep their draws and seeds)
        self.misuse_state = None    # misuse: the generator's _State (steps after a misuse the runtime survives)

    def on(self, group: str) -> bool:
        return group in self.groups

    def feat(self, *names: str) -> None:
        self.features.update(names)


def _shapes(g: _Gen, n: int) -> list[tuple[int, ...]]:
    rng = g.rng
    out = []
    for _ in range(n):
        d = rng.randint(1, 3)
        out.append(tuple(rng.randint(1, 9 if d < 3 else 5) for _ in range(d)))
    return out


def _init_data(rng: random.Random, shape, dtype) -> np.ndarray:
    vals = np.random.default_rng(rng.randrange(1 << 30)).integers(0, 50, size=shape)
    return store(vals.astype(np.int64), dtype)


def generate(rng: random.Random, kind: str | None = None, groups=GROUPS, repeat: int = 1) -> Program:
    """A random program; ``kind`` None picks one (mostly ``main``), ``groups`` limits the optional
    features; ``repeat`` makes loops that many times longer (steps that replay can hit)."""
    g = _Gen(rng, frozenset(groups), repeat)
    if kind is None:
        r = rng.random()
        # (bad_mapper's 5% is taken from main: the other kinds keep their shares and seeds)
        # (misuse's 3% too: seeds drawn below 0.72 keep their main programs)
        kind = "main" if r < 0.72 else "misuse" if r < 0.75 else "bad_mapper" if r < 0.8 else \
            "fail" if r < 0.88 else "bad_reduction" if r < 0.94 else "overlap"
    if kind == "main":
        p = _gen_main(g)
    elif kind == "bad_mapper":
        p = _gen_bad_mapper(g)
    elif kind == "misuse":
        p = _gen_misuse(g)
    elif kind == "fail":
        p = _gen_fail(g)
    elif kind == "bad_reduction":
        p = _gen_bad_reduction(g)
    elif kind == "overlap":
        p = _gen_overlap(g)
    else:
        raise ValueError(f"unknown program kind {kind!r}")
    p.features |= g.features
    _draw_index_styles(g, p)
    # (each after the ones before it, in this order, so that every seed keeps what it drew before;
    # the module's switches are read now, so that a test may turn one off)
    for switch, draw in (("GEOMETRY_DRAWS", _draw_geometry), ("SPLIT_DRAWS", _draw_splits), ("OOC_DRAWS", _draw_ooc),
                         ("EMPTY_DRAWS", _draw_empty), ("LONG_DRAWS", _draw_long), ("SOURCE_DRAWS", _draw_source),
                         ("EMPTY_TARGET_DRAWS", _draw_empty_target), ("MANY_DRAWS", _draw_many),
                         ("REGION_FENCE_DRAWS", _draw_region_fences), ("BYTE_ORDER_DRAWS", _draw_byte_order),
                         ("DISJOINT_READ_DRAWS", _draw_disjoint_reads), ("RELEASE_DRAWS", _draw_releases),
                         ("FANCY_DRAWS", _draw_fancy), ("REPLACE_DRAWS", _draw_replacements),
                         ("STEP_LOOP_DRAWS", _draw_step_loop), ("RESIDUAL_DRAWS", _draw_step_residual)):
        if kind == "main" and globals()[switch]:
            draw(g, p)
    if kind == "misuse":
        _draw_partial_raise(g, p)
        _draw_config(g, p)
        _draw_config_start(g, p)
        _draw_misuse_more(g, p)
        _draw_mixed_region(g, p)
    return p


def _draw_mixed_region(g: _Gen, p: Program) -> None:
    """Half of the mapper_dims programs still of the ``region`` form (drawn last, so that every
    other program is what its seed gave before) return a ``cl.Region`` of two boxes instead, one
    of the buffer's dimensionality and one of ``wrong_dims``: ``cl.Region`` refuses it inside the
    mapper (a GeometryError), which the runtime reports as the mapper's error."""
    t = p.tasks[-1]
    if t.misuse != "mapper_dims" or t.misuse_form != "region" or g.rng.random() >= 0.5:
        return
    t.misuse_form = "mixed"
    _misuse_read(t).form = "mixed"
    p.features.discard("misuse:mapper_dims:region")
    p.features.add("misuse:mapper_dims:mixed")


def _draw_config(g: _Gen, p: Program) -> None:
    """Most misuse buffer programs (drawn after the whole program, so that every other misuse
    program is what its seed gave before) misconfigure instead (``CONFIG_FORMS``): the misuse
    task becomes a ``bad_config`` step (its ``fence_index`` the case of ``CONFIG_ENV_CASES`` /
    ``CONFIG_QUEUE_CASES``, or the invalid lookahead mode)."""
    rng = g.rng
    t = p.tasks[-1]
    if t.misuse != "buffer" or rng.random() >= 0.6:
        return
    form = rng.choice(CONFIG_FORMS)
    n = {"env": len(CONFIG_ENV_CASES), "queue_arg": len(CONFIG_QUEUE_CASES), "set_lookahead": 3,
         "second_queue": 2}[form]
    p.tasks[-1] = Task("bad_config", name=MISUSE_TASK, misuse="config", misuse_form=form, fence_index=rng.randrange(n))
    p.features -= {f for f in p.features if f.startswith("misuse:buffer")}
    setting, _value = config_setting(p.tasks[-1])
    p.features |= {"misuse:config", f"misuse:config:{form}", f"misuse:config:{form}:{setting}"}


def _draw_config_start(g: _Gen, p: Program) -> None:
    """A third of misuse config programs (drawn after ``_draw_config``, so that every other
    program is what its seed gave before) name instead an output folder that cannot be made or
    a device that does not exist (``CONFIG_START_FORMS``): its ``fence_index`` the case of
    ``CONFIG_OUTPUT_CASES`` / ``CONFIG_DEVICE_CASES``."""
    rng = g.rng
    t = p.tasks[-1]
    if t.misuse != "config" or rng.random() >= 0.35:
        return
    form = rng.choice(CONFIG_START_FORMS)
    n = len(CONFIG_OUTPUT_CASES) if form == "output" else len(CONFIG_DEVICE_CASES)
    t.misuse_form, t.fence_index = form, rng.randrange(n)
    p.features -= {f for f in p.features if f.startswith("misuse:config:")}
    setting, value = config_setting(t)
    what = {"output": lambda: "under_file" if CONFIG_OUTPUT_CASES[t.fence_index][3] == errno.ENOTDIR
            else "is_file", "device": lambda: value.replace(":", "_")}[form]()
    p.features |= {f"misuse:config:{form}", f"misuse:config:{form}:{setting}", f"misuse:config:{form}:{what}"}


def _draw_misuse_more(g: _Gen, p: Program) -> None:
    """Most misuse write_read, outside_kernel and mapper_dims programs (drawn after the whole program,
    so that every other program is what its seed gave before) become a divergence (``diverge``) or a
    command-group misuse the runtime survives (``cg_handler``, ``cg_call``, ``fence_region``: ordinary
    steps follow, and the program ends as ``main`` does)."""
    rng = g.rng
    t = p.tasks[-1]
    if t.misuse not in ("write_read", "outside_kernel", "mapper_dims") or rng.random() >= 0.6:
        return
    old = t.misuse
    p.features -= {f for f in p.features if f.startswith(f"misuse:{old}") or f.startswith("misuse:sync:")
                   or f in ("misuse:kernel", "misuse:host", "misuse:on_master")}
    w, b = t.write.buffer, _misuse_read(t).buffer
    shape = p.shapes[w]
    r = rng.random()
    form = "diverge" if r < 0.3 else "cg_handler" if r < 0.6 else "cg_call" if r < 0.9 else "fence_region"
    region = None
    if form == "fence_region":
        region = _region_draw(rng, p)
        if region is None:
            form = "cg_call"
    arg: dict = {"w": w, "b": b, "range": shape, "host": g.on("host_range") and rng.random() < 0.3}
    if form == "diverge":
        sub = rng.choice(DIVERGE_FORMS)
        if sub == "range":
            arg["other"] = (rng.randrange(shape[0]),) + tuple(shape[1:])
        elif sub.startswith("buffer"):
            bshape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 2)))
            dt = rng.choice(DATA_DTYPES)
            if sub == "buffer_shape":
                other = (bshape[0] + rng.randint(1, 3),) + bshape[1:]
                arg["buffer"] = (bshape, dt, other, dt)
            else:
                arg["buffer"] = (bshape, dt, bshape, rng.choice([d for d in DATA_DTYPES if d != dt]))
        p.tasks[-1] = Task("diverge", shape, write=Write("data", w, "one_to_one", "discard_write"),
                           name=MISUSE_TASK, misuse=form, misuse_form=sub, fence_index=rng.randrange(4),
                           misuse_arg=arg)
        # (q.shutdown(): an epoch that waits until the neighbour's matching epoch arrived and matched; a
        # q.wait() is checked in the background, so the error could come after the program, at the
        # runtime's shutdown in run_cluster, past what the ranks' outcomes record)
        p.sync = "shutdown"
        p.features |= {"misuse:diverge", f"misuse:diverge:{sub}",
                       f"misuse:diverge:{'host' if arg['host'] else 'kernel'}"}
        if sub == "extra" and rng.random() < 0.5:
            # (a fence of what the misuse task writes first: its transfers never match across
            # the extra task, so the ranks wait there, where no epoch compares their streams)
            p.sync = "fence_shutdown"
            p.features.add("misuse:diverge:at_fence")
        if sub == "name" and rng.random() < 0.5:
            # (drawn last, so the other forms' programs are what their seeds gave before: the
            # same name and range, the write declared write (consuming) instead of discard_write,
            # then a fence of it: the streams differ in the accesses alone)
            t = p.tasks[-1]
            t.misuse_form = "mode"
            p.sync = "fence_shutdown"
            p.features = (p.features - {"misuse:diverge:name"}) | {"misuse:diverge:mode", "misuse:diverge:at_fence"}
        elif sub == "range" and arg["host"] and rng.random() < 0.5:
            # (drawn last, as "mode": the same host task, with a side effect on the log host object
            # on the rank at fault only; the streams differ in that side effect alone)
            p.tasks[-1].misuse_form = "side_effect"
            p.features = (p.features - {"misuse:diverge:range"}) | {"misuse:diverge:side_effect"}
        elif sub == "buffer_dtype" and rng.random() < 0.5:
            # (drawn last, as "mode": the same buffer, made from an array on the rank at fault and
            # from its shape and dtype elsewhere)
            arg["buffer"] = (bshape, dt, bshape, dt)
            p.tasks[-1].misuse_form = "host_data"
            p.features = (p.features - {"misuse:diverge:buffer_dtype"}) | {"misuse:diverge:host_data"}
        return
    if form == "cg_handler":
        sub = f"{rng.choice(CG_HANDLER_TARGETS)}:{rng.choice(['none', 'stale'])}"
        arg["r"] = rng.randrange(len(p.targets))
    elif form == "cg_call":
        sub = rng.choice(CG_CALLS)
        arg["v"] = rng.randrange(3)
    else:
        sub = f"{len(region[1])}_boxes"
        arg["b"], arg["dim"], arg["at"] = region[0], region[1][0][0], [a for _d, a in region[1]]
    bad = p.tasks[-1] = Task("bad_cg", name=MISUSE_TASK, misuse=form, misuse_form=sub, misuse_arg=arg)
    p.features |= {f"misuse:{form}", f"misuse:{form}:{sub}"}
    if form != "fence_region" and sub not in ("submit_noncallable",):
        p.features.add(f"misuse:{form}:{'host' if _cg_host(p.tasks[-1]) else 'kernel'}")
    st = g.misuse_state
    for _ in range(rng.randint(1, 3)):
        _gen_step(g, st, p.tasks)
    p.sync = "end"
    p.features.add("misuse:continues")
    _draw_region_fences(g, p)
    # (drawn last, so that the programs above keep their forms) a placement misused instead
    if form == "cg_call" and sub.startswith("host_range") and rng.random() < 0.4:
        new = rng.choice(CG_PLACEMENTS)
        bad.misuse_form = new
        p.features -= {f"misuse:{form}:{sub}"}
        p.features.add(f"misuse:{form}:{new}")
    # (drawn after that) two hints that cannot go together instead of a name that is no str
    if form == "cg_call" and sub == "name_type" and rng.random() < 0.5:
        new = rng.choice(sorted(CG_HINTS))
        bad.misuse_form = new
        p.features -= {f"misuse:{form}:{sub}"}
        p.features.add(f"misuse:{form}:{new}")


def _region_draw(rng: random.Random, p: Program):
    """(buffer, [(dim, index), ...]) of a fence_region misuse: 2 or 3 slabs of one dimension of
    extent >= 3, never adjacent (a region of 2 or 3 boxes, whatever it merges), or None."""
    cands = [(k, d) for k, s in enumerate(p.shapes) for d, n in enumerate(s) if n >= 3]
    if not cands:
        return None
    k, d = rng.choice(cands)
    n = p.shapes[k][d]
    at = [rng.randrange(n - 2)]
    at.append(rng.randrange(at[0] + 2, n))
    if at[1] + 2 < n and rng.random() < 0.4:
        at.append(rng.randrange(at[1] + 2, n))
    return k, [(d, a) for a in at]


def fence_region_boxes(p: Program, t: Task) -> list[Box]:
    a = t.misuse_arg
    shape = p.shapes[a["b"]]
    d = a["dim"]
    return [_with_dim((0,) * len(shape), shape, d, x, x + 1) for x in a["at"]]


def _cg_host(t: Task) -> bool:
    """Whether a misuse cg_handler / cg_call command group declares a host task (else a kernel)."""
    sub = t.misuse_form
    if t.misuse == "cg_call":
        if sub.startswith("host_range") or sub.endswith("_host") or sub in CG_PLACEMENTS:
            return True
        if sub in ("side_effect_kernel", "reduction_target") or sub.endswith("_kernel"):
            return False
    elif sub.startswith("side_effect"):
        return True
    elif sub.startswith("reduction"):
        return False
    return bool(t.misuse_arg.get("host"))


def _draw_region_fences(g: _Gen, p: Program) -> None:
    """Some subrange fences (drawn after the whole program) are given as a ``cl.Region`` of their
    one box ("region"), or of its two halves along dimension 0, which the region merges
    ("region_split"): the same fence, the same array."""
    rng = g.rng
    for t in p.tasks:
        if t.kind != "fence" or not t.fence_box or rng.random() >= 0.35:
            continue
        t.misuse_arg = "region_split" if t.fence_box[1][0] >= 2 and rng.random() < 0.5 else "region"
        p.features.add(f"fence:subrange:{t.misuse_arg}")


def not_a_folder() -> str:
    """A regular file (made here if missing) that output settings name as, or above, a folder."""
    path = os.path.join(tempfile.gettempdir(), "celeritas-fuzz-not-a-folder")
    if not os.path.isfile(path):
        with open(path, "a"):
            pass
    return path


@functools.lru_cache(maxsize=None)
def _opencl_platforms() -> tuple[str | None, list]:
    """(why OpenCL cannot be used, or None; ``[(platform name, [device names])]``) on this machine."""
    try:
        import pyopencl
    except ImportError as exc:
        return f"PyOpenCL is not installed (pip install 'celeritas[opencl]'): {exc}", []
    try:
        platforms = pyopencl.get_platforms()
    except Exception:  # noqa: BLE001 - no ICD registered
        return "no OpenCL platform is installed", []
    out = []
    for plat in platforms:
        try:
            devs = [d.name.strip() for d in plat.get_devices()]
        except Exception:  # noqa: BLE001 - a platform without devices
            devs = []
        out.append((plat.name.strip(), devs))
    return None, out


@functools.lru_cache(maxsize=None)
def _cuda_gpus() -> tuple[str | None, int]:
    """(why CuPy cannot be imported, or None; how many CUDA GPUs it sees)."""
    try:
        import cupy
    except ImportError as exc:
        return str(exc), 0
    try:
        return None, int(cupy.cuda.runtime.getDeviceCount())
    except Exception:  # noqa: BLE001 - no driver, no device
        return None, 0


def device_error_pattern(value: str, cuda_stand_in: bool = False) -> str:
    """The whole message (a regex) of the cl.ConfigError for ``CELERITAS_DEVICES=value`` naming a
    device that does not exist, on this machine (docs/api.md: "a device that does not exist is a
    cl.ConfigError listing the ones that do"); ``cuda_stand_in``: the program runs on the CuPy
    stand-in (a ``cuda`` configuration), whose one GPU the runtime sees instead."""
    var = "CELERITAS_DEVICES"
    if value.count(":") == 1 and value.startswith("opencl"):     # (opencl:N: not P:D, a malformed list)
        return re.escape(f"{var}={value!r} is not a device list; use host:N, cuda, cuda:0,1, opencl or "
                         f"opencl:P:D,...")
    head = re.escape(f"{var}={value!r}: ")
    if value.startswith("cuda"):
        dev = int(value.split(":")[1])
        why, n = (None, 1) if cuda_stand_in else _cuda_gpus()
        if why is not None:
            return head + re.escape(f"the CUDA backend needs CuPy (pip install 'celeritas[cuda]'): "
                                    f"CuPy is not installed: {why}")
        if n == 0:
            return head + re.escape("no CUDA GPU is visible")
        return head + re.escape(f"CUDA device {dev} does not exist; this machine has {n} visible: "
                                + ", ".join(f"cuda:{d}" for d in range(n)))
    plat, dev = (int(x) for x in value.split(":")[1:])
    why, platforms = _opencl_platforms()
    if why is not None:
        return head + re.escape(why) + ".*"
    listing = "; ".join(f"platform {p} {name!r}: " + (", ".join(f"opencl:{p}:{d} {dn}" for d, dn in enumerate(devs))
                                                       or "no devices")
                        for p, (name, devs) in enumerate(platforms))
    if plat >= len(platforms):
        n = len(platforms)
        return head + re.escape(f"OpenCL platform {plat} does not exist; this machine has {n} "
                                f"platform{'s' if n != 1 else ''} ({listing or 'none'})")
    name, devs = platforms[plat]
    assert dev >= len(devs), f"opencl:{plat}:{dev} exists on this machine"
    return head + re.escape(f"OpenCL platform {plat} {name!r} has no device {dev}; this machine has: {listing}")


BAD_LOOKAHEADS = ("sometimes", "", "always")


def config_setting(t: Task) -> tuple[str, Any]:
    """The setting a misuse config task gets wrong and its invalid value (second_queue devices:
    ``None``, the rank's devices plus one, known only on the configuration)."""
    if t.misuse_form == "env":
        return CONFIG_ENV_CASES[t.fence_index][:2]
    if t.misuse_form == "queue_arg":
        return CONFIG_QUEUE_CASES[t.fence_index][:2]
    if t.misuse_form == "set_lookahead":
        return "lookahead", BAD_LOOKAHEADS[t.fence_index]
    if t.misuse_form == "output":
        var, value = CONFIG_OUTPUT_CASES[t.fence_index][:2]
        return var, value.format(file=not_a_folder())
    if t.misuse_form == "device":
        return "CELERITAS_DEVICES", CONFIG_DEVICE_CASES[t.fence_index]
    return ("devices", None) if t.fence_index == 0 else ("lookahead", "sometimes")


def _config_step(p: Program, *forms: str) -> dict:
    """``{setting: invalid value}`` of a misuse config program of one of ``forms`` (else none)."""
    t = p.tasks[-1] if p.tasks else None
    if t is None or t.misuse != "config" or t.misuse_form not in forms:
        return {}
    setting, value = config_setting(t)
    return {setting: value}


def config_queue_kwargs(p: Program) -> dict:
    """The arguments of a misuse queue_arg program's cl.Queue() (else none)."""
    return _config_step(p, "queue_arg")


def config_env(p: Program) -> dict:
    """The invalid variable of a misuse env, output or device program (else none)."""
    return _config_step(p, "env", *CONFIG_START_FORMS)


def _draw_partial_raise(g: _Gen, p: Program) -> None:
    """Most misuse mapper_raises programs (drawn after the whole program, so that every other
    misuse program is what its seed gave before) get a mapper that raises for part of the range
    only (``PARTIAL_RAISE_FORMS``), and a sync of any kind."""
    rng = g.rng
    t = p.tasks[-1]
    if t.misuse != "mapper_raises" or rng.random() >= 0.7:
        return
    rd = next(r for r in t.reads if r.mapper == "raising")
    n = t.range_shape[0]
    rd.form = rng.choice(PARTIAL_RAISE_FORMS) if n >= 2 else "holding"
    rd.k = rng.randrange(1, n) if rd.form == "offset_eq" else rng.randrange(n)
    p.sync = rng.choice(["wait", "fence", "shutdown"])
    t.misuse_form = "partial"
    p.features -= {"misuse:sync:wait"}
    p.features |= {f"misuse:partial:{rd.form}", f"misuse:sync:{p.sync}"}


def _add_buffers(p: Program, rng: random.Random, shape: tuple, dtype: str, n: int = 2) -> tuple[int, ...]:
    """``n`` new data buffers of ``shape`` and ``dtype``, host-initialized (their ids)."""
    a = len(p.shapes)
    for _ in range(n):
        p.shapes.append(shape)
        p.dtypes.append(dtype)
        p.init.append(_init_data(rng, shape, dtype))
    return tuple(range(a, a + n))


def _draw_long(g: _Gen, p: Program) -> None:
    """Rarely (drawn after the whole program, so that every seed keeps its program) a long part
    over two new buffers of one shape, inserted anywhere: a stencil loop of ping-pong
    steps between them (``_gen_stencil_loop``: 100-200 steps, one kernel name and mapper, so that replay
    reuses one template hundreds of times and the bounded caches fill; waits every 50-100
    steps; ``long:stencil``), or a front of 65-96 independent kernels (``long:wide``): kernel
    i over row i of the second buffer (``offset=(i, 0)``), reading the first one_to_one (and
    maybe through a row neighborhood), so that no two depend on each other and the horizon
    by width (``CELERITAS_HORIZON_MAX_PARALLELISM``, 64 by default) is reached; maybe then
    a kernel reading all rows, which depends on every one of them."""
    rng = g.rng
    x = rng.random()
    if x >= LONG_STENCIL_SHARE + WIDE_SHARE:
        return
    wide = x >= LONG_STENCIL_SHARE
    rows = rng.randint(65, 96) if wide else rng.randint(8, 24)
    shape = (rows, rng.randint(1, 4) if wide else rng.randint(4, 8))
    dtype = rng.choice(("int64", "int32", "float64"))
    a, b = _add_buffers(p, rng, shape, dtype)
    if wide:
        nbh = rng.random() < 0.4
        part = []
        for i in range(rows):
            reads = [Read("data", a, "one_to_one")] + ([Read("data", a, "neighborhood", extent=(1, 0))] if nbh else [])
            part.append(Task("kernel", (1, shape[1]), reads, Write("data", b, "one_to_one", rng.choice(MODES)),
                             c0=i % 7, offset=(i, 0), name="wide", index=rng.choice(INDEX_DRAW)))
        if rng.random() < 0.6:
            part.append(Task("kernel", shape, [Read("data", b, "all")], Write("data", a, "one_to_one", "read_write"),
                             c0=1, name="wide_join"))
            p.features.add("long:wide:join")
        p.features.add("long:wide" + (":neighborhood" if nbh else ""))
    else:
        st = _State(p.shapes, p.dtypes, p.targets)
        part = _gen_stencil_loop(g, st, (a, b), steps=rng.randint(100, 200), wait_scale=rng.choice((50, 100)))
        for t in part:
            if t.kind == "kernel":
                t.index = rng.choice(INDEX_DRAW)
        p.features.add("long:stencil")
    at = rng.randint(0, len(p.tasks))
    p.tasks[at:at] = part
    p.features.add("long")


def _draw_step_loop(g: _Gen, p: Program) -> None:
    """Sometimes (drawn after every other draw, so that every seed keeps what it drew before) a
    step over new buffers repeated 10-30 times, inserted anywhere: a ping-pong neighborhood
    kernel between two buffers, then maybe a kernel that reads the new state through ``all``,
    ``mirror`` or ``shift`` into a third, then maybe a host task that reads it.  Each task's
    chunks read other ranks' rows, so on several ranks a rank's commands of one task (its
    execution, pushes and await-pushes) repeat often enough, with the same buffer states,
    that replay keeps them as one template (``reached:replay:grouped``); the main programs'
    own loops are mostly too short for it (``loop:step``)."""
    rng = g.rng
    if rng.random() >= STEP_LOOP_SHARE:
        return
    shape = (rng.randint(6, 16), rng.randint(2, 6))
    dtype = rng.choice(("int64", "int32", "float64"))
    a, b, c = _add_buffers(p, rng, shape, dtype, 3)
    extent = (rng.randint(1, 2), rng.randint(0, 1))
    nbh = rng.choice(("bounding_box", "along_axes"))
    split2d = rng.random() < 0.4
    mode = rng.choice(("discard_write", "read_write"))
    second = rng.choice(("all", "mirror", "shift", None))
    shift = rng.randrange(1, shape[0])
    host = second is not None and rng.random() < 0.3
    side_effect = rng.random() < 0.5
    index = rng.choice(INDEX_DRAW)
    part: list[Task] = []
    for step in range(rng.randint(10, 30)):
        src, dst = (a, b) if step % 2 == 0 else (b, a)
        part.append(Task("kernel", shape, [Read("data", src, "neighborhood", extent=extent, shape=nbh)],
                         Write("data", dst, "one_to_one", mode), c0=step % 2, split2d=split2d,
                         name="step_stencil", index=index))
        if second is not None:
            rd = Read("data", dst, second, dim=0, shift=shift if second == "shift" else 0)
            part.append(Task("kernel", shape, [rd, Read("data", c, "one_to_one")],
                             Write("data", c, "one_to_one", "read_write"), c0=1, name="step_gather", index=index))
        if host:
            part.append(Task("host", shape, [Read("data", c, "all")], side_effect=side_effect, name="step_host"))
    at = rng.randint(0, len(p.tasks))
    p.tasks[at:at] = part
    p.features.update(("loop:step", f"loop:step:{second or 'stencil'}", f"read:neighborhood:{nbh}"))
    if host:
        p.features.add("loop:step:host")
    if split2d:
        p.features.add("split_2d:stencil")


STEP_RESIDUAL_SHARE = 0.5    # of the programs with a step loop (``_draw_step_residual``)


def _draw_step_residual(g: _Gen, p: Program) -> None:
    """Half of the step loops (drawn after every other draw, so that every seed keeps what it
    drew before): every stencil step also reduces into a new int64 target, as jacobi3d's
    convergence check reduces its residual (``loop:step:residual``), in half of them folding
    the target's value in (``loop:step:residual:current``: the step before's partial results
    gathered on the master node by each step), and in a third of them a master-node host
    task reads it after every third step (``loop:step:residual:read``: the partial results
    gathered there).  On several ranks a rank's commands of such a step (its execution with
    the task's reduction, pushes and await-pushes, and on the master node the gathering
    await-pushes and reduction command) replay as one template
    (``reached:replay:grouped:reduction``)."""
    rng = g.rng
    steps = [t for t in p.tasks if t.name == "step_stencil"]
    if not steps or rng.random() >= STEP_RESIDUAL_SHARE:
        return
    op = rng.choice(("plus", "maximum"))
    read_every = rng.choice((0, 0, 3))
    current = rng.random() < 0.5     # each step folds the residual's value in (the last step's gathered)
    k = len(p.targets)
    p.targets.append(TargetSpec("int64", (1,), rng.randint(0, 50) if current else None))
    old = list(p.tasks)
    out = []
    n = 0
    for t in old:
        out.append(t)
        if t.name == "step_stencil":
            t.reds = [RedSpec(k, op, "int64", not current)]
            n += 1
            if read_every and n % read_every == 0:
                out.append(Task("master", reads=[Read("target", k, "all")]))
    p.tasks[:] = out
    if lifecycle(p)[0] is not None:     # (not expected: the target is new, each step defines it)
        for t in steps:
            t.reds = []
        p.tasks[:] = old
        p.targets.pop()
        return
    p.features.update(("loop:step:residual", f"red:{op}", "red:target:int64"))
    if read_every:
        p.features.add("loop:step:residual:read")
    if current:
        p.features.update(("loop:step:residual:current", "red:no_init"))


def _draw_source(g: _Gen, p: Program) -> None:
    """Kernels that run as ``cl.Kernel`` OpenCL C source on the opencl backend (drawn after the
    whole program, so that every seed keeps its program; elsewhere they stay Python kernels):
    40% of those ``source_kernel`` can express (``source:kernel``, ``source:mode:<mode>``)."""
    rng = g.rng
    for t in p.tasks:
        if t.kind == "kernel" and source_eligible(p, t) and rng.random() < 0.4:
            t.source = True
            p.features |= {"source:kernel", f"source:mode:{t.write.mode}", f"source:dims:{len(t.range_shape)}"}
            if t.local_range is not None:
                p.features.add("source:local_range")
            if t.offset is not None:
                p.features.add("source:offset")
            if "bool" in [p.dtypes[t.write.buffer]] + [p.dtypes[rd.buffer] for rd in t.reads]:
                p.features.add("source:bool")
            if task_box(t).empty:
                p.features.add("source:empty")


BYTE_ORDER_SHARE = 0.08     # data buffers of multi-byte dtypes drawn with the non-native byte order


def _draw_byte_order(g: _Gen, p: Program) -> None:
    """Some data buffers (drawn after the whole program, so that every seed keeps its program) hold
    their dtype in the non-native byte order (``dtype:byte_order``): kernels, transfers, fences and
    the host see the same values.  Not those of source kernels (an error: ``SOURCE_TYPES``)."""
    rng = g.rng
    sourced = {b for t in p.tasks if getattr(t, "source", False)
               for b in [rd.buffer for rd in t.reads if rd.space == "data"] + [t.write.buffer]}
    for k, dt in enumerate(p.dtypes):
        d = np.dtype(dt)
        if d.itemsize < 2 or k in sourced or rng.random() >= BYTE_ORDER_SHARE:
            continue
        other = d.newbyteorder("S")
        p.dtypes[k] = other.str
        if p.init[k] is not None:
            p.init[k] = p.init[k].astype(other)
        p.features.add("dtype:byte_order")


def _draw_releases(g: _Gen, p: Program) -> None:
    """Half of the buffers and host objects a program destroys (drawn after the whole program, so
    that every seed keeps its program) are released instead by dropping their last reference, on
    the application thread (``lifetime:drop``) or on another thread (``lifetime:drop_thread``): the
    finalizer queues the destruction, which the application thread does at its next call into the
    runtime.  Every later result must be the same."""
    rng = g.rng
    for t in p.tasks:
        if t.kind in ("destroy", "hdestroy") and rng.random() < 0.5:
            t.release = rng.choice(RELEASE_FORMS)
            p.features.add("lifetime:drop" if t.release == "drop" else "lifetime:drop_thread")


def _draw_fancy(g: _Gen, p: Program) -> None:
    """A tenth of the kernels and host tasks (drawn after the whole program, so that every seed
    keeps its program) index their accessors with numpy's integer (fancy) indexing in global
    coordinates instead (``index:fancy``: ``np.ix_`` of the box's ranges, a plain list for some
    1-D boxes; ``_fancy_key``)."""
    for t in p.tasks:
        if t.kind in ("kernel", "host") and g.rng.random() < 0.1:
            t.index = "fancy"
            p.features.add("index:fancy")


def _draw_replacements(g: _Gen, p: Program) -> None:
    """Half of the extra host objects that live through the whole program (drawn after the whole
    program, so that every seed keeps its program) are replaced by the master-node host tasks that
    record on them (``h.obj = h.obj + [record]``, ``hobj:replace``) instead of appended to: the
    collective tasks that record there append to ``h.obj`` as it is when they run (what
    ``cl.side_effect`` returned at the submit may be an older object), and fences must show the
    newest.  (Not objects destroyed or released: a task's command group holds the handle.)"""
    gone = {u.fence_index for u in p.tasks if u.kind in ("hdestroy", "hcreate")}
    for k in range(p.hobjs):
        if k in gone or g.rng.random() >= 0.5:
            continue
        users = [t for t in p.tasks if t.kind in ("master", "collective") and t.hobj == k]
        for t in users:
            t.hobj_replace = True
        if any(t.kind == "master" for t in users):
            p.features.add("hobj:replace")


def _draw_disjoint_reads(g: _Gen, p: Program) -> None:
    """In some programs (drawn after the whole program, so that every seed keeps its program) a
    task that reads a data buffer of 3 or more rows also reads its first and its last row through
    two ``fixed`` accessors (``read:disjoint_rows``): two accesses that do not touch, which get an
    allocation each (not their bounding box), and are received apart from another rank.  Not in
    source kernels (one_to_one reads only), not of the buffer the task writes, not in the
    out-of-core pair (sized for its capacity)."""
    rng = g.rng
    if rng.random() >= DISJOINT_READ_SHARE:
        return
    picks = []
    for t in p.tasks:
        if t.kind not in ("kernel", "host", "master", "collective") or getattr(t, "source", False) \
                or (t.name or "").startswith("ooc_"):
            continue
        w = t.write
        for rd in t.reads:
            if rd.space != "data" or len(p.shapes[rd.buffer]) < 1 or p.shapes[rd.buffer][0] < 3:
                continue
            if w is not None and w.space == "data" and w.buffer == rd.buffer:
                continue
            picks.append((t, rd.buffer))
            break
    if not picks:
        return
    for t, b in rng.sample(picks, min(len(picks), rng.randint(1, 2))):
        shape = p.shapes[b]
        rest = tuple(shape[1:])
        first = Read("data", b, "fixed", fixed_box=((0,) + (0,) * len(rest), (1,) + rest))
        last = Read("data", b, "fixed", fixed_box=((shape[0] - 1,) + (0,) * len(rest), (shape[0],) + rest))
        t.reads.extend([first, last] if rng.random() < 0.5 else [last, first])
        p.features.add("read:disjoint_rows")


SOURCE_TYPES = {"int64": "long", "int32": "int", "int16": "short", "uint8": "uchar", "float32": "float",
                "float64": "double", "bool": "uchar"}   # (bool: bytes 0 and 1, stored as ``store`` does)
_SOURCE_KERNELS: dict = {}      # source text -> cl.Kernel (one object per text: the runtime caches its programs)


def source_eligible(p: Program, t: Task) -> bool:
    """Whether ``source_kernel`` computes kernel ``t``: a one_to_one write of a data buffer (any
    mode), one_to_one reads of data buffers that hold its whole index space, no reductions, no
    injected delay or failure, buffers of ``SOURCE_TYPES`` (bool as uchar), an index space of
    at least one dimension (an empty one launches nothing)."""
    w = t.write
    if (w is None or w.space != "data" or w.mapper != "one_to_one" or w.opaque or t.reds or t.delay
            or t.fail_at is not None or not t.range_shape or p.dtypes[w.buffer] not in SOURCE_TYPES):
        return False
    box = task_box(t)
    return all(rd.space == "data" and rd.mapper == "one_to_one" and p.dtypes[rd.buffer] in SOURCE_TYPES
               and len(p.shapes[rd.buffer]) == box.dims and Box.full(p.shapes[rd.buffer]).contains(box)
               for rd in t.reads) and Box.full(p.shapes[w.buffer]).contains(box)


def source_kernel(p: Program, t: Task):
    """The OpenCL C kernel of ``t`` (``source_eligible``): per work item, ``element_values``
    (c0 + the reads' elements + the weighted global index, mod 997) stored by ``apply_mode``;
    its arguments are the reads' accessors, the write's, then c0."""
    n = len(t.range_shape)
    at = f"AT{n}"
    idx = ", ".join(f"g{d}" for d in range(n))
    params = [f"ACCESSOR({SOURCE_TYPES[p.dtypes[rd.buffer]]}, r{j})" for j, rd in enumerate(t.reads)]
    wt = SOURCE_TYPES[p.dtypes[t.write.buffer]]
    boolean = p.dtypes[t.write.buffer] == "bool"
    terms = [f"(long){at}(r{j}, {idx})" for j in range(len(t.reads))] + \
        [f"g{d} * {WEIGHTS[d]}" for d in range(n)]
    store_v = {"discard_write": "v", "discard_read_write": "v", "write": "v",
               "read_write": f"(v + (long){at}(w, {idx})) % {MOD}"}[t.write.mode]
    assign = (f"{at}(w, {idx}) = (uchar)(({store_v}) % 2 == 0);" if boolean   # (``store``'s rule for bool)
              else f"{at}(w, {idx}) = ({wt})({store_v});")
    if t.write.mode == "write":      # (every other element, by the sum of its global indices: write_mask)
        assign = f"if (({' + '.join(f'g{d}' for d in range(n))}) % 2 == 0) {assign}"
    src = (f"__kernel void fuzz_kernel(CHUNK_PARAMS, {', '.join(params + [f'ACCESSOR({wt}, w)'])}, long c0) {{\n"
           f"    if (!IN_CHUNK()) return;\n"
           + "".join(f"    long g{d} = GID({d});\n" for d in range(n))
           + f"    long v = (c0 + {' + '.join(terms)}) % {MOD};\n"
           f"    {assign}\n}}\n")
    k = _SOURCE_KERNELS.get(src)
    if k is None:
        k = _SOURCE_KERNELS[src] = cl.Kernel(source={"opencl": src}, name="fuzz_kernel")
    return k


def _source_reads(t: Task, accs: dict) -> list:
    """The accessors of ``t``'s reads in the order of ``t.reads`` (``_Run._reads`` keeps them per
    buffer, in that order)."""
    used: Counter = Counter()
    out = []
    for rd in t.reads:
        key = (rd.space, rd.buffer)
        out.append(accs[key][used[key]])
        used[key] += 1
    return out


def _draw_empty(g: _Gen, p: Program) -> None:
    """Empty index spaces where ``_draw_geometry`` draws none (drawn after the whole program, so
    that every seed keeps the program it gave before): kernels with reductions (``geometry:
    empty:reduction``; maybe beside reads and a data write through any write mapper, maybe at an
    offset, maybe with split hints: no chunk runs, nothing is written, and every reduction's
    result is its identity, folded into the target's current value unless
    ``initialize_to_identity``: ``reduce_model``) and host tasks with a range (``geometry:empty:
    host``, maybe ``on_master_node``: no partition runs anywhere).  A kernel with a point write
    into a target keeps its range (that write defines the target); so does a task whose
    emptiness would leave a buffer made without data unwritten (``lifecycle``)."""
    rng = g.rng
    for t in p.tasks:
        if t.kind == "kernel" and t.reds:
            if (t.write is not None and t.write.space == "target") or 0 in t.range_shape or rng.random() >= 0.1:
                continue
        elif t.kind == "host" and t.range_shape:
            if 0 in t.range_shape or rng.random() >= 0.05:
                continue
        else:
            continue
        old = (t.range_shape, t.local_range)
        d = rng.randrange(len(t.range_shape))
        t.range_shape = tuple(0 if i == d else e for i, e in enumerate(t.range_shape))
        t.local_range = None
        if lifecycle(p)[0] is not None:
            t.range_shape, t.local_range = old
            continue
        if t.kind == "host":
            p.features.add("geometry:empty:host" + (":on_master" if t.on_master else ""))
            continue
        p.features.add("geometry:empty:reduction")
        if any(not s.init for s in t.reds):
            p.features.add("geometry:empty:reduction:include_current")
        if any(s.init for s in t.reds):
            p.features.add("geometry:empty:reduction:initialize_to_identity")
        if t.write is not None:
            p.features.add("geometry:empty:reduction:with_write")
        if t.reads:
            p.features.add("geometry:empty:reduction:with_reads")
        if t.offset is not None:
            p.features.add("geometry:empty:reduction:offset")


def _draw_empty_target(g: _Gen, p: Program) -> None:
    """Empty index spaces of kernels whose point write into a reduction target would define it
    (``write:target_by_point_mapper``; drawn after the whole program, so that every seed keeps
    the program it gave before): one extent becomes 0, so that no chunk runs and the point is
    never written (``geometry:empty:target_write``).  The target keeps what it held before
    (``run_model``): its host-initialized value (``:keeps_init``), a reduction's result
    (``:keeps_reduction``) or an earlier point write's value (``:keeps_point_write``); a target
    nothing defined before stays undefined (``:undefined``), and the draw is dropped where a
    later task would then read it before something defines it (``target_problem``).  What
    the target's next user sees is tagged too: a reduction folding in the current value
    (``:then_reduced_no_init``), one with ``initialize_to_identity`` (``:then_reduced_init``),
    a read or a fence (``:then_read``), nothing (the value fenced at the end: ``:then_end``)."""
    rng = g.rng
    for idx, t in enumerate(p.tasks):
        w = t.write
        if t.kind != "kernel" or w is None or w.space != "target" or 0 in t.range_shape or rng.random() >= 0.3:
            continue
        old = (t.range_shape, t.local_range)
        d = rng.randrange(len(t.range_shape))
        t.range_shape = tuple(0 if i == d else e for i, e in enumerate(t.range_shape))
        t.local_range = None
        if target_problem(p) is not None or lifecycle(p)[0] is not None:
            t.range_shape, t.local_range = old
            continue
        k = w.buffer
        before = p.targets[k].init is not None and "init"
        for u in p.tasks[:idx]:
            if any(s.target == k for s in u.reds):
                before = "reduction"
            if u.write is not None and u.write.space == "target" and u.write.buffer == k and \
                    not task_box(u).empty:
                before = "point_write"
        then = "end"
        for u in p.tasks[idx + 1:]:
            specs = [s for s in u.reds if s.target == k]
            if any(rd.space == "target" and rd.buffer == k for rd in u.reads) or \
                    (u.kind == "fence" and u.fence_space == "target" and u.fence_index == k):
                then = "read"
            elif specs:
                then = "reduced_init" if all(s.init for s in specs) else "reduced_no_init"
            elif u.write is not None and u.write.space == "target" and u.write.buffer == k and \
                    not task_box(u).empty:
                then = "overwritten"
            else:
                continue
            break
        p.features |= {"geometry:empty:target_write", f"geometry:empty:target_write:then_{then}",
                       "geometry:empty:target_write:" + (f"keeps_{before}" if before else "undefined")}
        if t.offset is not None:
            p.features.add("geometry:empty:target_write:offset")


def _draw_many(g: _Gen, p: Program) -> None:
    """Rarely (``MANY_SHARE``; drawn after the whole program, so that every seed keeps its program)
    a front of 260-300 kernels over one row each of a new buffer of as many rows (``offset=(i, 0)``,
    the rows in a random order), reading the row of a second new buffer one_to_one (``long:many``),
    maybe then a kernel reading every row (``long:many:join``): more distinct index spaces than
    the command graph's per-split caches hold (``SPLIT_CACHE_ENTRIES``), so that every rank's
    caches must be cleared while the front is lowered (``split_caches_overflow``) and the results
    must still be exact."""
    rng = g.rng
    if rng.random() >= MANY_SHARE:
        return
    rows = rng.randint(SPLIT_CACHE_ENTRIES + 4, 300)
    shape = (rows, rng.randint(1, 2))
    dtype = rng.choice(("int64", "int32"))
    a, b = _add_buffers(p, rng, shape, dtype)
    order = list(range(rows))
    rng.shuffle(order)
    part = [Task("kernel", (1, shape[1]), [Read("data", a, "one_to_one")], Write("data", b, "one_to_one",
                                                                                 rng.choice(MODES)),
                 c0=i % 7, offset=(i, 0), name="many", index=rng.choice(INDEX_DRAW)) for i in order]
    p.features.add("long:many")
    if rng.random() < 0.5:
        part.append(Task("kernel", shape, [Read("data", b, "all")], Write("data", a, "one_to_one", "read_write"),
                         c0=2, name="many_join"))
        p.features.add("long:many:join")
    at = rng.randint(0, len(p.tasks))
    p.tasks[at:at] = part


def split_caches_overflow(p: Program) -> bool:
    """Whether the command graph of every rank must clear its per-split caches: its kernels and
    host tasks have more distinct index spaces than ``SPLIT_CACHE_ENTRIES`` (each a split of its
    own, memoised until the cache is full, then the cache forgets everything)."""
    spaces = {(t.kind, task_box(t)) for t in p.tasks if t.kind in ("kernel", "host") and t.range_shape
              and not task_box(t).empty}
    return len(spaces) > SPLIT_CACHE_ENTRIES


def target_problem(p: Program) -> str | None:
    """The first use of a reduction target before anything defined it, or None: a target is
    defined by its host data, a reduction or a point write that runs (a kernel over an empty
    range writes nothing); it is read (``all``), fenced, or reduced into without
    ``initialize_to_identity`` only once defined."""
    defined = [t.init is not None for t in p.targets]
    for idx, t in enumerate(p.tasks):
        for rd in t.reads:
            if rd.space == "target" and not defined[rd.buffer]:
                return f"T{idx} reads r{rd.buffer}, which nothing defined yet"
        if t.kind == "fence" and t.fence_space == "target" and not defined[t.fence_index]:
            return f"T{idx} fences r{t.fence_index}, which nothing defined yet"
        for spec in t.reds:
            if not spec.init and not defined[spec.target]:
                return f"T{idx} folds r{spec.target}'s current value, which nothing defined yet"
        for spec in t.reds:
            defined[spec.target] = True
        if t.write is not None and t.write.space == "target" and t.range_shape and not task_box(t).empty:
            defined[t.write.buffer] = True
    return None


def _draw_ooc(g: _Gen, p: Program) -> None:
    """Sometimes (drawn after the whole program, so that every seed keeps its program) a pair
    of kernels over two larger buffers (16-48 rows of 4-8 columns, beside the at most 9-row
    ones): a read_write of the first through one_to_one, then a 3x3 neighborhood read of it
    into the second.  Their rows are small and their chunks large, so that under
    ``device_memory_batched`` their chunks are cut into batches (``batching:pair``)."""
    rng = g.rng
    if rng.random() >= 0.3:
        return
    shape = (rng.randint(16, 48), rng.randint(4, 8))
    dtype = rng.choice(("int64", "int32"))
    a, b = _add_buffers(p, rng, shape, dtype)
    first = Task("kernel", shape, [Read("data", a, "one_to_one")], Write("data", a, "one_to_one", "read_write"),
                 c0=rng.randint(0, 9), name="ooc_rw")
    second = Task("kernel", shape, [Read("data", a, "neighborhood", extent=(1, 1))],
                  Write("data", b, "one_to_one", rng.choice(MODES)), c0=rng.randint(0, 9), name="ooc_stencil")
    for t in (first, second):
        t.index = rng.choice(INDEX_DRAW)
        if rng.random() < 0.3:
            t.oversub = rng.choice((2, 3))
    at = rng.randint(0, len(p.tasks))
    p.tasks[at:at] = [first, second]
    p.features.add("batching:pair")


def split_granularity(t: Task) -> tuple:
    """Where a task's chunks (partitions) may be cut, per dimension, counted from its index
    space's minimum: the lcm of its local range and its ``constrain_split`` granularity (an
    int applies to dimension 0 only; missing dimensions are 1), as the API documents."""
    n = len(t.range_shape)
    g = [1] * n
    if t.gran is not None:
        given = (t.gran,) if isinstance(t.gran, int) else tuple(t.gran)
        for d, x in enumerate(given[:n]):
            g[d] = x
    if t.local_range is not None:
        g = [math.lcm(a, b) for a, b in zip(g, t.local_range)]
    return tuple(g)


def even_split_rows(total: int, gran: int, part: tuple[int, int], whole: int) -> tuple[int, int]:
    """Rows ``[start, end)`` of a buffer's dimension 0 that ``cl.even_split(gran)`` grants the
    chunk ``part`` (rows of the index space's dimension 0, relative to its offset) of a kernel
    over ``whole`` rows, as Celerity splits: each row of the index space gets the same whole
    granules, the granules left over go one each to the first rows, and the rows that fill no
    granule to the last one."""
    gran = gran or 1
    if whole <= 0:
        return 0, 0
    each = total // (whole * gran) * gran
    rest = total - whole * each
    sizes = [each + gran if i < rest // gran else each for i in range(whole)]
    sizes[-1] += rest % gran
    start = sum(sizes[:part[0]])
    return start, start + sum(sizes[part[0]:part[1]])


def _draw_splits(g: _Gen, p: Program) -> None:
    """Split controls (drawn after the whole program, so that every seed keeps its program):
    per-kernel ``cl.oversubscribe(k)`` (k 1, 2, 3, 5), an explicit ``cl.split_1d()``,
    ``cl.constrain_split`` (an int or one per dimension) on kernels and host tasks, split
    hints on host tasks, and reads through ``cl.even_split(granularity)``, which add nothing to
    the values (their rows depend on the split) but whose granted rows and data are checked
    per chunk (``even_split_rows``, the model's buffer before the task)."""
    rng = g.rng
    for idx, t in enumerate(p.tasks):
        if t.kind not in ("kernel", "host") or not t.range_shape:
            continue
        n = len(t.range_shape)
        if t.kind == "kernel" and rng.random() < 0.25:
            t.oversub = rng.choice((1, 2, 3, 5))
            p.features.add(f"split:oversubscribe:{t.oversub}")
        if t.kind == "host" and rng.random() < 0.3:
            if n >= 2 and rng.random() < 0.5:
                t.split2d = True
                p.features.add("split:host:split_2d")
            else:
                t.split1d = True
                p.features.add("split:host:split_1d")
        elif t.kind == "kernel" and not t.split2d and rng.random() < 0.2:
            t.split1d = True
            p.features.add("split:split_1d")
        if rng.random() < 0.25:
            if rng.random() < 0.5:
                t.gran = rng.randint(1, 4)
                p.features.add("split:constrain:int")
            else:
                t.gran = tuple(rng.randint(1, 3) for _ in range(rng.randint(1, n)))
                p.features.add("split:constrain:dims")
            p.features.add(f"split:constrain:{t.kind}")
            if t.local_range is not None:
                p.features.add("split:constrain:local_range")
        if t.kind == "kernel" and rng.random() < 0.15:
            avoid = t.write.buffer if t.write is not None and t.write.space == "data" else None
            cands = [b for b in range(len(p.shapes)) if b != avoid]
            if cands:
                rd = Read("data", rng.choice(cands), "even_split", k=rng.choice((0, 0, 1, 2, 3)))
                t.reads.append(rd)
                if lifecycle(p)[0] is not None:     # (the buffer is not there, or not written yet)
                    t.reads.pop()
                else:
                    p.features.add("split:even_split" + (":granularity" if rd.k else ""))


def task_box(t: Task) -> Box:
    """A kernel's or host task's whole index space: ``Box(offset, offset + range)``."""
    if t.offset is None:
        return Box.full(t.range_shape)
    return Box(tuple(t.offset), tuple(o + r for o, r in zip(t.offset, t.range_shape)), len(t.range_shape))


def _sub_extent(rng: random.Random, n: int, lr: int) -> tuple[int, int]:
    """(offset, extent) of a non-empty part of ``[0, n)``, the extent a multiple of ``lr``."""
    k = rng.randint(1, n // lr)
    e = k * lr
    return rng.randint(0, n - e), e


def _draw_geometry(g: _Gen, p: Program) -> None:
    """Kernels over other index spaces than a buffer's shape (drawn after the whole program, so
    that every seed keeps the program it gave before): a global ``offset=`` and a sub-range of
    the written buffer (``geometry:offset``), a range of the kernel's own for kernels that write
    no data buffer through a full-range mapper (``geometry:free_range``), all-ones ranges
    (``geometry:size1``) and empty ones (``geometry:empty``: no chunk runs, nothing is written;
    not for a target's point write, which defines the target; reductions' empty ranges are
    ``_draw_empty``'s, drawn later so that older seeds keep their programs).  Dropped again where
    the program would stop being valid (the first write of a buffer made without data)."""
    rng = g.rng
    for t in p.tasks:
        if t.kind != "kernel" or rng.random() >= 0.35:
            continue
        old = (t.range_shape, t.offset, t.local_range, t.write.point if t.write is not None else None)
        w = t.write
        n = len(t.range_shape)
        lr = t.local_range or (1,) * n
        what = []
        if w is not None and w.space == "data" and w.mapper in FULL_WRITE_MAPPERS:
            # a sub-range of the written buffer's index space, shifted by the offset
            shape = p.shapes[w.buffer]
            if any(l > s for l, s in zip(lr, shape)):
                t.local_range, lr = None, (1,) * n
            parts = [_sub_extent(rng, s, l) for s, l in zip(shape, lr)]
            if rng.random() < 0.15:
                parts = [(rng.randrange(s), 1) for s in shape]
                t.local_range = None
                what.append("geometry:size1")
            t.offset = tuple(o for o, _ in parts)
            t.range_shape = tuple(e for _, e in parts)
            what.append("geometry:offset")
        else:
            # (reductions only, or a point write): any range and offset of the same dimensionality
            t.local_range = None
            ext = [rng.randint(1, 9 if n < 3 else 5) for _ in range(n)]
            if rng.random() < 0.15:
                ext = [1] * n
                what.append("geometry:size1")
            t.range_shape = tuple(ext)
            t.offset = tuple(rng.randint(0, 6) for _ in range(n)) if rng.random() < 0.7 else None
            if w is not None:
                # the point writes from a chunk inside the new index space
                w.point = tuple(rng.randrange(lo, hi) for lo, hi in zip(task_box(t).min, task_box(t).max))
            what.append("geometry:free_range" + (":offset" if t.offset is not None else ""))
        if not t.reds and not (w is not None and w.space == "target") and rng.random() < 0.12:
            # an empty range (one extent 0): the kernel never runs, nothing is written
            d = rng.randrange(n)
            t.range_shape = tuple(0 if i == d else e for i, e in enumerate(t.range_shape))
            t.local_range = None
            what = ["geometry:empty"] + [f for f in what if f.startswith("geometry:offset")]
        if t.offset is not None and all(o == 0 for o in t.offset):
            what.append("geometry:offset_zero")
        if lifecycle(p)[0] is not None:
            t.range_shape, t.offset, t.local_range = old[:3]
            if w is not None:
                w.point = old[3]
            continue
        p.features.update(what)
        if t.local_range is not None and t.offset is not None:
            p.features.add("geometry:offset:local_range")


def _draw_index_styles(g: _Gen, p: Program) -> None:
    """Each kernel's and host task's accessor indexing (drawn after the whole program, so that
    every seed keeps the program it gave before)."""
    for t in p.tasks:
        if t.kind in ("kernel", "host"):
            t.index = g.rng.choice(INDEX_DRAW)
            p.features.add(f"index:{t.index}")


def _gen_buffers(g: _Gen, lo: int, hi: int):
    rng = g.rng
    shapes = _shapes(g, rng.randint(lo, hi))
    dtypes = []
    for _ in shapes:
        dt = rng.choice(DATA_DTYPES) if g.on("dtypes") and rng.random() < 0.5 else "int64"
        if dt != "int64":
            g.feat(f"dtype:{dt}")
        dtypes.append(dt)
    init = [_init_data(rng, s, d) for s, d in zip(shapes, dtypes)]
    return shapes, dtypes, init


def _gen_targets(g: _Gen) -> list[TargetSpec]:
    rng = g.rng
    targets = []
    for _ in range(rng.randint(1, 3)):
        if g.on("reductions"):
            dt = rng.choice(TARGET_DTYPES)
            shape = () if rng.random() < 0.25 else (1,)
            init = None
            if rng.random() < 0.5:
                init = bool(rng.random() < 0.7) if dt == "bool" else rng.randint(0, 50)
        else:
            dt, shape, init = "int64", (1,), None
        targets.append(TargetSpec(dt, shape, init))
    return targets


class _State:
    """What the generator knows about buffers while it emits tasks."""

    def __init__(self, shapes, dtypes, targets):
        self.shapes = shapes
        self.dtypes = dtypes
        self.targets = targets
        self.defined = [t.init is not None for t in targets]
        self.written_remote = [False] * len(targets)     # current value written by a point-mapper chunk
        self.live = [True] * len(shapes)         # data buffers made and not destroyed
        self.ddef = [True] * len(shapes)         # data buffers holding defined values (host data or a full write)
        self.ngroups = 0                         # collective groups besides the default one
        self.hlive: list[bool] = []              # extra host objects made and not destroyed

    def usable(self) -> list[int]:
        """Data buffers a task may read, write or fence."""
        return [b for b in range(len(self.shapes)) if self.live[b] and self.ddef[b]]


def _pick_buf(g: _Gen, st: _State) -> int:
    """A usable data buffer (while all are, the same draw as before lifetimes existed)."""
    ok = st.usable()
    if len(ok) == len(st.shapes):
        return g.rng.randrange(len(st.shapes))
    return g.rng.choice(ok)


def _pick_reads(g: _Gen, st: _State, range_shape, *, avoid_data: set, own: int | None,
                avoid_targets: set, max_reads: int = 3) -> list[Read]:
    """Reads for a task over ``range_shape``; ``own`` may be read element-wise only, ``avoid_data`` not at all."""
    rng = g.rng
    dims = len(range_shape)
    reads = []
    for _ in range(rng.randint(0, max_reads)):
        readable_targets = [k for k, d in enumerate(st.defined) if d and k not in avoid_targets]
        if readable_targets and g.on("reductions") and rng.random() < 0.2:
            k = rng.choice(readable_targets)
            reads.append(Read("target", k, "all"))
            g.feat("read:target_in_task")
            continue
        b = _pick_buf(g, st)
        if b in avoid_data:
            continue
        if b == own:
            reads.append(Read("data", b, "one_to_one"))
            g.feat("read:own_one_to_one")
            continue
        shape = st.shapes[b]
        same = len(shape) == dims
        options = ["all", "fixed"]
        if same:
            options += ["one_to_one", "slice", "neighborhood", "transposed"]
            if g.on("custom_mappers"):
                options += ["mirror", "shift"]
        m = rng.choice(options)
        rd = Read("data", b, m)
        if m == "fixed":
            lo = tuple(rng.randrange(s) for s in shape)
            hi = tuple(rng.randint(lv + 1, s) for lv, s in zip(lo, shape))
            rd.fixed_box = (lo, hi)
        elif m == "slice":
            rd.dim = rng.randrange(dims)
        elif m == "neighborhood":
            if g.on("stencils"):
                rd.extent = tuple(rng.randint(0, 2 if dims < 3 else 1) for _ in range(dims))
                rd.shape = rng.choice(["bounding_box", "along_axes"])
                g.feat(f"read:neighborhood:{rd.shape}")
                if max(rd.extent) > 1:
                    g.feat("read:neighborhood:extent2")
            else:
                rd.extent = (1,) * dims
        elif m in ("mirror", "shift"):
            rd.dim = rng.randrange(dims)
            rd.shift = rng.randrange(shape[rd.dim]) if m == "shift" else 0
            rd.opaque = rng.random() < 0.3
            g.feat(f"read:custom_{m}")
            g.feat("mapper:opaque" if rd.opaque else "mapper:keyed")
        g.feat(f"read:{m}")
        reads.append(rd)
    return reads


def _pick_local_range(g: _Gen, range_shape) -> tuple | None:
    rng = g.rng
    if not g.on("local_range") or rng.random() > 0.15:
        return None
    # (whole work groups only: as in SYCL, a global range that is not a multiple of the
    # local range is an error at submit, which tests/test_celerity_cases.py checks)
    lr = tuple(rng.choice([d for d in range(1, n + 1) if n % d == 0]) for n in range_shape)
    g.feat("local_range")
    if any(l > 1 for l in lr):
        g.feat("local_range:groups")
    return lr


def _pick_reduction(g: _Gen, st: _State, k: int, *, allow_bad: bool = False) -> RedSpec:
    rng = g.rng
    td = st.targets[k].dtype
    tdt = np.dtype(td)
    if not g.on("reductions"):
        return RedSpec(k, "plus", td, True)
    if tdt.kind == "b":
        op = rng.choice(BOOL_OPS)
        vd = "bool"
    else:
        ops = INT_OPS if tdt.kind in "iu" else FLOAT_OPS
        op = rng.choice(ops)
        vd = td
        if g.on("cross_dtype") and rng.random() < 0.5:
            if tdt.kind in "iu":
                cands = ["int32", "int64"] + (["bool"] if op in ("plus", "maximum", "minimum") else [])
            else:
                cands = ["float32", "float64", "int32", "int64"] + (["bool"] if op != "multiplies" else [])
            vd = rng.choice(cands)
    init = True if not st.defined[k] else rng.random() < 0.4
    spec = RedSpec(k, op, vd, init, combine=rng.choice(["whole", "whole", "halves", "elements"]),
                   identity=rng.random() < 0.2)
    if np.dtype(vd).kind in "iu" and tdt.kind in "iu" and g.on("int_wrap") and rng.random() < 0.5:
        spec.wide = True
        g.feat("red:int_wraps")
    g.feat(f"red:{op}", f"red:target:{td}")
    if vd != td:
        g.feat("red:cross_dtype", f"red:cross:{vd}->{td}")
    if not init:
        g.feat("red:no_init")
        if st.written_remote[k]:
            g.feat("red:no_init_remote_value")
    if spec.combine != "whole":
        g.feat(f"red:combine_{spec.combine}")
    if spec.identity:
        g.feat("red:explicit_identity")
    if st.targets[k].shape == ():
        g.feat("red:target_0d")
    return spec


def _gen_main(g: _Gen) -> Program:
    rng = g.rng
    shapes, dtypes, init = _gen_buffers(g, 2, 4)
    if g.on("stencils") and rng.random() < 0.3:
        # a second buffer shaped like the first: stencil steps can ping-pong between them
        shapes[1] = shapes[0] if len(shapes[0]) >= 2 else (rng.randint(2, 9), rng.randint(2, 9))
        shapes[0] = shapes[1]
        init[0] = _init_data(rng, shapes[0], dtypes[0])
        init[1] = _init_data(rng, shapes[1], dtypes[1])
    targets = _gen_targets(g)
    st = _State(shapes, dtypes, targets)
    plan = _plan_extras(g, st, init)
    tasks: list[Task] = []
    n = rng.randint(3, 12)
    while len(tasks) < n:
        r = rng.random()
        if r < 0.08 and g.on("loops"):
            block: list[Task] = []
            for _ in range(rng.randint(1, 3)):
                _gen_step(g, st, block)
            for j, t in enumerate(block):
                t.name = f"loop{len(tasks)}_{j}"
            reps = rng.randint(2, 4) * g.repeat
            for _ in range(reps):
                tasks += copy.deepcopy(block)
            g.feat("loop")
        elif r < 0.14 and g.on("stencils") and shapes[0] == shapes[1] and len(shapes[0]) >= 2 \
                and {0, 1} <= set(st.usable()):
            tasks += _gen_stencil_loop(g, st)
        elif r < 0.30 and plan.any:
            _gen_extra(g, st, tasks, plan)
        else:
            _gen_step(g, st, tasks)
    _finish_extras(g, st, tasks, plan)
    p = Program("main", shapes, dtypes, init, targets, tasks, ngroups=plan.ngroups, hobjs=len(st.hlive))
    problem, _observed = lifecycle(p)
    assert problem is None, f"generator bug: {problem}\n{p.describe()}"
    defined_at_end = [t.init is not None or any(s.target == k for x in tasks for s in x.reds)
                      for k, t in enumerate(targets)]
    if any(d and not f for d, f in zip(defined_at_end, fenced_at_end(p))):
        g.feat("red:consumed_by_master_only")
    return p


def _gen_step(g: _Gen, st: _State, tasks: list[Task]) -> None:
    """Append one random task."""
    rng = g.rng
    shapes = st.shapes
    if g.extras:
        x = rng.random()
        if x < 0.07 and g.on("collectives"):
            tasks.append(_gen_collective(g, st))
            return
        if x < 0.11 and g.on("lookahead_steps"):
            tasks.append(_gen_lookahead(g))
            return
        if x < 0.13 and st.hlive and any(st.hlive):
            k = rng.choice([k for k, a in enumerate(st.hlive) if a])
            tasks.append(Task("hfence", fence_index=k))
            g.feat("hobj:fence")
            return
    r = rng.random()
    if r < 0.10:
        if rng.random() < 0.3 and any(st.defined):
            k = rng.choice([k for k, d in enumerate(st.defined) if d])
            tasks.append(Task("fence", fence_space="target", fence_index=k))
            g.feat("fence:target")
            return
        b = _pick_buf(g, st)
        t = Task("fence", fence_index=b)
        if g.on("epochs") and rng.random() < 0.3:
            lo = tuple(rng.randrange(s) for s in shapes[b])
            t.fence_box = (lo, tuple(rng.randint(1, s - lv) for lv, s in zip(lo, shapes[b])))
            g.feat("fence:subrange")
        tasks.append(t)
        g.feat("fence")
    elif r < 0.18:
        defined = [k for k, d in enumerate(st.defined) if d]
        if defined and rng.random() < 0.5:
            k = rng.choice(defined)
            tasks.append(Task("master", reads=[Read("target", k, "all")]))
            g.feat("master:target")
        else:
            tasks.append(Task("master", reads=[Read("data", _pick_buf(g, st), "all")]))
            g.feat("master:data")
        if g.extras:
            _master_extras(g, st, tasks[-1])
    elif r < 0.25 and g.on("epochs"):
        t = Task("wait", barrier=rng.random() < 0.3)
        tasks.append(t)
        g.feat("wait:barrier" if t.barrier else "wait")
    elif r < 0.29 and g.on("host_object_fence"):
        tasks.append(Task("fence_log"))
        g.feat("fence:host_object")
    elif r < 0.39 and g.on("host_range"):
        tasks.append(_gen_host_range(g, st))
    elif r < 0.45 and g.on("remote_target") and g.on("reductions"):
        tasks.append(_gen_target_write(g, st))
        if rng.random() < 0.6:
            # the next reduction folds in the value the point-mapper chunk left (maybe elsewhere)
            tasks.append(_gen_reduce(g, st, first=tasks[-1].write.buffer))
    elif r < 0.58:
        tasks.append(_gen_reduce(g, st))
    else:
        tasks.append(_gen_kernel(g, st))
    t = tasks[-1]
    if g.on("timing") and t.kind in ("kernel", "host", "master") and rng.random() < 0.25:
        # a slow chunk: later work, fences and epochs must still wait for it
        t.delay = rng.choice([0.002, 0.01, 0.03])
        g.feat("timing:slow_chunk")


@dataclass
class _Plan:
    """What a ``main`` program's extra steps (``_gen_extra``) may do."""
    late: list[int]                 # data buffers still to be made (by a ``create`` task)
    hlate: list[int]                # extra host objects still to be made (``hcreate``)
    ngroups: int                    # collective groups besides the default one
    collectives: bool
    lifetimes: bool
    lookahead: bool

    @property
    def any(self) -> bool:
        return self.collectives or self.lifetimes or self.lookahead


def _plan_extras(g: _Gen, st: _State, init: list) -> _Plan:
    """Draw a ``main`` program's lifetimes (data buffers made without data, or made by a task
    later: ``late``; extra host objects, maybe one made later) and its collective groups."""
    rng = g.rng
    g.extras = True
    shapes, dtypes = st.shapes, st.dtypes
    late: list[int] = []
    hlate: list[int] = []
    if g.on("lifetimes"):
        if len(shapes) >= 3 and rng.random() < 0.25:
            b = rng.randrange(2, len(shapes))       # (b0 and b1, a stencil pair, keep their data)
            init[b] = None
            st.ddef[b] = False
            g.feat("lifetime:uninit")
        if rng.random() < 0.4:
            for _ in range(rng.randint(1, 2)):
                b = len(shapes)
                shape = _shapes(g, 1)[0]
                dt = rng.choice(DATA_DTYPES) if g.on("dtypes") and rng.random() < 0.5 else "int64"
                shapes.append(shape)
                dtypes.append(dt)
                init.append(None if rng.random() < 0.5 else _init_data(rng, shape, dt))
                st.live.append(False)
                st.ddef.append(init[b] is not None)
                late.append(b)
    if (g.on("collectives") or g.on("lifetimes")) and rng.random() < 0.6:
        st.hlive = [True] * rng.randint(1, 2)
        if g.on("lifetimes") and rng.random() < 0.3:
            hlate.append(len(st.hlive) - 1)
            st.hlive[-1] = False
        if len(st.hlive) > 1 or hlate:
            g.feat("hobj:second")
    if g.on("collectives") and rng.random() < 0.6:
        st.ngroups = rng.randint(2, 3)
    return _Plan(late, hlate, st.ngroups, g.on("collectives"), g.on("lifetimes"), g.on("lookahead_steps"))


def _gen_extra(g: _Gen, st: _State, tasks: list[Task], plan: _Plan) -> None:
    """One of the steps of the ``collectives``, ``lifetimes`` and ``lookahead_steps`` groups."""
    rng = g.rng
    options: list[tuple[str, float]] = []
    if any(st.live[b] and not st.ddef[b] for b in range(len(st.shapes))):
        options.append(("init", 3))
    if plan.late:
        options.append(("create", 2))
    if plan.lifetimes and len(st.usable()) >= 3:
        options.append(("destroy", 1))
    if plan.hlate:
        options.append(("hcreate", 1))
    if plan.lifetimes and any(st.hlive):
        options.append(("hdestroy", 0.5))
    if plan.collectives:
        options += [("collective_loop", 2), ("collective", 1)]
    if plan.lookahead:
        options.append(("lookahead", 1))
    if not options:
        _gen_step(g, st, tasks)
        return
    what = rng.choices([o for o, _w in options], [w for _o, w in options])[0]
    if what == "init":
        b = rng.choice([b for b in range(len(st.shapes)) if st.live[b] and not st.ddef[b]])
        tasks.append(_gen_init_write(g, st, b))
    elif what == "create":
        _gen_create(g, st, tasks, plan)
    elif what == "destroy":
        b = rng.choice(st.usable())
        if rng.random() < 0.4:
            # a writer that may still run (or sleep) when the buffer goes
            shape = st.shapes[b]
            t = Task("kernel", shape, _pick_reads(g, st, shape, avoid_data=set(), own=b, avoid_targets=set(),
                                                  max_reads=2),
                     Write("data", b, "one_to_one", rng.choice(MODES)), c0=rng.randint(0, 9))
            if g.on("timing") and rng.random() < 0.4:
                t.delay = 0.01
                g.feat("timing:slow_chunk")
            tasks.append(t)
            g.feat("lifetime:destroy_after_write")
        if rng.random() < 0.6:
            tasks.append(Task("fence", fence_index=b))
            g.feat("fence", "lifetime:fence_then_destroy")
        tasks.append(Task("destroy", fence_index=b))
        st.live[b] = False
        g.feat("lifetime:destroy")
    elif what == "hcreate":
        k = plan.hlate.pop(0)
        tasks.append(Task("hcreate", fence_index=k))
        st.hlive[k] = True
        g.feat("hobj:create")
    elif what == "hdestroy":
        k = rng.choice([k for k, a in enumerate(st.hlive) if a])
        if rng.random() < 0.5:
            tasks.append(Task("hfence", fence_index=k))
            g.feat("hobj:fence")
        tasks.append(Task("hdestroy", fence_index=k))
        st.hlive[k] = False
        g.feat("hobj:destroy")
    elif what == "collective_loop":
        _gen_collective_loop(g, st, tasks)
    elif what == "collective":
        tasks.append(_gen_collective(g, st))
    else:
        tasks.append(_gen_lookahead(g))


def _finish_extras(g: _Gen, st: _State, tasks: list[Task], plan: _Plan) -> None:
    """Every late buffer made and every buffer made without data written before the end."""
    while plan.late:
        _gen_create(g, st, tasks, plan)
    for b in range(len(st.shapes)):
        if st.live[b] and not st.ddef[b]:
            tasks.append(_gen_init_write(g, st, b))


def _gen_create(g: _Gen, st: _State, tasks: list[Task], plan: _Plan) -> None:
    rng = g.rng
    b = plan.late.pop(0)
    if any(t.kind in ("kernel", "host", "master", "collective") for t in tasks):
        g.feat("lifetime:create_after_tasks")
        if rng.random() < 0.4:
            tasks.append(Task("wait"))
            g.feat("wait", "lifetime:create_after_wait")
    tasks.append(Task("create", fence_index=b))
    st.live[b] = True
    g.feat("lifetime:create")
    if not st.ddef[b]:
        g.feat("lifetime:create_uninit")
        if rng.random() < 0.5:
            tasks.append(_gen_init_write(g, st, b))


def _gen_init_write(g: _Gen, st: _State, b: int) -> Task:
    """The first write of a buffer made without data: a kernel or host task over its whole
    shape, one_to_one in a discard mode (so nothing reads its unspecified contents)."""
    rng = g.rng
    shape = st.shapes[b]
    host = g.on("host_range") and rng.random() < 0.3
    mode = rng.choice(["discard_write", "discard_read_write"])
    t = Task("host" if host else "kernel", shape, write=Write("data", b, "one_to_one", mode), c0=rng.randint(0, 9))
    t.reads = _pick_reads(g, st, shape, avoid_data={b}, own=None, avoid_targets=set(), max_reads=2)
    if not host:
        _kernel_options(g, t)
    st.ddef[b] = True
    g.feat("lifetime:first_write_" + ("host" if host else "kernel"), f"mode:{mode}")
    return t


def _gen_collective(g: _Gen, st: _State) -> Task:
    """A collective host task: every rank's part sums what it reads (``all`` / ``fixed``
    reads, split-independent) and records that plus its rank (``collective_record``)."""
    rng = g.rng
    t = Task("collective", c0=rng.randint(0, 9), group=rng.randint(0, st.ngroups))
    if t.group == 0:
        t.form = rng.choice(["attr", "call"])
        g.feat(f"collective:default:{t.form}")
    else:
        g.feat("collective:group")
    t.reads = _pick_reads(g, st, (), avoid_data=set(), own=None, avoid_targets=set(), max_reads=2)
    t.comm = rng.random() < 0.5
    live = [k for k, a in enumerate(st.hlive) if a]
    if live and rng.random() < 0.5:
        t.hobj = rng.choice(live)
        g.feat("collective:hobj", "hobj:side_effect")
    if g.on("timing") and rng.random() < 0.2:
        t.delay = rng.choice([0.002, 0.01])     # (rank 0's part only: the ranks' parts start apart)
        g.feat("timing:slow_chunk", "collective:slow")
    g.feat("collective")
    if t.comm:
        g.feat("collective:comm", f"collective:comm:{comm_op(t)}")
    if t.reads:
        g.feat("collective:reads")
    return t


def _gen_collective_loop(g: _Gen, st: _State, tasks: list[Task]) -> None:
    """A loop body of collective tasks (of several groups) and ordinary steps, repeated."""
    rng = g.rng
    block: list[Task] = []
    for _ in range(rng.randint(2, 4)):
        if rng.random() < 0.7:
            block.append(_gen_collective(g, st))
        else:
            _gen_step(g, st, block)
    if not any(t.kind == "collective" for t in block):
        block.append(_gen_collective(g, st))
    for j, t in enumerate(block):
        t.name = f"loop{len(tasks)}_{j}"
    for _ in range(rng.randint(2, 4) * g.repeat):
        tasks += copy.deepcopy(block)
    g.feat("loop", "collective:loop")
    if len({t.group for t in block if t.kind == "collective"}) >= 2:
        g.feat("collective:loop:groups")


def _gen_lookahead(g: _Gen) -> Task:
    rng = g.rng
    if rng.random() < 0.7:
        t = Task("lookahead", mode=rng.choice(LOOKAHEAD_MODES))
        g.feat(f"lookahead:set:{t.mode}")
        return t
    g.feat("lookahead:flush")
    return Task("flush")


def _master_extras(g: _Gen, st: _State, t: Task) -> None:
    """A master-node task's placement (``on_master_node``, ``cl.once`` or none) and maybe a
    side effect on an extra host object."""
    rng = g.rng
    t.form = rng.choice(["", "", "once", "default"])
    if t.form:
        g.feat(f"master:{t.form}")
    live = [k for k, a in enumerate(st.hlive) if a]
    if live and rng.random() < 0.4:
        t.hobj = rng.choice(live)
        g.feat("master:hobj", "hobj:side_effect")


def _gen_stencil_loop(g: _Gen, st: _State, pair: tuple[int, int] = (0, 1), steps: int | None = None,
                      wait_scale: int = 1) -> list[Task]:
    """Ping-pong neighborhood steps between ``pair`` (b0 and b1: same shape), split_2d, maybe
    waits inside (every 1 or 2 steps, times ``wait_scale``); ``steps``: that many (else 2-6)."""
    rng = g.rng
    shape = st.shapes[pair[0]]
    dims = len(shape)
    nbh = rng.choice(["bounding_box", "along_axes"])
    extent = tuple(rng.randint(1, 2 if dims < 3 else 1) for _ in range(dims))
    split2d = rng.random() < 0.8
    wait_every = rng.choice([0, 0, 1, 2])
    out = []
    for step in range(steps if steps is not None else rng.randint(2, 6) * g.repeat):
        src, dst = pair if step % 2 == 0 else pair[::-1]
        t = Task("kernel", shape, [Read("data", src, "neighborhood", extent=extent, shape=nbh)],
                 Write("data", dst, "one_to_one", rng.choice(["discard_write", "discard_write", "read_write"])),
                 c0=step % 3, split2d=split2d, name="stencil")
        out.append(t)
        if wait_every and step % (wait_every * wait_scale) == wait_every * wait_scale - 1:
            out.append(Task("wait"))
            g.feat("wait", "stencil_loop:wait")
    g.feat("stencil_loop", f"read:neighborhood:{nbh}", "read:neighborhood")
    if split2d:
        g.feat("split_2d", "split_2d:stencil")
    return out


def _gen_kernel(g: _Gen, st: _State) -> Task:
    rng = g.rng
    w = _pick_buf(g, st)
    shape = st.shapes[w]
    mapper = "one_to_one"
    if g.on("custom_mappers") and rng.random() < 0.35:
        mapper = rng.choice(["mirror", "shift", "point"])
    mode = rng.choice(MODES)
    wr = Write("data", w, mapper, mode)
    range_shape = shape
    if mapper in ("mirror", "shift"):
        wr.dim = rng.randrange(len(shape))
        wr.shift = rng.randrange(shape[wr.dim]) if mapper == "shift" else 0
    elif mapper == "point":
        range_shape = st.shapes[rng.randrange(len(st.shapes))]
        wr.point = _far_point(rng, range_shape)
        wr.dest = tuple(rng.randrange(s) for s in shape)
    if mapper != "one_to_one":
        wr.opaque = rng.random() < 0.3
        g.feat(f"write:custom_{mapper}")
        g.feat("mapper:opaque" if wr.opaque else "mapper:keyed")
    g.feat(f"mode:{mode}")
    reads = _pick_reads(g, st, range_shape, avoid_data=set() if mapper == "one_to_one" else {w},
                        own=w if mapper == "one_to_one" else None, avoid_targets=set())
    t = Task("kernel", range_shape, reads, wr, c0=rng.randint(0, 9))
    _kernel_options(g, t)
    if g.on("reductions") and rng.random() < 0.2:
        k = rng.randrange(len(st.targets))
        if k not in {rd.buffer for rd in reads if rd.space == "target"}:
            t.reds.append(_pick_reduction(g, st, k))
            st.defined[k] = True
            st.written_remote[k] = False
            g.feat("red:with_write")
    return t


def _far_point(rng: random.Random, shape) -> tuple:
    """Mostly the last index (its chunk is on the last rank/device), else anywhere."""
    if rng.random() < 0.6:
        return tuple(s - 1 for s in shape)
    return tuple(rng.randrange(s) for s in shape)


def _kernel_options(g: _Gen, t: Task) -> None:
    rng = g.rng
    t.local_range = _pick_local_range(g, t.range_shape)
    if g.on("stencils") and len(t.range_shape) >= 2 and rng.random() < 0.4:
        t.split2d = True
        g.feat("split_2d")
        if any(rd.mapper == "neighborhood" for rd in t.reads):
            g.feat("split_2d:stencil")


def _gen_reduce(g: _Gen, st: _State, first: int | None = None) -> Task:
    """A kernel with one or more reductions (``first``: one of them into that target)."""
    rng = g.rng
    range_shape = st.shapes[rng.randrange(len(st.shapes))]
    n = 1
    if g.on("reductions"):
        n = rng.randint(1, len(st.targets))
        if n > 1:
            g.feat("red:multi")
    ks = rng.sample(range(len(st.targets)), n)
    if first is not None and first not in ks:
        ks[0] = first
    reads = _pick_reads(g, st, range_shape, avoid_data=set(), own=None, avoid_targets=set(ks))
    t = Task("kernel", range_shape, reads, None, c0=rng.randint(0, 5))
    for k in ks:
        t.reds.append(_pick_reduction(g, st, k))
        st.defined[k] = True
        st.written_remote[k] = False
    _kernel_options(g, t)
    return t


def _gen_target_write(g: _Gen, st: _State) -> Task:
    """A kernel whose chunk holding one point writes a reduction target (a custom point mapper)."""
    rng = g.rng
    k = rng.randrange(len(st.targets))
    range_shape = st.shapes[rng.randrange(len(st.shapes))]
    tshape = st.targets[k].shape
    wr = Write("target", k, "point", "discard_write", point=_far_point(rng, range_shape), dest=(0,) * len(tshape))
    reads = _pick_reads(g, st, range_shape, avoid_data=set(), own=None, avoid_targets={k})
    t = Task("kernel", range_shape, reads, wr, c0=rng.randint(0, 9))
    _kernel_options(g, t)
    st.defined[k] = True
    st.written_remote[k] = True
    g.feat("write:target_by_point_mapper")
    return t


def _gen_host_range(g: _Gen, st: _State) -> Task:
    rng = g.rng
    w = _pick_buf(g, st)
    write = rng.random() < 0.5
    t = Task("host", st.shapes[w], c0=rng.randint(0, 9))
    if write:
        mode = rng.choice(MODES)
        t.write = Write("data", w, "one_to_one", mode)
        g.feat("host:write", f"mode:{mode}")
    t.reads = _pick_reads(g, st, t.range_shape, avoid_data=set(), own=w if write else None, avoid_targets=set())
    if rng.random() < 0.2:
        t.on_master = True
        g.feat("host:range_on_master")
    else:
        g.feat("host:range")
    if rng.random() < 0.4:
        t.oversub = rng.randint(2, 3)
        g.feat("host:oversubscribe")
    if rng.random() < 0.4:
        # no side effect: partitions may run concurrently (and be oversubscribed); they
        # record outside the runtime
        t.side_effect = False
        g.feat("host:no_side_effect")
    return t


# ---- the error kinds -------------------------------------------------------------------------
def _gen_fail(g: _Gen) -> Program:
    """Independent work, a failing kernel or host task, tasks that depend on it (markers), a sync."""
    rng = g.rng
    shapes, dtypes, init = _gen_buffers(g, 3, 4)
    targets = _gen_targets(g)
    st = _State(shapes, dtypes, targets)
    x, y, z = 0, 1, 2
    tasks: list[Task] = []
    for _ in range(rng.randint(0, 2)):         # independent work before (may or may not have run)
        reads = _pick_reads(g, st, shapes[z], avoid_data=set(), own=z, avoid_targets=set(), max_reads=2)
        tasks.append(Task("kernel", shapes[z], reads, Write("data", z, "one_to_one", rng.choice(MODES)),
                          c0=rng.randint(0, 9)))
    host = rng.random() < 0.3
    f = Task("host" if host else "kernel", shapes[x], [], Write("data", x, "one_to_one", "discard_write"),
             c0=rng.randint(0, 9), fail_at=tuple(rng.randrange(s) for s in shapes[x]))
    g.feat("fail:host_task" if host else "fail:kernel")
    tasks.append(f)
    deps = []
    for _ in range(rng.randint(1, 4)):
        c = rng.choice(["kernel_all", "chain", "master", "host_all", "reduce_all"] +
                       (["side_effect"] if host else []))
        if c == "kernel_all":
            deps.append(Task("kernel", shapes[y], [Read("data", x, "all")], Write("data", y, "one_to_one",
                                                                                    "discard_write"), marker=True))
        elif c == "chain":
            deps.append(Task("kernel", shapes[y], [Read("data", x, "all")],
                             Write("data", y, "one_to_one", "discard_write"), marker=True))
            deps.append(Task("kernel", shapes[y], [Read("data", y, "one_to_one")],
                             Write("data", y, "one_to_one", "read_write"), marker=True))
        elif c == "master":
            deps.append(Task("master", reads=[Read("data", x, "all")], marker=True))
        elif c == "host_all":
            deps.append(Task("host", shapes[y], [Read("data", x, "all")], marker=True))
        elif c == "reduce_all":
            deps.append(Task("kernel", shapes[y], [Read("data", x, "all")], None, marker=True,
                             reds=[RedSpec(0, "plus", targets[0].dtype if targets[0].dtype != "bool" else "bool",
                                           True)]))
            if targets[0].dtype == "bool":
                deps[-1].reds[0].op = "logical_or"
        elif c == "side_effect":
            deps.append(Task("master", reads=[], marker=True))
        g.feat(f"fail:dependent:{c}")
    tasks += deps
    sync = rng.choice(["wait", "fence", "shutdown"] + (["fence_log"] if host else []))
    g.feat(f"fail:sync:{sync}")
    p = Program("fail", shapes, dtypes, init, targets, tasks, sync=sync)
    return p


def _gen_bad_reduction(g: _Gen) -> Program:
    rng = g.rng
    shapes, dtypes, init = _gen_buffers(g, 1, 2)
    td = rng.choice(["int32", "int64", "bool"])
    vd = rng.choice(["float32", "float64"] + (["int32", "int64"] if td == "bool" else []))
    targets = [TargetSpec(td, (1,), None), TargetSpec("int64", (1,), None)]
    op = "logical_or" if td == "bool" else rng.choice(["plus", "maximum", "minimum"])
    reds = [RedSpec(0, op, vd, True)]
    if rng.random() < 0.5:       # a good reduction beside the bad one
        reds.append(RedSpec(1, "plus", "int64", True))
        g.feat("bad_red:with_good_one")
    rng.shuffle(reds)
    range_shape = shapes[0]
    t = Task("kernel", range_shape, [Read("data", 0, "one_to_one")], None, reds=reds, c0=rng.randint(0, 5))
    g.feat(f"bad_red:{vd}->{td}")
    sync = rng.choice(["wait", "fence"])
    return Program("bad_reduction", shapes, dtypes, init, targets, [t], sync=sync)


def _gen_overlap(g: _Gen) -> Program:
    rng = g.rng
    n = rng.randint(1, 9)
    shapes = [(n,)]
    dtypes = ["int64"]
    init = [_init_data(rng, (n,), "int64")]
    mapper = rng.choice(["all", "neighborhood", "fixed"])
    wr = Write("data", 0, mapper, "discard_write")
    if mapper == "fixed":
        lo = rng.randrange(n)
        wr.fixed_box = ((lo,), (rng.randint(lo + 1, n),))
    t = Task("kernel", (n,), [], wr, c0=rng.randint(0, 9))
    g.feat(f"overlap:{mapper}")
    return Program("overlap", shapes, dtypes, init, [], [t], sync="fence")


def _gen_bad_mapper(g: _Gen) -> Program:
    """Ordinary steps, one task reading a buffer through a bad range mapper (``BAD_FORMS``),
    ordinary steps.  Maybe a writer of that buffer right before the task (its chunks must
    read the new data) and right after it (which must not overwrite what they read).

    The bad task is a kernel (maybe with a local_range) or a host task with a range (maybe
    on the master node, maybe oversubscribed), never with a split_2d hint: its rank chunks
    and their local chunks are then cut along dim 0 only, which ``bad_rank_chunks`` and
    ``bad_local_chunks`` model exactly."""
    rng = g.rng
    shapes, dtypes, init = _gen_buffers(g, 2, 3)
    b = rng.randrange(len(shapes))              # read through the bad mapper
    if shapes[b][0] < 4 and rng.random() < 0.8:
        # rows enough that what a chunk is mapped to is seldom clipped away
        shapes[b] = (rng.randint(4, 9),) + shapes[b][1:]
        init[b] = _init_data(rng, shapes[b], dtypes[b])
    targets = _gen_targets(g)
    st = _State(shapes, dtypes, targets)
    tasks: list[Task] = []
    for _ in range(rng.randint(0, 2)):
        _gen_step(g, st, tasks)
    if rng.random() < 0.5:
        tasks.append(Task("kernel", shapes[b], [], Write("data", b, "one_to_one", rng.choice(MODES)),
                          c0=rng.randint(0, 9)))
        g.feat("bad_mapper:written_before")
    w = rng.choice([k for k in range(len(shapes)) if k != b])   # never b: its chunks would race the bad reads
    range_shape = shapes[w] if rng.random() < 0.7 else shapes[rng.randrange(len(shapes))]
    write = None
    if range_shape == shapes[w] and rng.random() < 0.8:
        write = Write("data", w, "one_to_one", rng.choice(MODES))
    host = g.on("host_range") and rng.random() < 0.35
    t = Task("host" if host else "kernel", range_shape, write=write, c0=rng.randint(0, 9), name=BAD_TASK)
    t.reads = _pick_reads(g, st, range_shape, avoid_data=set(), own=w if write is not None else None,
                          avoid_targets=set(), max_reads=2)
    if host:
        if rng.random() < 0.25:
            t.on_master = True      # a master-node task is never split: no diagnostic on any configuration
            g.feat("bad_mapper:on_master")
        if rng.random() < 0.3:
            t.oversub = rng.randint(2, 3)
        if rng.random() < 0.3:
            t.side_effect = False
        g.feat("bad_mapper:host")
    else:
        t.local_range = _pick_local_range(g, range_shape)
        if g.on("reductions") and rng.random() < 0.3:
            k = rng.randrange(len(targets))
            if k not in {rd.buffer for rd in t.reads if rd.space == "target"}:
                t.reds.append(_pick_reduction(g, st, k))
                st.defined[k] = True
                st.written_remote[k] = False
        g.feat("bad_mapper:kernel")
    n = range_shape[0]
    forms = [f for f in BAD_FORMS if f != "offset_eq" or n >= 2]     # (offset_eq needs a second chunk's offset)
    rd = Read("data", b, "bad", form=rng.choice(forms), opaque=rng.random() < 0.3)
    if rd.form == "offset_eq":
        gran = t.local_range[0] if t.local_range else 1
        starts = sorted({o for r in range(2, 5) for o, _ in split_rows(n, gran, r)[1:]})
        # mostly where a second (or later) chunk starts on 2-4 ranks, else any row
        rd.k = rng.choice(starts) if starts and rng.random() < 0.8 else rng.randrange(1, n)
    t.reads.insert(rng.randint(0, len(t.reads)), rd)
    tasks.append(t)
    g.feat(f"bad_mapper:{rd.form}", "mapper:opaque" if rd.opaque else "mapper:keyed")
    if shapes[b] == range_shape:
        g.feat("bad_mapper:own_shape")
    if rng.random() < 0.5:
        tasks.append(Task("kernel", shapes[b], [], Write("data", b, "one_to_one", "discard_write"),
                          c0=rng.randint(0, 9)))
        g.feat("bad_mapper:written_after")
    for _ in range(rng.randint(0, 2)):
        _gen_step(g, st, tasks)
    return Program("bad_mapper", shapes, dtypes, init, targets, tasks)


def _gen_misuse(g: _Gen) -> Program:
    """Ordinary steps, then one task that misuses the API (``MISUSE_FORMS``, named
    ``MISUSE_TASK``): a kernel or host task with a range (maybe on the master node, maybe
    oversubscribed, never with a split_2d hint: ``bad_rank_chunks`` / ``bad_local_chunks``
    model which chunk misbehaves) writing one buffer and reading another through the mapper
    or accessor it misuses; or a ``cl.Buffer`` that does not fit.  The error ends the program."""
    rng = g.rng
    shapes, dtypes, init = _gen_buffers(g, 2, 3)
    form = rng.choice(MISUSE_FORMS)
    w = rng.randrange(len(shapes))
    b = rng.choice([k for k in range(len(shapes)) if k != w])
    if form == "outside" and shapes[b][0] < 2:
        shapes[b] = (rng.randint(2, 9),) + shapes[b][1:]    # (rows outside a fixed box of at least one)
        init[b] = _init_data(rng, shapes[b], dtypes[b])
    targets = _gen_targets(g)
    st = _State(shapes, dtypes, targets)
    g.misuse_state = st
    tasks: list[Task] = []
    for _ in range(rng.randint(0, 2)):
        _gen_step(g, st, tasks)
    g.feat(f"misuse:{form}")
    if form == "buffer":
        t = Task("bad_buffer", fence_index=b, name=MISUSE_TASK, misuse=form, misuse_form=rng.choice(BUFFER_FORMS))
        g.feat(f"misuse:buffer:{t.misuse_form}")
        tasks.append(t)
        return Program("misuse", shapes, dtypes, init, targets, tasks, sync="wait")
    host = g.on("host_range") and rng.random() < 0.35
    t = Task("host" if host else "kernel", shapes[w], write=Write("data", w, "one_to_one", "discard_write"),
             c0=rng.randint(0, 9), name=MISUSE_TASK, misuse=form)
    if host:
        if rng.random() < 0.25:
            t.on_master = True
            g.feat("misuse:on_master")
        if rng.random() < 0.3:
            t.oversub = rng.randint(2, 3)
        g.feat("misuse:host")
    else:
        t.local_range = _pick_local_range(g, shapes[w])
        g.feat("misuse:kernel")
    t.reads = _pick_reads(g, st, shapes[w], avoid_data=set(), own=w, avoid_targets=set(), max_reads=1)
    shape = shapes[b]
    elem = tuple(rng.randrange(n) for n in shape)
    if form == "outside":
        k = rng.randint(1, shape[0] - 1)
        rd = Read("data", b, "fixed", fixed_box=((0,) * len(shape), (k,) + tuple(shape[1:])), form="misuse")
        elem = (rng.randrange(k, shape[0]),) + elem[1:]
    elif form in ("write_read", "outside_kernel"):
        rd = Read("data", b, "all", form="misuse")
        if form == "outside_kernel":
            t.misuse_form = rng.choice(["cgf", "after"])
            g.feat(f"misuse:outside_kernel:{t.misuse_form}")
    elif form == "mapper_raises":
        rd = Read("data", b, "raising")
        elem = ()
    else:
        t.misuse_form = rng.choice(MAPPER_DIMS_FORMS)
        rd = Read("data", b, "wrong_dims", form=t.misuse_form)
        g.feat(f"misuse:mapper_dims:{t.misuse_form}")
        elem = ()
    rd.opaque = form != "outside" and rng.random() < 0.3
    t.misuse_elem = elem
    if form in ("outside", "write_read"):
        t.misuse_at = tuple(rng.randrange(n) for n in shapes[w])
    t.reads.insert(rng.randint(0, len(t.reads)), rd)
    tasks.append(t)
    sync = rng.choice(["wait", "fence", "shutdown"]) if form in ("outside", "write_read") else "wait"
    g.feat(f"misuse:sync:{sync}")
    return Program("misuse", shapes, dtypes, init, targets, tasks, sync=sync)


# ---- sequential model ---------------------------------------------------------------------
def _target_shape(p: Program, rd: Read):
    return p.shapes[rd.buffer] if rd.space == "data" else p.targets[rd.buffer].shape


FULL_WRITE_MAPPERS = ("one_to_one", "mirror", "shift")     # over a range of the buffer's shape: every element
DISCARD_MODES = ("discard_write", "discard_read_write")


def lifecycle(p: Program) -> tuple[str | None, list[bool]]:
    """(the first misuse of a buffer's or host object's lifetime, or None; which data buffers
    are fenced at the end: made, not destroyed and written).  A data buffer is used (read,
    written, fenced) only between its ``create`` task (if any: else from the start) and its
    ``destroy``; one made without data is read only after a task wrote all of it in a
    discard mode; an extra host object is used only between its ``hcreate`` and ``hdestroy``;
    a collective task's group exists."""
    nb = len(p.shapes)
    late = {t.fence_index for t in p.tasks if t.kind == "create"}
    hlate = {t.fence_index for t in p.tasks if t.kind == "hcreate"}
    state = ["new" if k in late else "live" for k in range(nb)]
    defined = [a is not None for a in p.init]
    hstate = ["new" if k in hlate else "live" for k in range(p.hobjs)]
    for idx, t in enumerate(p.tasks):
        k = t.fence_index
        if t.kind in ("create", "destroy"):
            want, then = ("new", "live") if t.kind == "create" else ("live", "dead")
            if not 0 <= k < nb or state[k] != want:
                return f"T{idx}: {t.kind} of b{k}, which is {state[k] if 0 <= k < nb else 'unknown'}", []
            state[k] = then
            continue
        if t.kind in ("hcreate", "hfence", "hdestroy"):
            want, then = {"hcreate": ("new", "live"), "hfence": ("live", "live"),
                          "hdestroy": ("live", "dead")}[t.kind]
            if not 0 <= k < p.hobjs or hstate[k] != want:
                return f"T{idx}: {t.kind} of h{k}, which is {hstate[k] if 0 <= k < p.hobjs else 'unknown'}", []
            hstate[k] = then
            continue
        if t.hobj is not None and (not 0 <= t.hobj < p.hobjs or hstate[t.hobj] != "live"):
            return f"T{idx}: side effect on h{t.hobj}, which is not live", []
        if t.kind == "collective" and not 0 <= t.group <= p.ngroups:
            return f"T{idx}: collective group {t.group} of {p.ngroups}", []
        used = [rd.buffer for rd in t.reads if rd.space == "data"]
        if t.kind == "fence" and t.fence_space == "data":
            used.append(k)
        for b in used:
            if state[b] != "live" or not defined[b]:
                return f"T{idx} reads b{b}, which is {state[b] if state[b] != 'live' else 'not written yet'}", []
        w = t.write
        if w is not None and w.space == "data":
            b = w.buffer
            if state[b] != "live":
                return f"T{idx} writes b{b}, which is {state[b]}", []
            if not defined[b]:
                if not (w.mapper in FULL_WRITE_MAPPERS and w.mode in DISCARD_MODES
                        and t.kind in ("kernel", "host") and task_box(t) == Box.full(p.shapes[b])
                        and len(t.range_shape) == len(p.shapes[b])):
                    return f"T{idx}: the first write of b{b} (made without data) does not discard all of it", []
                defined[b] = True
    return None, [state[k] == "live" and defined[k] for k in range(nb)]


def collective_value(t: Task, getters: dict, shape_of) -> int:
    """What every rank's part of a collective task computes before adding its rank."""
    one = Box((0,), (1,), 1)
    return (t.c0 + sum(int(contribution(rd, one, shape_of(rd), getters[(rd.space, rd.buffer)]))
                       for rd in t.reads)) % MOD


COMM_OPS = ("allreduce", "reduce", "scan", "exscan")


def comm_op(t: Task) -> str:
    """Which reduction a collective task with ``comm`` makes through ``partition.comm``
    (from its drawn ``c0``: no draw of its own, so programs drawn before it are unchanged)."""
    return COMM_OPS[t.c0 % len(COMM_OPS)]


def comm_reduce(comm, op: str, v):
    """``op`` (``comm_op``) of every rank's ``v``, summed: ``reduce`` to the last rank."""
    if op == "allreduce":
        return comm.allreduce(v)
    if op == "reduce":
        return comm.reduce(v, root=comm.size - 1)
    return comm.scan(v) if op == "scan" else comm.exscan(v)


def _sum_of_ranks(s: int, n: int):
    """The sum of ``s + r`` over ranks ``r < n``."""
    return n * s + n * (n - 1) // 2


def collective_record(idx: int, group: int, s: int, comm: str | None, rank: int, ranks: int) -> tuple:
    """What rank ``rank`` of ``ranks`` records for collective task ``idx`` whose value is ``s``:
    its partition (box ``[rank, rank + 1)`` of ``(ranks,)``), ``s + rank``, and with ``comm``
    (``comm_op``) that reduction (sum) of the ranks' ``s + rank`` and the communicator's
    (rank, size)."""
    tot = None
    if comm == "allreduce" or (comm == "reduce" and rank == ranks - 1):
        tot = _sum_of_ranks(s, ranks)
    elif comm == "scan":
        tot = _sum_of_ranks(s, rank + 1)
    elif comm == "exscan" and rank > 0:
        tot = _sum_of_ranks(s, rank)
    return ("c", idx, group, rank, (rank,), (rank + 1,), (ranks,), s + rank, tot,
            (rank, ranks) if comm else None)


def host_object_records(entries: list, rank: int, ranks: int) -> list:
    """A model's list of an extra host object (``("m", task, value)``: master-node tasks;
    ``("c", task, group, value, comm)``: collective tasks) as rank ``rank`` holds it."""
    out = []
    for e in entries:
        if e[0] == "m":
            if rank == 0:
                out.append(e)
        else:
            out.append(collective_record(e[1], e[2], e[3], e[4], rank, ranks))
    return out


MASTER_GEOMETRY = {"": ((), (), ()), "once": ((1,), (0,), (1,)), "default": ((1,), (0,), (1,))}


def run_model(p: Program) -> dict:
    """What every rank must observe.  ``log`` lists host-task entries in task order:
    ``("m", task, value)`` (master node, rank 0 only) and ``("h", task, flat index, value)``.
    ``coll`` lists collective tasks as ``(task, group, value, comm)`` (``collective_record``
    gives each rank's record), ``hlog`` each extra host object's entries
    (``host_object_records``), ``hfences`` those lists when each ``hfence`` ran."""
    late = {t.fence_index for t in p.tasks if t.kind == "create"}

    def made(k):
        a = p.init[k]
        return a.copy() if a is not None else np.zeros(p.shapes[k], dtype=p.dtypes[k])   # (never read)
    bufs: list = [None if k in late else made(k) for k in range(len(p.init))]
    coll: list = []
    hlog: list[list] = [[] for _ in range(p.hobjs)]
    hfences: list = []
    tvals: list[np.ndarray | None] = [None if t.init is None else np.asarray(t.init, dtype=t.dtype).reshape(t.shape)
                                      for t in p.targets]
    fences, log, log_fences, plain = [], [], [], []

    def getter(space, k):
        if space == "data":
            return lambda box: as_int(bufs[k][box.slices])
        return lambda box: as_int(tvals[k][box.slices])

    def shape_of(rd):
        return _target_shape(p, rd)

    for idx, t in enumerate(p.tasks):
        getters = {(rd.space, rd.buffer): getter(rd.space, rd.buffer) for rd in t.reads}
        if t.kind == "fence":
            if t.fence_space == "target":
                fences.append(tvals[t.fence_index].copy())
            elif t.fence_box:
                fences.append(bufs[t.fence_index][Box.from_subrange(*t.fence_box).slices].copy())
            else:
                fences.append(bufs[t.fence_index].copy())
        elif t.kind == "fence_log":
            log_fences.append(list(log))
        elif t.kind in ("wait", "destroy", "hcreate", "hdestroy", "lookahead", "flush", "bad_cg", "diverge"):
            pass    # (bad_cg: the submit raised and made no task; diverge: the program ends in an error)
        elif t.kind == "create":
            bufs[t.fence_index] = made(t.fence_index)
        elif t.kind == "hfence":
            hfences.append(list(hlog[t.fence_index]))
        elif t.kind == "collective":
            v = collective_value(t, getters, shape_of)
            op = comm_op(t) if t.comm else None
            coll.append((idx, t.group, v, op))
            if t.hobj is not None:
                hlog[t.hobj].append(("c", idx, t.group, v, op))
        elif t.kind == "master":
            if t.reads:
                rd = t.reads[0]
                log.append(("m", idx, int(getters[(rd.space, rd.buffer)](Box.full(shape_of(rd))).sum())))
            else:
                log.append(("m", idx, 0))
            if t.hobj is not None:
                hlog[t.hobj].append(log[-1])
        else:
            full = task_box(t)
            vals = element_values(t, full, shape_of, getters)
            if t.kind == "host":
                flat = np.ravel_multi_index(np.indices(t.range_shape).reshape(len(t.range_shape), -1),
                                            t.range_shape)
                (log if t.side_effect else plain).extend(("h", idx, int(f), int(v))
                                                         for f, v in zip(flat, vals.reshape(-1)))
            for spec in t.reds:
                tv = p.targets[spec.target]
                tvals[spec.target] = reduce_model(vals, spec, tv.dtype, tvals[spec.target]).reshape(tv.shape)
            w = t.write
            if w is None or full.empty:     # (an empty range runs no chunk: nothing is written)
                continue
            if w.space == "target":
                tv = p.targets[w.buffer]
                tvals[w.buffer] = store(vals[tuple(a - o for a, o in zip(w.point, full.min))], tv.dtype
                                        ).reshape(tv.shape)
                continue
            shape = p.shapes[w.buffer]
            for src, dest, flip in write_pieces(w, full, shape):
                v = vals[src.slices_in(full)]
                if flip:
                    v = np.flip(v, w.dim)
                old = bufs[w.buffer][dest.slices]
                bufs[w.buffer][dest.slices] = apply_mode(w.mode, v, old, dest, p.dtypes[w.buffer])
    _problem, observed = lifecycle(p)
    bufs = [b if keep else None for b, keep in zip(bufs, observed)]
    return {"buffers": bufs, "targets": tvals, "fences": fences, "log": log, "log_fences": log_fences,
            "plain": plain, "coll": coll, "hlog": hlog, "hfences": hfences}


def overlap_expects_error(p: Program, chunks_possible: int) -> bool:
    """An overlapping write is diagnosed whenever the kernel runs as two or more chunks."""
    return p.tasks[0].range_shape[0] >= 2 and chunks_possible >= 2


def overlap_model(p: Program) -> np.ndarray:
    t = p.tasks[0]
    out = p.init[0].copy()
    region = _overlap_region(t.write, p.shapes[0])
    out[region.slices] = (_weighted_index(region) + t.c0) % MOD
    return out


def _overlap_region(w: Write, shape) -> Box:
    if w.mapper == "fixed":
        lo, hi = w.fixed_box
        return Box(lo, hi, 1)
    return Box.full(shape)


def split_rows(n: int, gran: int, ranks: int) -> list[tuple[int, int]]:
    """``(offset, size)`` along dim 0 of the chunks ``split_1d`` cuts ``n`` rows into on
    ``ranks`` ranks, restated from scheduler/split.py's contract (not called, so that a
    change there shows): ``n // gran`` whole granules dealt out as evenly as possible,
    the larger chunks first, at most one chunk per granule, the rest of a granule to the
    last chunk; one chunk when there are fewer than two granules or one rank."""
    full = n // gran
    if full <= 1 or ranks == 1:
        return [(0, n)]
    k = min(ranks, full)
    small, large = divmod(full, k)
    sizes = [(small + 1) * gran] * large + [small * gran] * (k - large)
    sizes[-1] += n - full * gran
    out, o = [], 0
    for sz in sizes:
        out.append((o, sz))
        o += sz
    return out


def bad_access(p: Program) -> tuple[int, Task, Read]:
    """The bad_mapper program's task with the bad access: (index, task, the access)."""
    for idx, t in enumerate(p.tasks):
        for rd in t.reads:
            if rd.mapper == "bad":
                return idx, t, rd
    raise ValueError("a bad_mapper program without a bad access")


def bad_rank_chunks(t: Task, ranks: int) -> list[tuple[int, int]]:
    """The command graph's chunks of the bad task, one per rank (rank i gets the i-th), as
    ``(offset, size)`` along dim 0.  From scheduler/command_graph.py ``split_task``: a
    master-node task is one chunk on rank 0; a kernel or a host task with a range is
    ``split_1d`` (the generator never gives the bad task a split_2d hint) over the ranks
    at the granularity of its local_range."""
    n = t.range_shape[0]
    if t.kind == "host" and t.on_master:
        return [(0, n)]
    return split_rows(n, t.local_range[0] if t.local_range else 1, ranks)


def bad_local_chunks(t: Task, cfg: Config, chunk: tuple[int, int]) -> list[tuple[int, int, int | None]]:
    """The local chunks a rank cuts its chunk ``(offset, size)`` of the bad task into, as
    ``(offset, size, device)`` (device None: a host task's part), in the instruction
    graph's order.  Restated from scheduler/device_chunks.py (``_make_plans``,
    ``_local_split``), not called:

    * a kernel: ``split_1d`` into ``devices * k`` parts (k: the oversubscribe hint, the
      task's own or the configuration's), part j of nb on device ``j * devices // nb``
      where nb >= devices, else on device j;
    * a host task with a range: ``split_1d`` into k parts, on no device;
    * a master-node host task: the chunk itself (never cut);

    at the task's granularity, its local_range (host tasks: 1), along dim 0 only (no
    split_2d hint).  ``_local_split`` keeps the box whole when it is cut into one part,
    as ``split_rows`` does.

    Bounded memory (``Config.memory``) could add batches (``_batches``: a device chunk
    whose working set does not fit its device memory is cut again), which this does not
    model.  It need not: the harness's capacity (``device_memory_for``) is never less
    than the bytes of every buffer any one task touches, plus 16 per reduction, and a
    chunk's working set is at most that (bounding boxes inside the buffers, one scratch
    element of at most 8 bytes per reduction), so the bad task is never batched.
    ``bad_mapper_outcome`` asserts that bound for the bad task (``_assert_unbatched``)."""
    o, r = chunk
    if t.kind == "host" and t.on_master:
        return [(o, r, None)]
    k = max(1, t.oversub or cfg.oversubscribe)
    gran = t.local_range[0] if t.local_range else 1
    if t.kind == "host":
        return [(o + a, s, None) for a, s in split_rows(r, gran, k)]
    d = cfg.devices
    parts = split_rows(r, gran, d * k)
    nb = len(parts)
    return [(o + a, s, (j * d) // nb if nb >= d else j) for j, (a, s) in enumerate(parts)]


def _assert_unbatched(p: Program, t: Task, cfg: Config) -> None:
    """Under bounded memory: the bad task's whole footprint fits a device's capacity, so
    none of its chunks is cut into batches (see ``bad_local_chunks``)."""
    if cfg.memory is None or t.kind != "kernel":
        return      # (host tasks are never batched: only device kernels are)
    def nbytes(space: str, i: int) -> int:
        shape, dtype = (p.shapes[i], p.dtypes[i]) if space == "data" else (p.targets[i].shape, p.targets[i].dtype)
        return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize
    touched = {(rd.space, rd.buffer) for rd in t.reads} | {("target", s.target) for s in t.reds}
    if t.write is not None:
        touched.add((t.write.space, t.write.buffer))
    need = sum(nbytes(*b) for b in touched) + sum(np.dtype(p.targets[s.target].dtype).itemsize for s in t.reds)
    cap = device_memory_for(p, cfg.memory)
    assert need <= cap, (f"the bad task needs {need} bytes, the devices hold {cap}: its chunks may be batched, "
                         f"which bad_local_chunks does not model")


@dataclass
class BadMapperOutcome:
    """What the bad task's split makes of a bad_mapper program on one configuration.

    ``outside``: ranks whose rank chunk the bad access maps outside what it maps the whole
    range to; with two or more rank chunks the command graph raises a ``DiagnosticError``
    on every rank, naming the first of them (``rank_outside``).  ``local``: per rank, the
    first local chunk ``(offset, size, device)`` mapped outside what the access maps that
    rank's chunk to; the instruction graph of that rank raises (``RangeMapperError`` on
    several ranks, else ``DiagnosticError``) unless the command graph raised first."""
    ranks: int
    chunks: list            # rank chunks, (offset, size); rank i holds the i-th
    outside: list           # ranks (command graph)
    local: dict             # rank -> (offset, size, device) (instruction graph)

    @property
    def case(self) -> str:
        """``rank_outside``, ``local_outside:ranks`` (RangeMapperError), ``local_outside:one_rank``
        (DiagnosticError) or ``none`` (no error: the model's data)."""
        if len(self.chunks) >= 2 and self.outside:
            return "rank_outside"
        if self.local:
            return "local_outside:ranks" if self.ranks > 1 else "local_outside:one_rank"
        return "none"

    @property
    def failing(self) -> list[int]:
        """The ranks whose own scheduler raises the error (every rank for ``rank_outside``)."""
        case = self.case
        if case == "none":
            return []
        return list(range(self.ranks)) if case == "rank_outside" else sorted(self.local)


def bad_mapper_outcome(p: Program, cfg: Config) -> BadMapperOutcome:
    """The rank chunks and local chunks of the bad task on ``cfg`` and which are mapped
    outside (see ``BadMapperOutcome``).  The two checks, restated:

    * command graph (scheduler/command_graph.py ``_check_mapper_covers_chunks``): with
      two or more rank chunks, a rank chunk whose (non-empty) region is not inside the
      whole range's region;
    * instruction graph (scheduler/device_chunks.py ``_mapped_outside``): where a rank's
      chunk is cut into two or more local chunks, the first local chunk whose
      (non-empty) region is not inside the rank chunk's region.

    (Only the bad access can be outside: every other mapper maps a part of a box inside
    what it maps the box to.)"""
    _idx, t, rd = bad_access(p)
    _assert_unbatched(p, t, cfg)
    m = p.shapes[rd.buffer][0]

    def inside(part: tuple[int, int], whole: tuple[int, int]) -> bool:
        lo, hi = bad_rows(rd.form, rd.k, *part, m)
        wlo, whi = bad_rows(rd.form, rd.k, *whole, m)
        return lo >= hi or (wlo < whi and wlo <= lo and hi <= whi)

    chunks = bad_rank_chunks(t, cfg.ranks)
    full = (0, t.range_shape[0])
    outside = [rank for rank, c in enumerate(chunks) if not inside(c, full)]
    local = {}
    for rank, c in enumerate(chunks):
        parts = bad_local_chunks(t, cfg, c)
        if len(parts) < 2:
            continue        # (one part is the chunk itself: not checked)
        bad = [(o, r, dev) for o, r, dev in parts if not inside((o, r), c)]
        if bad:
            local[rank] = bad[0]
    return BadMapperOutcome(cfg.ranks, chunks, outside, local)


def bad_mapper_before(p: Program) -> np.ndarray:
    """The model's contents of the badly mapped buffer when the bad task runs."""
    idx, _t, rd = bad_access(p)
    return run_model(_prefix(p, idx))["buffers"][rd.buffer]


def _prefix(p: Program, n: int) -> Program:
    q = copy.copy(p)
    q.tasks = p.tasks[:n]
    return q


# ---- celeritas ----------------------------------------------------------------------------------
class _Getters:
    """The getters of a task's reads, ``{(space, buffer): box -> int64 array}``, indexing the
    accessors in the task's style (``at(chunk)``: the same, for that chunk or partition)."""

    def __init__(self, accs: dict, style: str, chunk=None):
        self.accs, self.style, self.chunk = accs, style, chunk

    def at(self, chunk) -> "_Getters":
        return _Getters(self.accs, self.style, chunk)

    def __getitem__(self, key):
        lst = self.accs[key]
        return lambda box: _read_any(lst, box, self.style, self.chunk)

    def __contains__(self, key) -> bool:
        return key in self.accs


class _Run:
    """One rank's run of a program: its buffers, host object and recorded observations."""

    def __init__(self, p: Program, q: cl.Queue, oversubscribe: int, ran: list | None, backend: str = "host"):
        self.p = p
        self.backend = backend
        self.source_tasks: list = []    # kernels launched as cl.Kernel source (no Python bookkeeping)
        self.q = q
        self.rank = q.rank
        self.oversubscribe = oversubscribe
        self.ran = ran if ran is not None else []
        late = {t.fence_index for t in p.tasks if t.kind == "create"}
        self.bufs: list = [None if k in late else self._make_buffer(k) for k in range(len(p.init))]
        self.tbufs = []
        for k, t in enumerate(p.targets):
            if t.init is None:
                self.tbufs.append(cl.Buffer(shape=t.shape, dtype=t.dtype, name=f"r{k}"))
            else:
                self.tbufs.append(cl.Buffer(np.asarray(t.init, dtype=t.dtype).reshape(t.shape), name=f"r{k}"))
        self.log = cl.HostObject([])
        self.groups = [cl.CollectiveGroup() for _ in range(p.ngroups)]   # (every rank, in the same order)
        hlate = {t.fence_index for t in p.tasks if t.kind == "hcreate"}
        self.hobjs: list = [None if k in hlate else cl.HostObject([]) for k in range(p.hobjs)]
        # the extra host objects' lists, held here: they are read at the end even when destroyed
        self.hlists: list = [h.obj if h is not None else None for h in self.hobjs]
        self.hfence_futures: list = []
        self.coll: list = []            # every record of this rank's parts of collective tasks, as they ran
        self.geometry: list = []        # (task, global_range, box min, box max) of master-node tasks' partitions
        self.violations: list = []
        self.geometry_problems: list = []   # (task, rank, chunk, (global range, offset), index space)
        self.split_problems: list = []      # (task, rank, chunk, what): split controls not honoured
        self.even_before: dict = {}         # (task, buffer): the model's buffer before an even_split read
        self.even_lock = threading.Lock()
        self.plain: list = []           # entries of host tasks without a side effect
        self.executed: list = []        # (task, elements) of every kernel chunk and host-task partition
        self.wait_snapshots: list = []  # what had executed when each q.wait() returned
        self.partitions: list = []      # (task, box) of their partitions
        self.fence_futures: list = []
        self.log_fence_futures: list = []
        self.bad_reads: list = []       # bad_mapper: (task, rank, chunk, rows, what differed) of wrong data
        self.bad_before = bad_mapper_before(p) if p.kind == "bad_mapper" else None
        self.misuse_acc = None          # misuse: the accessor the misuse task misuses
        self.last_cgh = None            # the handler of the latest command group (misuse cg_handler stale)
        self.cg_errors: list = []       # misuse cg_*: (task, what its submit raised, or None)
        self.keep: list = []            # misuse diverge: the buffer it makes (kept alive)

    def buffer(self, space: str, k: int) -> cl.Buffer:
        return self.bufs[k] if space == "data" else self.tbufs[k]

    def _make_buffer(self, k: int) -> cl.Buffer:
        a = self.p.init[k]
        if a is None:
            return cl.Buffer(shape=self.p.shapes[k], dtype=self.p.dtypes[k], name=f"b{k}")
        return cl.Buffer(a, name=f"b{k}")

    def _kept(self, cgf):
        def keeping(cgh):
            self.last_cgh = cgh
            cgf(cgh)
        return keeping

    def submit(self, idx: int, t: Task) -> None:
        q = self.q
        if t.kind == "fence":
            if t.fence_box and t.misuse_arg:
                box = Box.from_subrange(*t.fence_box)
                boxes = [box]
                if t.misuse_arg == "region_split":
                    mid = box.min[0] + box.range[0] // 2
                    boxes = [_with_dim(box.min, box.max, 0, box.min[0], mid),
                             _with_dim(box.min, box.max, 0, mid, box.max[0])]
                self.fence_futures.append(q.fence(self.bufs[t.fence_index], fence_region(boxes)))
            elif t.fence_box:
                self.fence_futures.append(q.fence(self.bufs[t.fence_index], cl.Subrange(*t.fence_box)))
            else:
                self.fence_futures.append(q.fence(self.buffer(t.fence_space, t.fence_index)))
        elif t.kind == "fence_log":
            self.log_fence_futures.append(q.fence(self.log))
        elif t.kind == "wait":
            q.wait(barrier=t.barrier)
            done = Counter()
            for i, n in list(self.executed):
                done[i] += n
            self.wait_snapshots.append((idx, dict(done)))
        elif t.kind == "master":
            q.submit(self._kept(self._master_cgf(idx, t)))
        elif t.kind == "collective":
            q.submit(self._kept(self._collective_cgf(idx, t)))
        elif t.kind == "bad_cg":
            try:
                self._bad_cg(t)
            except Exception as exc:  # noqa: BLE001 - what it raised is checked (check_cg_misuse)
                self.cg_errors.append((idx, exc))
            else:
                self.cg_errors.append((idx, None))
        elif t.kind == "diverge":
            self._diverge(t)
        elif t.kind == "create":
            self.bufs[t.fence_index] = self._make_buffer(t.fence_index)
        elif t.kind == "destroy":
            self._release(self.bufs, t)
        elif t.kind == "hcreate":
            self.hobjs[t.fence_index] = cl.HostObject([])
            self.hlists[t.fence_index] = self.hobjs[t.fence_index].obj
        elif t.kind == "hfence":
            self.hfence_futures.append(q.fence(self.hobjs[t.fence_index]))
        elif t.kind == "hdestroy":
            self._release(self.hobjs, t)
        elif t.kind == "lookahead":
            q.set_lookahead(t.mode)
        elif t.kind == "flush":
            q.flush()
        elif t.kind == "bad_buffer":
            make_bad_buffer(t.misuse_form, self.p.shapes[t.fence_index], self.p.dtypes[t.fence_index])
        elif t.kind == "bad_config":
            setting, value = config_setting(t)
            if t.misuse_form == "set_lookahead":
                q.set_lookahead(value)
            elif t.misuse_form == "second_queue":
                cl.Queue(**{setting: value if value is not None else _other_devices(q)})
            # (env, queue_arg, output, device: the first cl.Queue() raised already, or nothing is left to do)
        elif t.kind == "host":
            q.submit(self._kept(self._host_cgf(idx, t)))
        else:
            q.submit(self._kept(self._kernel_cgf(idx, t)))
        if t.misuse == "outside_kernel" and t.misuse_form == "after":
            self.misuse_acc[Box(t.misuse_elem, tuple(e + 1 for e in t.misuse_elem), len(t.misuse_elem))]

    # -- misuse diverge / cg_*
    def _poison_cgf(self, t: Task, name, rng, host: bool, before=None, fn=None, on=None, mode=cl.discard_write):
        """A command group writing POISON over ``rng`` of the buffer ``misuse_arg["w"]`` (discard_write,
        declared first); ``before(cgh)`` runs after that declaration; ``fn`` replaces the kernel."""
        run = self
        wbuf = self.bufs[t.misuse_arg["w"]]
        dtype = self.p.dtypes[t.misuse_arg["w"]]

        def cgf(cgh):
            wacc = wbuf.access(cgh, cl.one_to_one(), mode)
            if before is not None:
                before(cgh)

            def poison(chunk):
                box = chunk.box
                if not box.empty:
                    wacc[box] = store(np.full(box.range, POISON, dtype=np.int64), dtype)
            run.last_cgh = cgh
            if host:
                cgh.host_task(fn or poison, range=rng, name=name, **({"on": on} if on is not None else {}))
            else:
                cgh.parallel_for(rng, fn or poison, name=name)
        return cgf

    def _diverge(self, t: Task) -> None:
        """misuse diverge: the rank ``fence_index % ranks`` submits something else."""
        a = t.misuse_arg
        me = self.rank == t.fence_index % self.q.num_ranks
        shape = tuple(a["range"])
        if "buffer" in a:
            bshape, dt, other, odt = a["buffer"]
            if t.misuse_form == "host_data" and me:
                self.keep.append(cl.Buffer(np.zeros(bshape, dtype=dt), name="misuse"))
            else:
                self.keep.append(cl.Buffer(shape=other if me else bshape, dtype=odt if me else dt, name="misuse"))
        if t.misuse_form == "extra" and me:
            self.q.submit(self._poison_cgf(t, DIVERGE_EXTRA, shape, a["host"]))
        name = DIVERGE_RENAMED if t.misuse_form == "name" and me else MISUSE_TASK
        rng = tuple(a["other"]) if t.misuse_form == "range" and me else shape
        mode = cl.write if t.misuse_form == "mode" and me else cl.discard_write
        log = self.log
        before = (lambda cgh: cl.side_effect(log, cgh)) if t.misuse_form == "side_effect" and me else None
        self.q.submit(self._poison_cgf(t, name, rng, a["host"], before=before, mode=mode))

    def _release(self, objs: list, t: Task) -> None:
        """A destroy step: ``destroy()``, or the last reference dropped (``_draw_releases``; the
        command group kept for a stale-handler misuse holds its buffers: it goes first)."""
        k = t.fence_index
        if not t.release:
            objs[k].destroy()
            objs[k] = None
            return
        self.last_cgh = None
        if t.release == "drop":
            objs[k] = None
        else:
            holder = [objs[k]]
            objs[k] = None
            th = threading.Thread(target=holder.clear, name="celeritas-fuzz-release")
            th.start()
            th.join()

    def _bad_cg(self, t: Task) -> None:
        """misuse cg_handler / cg_call / fence_region: the call that must raise (``cg_misuse_error``)."""
        q, a, sub = self.q, t.misuse_arg, t.misuse_form
        if t.misuse == "fence_region":
            q.fence(self.bufs[a["b"]], cl.Region(fence_region_boxes(self.p, t)))
            return
        if sub == "submit_noncallable":
            q.submit(CG_NONCALLABLES[a["v"]])
            return
        rng = tuple(a["range"])
        host = _cg_host(t)
        if t.misuse == "cg_handler":
            target, how = sub.split(":")
            if how == "stale" and self.last_cgh is None:
                q.submit(self._kept(lambda cgh: cgh.parallel_for((1,), lambda chunk: None, name="keep")))

            def before(cgh):
                bad = None if how == "none" else self.last_cgh
                if target == "access":
                    self.bufs[a["b"]].access(bad, cl.all(), cl.read)
                elif target == "reduction":
                    cl.reduction(self.tbufs[a["r"]], bad, cl.plus)
                elif target == "side_effect":
                    cl.side_effect(self.log, bad)
                elif target == "hint":
                    cl.hint(bad, cl.split_1d())
                else:
                    cl.constrain_split(bad, 1)
            q.submit(self._poison_cgf(t, MISUSE_TASK, rng, host, before))
            return
        before = fn = on = None
        name = MISUSE_TASK
        if sub == "reduction_target":
            value = {"ndarray": np.zeros(1), "HostObject": self.log, "int": 7}[CG_TARGETS[a["v"]]]

            def before(cgh):
                cl.reduction(value, cgh, cl.plus)
        elif sub == "side_effect_kernel":
            def before(cgh):
                cl.side_effect(self.log, cgh)
        elif sub.startswith("host_range"):
            on = {"host_range_once": cl.once, "host_range_collective": cl.collective,
                  "host_range_collective_call": cl.collective()}[sub]
        elif sub in CG_PLACEMENTS:
            def before(cgh):
                if sub == "collective_bad_group":
                    cl.collective("group")
                else:
                    (cl.on_master_node if sub.endswith("master") else cl.once)()
        elif sub == "no_init_read":
            def before(cgh):
                self.bufs[a["b"]].access(cgh, cl.all(), cl.read, no_init=True)
        elif sub == "name_type":
            name = CG_NAMES[a["v"]]
        elif sub in CG_HINTS:
            def before(cgh):
                for kind, *arg in CG_HINTS[sub]:
                    cl.hint(cgh, getattr(cl, kind)(*arg))
        else:
            fn = _suspending(sub)
        q.submit(self._poison_cgf(t, name, rng, host, before, fn, on))

    # -- helpers building accessors and getters
    def _reads(self, cgh, t: Task, bad: list | None = None) -> dict:
        """Getters of the reads' data; the accessors of bad mappers go to ``bad`` instead
        (as (read, accessor): see ``_check_bad_reads``)."""
        accs: dict = {}
        for rd in t.reads:
            m = make_read_mapper(rd)
            acc = self.buffer(rd.space, rd.buffer).access(cgh, m, cl.read)
            if rd.form == "misuse":
                self.misuse_acc = acc
                if t.misuse == "outside_kernel" and t.misuse_form == "cgf":
                    acc[Box(t.misuse_elem, tuple(e + 1 for e in t.misuse_elem), len(t.misuse_elem))]
                bad.append((rd, acc))   # (and a read like any other: element_values reads what it grants)
            if rd.mapper in ("bad", "even_split"):
                bad.append((rd, acc))
                continue
            accs.setdefault((rd.space, rd.buffer), []).append(acc)
        return _Getters(accs, t.index)

    def _check_bad_reads(self, idx: int, box: Box, bad: list) -> None:
        """A chunk (or partition) ``box`` reads what its bad mapper maps it to, as a kernel
        that trusts its mapper would: the data must be the model's at that task."""
        for rd, acc in bad:
            if rd.form == "misuse":
                self._misuse(idx, box, acc)
                continue
            if rd.mapper == "even_split":
                self._check_even_split(idx, box, rd, acc)
                continue
            shape = self.p.shapes[rd.buffer]
            dest = bad_box(bad_rows(rd.form, rd.k, box.min[0], box.range[0], shape[0]), shape)
            if dest is None:
                continue
            d = _array_diff(np.asarray(acc[dest]), self.bad_before[dest.slices])
            if d:
                self.bad_reads.append((idx, self.rank, str(box), str(dest), d))

    def _misuse(self, idx: int, box: Box, acc) -> None:
        """misuse outside / write_read: the chunk (or partition) holding ``misuse_at`` reads
        an element its mapper does not grant, or assigns through the read accessor."""
        t = self.p.tasks[idx]
        if t.misuse_at is None or not box.contains(t.misuse_at):
            return
        e = Box(t.misuse_elem, tuple(x + 1 for x in t.misuse_elem), len(t.misuse_elem))
        if t.misuse == "outside":
            acc[e]
        elif t.misuse == "write_read":
            acc[e] = 0

    def _check_even_split(self, idx: int, box: Box, rd: Read, acc) -> None:
        """A chunk reading through ``cl.even_split``: granted exactly ``even_split_rows`` of the
        buffer, and they hold the model's data at this task."""
        t = self.p.tasks[idx]
        shape = self.p.shapes[rd.buffer]
        base = task_box(t).min[0]
        lo, hi = even_split_rows(shape[0], rd.k, (box.min[0] - base, box.max[0] - base), t.range_shape[0])
        want = Box((lo,) + (0,) * (len(shape) - 1), (hi,) + tuple(shape[1:]), len(shape))
        reg = acc.region
        got = Region([]) if reg is None else reg
        if not (got == (Region([want]) if not want.empty else Region([]))):
            self.split_problems.append((idx, self.rank, str(box), f"even_split granted {got}, expected {want}"))
            return
        if want.empty:
            return
        with self.even_lock:        # (chunks run concurrently)
            before = self.even_before.get((idx, rd.buffer))
            if before is None:
                before = self.even_before[(idx, rd.buffer)] = run_model(_prefix(self.p, idx))["buffers"][rd.buffer]
        d = _array_diff(np.asarray(acc_get(acc, want, t.index, None)), before[want.slices])
        if d:
            self.split_problems.append((idx, self.rank, str(box), f"even_split rows {lo}-{hi} read: {d}"))

    def _check_split(self, idx: int, t: Task, box: Box) -> None:
        """A chunk (or partition) is cut at multiples of ``split_granularity`` from the index
        space's minimum (or at its end), and under ``split_1d`` spans every other dimension."""
        whole = task_box(t) if t.kind == "kernel" else Box.full(t.range_shape)
        for d, gr in enumerate(split_granularity(t)):
            lo, hi = box.min[d] - whole.min[d], box.max[d] - whole.min[d]
            if lo % gr or (hi % gr and hi != t.range_shape[d]):
                self.split_problems.append((idx, self.rank, str(box), f"not cut at multiples of "
                                            f"{split_granularity(t)} from {whole.min}"))
                return
        if t.split1d and any(box.min[d] != whole.min[d] or box.max[d] != whole.max[d]
                             for d in range(1, box.dims)):
            self.split_problems.append((idx, self.rank, str(box), f"split_1d, but cut in dimension >= 1 of {whole}"))

    def _shape_of(self, rd: Read):
        return _target_shape(self.p, rd)

    def _master_cgf(self, idx: int, t: Task):
        run = self

        def cgf(cgh):
            getters = run._reads(cgh, t)
            lst = cl.side_effect(run.log, cgh)
            extra = cl.side_effect(run.hobjs[t.hobj], cgh) if t.hobj is not None else None
            holder = run.hobjs[t.hobj] if t.hobj_replace else None

            def fn(part):
                if t.delay:
                    time.sleep(t.delay)
                run.executed.append((idx, 1))
                if t.marker:
                    run.ran.append(("master", idx, run.rank))
                if t.form:
                    run.geometry.append((idx, tuple(part.global_range), tuple(part.box.min), tuple(part.box.max)))
                if t.reads:
                    rd = t.reads[0]
                    lst.append(("m", idx, int(getters[(rd.space, rd.buffer)](Box.full(run._shape_of(rd))).sum())))
                else:
                    lst.append(("m", idx, 0))
                if holder is not None:      # (hobj:replace: the object itself changes; fences copy the new one)
                    holder.obj = run.hlists[t.hobj] = holder.obj + [lst[-1]]
                elif extra is not None:
                    extra.append(lst[-1])
            on = {"": cl.on_master_node, "once": cl.once, "default": None}[t.form]
            cgh.host_task(fn, on=on, name=f"master_T{idx}")
        return cgf

    def _collective_cgf(self, idx: int, t: Task):
        run = self

        def cgf(cgh):
            getters = run._reads(cgh, t)
            extra = cl.side_effect(run.hobjs[t.hobj], cgh) if t.hobj is not None else None
            holder = run.hobjs[t.hobj] if t.hobj_replace else None
            on = cl.collective(run.groups[t.group - 1]) if t.group else \
                cl.collective() if t.form == "call" else cl.collective

            def fn(part):
                if t.delay and part.rank == 0:
                    time.sleep(t.delay)
                run.executed.append((idx, 1))
                v = collective_value(t, getters, run._shape_of) + part.rank
                tot = cr = None
                if t.comm:
                    tot = comm_reduce(part.comm, comm_op(t), v)
                    cr = (part.comm.rank, part.comm.size)
                rec = ("c", idx, t.group, part.rank, tuple(part.box.min), tuple(part.box.max),
                       tuple(part.global_range), v, tot, cr)
                run.coll.append(rec)
                if holder is not None:
                    holder.obj.append(rec)      # (hobj:replace: the object as it is now)
                elif extra is not None:
                    extra.append(rec)
            cgh.host_task(fn, on=on, name=t.name or f"coll_T{idx}")
        return cgf

    def _host_cgf(self, idx: int, t: Task):
        run = self

        def cgf(cgh):
            bad: list = []
            getters = run._reads(cgh, t, bad)
            w = None
            if t.write is not None:
                w = run.bufs[t.write.buffer].access(cgh, cl.one_to_one(), t.write.mode)
            lst = cl.side_effect(run.log, cgh) if t.side_effect else run.plain
            k = t.oversub or run.oversubscribe
            if k > 1:
                cl.hint(cgh, cl.oversubscribe(k))
            if t.split2d or t.split1d:
                cl.hint(cgh, cl.split_2d() if t.split2d else cl.split_1d())
            if t.gran is not None:
                cl.constrain_split(cgh, t.gran)

            def fn(part):
                box = part.box
                if box.empty or tuple(part.global_range) != tuple(t.range_shape):
                    # (an empty range runs no partition, on the master node too, as a kernel's runs no chunk)
                    run.geometry_problems.append((idx, run.rank, str(box), (tuple(part.global_range),),
                                                  str(Box.full(t.range_shape))))
                run._enter("host", idx, t, box)
                if t.split1d or t.split2d or t.gran is not None:
                    run._check_split(idx, t, box)
                if bad:
                    run._check_bad_reads(idx, box, bad)
                if not t.side_effect:
                    run.partitions.append((idx, box))
                vals = element_values(t, box, run._shape_of, getters.at(part))
                if w is not None:
                    old = np.asarray(acc_get(w, box, t.index, part))
                    acc_set(w, box, apply_mode(t.write.mode, vals, old, box, run.p.dtypes[t.write.buffer]),
                            t.index, part)
                flat = np.ravel_multi_index(np.indices(box.range).reshape(box.dims, -1)
                                            + np.asarray(box.min).reshape(-1, 1), t.range_shape)
                lst.extend([("h", idx, int(f), int(v)) for f, v in zip(flat, vals.reshape(-1))])
            cgh.host_task(fn, range=t.range_shape, on=cl.on_master_node if t.on_master else None,
                          name=FAIL_KERNEL if t.fail_at is not None else t.name if t.name in (BAD_TASK, MISUSE_TASK)
                          else f"host_T{idx}")
        return cgf

    def _kernel_cgf(self, idx: int, t: Task):
        run = self
        p = self.p

        def cgf(cgh):
            bad: list = []
            getters = run._reads(cgh, t, bad)
            wacc = None
            w = t.write
            if w is not None:
                wshape = p.shapes[w.buffer] if w.space == "data" else p.targets[w.buffer].shape
                wacc = run.buffer(w.space, w.buffer).access(cgh, make_write_mapper(w, wshape), w.mode)
            made = {}
            # (in every other task the cl.reduction calls run in reverse: the kernel's reducers
            # follow reductions=, not the order of the calls)
            for k in (reversed(range(len(t.reds))) if idx % 2 else range(len(t.reds))):
                spec = t.reds[k]
                kw = {}
                if spec.identity:
                    kw["identity"] = _identity(spec.op, p.targets[spec.target].dtype)
                made[k] = cl.reduction(run.tbufs[spec.target], cgh, OPS[spec.op],
                                       initialize_to_identity=spec.init, **kw)
            reds = [made[k] for k in range(len(t.reds))]
            if t.split2d:
                cl.hint(cgh, cl.split_2d())
            if t.split1d:
                cl.hint(cgh, cl.split_1d())
            if t.gran is not None:
                cl.constrain_split(cgh, t.gran)
            k = t.oversub if t.oversub is not None else run.oversubscribe
            if k > 1 or t.oversub is not None:     # (an explicit oversubscribe(1) too)
                cl.hint(cgh, cl.oversubscribe(k))

            def kernel(chunk, *reducers):
                box = chunk.box
                run._check_geometry(idx, t, chunk)
                run._enter("kernel", idx, t, box)
                if t.split1d or t.gran is not None:
                    run._check_split(idx, t, box)
                if bad:
                    run._check_bad_reads(idx, box, bad)
                if t.local_range is not None:
                    run._check_local_range(idx, t, box)
                vals = element_values(t, box, run._shape_of, getters.at(chunk))
                if w is not None:
                    run._write(t, w, wacc, box, vals, chunk)
                for spec, red in zip(t.reds, reducers):
                    _combine(red, red_values(vals, spec, p.targets[spec.target].dtype), spec.combine)

            name = FAIL_KERNEL if t.fail_at is not None else t.name or f"kernel_T{idx}"
            offset = {"offset": t.offset} if t.offset is not None else {}
            if t.source and run.backend == "opencl":
                run.source_tasks.append(idx)
                cgh.parallel_for(t.range_shape, source_kernel(p, t), name=name, local_range=t.local_range,
                                 args=(*_source_reads(t, getters.accs), wacc, t.c0), **offset)
                return
            cgh.parallel_for(t.range_shape, kernel, name=name, reductions=reds, local_range=t.local_range,
                             **offset)
        return cgf

    def _enter(self, what: str, idx: int, t: Task, box: Box) -> None:
        """What every chunk of a host task or kernel does first: its injected delay and
        failure, then the bookkeeping the checks read (what ran, where)."""
        if t.delay and box.contains(task_box(t).min if t.kind == "kernel" else (0,) * box.dims):
            time.sleep(t.delay)
        if t.fail_at is not None and box.contains(t.fail_at):
            where = "partition" if what == "host" else "chunk"
            raise ValueError(f"injected failure in the {where} holding {t.fail_at}")
        self.executed.append((idx, box.area))
        if t.marker:
            self.ran.append((what, idx, self.rank, box))

    def _write(self, t: Task, w: Write, wacc, box: Box, vals: np.ndarray, chunk=None) -> None:
        p = self.p
        if w.space == "target":
            if box.contains(w.point):
                tv = p.targets[w.buffer]
                v = store(vals[tuple(a - b for a, b in zip(w.point, box.min))], tv.dtype)
                wacc[Box.full(tv.shape)] = np.asarray(v).reshape(tv.shape)
            return
        if w.mapper in ("all", "fixed", "neighborhood"):      # overlap kind: values by destination index
            granted = wacc.region
            for dest in granted:
                acc_set(wacc, dest, (_weighted_index(dest) + t.c0) % MOD, t.index, chunk)
            return
        dtype = p.dtypes[w.buffer]
        for src, dest, flip in write_pieces(w, box, p.shapes[w.buffer]):
            v = vals[src.slices_in(box)]
            if flip:
                v = np.flip(v, w.dim)
            old = np.asarray(acc_get(wacc, dest, t.index, chunk))
            acc_set(wacc, dest, apply_mode(w.mode, v, old, dest, dtype), t.index, chunk)

    def _check_geometry(self, idx: int, t: Task, chunk) -> None:
        """A kernel's chunk lies in its index space ``task_box(t)`` and is never empty, and it
        reports the task's global range and offset."""
        whole = task_box(t)
        got = (tuple(chunk.global_range), tuple(chunk.global_offset))
        want = (tuple(t.range_shape), tuple(whole.min))
        if chunk.box.empty or chunk.box.dims != whole.dims or not whole.contains(chunk.box) or got != want:
            self.geometry_problems.append((idx, self.rank, str(chunk.box), got, str(whole)))

    def _check_local_range(self, idx: int, t: Task, box: Box) -> None:
        base = task_box(t).min      # (work groups are aligned to the offset)
        for d, lr in enumerate(t.local_range):
            lo, hi, n = box.min[d] - base[d], box.max[d] - base[d], t.range_shape[d]
            if lo % lr or ((hi - lo) % lr and hi != n):
                self.violations.append((idx, self.rank, str(box), t.local_range))
                return

    def observe(self) -> dict:
        q = self.q
        out = {"fences": [f.result() for f in self.fence_futures]}
        _problem, observed = lifecycle(self.p)
        out["buffers"] = [q.fence(b).result() if keep else None for b, keep in zip(self.bufs, observed)]
        out["targets"] = [q.fence(b).result() if d else None
                          for b, d in zip(self.tbufs, fenced_at_end(self.p))]
        out["log"] = list(q.fence(self.log).result())
        # read only now, when every host task has run: a fence that handed out the live
        # object instead of a snapshot shows the final contents, whatever the timing
        out["log_fences"] = [list(f.result()) for f in self.log_fence_futures]
        q.wait()    # side-effect-free host tasks need not be done before any fence above
        out["violations"] = list(self.violations)
        out["kernel_geometry"] = list(self.geometry_problems)
        out["split"] = list(self.split_problems)
        out["plain"] = list(self.plain)
        out["wait_snapshots"] = list(self.wait_snapshots)
        out["partitions"] = list(self.partitions)
        out["bad_reads"] = list(self.bad_reads)
        out["coll"] = list(self.coll)
        out["hobjs"] = [list(h) if h is not None else None for h in self.hlists]
        out["hfences"] = [list(f.result()) for f in self.hfence_futures]
        out["geometry"] = list(self.geometry)
        out["source"] = list(self.source_tasks)
        out["cg_errors"] = list(self.cg_errors)
        # every fence above is resolved: the runtime holds none of them any more (it kept the
        # last one, and its result, until the next fence)
        out["held_fences"] = [getattr(f, "task", None) for f in q.runtime._fences]
        return out


def fenced_at_end(p: Program) -> list[bool]:
    """Targets whose final value is fenced at the end: defined ones, except those last
    produced by a reduction and then read only by master-node host tasks (the value is
    consumed on rank 0 alone, and the master's record is what is compared)."""
    defined = [t.init is not None for t in p.targets]
    master_only = [False] * len(p.targets)
    for t in p.tasks:
        for rd in t.reads:
            if rd.space == "target":
                master_only[rd.buffer] = t.kind == "master" and master_only[rd.buffer] is not False
        for spec in t.reds:
            defined[spec.target] = True
            master_only[spec.target] = None        # produced by a reduction, not consumed yet
        if t.write is not None and t.write.space == "target" and not task_box(t).empty:
            defined[t.write.buffer] = True      # (a kernel over an empty range writes nothing)
            master_only[t.write.buffer] = False
        if t.kind == "fence" and t.fence_space == "target":
            master_only[t.fence_index] = False
    return [d and m is not True for d, m in zip(defined, master_only)]


def _identity(op: str, dtype: str):
    dt = np.dtype(dtype)
    if op in ("plus", "bit_or", "bit_xor"):
        return dt.type(0)
    if op == "multiplies":
        return dt.type(1)
    if op == "bit_and":
        return dt.type(-1)
    if op == "logical_and":
        return True
    if op == "logical_or":
        return False
    big = np.inf if dt.kind == "f" else np.iinfo(dt).max
    return dt.type(big) if op == "minimum" else dt.type(-big if dt.kind == "f" else np.iinfo(dt).min)


def _combine(red, values: np.ndarray, how: str) -> None:
    flat = values.reshape(-1)
    if how == "halves" and flat.size > 1:
        red.combine(flat[: flat.size // 2])
        red.combine(flat[flat.size // 2:])
    elif how == "elements" and flat.size <= 64:
        for v in flat:            # numpy scalars of the values' dtype
            red.combine(v)
    else:
        red.combine(values)


def _read_any(accessors, box: Box, style: str = "box", chunk=None) -> np.ndarray:
    """Several accessors of one buffer: the first whose granted region holds the box (as int64)."""
    for a in accessors:
        reg = a.region
        if reg is not None and (box.empty or reg.contains(box)):
            return as_int(acc_get(a, box, style, chunk))
    return as_int(acc_get(accessors[0], box, style, chunk))


class _BoxKey:
    """A key with a ``box`` attribute, as a chunk or partition has (``acc[chunk]`` for a box
    that is not the chunk's own)."""
    __slots__ = ("box",)

    def __init__(self, box: Box):
        self.box = box


def _style_for(style: str, box: Box) -> str:
    if box.dims == 0 or (style == "fancy" and box.empty):
        return "box"            # (0-D targets: no slices, no integer index; no index arrays of nothing)
    if style == "mixed":
        return INDEX_STYLES[(sum(box.min) * 7 + box.area + box.dims) % 5]
    return style


def _slices_key(box: Box):
    key = tuple(slice(a, b) for a, b in zip(box.min, box.max))
    if box.dims == 1 and box.min[0] % 2:
        return key[0]           # 1-D: a bare slice (the general path) or a 1-tuple (the fast one)
    return key


def _fancy_key(box: Box):
    """``box`` as numpy integer (fancy) indices in global coordinates: ``np.ix_`` of its ranges,
    or for 1-D boxes at an odd start a plain list."""
    axes = [np.arange(a, b) for a, b in zip(box.min, box.max)]
    if box.dims == 1 and box.min[0] % 2:
        return [int(x) for x in axes[0]]
    return np.ix_(*axes)


def _int_key(box: Box, idx: tuple):
    g = tuple(int(a + i) for a, i in zip(box.min, idx))
    if box.dims == 1 and g[0] % 2:
        return g[0]
    return g


def _chunk_key(chunk, box: Box):
    """The chunk (or partition) itself where its box is ``box`` (the same dimensionality too:
    boxes compare as their 3-D embedding), else a key holding ``box``."""
    if chunk is not None and chunk.box.dims == box.dims and chunk.box == box:
        return chunk
    return _BoxKey(box)


def acc_get(acc, box: Box, style: str = "box", chunk=None):
    """``acc``'s elements in ``box``, read with the key ``style`` gives."""
    style = _style_for(style, box)
    if style == "box":
        return acc[box]
    if style == "chunk":
        return acc[_chunk_key(chunk, box)]
    if style == "slices":
        return acc[_slices_key(box)]
    if style == "ints":
        out = np.empty(box.range, dtype=acc.dtype)
        for idx in np.ndindex(*box.range):
            out[idx] = acc[_int_key(box, idx)]
        return out
    if style == "ellipsis":
        whole = _whole(acc, box)
        return whole[tuple(slice(a - o, b - o) for a, b, o in zip(box.min, box.max, acc.offset))]
    if style == "fancy":
        return acc[_fancy_key(box)]
    raise ValueError(style)


def _whole(acc, box: Box):
    """The accessor's allocation, as ``acc[...]`` or as ``acc.array`` (by the box's corner, so
    no draw is added and every seed keeps its program)."""
    return acc.array if sum(box.min) % 2 else acc[...]


def acc_set(acc, box: Box, value, style: str = "box", chunk=None) -> None:
    """Write ``value`` (of ``box``'s shape) to ``acc``'s elements in ``box``, with the key ``style`` gives."""
    style = _style_for(style, box)
    if style == "box":
        acc[box] = value
    elif style == "chunk":
        acc[_chunk_key(chunk, box)] = value
    elif style == "slices":
        acc[_slices_key(box)] = value
    elif style == "ints":
        value = np.asarray(value)       # (shaped as numpy's setitem would: a point write's (1, 1) to (1,))
        value = value.reshape(box.range) if value.size == box.area else np.broadcast_to(value, tuple(box.range))
        for idx in np.ndindex(*box.range):
            acc[_int_key(box, idx)] = value[idx]
    elif style == "ellipsis":
        whole = _whole(acc, box)
        whole[tuple(slice(a - o, b - o) for a, b, o in zip(box.min, box.max, acc.offset))] = value
    elif style == "fancy":
        value = np.asarray(value)       # (a point write's (1, 1) to the box's shape)
        acc[_fancy_key(box)] = value.reshape(box.range) if value.size == box.area else value
    else:
        raise ValueError(style)


def fence_region(boxes: list[Box]):
    """The cl.Region a region fence passes (its one box, or the halves it merges)."""
    return cl.Region(boxes)


def _suspending(sub: str):
    """cg_call generator_* / async_*: a kernel or host task that is a generator, a coroutine
    function or an async generator (its body would never run)."""
    if sub.startswith("generator"):
        def misuse_gen(chunk):
            yield chunk
        return misuse_gen
    if sub == "async_gen_host":
        async def misuse_agen(chunk):
            yield chunk
        return misuse_agen

    async def misuse_async(chunk):
        return chunk
    return misuse_async


def run_celeritas(p: Program, q: cl.Queue, *, oversubscribe: int = 1, ran: list | None = None,
                  gather: bool = False, backend: str = "host") -> dict:
    """Run a ``main`` program on ``q``; this rank's observations (``gather``: every rank's, via a collective)."""
    run = _Run(p, q, oversubscribe, ran, backend)
    for idx, t in enumerate(p.tasks):
        run.submit(idx, t)
    obs = run.observe()
    if gather:
        return {"ranks": _allgather(q, obs)}
    return obs


def _allgather(q: cl.Queue, obj) -> list:
    box = cl.HostObject([])

    def cgf(cgh):
        lst = cl.side_effect(box, cgh)
        cgh.host_task(lambda part: lst.append(part.comm.allgather(obj)), on=cl.collective, name="gather")
    q.submit(cgf)
    return q.fence(box).result()[0]


def _other_devices(q: cl.Queue) -> str:
    return f"host:{q.num_devices + 1}"


def run_expecting_error(p: Program, q: cl.Queue | None, *, oversubscribe: int = 1, ran: list | None = None) -> dict:
    """Run a ``fail`` / ``bad_reduction`` / ``overlap`` / ``misuse`` program; where (if at all) it
    raised.  ``q`` None: made here (``cl.Queue(**config_queue_kwargs(p))``), at the stage ``setup``."""
    stage = "setup"
    try:
        if q is None:
            q = cl.Queue(**config_queue_kwargs(p))
        run = _Run(p, q, oversubscribe, ran)
        for idx, t in enumerate(p.tasks):
            stage = f"submit T{idx}"
            run.submit(idx, t)
        stage = f"sync {p.sync}"
        if p.sync == "wait":
            q.wait()
        elif p.sync == "fence":
            written = [t.write.buffer for t in p.tasks if t.write is not None and t.write.space == "data"]
            if p.kind == "bad_reduction":
                buf = run.tbufs[0]
            elif p.kind == "misuse":
                buf = run.bufs[p.tasks[-1].write.buffer]     # (what the misuse task writes)
            elif p.kind == "fail":
                # the last buffer a dependent wrote, else the failing task's own output
                after = [t.write.buffer for t in p.tasks if t.marker and t.write is not None]
                buf = run.bufs[after[-1] if after else 0]
            else:
                buf = run.bufs[written[-1]]
            result = q.fence(buf).result(timeout=120)
            if p.kind == "overlap":
                return {"error": None, "stage": "done", "result": result}
        elif p.sync == "fence_log":
            q.fence(run.log).result(timeout=120)
        elif p.sync == "shutdown":
            q.shutdown()
            return {"error": None, "stage": "done"}
        elif p.sync == "fence_shutdown":      # (misuse diverge: a fence of what the misuse task writes)
            stage = "sync fence"
            q.fence(run.bufs[p.tasks[-1].write.buffer]).result(timeout=120)
            stage = "sync shutdown"
            q.shutdown()
            return {"error": None, "stage": "done"}
        stage = "final wait"
        q.wait()
        return {"error": None, "stage": "done"}
    except Exception as exc:  # noqa: BLE001 - the outcome is what is checked
        return {"error": exc, "stage": stage}


# ---- configurations and the simulated cluster --------------------------------------------------
@dataclass(frozen=True)
class Config:
    ranks: int = 1
    devices: int = 1
    lookahead: str = "auto"
    oversubscribe: int = 1
    transfers: str = "staged"
    backend: str = "host"           # host | opencl | cuda (the CUDA backend on tests/fake_cupy's CuPy
                                    # stand-in: the fuzzer's kernels compute with numpy)
    accessor_checks: bool = True
    replay: str = "on"              # CELERITAS_REPLAY
    memory: float | None = None     # host devices' capacity: this fraction of the program's bytes (see
                                    # device_memory_for), so that buffers are evicted and chunks batched
    ahead: int | None = None        # CELERITAS_MAX_TASKS_AHEAD: small, so that submit waits for the executor
    huge: str | None = None         # CELERITAS_HUGE_PAGES: "0" gives every host allocation its own
                                    # 2 MiB-aligned mapping (the fuzzer's buffers are all small)
    pause: str | None = None        # CELERITAS_PAUSE_AHEAD: "2" pauses the application thread after most submits
    inline: str | None = None       # CELERITAS_INLINE_US: "0" sends all work to the lanes, "1" nearly all
                                    # (device-queue kernels then enqueued by the executor), "1000000" runs
                                    # every kernel inline (and then directly from its batch) once measured
    horizon_step: int = 2           # CELERITAS_HORIZON_STEP (HORIZON_STEP_CHOICES)
    horizon_parallelism: int | None = None  # CELERITAS_HORIZON_MAX_PARALLELISM (None: the default, 64)
    diagnostics: str = "error"      # CELERITAS_DIAGNOSTICS: warn / off only for main programs (program_config)
    batch: float | None = None      # main only: host devices' capacity this fraction of the way from the
                                    # largest one-row working set to the largest task footprint
                                    # (device_memory_batched), so that chunks are cut into batches
    ooc_overlap: str | None = None  # CELERITAS_OUT_OF_CORE_OVERLAP: on / off (None: the default, on)
    device_delay_us: int | None = None  # cuda: the stand-in's time per device item after the one before
                                        # it on its stream (None: 20 us; 0: done when enqueued; 300: the
                                        # lanes' workers and waiters fall behind the executor)
    cuda_driver: str | None = None  # cuda: "off" runs the stand-in without its GIL-keeping driver calls
                                    # (as where libcuda cannot be bound: CuPy's calls alone)
    compile_after: int | None = None  # scheduler.replay.COMPILE_AFTER for the run: 1 compiles a
                                      # template's builder at its first replay, so that short programs reach
                                      # the compiled builders (and the accesses lists they keep, which direct
                                      # kernel runs keep launch contexts for); None: the default (8 replays)
    repeat: int = 1                 # the fuzzer's program for this configuration has its loops this many times
                                    # longer (generate's ``repeat``): steps replay and hit, and with
                                    # compile_after=1 run compiled builders (a program, not a runtime setting)

    def env(self) -> dict:
        env = {"CELERITAS_LOOKAHEAD": self.lookahead, "CELERITAS_HORIZON_STEP": str(self.horizon_step),
               "CELERITAS_MPI_DEVICE_MEMORY": self.transfers,
               "CELERITAS_DIAGNOSTICS": self.diagnostics, "CELERITAS_REPLAY": self.replay,
               "CELERITAS_ACCESSOR_CHECKS": "1" if self.accessor_checks else "0"}
        if self.horizon_parallelism is not None:
            env["CELERITAS_HORIZON_MAX_PARALLELISM"] = str(self.horizon_parallelism)
        if self.ahead is not None:
            env["CELERITAS_MAX_TASKS_AHEAD"] = str(self.ahead)
        if self.huge is not None:
            env["CELERITAS_HUGE_PAGES"] = self.huge
        if self.inline is not None:
            env["CELERITAS_INLINE_US"] = self.inline
        if self.pause is not None:
            env["CELERITAS_PAUSE_AHEAD"] = self.pause
        if self.ooc_overlap is not None:
            env["CELERITAS_OUT_OF_CORE_OVERLAP"] = self.ooc_overlap
        env["CELERITAS_DEVICES"] = self.devices_setting()
        return env

    def devices_setting(self) -> str:
        """``CELERITAS_DEVICES``: on opencl and cuda, the first device listed ``devices`` times."""
        if self.backend == "opencl":
            return "opencl:" + ",".join(["0:0"] * self.devices)
        if self.backend == "cuda":
            return "cuda:" + ",".join(["0"] * self.devices)
        return f"host:{self.devices}"

    def _with_backend(self, backend: str) -> Config:
        """On ``opencl`` and ``cuda``: staged transfers (OpenCL memory cannot be handed to MPI,
        nor CUDA memory to an MPI that is not CUDA-aware) and no host device capacity
        (``memory``, ``batch``: the host backend's)."""
        if backend == "host":
            return self
        return replace(self, backend=backend, transfers="staged", memory=None, batch=None)

    def describe(self) -> str:
        return (f"ranks={self.ranks} devices={self.backend}:{self.devices} lookahead={self.lookahead} "
                f"oversubscribe={self.oversubscribe} transfers={self.transfers} replay={self.replay}"
                + (f" memory={self.memory}" if self.memory is not None else "")
                + (f" ahead={self.ahead}" if self.ahead is not None else "")
                + (f" huge={self.huge}" if self.huge is not None else "")
                + (f" inline={self.inline}" if self.inline is not None else "")
                + (f" pause={self.pause}" if self.pause is not None else "")
                + (f" horizon_step={self.horizon_step}" if self.horizon_step != 2 else "")
                + (f" horizon_parallelism={self.horizon_parallelism}" if self.horizon_parallelism is not None
                   else "")
                + ("" if self.accessor_checks else " accessor_checks=0")
                + (f" batch={self.batch}" if self.batch is not None else "")
                + (f" ooc_overlap={self.ooc_overlap}" if self.ooc_overlap is not None else "")
                + (f" device_delay_us={self.device_delay_us}" if self.device_delay_us is not None else "")
                + (f" cuda_driver={self.cuda_driver}" if self.cuda_driver is not None else "")
                + (f" compile_after={self.compile_after}" if self.compile_after is not None else "")
                + (f" repeat={self.repeat}" if self.repeat != 1 else "")
                + (f" diagnostics={self.diagnostics}" if self.diagnostics != "error" else ""))

    def fields(self) -> str:
        """The ``--config`` text of ``tests.fuzz`` that pins this configuration."""
        return ",".join(f"{k}={int(v) if k == 'accessor_checks' else v}" for k in self.__dataclass_fields__
                        if (v := getattr(self, k)) is not None)


REPLAY_CHOICES = ("on", "on", "off")                # replay is the default: mostly on
MEMORY_CHOICES = (None, None, None, 0.3, 0.6, 1.0)  # unbounded, or a fraction of the program's bytes
AHEAD_CHOICES = (None, None, None, 2, 4, 8)        # the default bound, or one the programs reach
HUGE_CHOICES = (None, None, None, None, "0", "off")  # the default (2 MiB up), every allocation, none
# the default (100 us); never; 1 us (almost nothing inline, and what runs on a device queue is enqueued by
# the executor: the opencl backend's long-kernel path); every measured kernel
INLINE_CHOICES = (None, None, None, "0", "1", "1000000")
PAUSE_CHOICES = (None, None, None, "2", "0")         # the default (128 ahead), after most submits, never
ACCESSOR_CHECKS_OFF = 0.4                           # share of configurations without accessor checks
DIAGNOSTICS_CHOICES = ("error", "error", "error", "warn", "off")   # warn / off: main programs only
BATCH_CHOICES = (None, None, None, None, 0.0, 0.0, 0.0, 0.3)      # main programs only (program_config)
OOC_OVERLAP_CHOICES = (None, "on", "off")


DEVICE_DELAY_CHOICES = (None, 0, 300)                # cuda only: the stand-in's µs per device item
CUDA_DRIVER_CHOICES = (None, None, "off")            # cuda only: with the driver calls (as on a GPU), or not
COMPILE_AFTER_CHOICES = (None, None, 1)              # replay's default, or builders compiled at once
REPEAT_CHOICES = (1, 1, 4)                           # the fuzzer's loops as generated, or four times longer


@contextlib.contextmanager
def compiled_builders_after(n: int | None):
    """``scheduler.replay.COMPILE_AFTER`` at ``n`` while the block runs (None: as it
    is).  A module setting, not a configuration variable: the fuzzer's runs of one process
    run one program at a time."""
    if n is None:
        yield
        return
    import scheduler.replay as rp
    old = rp.COMPILE_AFTER
    rp.COMPILE_AFTER = n
    try:
        yield
    finally:
        rp.COMPILE_AFTER = old


def random_config(rng: random.Random) -> Config:
    cfg = _random_config(rng)
    if cfg.backend == "cuda":   # (drawn after everything else, and only here: no other seed changes)
        cfg = replace(cfg, device_delay_us=rng.choice(DEVICE_DELAY_CHOICES))
        cfg = replace(cfg, cuda_driver=rng.choice(CUDA_DRIVER_CHOICES))
    # (drawn last, after the backend's own fields: every configuration drawn before is unchanged)
    cfg = replace(cfg, compile_after=rng.choice(COMPILE_AFTER_CHOICES))
    return replace(cfg, repeat=rng.choice(REPEAT_CHOICES))


def _random_config(rng: random.Random) -> Config:
    return Config(ranks=rng.randint(1, 4), devices=rng.randint(1, 4),
                  lookahead=rng.choice(["none", "auto", "infinite"]), oversubscribe=rng.choice([1, 3]),
                  transfers=rng.choice(["staged", "direct"]), replay=rng.choice(REPLAY_CHOICES),
                  memory=rng.choice(MEMORY_CHOICES), ahead=rng.choice(AHEAD_CHOICES),
                  huge=rng.choice(HUGE_CHOICES), inline=rng.choice(INLINE_CHOICES),
                  pause=rng.choice(PAUSE_CHOICES),
                  # (drawn last: every earlier field is what the seed gave before these existed)
                  horizon_step=rng.choice(HORIZON_STEP_CHOICES),
                  horizon_parallelism=rng.choice(HORIZON_PARALLELISM_CHOICES),
                  # (and these after those)
                  accessor_checks=rng.random() >= ACCESSOR_CHECKS_OFF,
                  diagnostics=rng.choice(DIAGNOSTICS_CHOICES),
                  # (and these after those)
                  batch=rng.choice(BATCH_CHOICES), ooc_overlap=rng.choice(OOC_OVERLAP_CHOICES))._with_backend(
        # (and this after those): OpenCL where PoCL (or another platform) is there
        "opencl" if rng.random() < OPENCL_SHARE and opencl_available() else
        # (and this after that): the CUDA backend on the CuPy stand-in
        "cuda" if rng.random() < CUDA_SHARE else "host")


_OPENCL: list = []


def opencl_available() -> bool:
    """Whether an OpenCL device builds kernels here (asked once per process)."""
    if not _OPENCL:
        try:
            from executor.backends.opencl import opencl_devices
            opencl_devices()
            _OPENCL.append(True)
        except Exception:  # noqa: BLE001 - no PyOpenCL, no platform, no device that builds kernels
            _OPENCL.append(False)
    return _OPENCL[0]


def program_config(p: Program, cfg: Config) -> Config:
    """``cfg`` for ``p``: the error kinds (and bad_mapper, whose diagnostics are modelled as
    errors) run under ``CELERITAS_DIAGNOSTICS=error``; only ``main`` programs keep warn / off,
    and only they are run with the capacity that cuts chunks into batches (``batch``)."""
    if p.kind == "misuse" and p.tasks[-1].misuse == "outside" and not cfg.accessor_checks:
        cfg = replace(cfg, accessor_checks=True)     # (without checks an access outside is not an error)
    if p.kind == "misuse" and cfg.ranks < 2 and any(t.kind == "diverge" for t in p.tasks):
        cfg = replace(cfg, ranks=2)                  # (one rank has no other to diverge from)
    if p.kind != "main" and (cfg.diagnostics != "error" or cfg.batch is not None):
        # (and no batching: bad_mapper's model relies on unbatched chunks, _assert_unbatched)
        return replace(cfg, diagnostics="error", batch=None)
    return cfg


def device_memory_for(p: Program, fraction: float) -> int:
    """Bytes per host device: ``fraction`` of all the program's buffers together, but never
    less than what any one task touches in full (plus its reductions' scratch), so that
    every chunk fits in batches and a run never fails for lack of memory: what is tested
    is that eviction and batching keep the results exact."""
    def nbytes(space: str, idx: int) -> int:
        if space == "target":
            t = p.targets[idx]
            return int(np.prod(t.shape, dtype=np.int64)) * np.dtype(t.dtype).itemsize
        return int(np.prod(p.shapes[idx], dtype=np.int64)) * np.dtype(p.dtypes[idx]).itemsize
    total = sum(nbytes("data", i) for i in range(len(p.shapes))) + \
        sum(nbytes("target", i) for i in range(len(p.targets)))
    need = 0
    for t in p.tasks:
        touched = {(r.space, r.buffer) for r in t.reads}
        if t.write is not None:
            touched.add((t.write.space, t.write.buffer))
        touched |= {("target", r.target) for r in t.reds}
        # (reduction scratch: 16 B up to oversubscribe(3); a scratch value per part beyond)
        scratch = 16 if t.oversub is None or t.oversub <= 3 else 8 * (t.oversub + 1)
        need = max(need, sum(nbytes(*b) for b in touched) + scratch * len(t.reds))
    return max(need, int(total * fraction))


def _nbytes(p: Program, space: str, idx: int, box: Box | None = None) -> int:
    shape, dtype = (p.shapes[idx], p.dtypes[idx]) if space == "data" else (p.targets[idx].shape, p.targets[idx].dtype)
    area = int(np.prod(shape, dtype=np.int64)) if box is None else box.area
    return area * np.dtype(dtype).itemsize


def _bound_box(boxes: list[Box], dims: int) -> Box | None:
    live = [b for b in boxes if not b.empty]
    if not live:
        return None
    return Box(tuple(min(b.min[d] for b in live) for d in range(dims)),
               tuple(max(b.max[d] for b in live) for d in range(dims)), dims)


def _read_rows_bound(p: Program, t: Task, rd: Read, row: Box) -> Box:
    """A bound on what ``rd``'s mapper grants the part ``row`` of ``t``'s index space (any part
    of it: the mappers are monotonic), in the buffer's coordinates."""
    shape = _target_shape(p, rd)
    full = Box.full(shape)
    m = rd.mapper
    if m == "one_to_one":
        return row & full
    if m == "fixed":
        lo, hi = rd.fixed_box
        return Box(lo, hi, len(lo))
    if m == "neighborhood":
        return Box(tuple(a - e for a, e in zip(row.min, rd.extent)), tuple(b + e for b, e in zip(row.max, rd.extent)),
                   row.dims) & full
    if m == "transposed":
        return Box(tuple(reversed(row.min)), tuple(reversed(row.max)), row.dims) & full
    if m in ("slice", "mirror", "shift"):
        return _with_dim(row.min, row.max, rd.dim, 0, shape[rd.dim]) & full
    if m == "even_split":
        base = task_box(t).min[0]
        lo, hi = even_split_rows(shape[0], rd.k, (row.min[0] - base, row.max[0] - base), t.range_shape[0])
        return Box((lo,) + (0,) * (len(shape) - 1), (hi,) + tuple(shape[1:]), len(shape))
    return full     # all (and anything else: the whole buffer)


def _write_rows_bound(p: Program, t: Task, w: Write, row: Box) -> Box | None:
    if w.space == "target":
        return Box.full(p.targets[w.buffer].shape) if row.contains(w.point) else None
    shape = p.shapes[w.buffer]
    full = Box.full(shape)
    if w.mapper == "one_to_one":
        return row & full
    if w.mapper == "point":
        return Box(w.dest, tuple(a + 1 for a in w.dest), len(w.dest)) if row.contains(w.point) else None
    if w.mapper in ("mirror", "shift"):
        return _with_dim(row.min, row.max, w.dim, 0, shape[w.dim]) & full
    return full


def row_working_set(p: Program, t: Task) -> int:
    """A bound on the largest working set of one granule row of kernel ``t`` (rows of dimension
    0 in units of ``split_granularity``, from its index space's minimum, each with up to
    ``granularity - 1`` rows left over: the runtime never cuts a chunk finer): per buffer the bounding
    box of what its accessors grant the row, plus the reduction targets and their scratch.  No
    batch can be smaller, so a capacity below it fails with ``cl.OutOfMemoryError``."""
    whole = task_box(t)
    if t.kind != "kernel" or whole.empty or not t.range_shape:
        return 0
    g0 = split_granularity(t)[0]
    # (reduction scratch as device_memory_for counts it: a value per part beyond oversubscribe(3))
    scratch = 16 if t.oversub is None or t.oversub <= 3 else 8 * (t.oversub + 1)
    reds = sum(_nbytes(p, "target", s.target) + scratch for s in t.reds)
    worst = 0
    for a in range(whole.min[0], whole.max[0], g0):
        # (a granule: g0 rows, but the last of a chunk takes the rows left over, fewer than g0
        # more: split_sizes cuts whole units only)
        row = _with_dim(whole.min, whole.max, 0, a, min(a + 2 * g0 - 1, whole.max[0]))
        boxes: dict = {}
        for rd in t.reads:
            boxes.setdefault((rd.space, rd.buffer), []).append(_read_rows_bound(p, t, rd, row))
        if t.write is not None:
            wb = _write_rows_bound(p, t, t.write, row)
            if wb is not None:
                boxes.setdefault((t.write.space, t.write.buffer), []).append(wb)
        total = reds
        for (space, b), bs in boxes.items():
            dims = len(p.shapes[b]) if space == "data" else len(p.targets[b].shape)
            bb = _bound_box(bs, dims) if dims else Box.full(())
            if bb is not None:
                total += _nbytes(p, space, b, bb) if dims else _nbytes(p, space, b)
        worst = max(worst, total)
    return worst


def device_memory_batched(p: Program, fraction: float) -> int:
    """Bytes per host device between the largest one-row working set of any kernel
    (``row_working_set``: every batch fits, so no ``OutOfMemoryError``) and the largest whole
    footprint (``device_memory_for``), ``fraction`` of the way: where a chunk's working set
    does not fit, ``_batches`` cuts it into batches."""
    row = max((row_working_set(p, t) for t in p.tasks), default=0)
    # (twice the bound: a batch also holds what the bound does not model exactly, the
    # reduction scratch of every part of a device and the allocations sequenced batches
    # pin together; capacities between one and two rows, where one row per batch is the
    # only split that fits, are tested in test_out_of_core)
    row *= 2
    foot = device_memory_for(p, 0.0)
    return max(1, row, int(row + fraction * max(0, foot - row)))     # (1: a program without kernels)


def run_on_cluster(p: Program, cfg: Config, timeout: float = 120.0) -> dict:
    """Run ``p`` on a simulated cluster: ``{"ranks": [outcome per rank], "cluster_error", "ran"}``.

    A rank whose run raised re-raises after recording its outcome, so that
    ``run_cluster`` aborts the peers instead of leaving them waiting for its data.
    """
    outcomes: list[dict | None] = [None] * cfg.ranks
    ran: list = []
    lock = threading.Lock()

    def program(rank: int):
        if p.kind in MAIN_LIKE or recovers(p):
            q = cl.Queue()
            try:
                obs = run_celeritas(p, q, oversubscribe=cfg.oversubscribe, ran=ran, backend=cfg.backend)
            except Exception as exc:
                with lock:
                    outcomes[rank] = {"error": exc, "stage": "run"}
                raise
            outcomes[rank] = {"error": None, "obs": obs}
            return None
        res = run_expecting_error(p, None, oversubscribe=cfg.oversubscribe, ran=ran)
        outcomes[rank] = res
        if res["error"] is not None:
            raise res["error"]
        return None

    cluster_error = None
    env = cfg.env()
    if cfg.batch is not None and cfg.backend == "host":
        env["CELERITAS_HOST_DEVICE_MEMORY"] = str(device_memory_batched(p, cfg.batch))
    elif cfg.memory is not None and cfg.backend == "host":
        env["CELERITAS_HOST_DEVICE_MEMORY"] = str(device_memory_for(p, cfg.memory))
    if p.kind == "misuse" and any(t.kind == "diverge" for t in p.tasks):
        env["CELERITAS_DIVERGENCE_TIMEOUT"] = DIVERGENCE_TIMEOUT
    env.update(config_env(p))   # (last: the invalid value the program is about wins over the configuration's)
    watch = count_cache_clears() if p.kind == "main" and split_caches_overflow(p) else None
    try:
        # (the CUDA backend on the CuPy stand-in, only while this program runs: the tests after
        # it must not see a GPU; the fuzzer's kernels compute with numpy, which its arrays are)
        with (fake_cupy.stand_in(cfg.device_delay_us, driver=cfg.cuda_driver != "off") if cfg.backend == "cuda"
              else contextlib.nullcontext(),
              watch if watch is not None else contextlib.nullcontext(), compiled_builders_after(cfg.compile_after)):
            run_cluster(program, nodes=cfg.ranks, timeout=timeout, **env)
    except Exception as exc:  # noqa: BLE001 - judged by check()
        cluster_error = exc
    out = {"ranks": outcomes, "cluster_error": cluster_error, "ran": list(ran)}
    if watch is not None:
        out["cache_clears"] = dict(watch.clears)
    return out


def recorded_graphs(p: Program, q: cl.Queue, oversubscribe: int = 1, ran: list | None = None,
                    backend: str = "host") -> dict:
    """Run main program ``p`` on ``q`` (made with ``record=True``) and return what it recorded,
    as JSON text per graph: tasks, commands, instructions, pilots.  The run's buffers stay
    alive until the graphs are taken: frees issued when the garbage collector drops them would
    land before or after the last epoch by chance."""
    import json
    run = _Run(p, q, oversubscribe, ran, backend)
    for idx, t in enumerate(p.tasks):
        run.submit(idx, t)
    run.observe()
    q.wait()
    g = q.graphs()
    del run
    return {k: json.dumps(g[k], sort_keys=True, default=str) for k in ("tasks", "commands", "instructions", "pilots")}


def check_dry_run(p: Program, cfg: Config, timeout: float = 120.0) -> None:
    """A dry run (``CELERITAS_DRY_RUN_NODES`` = the configuration's ranks, in one process)
    builds exactly rank 0's graphs of the real run (every task, command, instruction and
    pilot, compared as recorded) and runs no kernel or host task; after it, a fence of a host
    object that cannot be copied fails that fence alone, and the queue goes on (raises
    ``Mismatch`` tagged ``dry_run``).  For ``main`` programs on the host backend, without
    ``CELERITAS_MAX_TASKS_AHEAD`` (see ``fuzz.dry_run_checked``: a throttled application's
    lookahead flushes depend on timing).  Both runs lift the default limit too: a program
    whose horizons come after nearly every task (``horizon_parallelism`` 1) passes its 512
    task ids, and the real and dry runs, both throttled, flushed at different tasks and
    allocated different boxes (seed 3549795 on 3 ranks, two runs in three)."""
    env = cfg.env()
    if cfg.batch is not None:
        env["CELERITAS_HOST_DEVICE_MEMORY"] = str(device_memory_batched(p, cfg.batch))
    elif cfg.memory is not None:
        env["CELERITAS_HOST_DEVICE_MEMORY"] = str(device_memory_for(p, cfg.memory))
    if cfg.ahead is None:
        env["CELERITAS_MAX_TASKS_AHEAD"] = str(1 << 20)
    env.update(config_env(p))

    def program(rank: int, dry: bool):
        q = cl.Queue(record=True)
        ran: list = []
        graphs = recorded_graphs(p, q, cfg.oversubscribe, ran, cfg.backend)
        problems = []
        if dry:
            try:
                q.fence(cl.HostObject(threading.Lock())).result(timeout=30)
                problems.append("a dry-run fence of a host object holding a lock returned")
            except cl.CeleritasError as exc:
                if "cannot be copied" not in str(exc):
                    problems.append(f"a dry-run fence of a host object holding a lock: {exc}")
            got = q.fence(cl.HostObject([7])).result(timeout=30)
            if got != [7]:
                problems.append(f"after it, a dry-run fence of HostObject([7]) returned {got!r}")
        return graphs, ran, problems

    with compiled_builders_after(cfg.compile_after):
        real = run_cluster(lambda r: program(r, False), nodes=cfg.ranks, timeout=timeout, **env)[0]
        try:
            dry = run_cluster(lambda r: program(r, True), nodes=1, timeout=timeout,
                              **{**env, "CELERITAS_DRY_RUN_NODES": str(cfg.ranks)})[0]
        except Exception as exc:  # noqa: BLE001 - the real run succeeded: the dry run's failure is the finding
            raise Mismatch([("dry_run", f"the dry run failed: {type(exc).__name__}: {exc}")]) from exc
    probs = [("dry_run", m) for m in dry[2]]
    if dry[1]:
        probs.append(("dry_run", f"the dry run ran tasks: {dry[1][:5]}"))
    for k in real[0]:
        if real[0][k] != dry[0][k]:
            probs.append(("dry_run", f"the dry run's {k} differ from rank 0's of a real run on {cfg.ranks} ranks"))
    if probs:
        raise Mismatch(probs)


# ---- checking ---------------------------------------------------------------------------------
class Mismatch(AssertionError):
    """A program disagreed with the model; ``tag`` classifies the first disagreement."""

    def __init__(self, problems: list[tuple[str, str]]):
        self.problems = problems
        self.tag = problems[0][0]
        super().__init__("\n".join(f"[{t}] {m}" for t, m in problems[:12])
                         + (f"\n... {len(problems) - 12} more" if len(problems) > 12 else ""))


def _err_text(exc: BaseException) -> str:
    return "".join(traceback.format_exception_only(type(exc), exc)).strip()


def _array_diff(got, want) -> str | None:
    got = np.asarray(got)
    want = np.asarray(want)
    if got.shape != want.shape:
        return f"shape {got.shape}, expected {want.shape}"
    if got.dtype != want.dtype:
        return f"dtype {got.dtype}, expected {want.dtype}"
    bad = np.argwhere(got != want)
    if not len(bad):
        return None
    i = tuple(int(x) for x in bad[0])
    return (f"{len(bad)} of {want.size} elements differ; first at {i}: got {got[i]!r}, expected {want[i]!r}"
            if want.ndim else f"got {got[()]!r}, expected {want[()]!r}")


def check(p: Program, want: dict | None, result: dict, cfg: Config) -> None:
    """Raise ``Mismatch`` if what the ranks observed differs from the model (or the expected error)."""
    if p.kind == "main":
        check_main(p, want, result, cfg)
    elif p.kind == "fail":
        check_fail(p, result)
    elif p.kind == "bad_reduction":
        check_bad_reduction(p, result)
    elif p.kind == "overlap":
        check_overlap(p, result, cfg)
    elif p.kind == "bad_mapper":
        check_bad_mapper(p, want, result, cfg)
    elif p.kind == "misuse":
        check_misuse(p, result, cfg, want)
    else:
        raise ValueError(p.kind)


def _crash_problems(result: dict) -> list[tuple[str, str]]:
    probs = []
    for r, o in enumerate(result["ranks"]):
        if o is None:
            ce = result["cluster_error"]
            probs.append(("hang" if ce is not None else "crash",
                          f"rank {r} did not finish: {_err_text(ce) if ce else '?'}"))
        elif o["error"] is not None:
            probs.append(("crash", f"rank {r} raised at {o['stage']}: {_err_text(o['error'])}"))
    probs.sort(key=lambda pr: pr[0] != "crash" or "abort" in pr[1].lower())   # the primary error first
    return probs


def check_main(p: Program, want: dict, result: dict, cfg: Config) -> None:
    probs = _crash_problems(result)
    if probs:
        raise Mismatch(probs)
    compare_observations(p, want, [o["obs"] for o in result["ranks"]], cfg.oversubscribe)
    clears = result.get("cache_clears")
    if clears is not None and clears.get(SPLIT_CACHE_ENTRIES, 0) < cfg.ranks:
        raise Mismatch([("cache_eviction", f"the kernels have more than {SPLIT_CACHE_ENTRIES} distinct index spaces, "
                                           f"so each of the {cfg.ranks} rank(s)' command graph must clear its "
                                           f"per-split caches ({SPLIT_CACHE_ENTRIES} entries) at least once; "
                                           f"clears seen, by cache size: {dict(clears)}")])


class count_cache_clears:
    """Within the block: how often a full ``BoundedCache`` forgot everything, by its size
    (``clears``).  The runtime counts none of this (``BoundedCache.put`` clears silently, and no
    stats name the caches), so the test side wraps ``put``: every cache of every rank of the
    simulated cluster in this process, while the block runs."""

    def __init__(self):
        self.clears: Counter = Counter()

    def __enter__(self):
        from scheduler.bounded_cache import BoundedCache
        self._cls, self._put = BoundedCache, BoundedCache.__dict__["put"]
        lock, clears, put = threading.Lock(), self.clears, self._put

        def counting_put(cache, key, value):
            if len(cache) >= cache.limit:
                with lock:
                    clears[cache.limit] += 1
            return put(cache, key, value)
        BoundedCache.put = counting_put
        return self

    def __exit__(self, *exc):
        self._cls.put = self._put
        return False


def compare_observations(p: Program, want: dict, per_rank: list[dict], oversubscribe: int = 1) -> None:
    """Every rank's observations against the model; host-task records are compared as the union over ranks."""
    probs: list[tuple[str, str]] = []
    h_union: Counter = Counter()
    plain_union: Counter = Counter()
    want_h = Counter(e for e in want["log"] if e[0] == "h")
    for r, o in enumerate(per_rank):
        probs += _rank_problems(p, want, r, o, oversubscribe, len(per_rank))
        h_union.update(e for e in o["log"] if e[0] == "h")
        plain_union.update(o["plain"])
    if h_union != want_h:
        missing = want_h - h_union
        extra = h_union - want_h
        probs.append(("host_range", f"host-task partitions (all ranks) recorded {sum(h_union.values())} entries, "
                                    f"expected {sum(want_h.values())}; missing {sorted(missing)[:4]}, "
                                    f"unexpected {sorted(extra)[:4]}"))
    probs += _epoch_problems(p, per_rank)
    if plain_union != Counter(want["plain"]):
        want_p = Counter(want["plain"])
        probs.append(("host_range", f"host-task partitions without side effect (all ranks) recorded "
                                    f"{sum(plain_union.values())} entries, expected {sum(want_p.values())}; "
                                    f"missing {sorted(want_p - plain_union)[:4]}, "
                                    f"unexpected {sorted(plain_union - want_p)[:4]}"))
    for j, wsnap in enumerate(want["log_fences"]):
        union: Counter = Counter()
        for r, o in enumerate(per_rank):
            snap = o["log_fences"][j]
            union.update(snap if r == 0 else [e for e in snap if e[0] != "m"])
        if union != Counter(wsnap):
            probs.append(("host_object_fence", f"fence {j} of the host object (all ranks) holds "
                                               f"{sum(union.values())} entries, expected {len(wsnap)} "
                                               f"(the object as it was when the fence ran)"))
    if probs:
        probs.sort(key=lambda pr: _RANK_PROBLEM_ORDER.index(pr[0]))
        raise Mismatch(probs)


# the order in which ``compare_observations`` reports its problems (the first one's tag is the mismatch's)
_RANK_PROBLEM_ORDER = ["bad_mapper:stale_read", "reduction", "geometry", "split", "local_range", "host_object_fence", "host_range",
                       "master", "collective", "host_object", "log_order", "epoch", "host_oversubscribe", "fence",
                       "fence_release",
                       "buffer"]


def _rank_problems(p: Program, want: dict, r: int, o: dict, oversubscribe: int,
                   ranks: int) -> list[tuple[str, str]]:
    """What rank ``r``'s own observations ``o`` show against the model, without the other
    ranks' (the checks over the union of all ranks are ``compare_observations``')."""
    probs: list[tuple[str, str]] = []
    want_m = [e for e in want["log"] if e[0] == "m"]
    fence_tasks = [k for k, t in enumerate(p.tasks) if t.kind == "fence"]
    for j, (g, w) in enumerate(zip(o["fences"], want["fences"])):
        d = _array_diff(g, w)
        if d:
            t = p.tasks[fence_tasks[j]]
            probs.append(("fence", f"rank {r}: fence T{fence_tasks[j]} of "
                                   f"{'b' if t.fence_space == 'data' else 'r'}{t.fence_index}: {d}"))
    for k, (g, w) in enumerate(zip(o["buffers"], want["buffers"])):
        if (g is None) != (w is None):      # (destroyed or never written: not fenced at the end)
            probs.append(("buffer", f"rank {r}: buffer b{k} was {'not ' if g is None else ''}fenced at the end, "
                                    f"the model {'has' if w is not None else 'has no'} final contents"))
            continue
        d = _array_diff(g, w) if w is not None else None
        if d:
            probs.append(("buffer", f"rank {r}: buffer b{k}: {d}"))
    for k, (g, w) in enumerate(zip(o["targets"], want["targets"])):
        if w is None or g is None:
            continue
        d = _array_diff(g, w)
        if d:
            probs.append(("reduction", f"rank {r}: reduction target r{k} ({p.targets[k].dtype}): {d}"))
    if o.get("bad_reads"):
        probs.append(("bad_mapper:stale_read", f"rank {r}: chunks of the bad_mapper task read other data than "
                                               f"the model's where their mapper maps them (task, rank, chunk, "
                                               f"rows, difference): {o['bad_reads'][:4]}"))
    if o.get("split"):
        probs.append(("split", f"rank {r}: split controls not honoured (task, rank, chunk, what): "
                               f"{o['split'][:4]}"))
    if o.get("kernel_geometry"):
        probs.append(("geometry", f"rank {r}: kernel chunks outside their task's index space, empty, or "
                                  f"with another global range / offset (task, rank, chunk, (range, offset) "
                                  f"seen, index space): {o['kernel_geometry'][:4]}"))
    if o.get("held_fences"):
        probs.append(("fence_release", f"rank {r}: the runtime still holds resolved fences (tasks "
                                       f"{o['held_fences'][:4]}), and so their results"))
    if o["violations"]:
        probs.append(("local_range", f"rank {r}: chunks not made of whole work groups "
                                     f"(task, rank, chunk, local_range): {o['violations'][:4]}"))
    log = o["log"]
    order = [e[1] for e in log]
    if order != sorted(order):
        probs.append(("log_order", f"rank {r}: side-effect host tasks ran out of submission order: {order}"))
    m = [e for e in log if e[0] == "m"]
    if r == 0 and m != want_m:
        probs.append(("master", f"rank 0: master-node host tasks saw {m}, expected {want_m}"))
    if r != 0 and m:
        probs.append(("master", f"rank {r}: master-node host tasks ran here: {m}"))
    on_master = [e for e in log if e[0] == "h" and p.tasks[e[1]].on_master]
    if r != 0 and on_master:
        probs.append(("master", f"rank {r}: partitions of an on_master_node host task ran here: "
                                f"{on_master[:4]}"))
    probs += _partition_problems(p, r, o["partitions"], oversubscribe)
    probs += _collective_problems(p, want, r, o, ranks)
    for j, snap in enumerate(o["log_fences"]):
        if snap != log[: len(snap)]:
            probs.append(("host_object_fence", f"rank {r}: fence {j} of the host object is not a snapshot "
                                               f"(not a prefix of the final object)"))
    return probs


def _collective_problems(p: Program, want: dict, r: int, o: dict, ranks: int) -> list[tuple[str, str]]:
    """Rank ``r``'s records of collective tasks (every group's in its submission order: tasks
    of one group run in order), of the extra host objects (exactly, in order: side effects
    serialize), of their fences (snapshots), and the partitions of master-node tasks placed
    by ``cl.once`` or by nothing."""
    probs: list[tuple[str, str]] = []
    got = o.get("coll", [])
    for g in range(p.ngroups + 1):
        mine = [e for e in got if e[2] == g]
        exp = [collective_record(i, gg, s, c, r, ranks) for i, gg, s, c in want["coll"] if gg == g]
        if mine != exp:
            how = "in another order" if sorted(mine) == sorted(exp) else "other records"
            first = next((j for j, (a, b) in enumerate(zip(mine, exp)) if a != b), min(len(mine), len(exp)))
            probs.append(("collective", f"rank {r}: collective group {g}: {how} ({len(mine)} records, expected "
                                        f"{len(exp)}); first difference at {first}: got "
                                        f"{mine[first] if first < len(mine) else None}, expected "
                                        f"{exp[first] if first < len(exp) else None}"))
    stray = [e for e in got if not 0 <= e[2] <= p.ngroups]
    if stray:
        probs.append(("collective", f"rank {r}: records of unknown collective groups: {stray[:3]}"))
    hobjs = o.get("hobjs", [])
    if len(hobjs) != len(want["hlog"]):
        probs.append(("host_object", f"rank {r}: {len(hobjs)} extra host objects, expected {len(want['hlog'])}"))
    for k, (g, w) in enumerate(zip(hobjs, want["hlog"])):
        exp = host_object_records(w, r, ranks)
        if g != exp:
            probs.append(("host_object", f"rank {r}: host object h{k} holds {g[:4] if g else g}..., expected "
                                         f"{exp[:4]}... ({len(g or ())} vs {len(exp)} entries)"))
    hf = o.get("hfences", [])
    ftasks = [t.fence_index for t in p.tasks if t.kind == "hfence"]
    if len(hf) != len(want["hfences"]):
        probs.append(("host_object", f"rank {r}: {len(hf)} fences of extra host objects, expected "
                                     f"{len(want['hfences'])}"))
    for j, (g, w) in enumerate(zip(hf, want["hfences"])):
        exp = host_object_records(w, r, ranks)
        if g != exp:
            probs.append(("host_object", f"rank {r}: fence {j} of h{ftasks[j]} holds {len(g)} entries "
                                         f"{g[:3]}..., expected {len(exp)} {exp[:3]}... (a snapshot when it ran)"))
    for idx, *geom in o.get("geometry", []):
        exp = MASTER_GEOMETRY[p.tasks[idx].form]
        if tuple(geom) != exp:
            probs.append(("master", f"rank {r}: T{idx} (master, on={p.tasks[idx].form or 'on_master_node'}) got a "
                                    f"partition of global range {geom[0]}, box {geom[1]}-{geom[2]}; expected "
                                    f"{exp[0]}, {exp[1]}-{exp[2]}"))
    return probs


def _epoch_problems(p: Program, per_rank: list[dict]) -> list[tuple[str, str]]:
    """When ``q.wait()`` returns, every kernel chunk and host-task partition submitted before it has run."""
    probs = []
    source = {i for o in per_rank for i in o.get("source", ())}    # (source kernels record nothing)
    for j, (pos, _) in enumerate(per_rank[0]["wait_snapshots"]):
        done: Counter = Counter()
        for o in per_rank:
            done.update(o["wait_snapshots"][j][1])
        for idx, t in enumerate(p.tasks[:pos]):
            if idx in source:
                continue
            if t.kind in ("kernel", "host"):
                want = int(np.prod(t.range_shape))
            elif t.kind == "master":
                want = 1
            elif t.kind == "collective":
                want = len(per_rank)
            else:
                continue
            if done[idx] != want:
                probs.append(("epoch", f"q.wait() at T{pos} returned when T{idx} ({t.kind}) had run "
                                       f"{done[idx]} of {want} elements (all ranks)"))
    return probs


def _partition_problems(p: Program, rank: int, partitions: list, oversubscribe: int) -> list[tuple[str, str]]:
    """Partitions of a side-effect-free host task on one rank: disjoint, one box together, and
    split ``oversubscribe`` ways (as Celerity splits a locally splittable task's chunk)."""
    by_task: dict = {}
    for idx, box in partitions:
        by_task.setdefault(idx, []).append(box)
    probs = []
    for idx, boxes in sorted(by_task.items()):
        t = p.tasks[idx]
        if sum(b.area for b in boxes) != cl.Region(boxes).area:
            probs.append(("host_range", f"rank {rank}: partitions of host task T{idx} overlap: {boxes}"))
            continue
        whole = cl.Region(boxes).bounding_box
        if whole.area != cl.Region(boxes).area:
            probs.append(("host_range", f"rank {rank}: partitions of host task T{idx} do not form one box: {boxes}"))
            continue
        k = t.oversub or oversubscribe
        # (cut at the task's split granularity: whole units of constrain_split; a split_2d hint
        # may cut the rank's chunk in two dimensions, so only the count is left unchecked there)
        want_n = len(split_1d(whole, split_granularity(t) if t.gran is not None else None, k))
        if k > 1 and not t.on_master and not t.split2d and len(boxes) != want_n:
            probs.append(("host_oversubscribe", f"rank {rank}: host task T{idx} over {whole} with "
                                                f"oversubscribe({k}) ran as {len(boxes)} partition(s), "
                                                f"expected {want_n}"))
    return probs


def check_fail(p: Program, result: dict) -> None:
    """No dependent ran; some rank raised a ``cl.KernelError`` naming the kernel; no other kind
    of error.  A rank that depends on nothing of the failed chunk may finish normally."""
    probs = []
    # A dependent only through the host object's side effect (a master task with no reads)
    # depends on the failed task's chunk on its own rank only: a chunk failing on another
    # rank cannot stop it, since nothing travels between the ranks for it.
    failed_on = {int(m) for o in result["ranks"] if o is not None and o["error"] is not None
                 for m in re.findall(r"failed on rank (\d+)", str(o["error"]))}
    ran = [e for e in result["ran"]
           if not (e[0] == "master" and not p.tasks[e[1]].reads and failed_on and e[2] not in failed_on)]
    if ran:
        probs.append(("fail:dependent_ran", f"tasks depending on the failed one ran: {ran[:4]}"))
    errors = []
    for r, o in enumerate(result["ranks"]):
        if o is None:
            probs.append(("hang", f"rank {r} did not finish: "
                                  f"{_err_text(result['cluster_error']) if result['cluster_error'] else '?'}"))
        elif o["error"] is not None:
            if not isinstance(o["error"], cl.CeleritasError):
                probs.append(("fail:foreign_error", f"rank {r} raised at {o['stage']}: {_err_text(o['error'])}"))
            errors.append((r, o["stage"], o["error"]))
    if not any(isinstance(e, cl.KernelError) and FAIL_KERNEL in str(e) for _r, _s, e in errors):
        if errors:
            probs.append(("fail:wrong_error", "no rank raised a cl.KernelError naming the kernel: " +
                          "; ".join(f"rank {r} at {s}: {_err_text(e)}" for r, s, e in errors)))
        elif not any(o is None for o in result["ranks"]):
            probs.append(("fail:no_error", f"every rank finished normally after the failing {FAIL_KERNEL!r}"))
    if probs:
        raise Mismatch(probs)


def check_bad_reduction(p: Program, result: dict) -> None:
    """Some rank raised a ``cl.CeleritasError`` naming the target and both dtypes.  (A rank
    without a chunk of the kernel may finish a ``wait`` normally: nothing there reads the target.)"""
    probs = []
    spec = next(s for s in p.tasks[0].reds if s.target == 0)
    td, vd = p.targets[0].dtype, spec.vdtype
    errors = []
    for r, o in enumerate(result["ranks"]):
        if o is None:
            probs.append(("hang", f"rank {r} did not finish"))
        elif o["error"] is not None:
            errors.append((r, o["stage"], o["error"]))
    ok = [e for _r, _s, e in errors
          if isinstance(e, cl.CeleritasError) and "r0" in str(e) and td in str(e) and vd in str(e)]
    if not errors and not probs:
        probs.append(("bad_red:no_error", f"a reduction of {vd} values into the {td} target r0 finished "
                                          f"without error on every rank"))
    elif errors and not ok:
        probs.append(("bad_red:wrong_error", f"no rank raised a cl.CeleritasError naming r0, {vd} and {td}: " +
                      "; ".join(f"rank {r} at {s}: {_err_text(e)}" for r, s, e in errors)))
    if probs:
        raise Mismatch(probs)


def chunks_possible(cfg: Config) -> int:
    return cfg.ranks * cfg.devices * cfg.oversubscribe


def check_overlap(p: Program, result: dict, cfg: Config) -> None:
    probs = []
    expect = overlap_expects_error(p, chunks_possible(cfg))
    outs = result["ranks"]
    diag = [o for o in outs if o is not None and isinstance(o["error"], cl.DiagnosticError)
            and "b0" in str(o["error"]) and "overlap" in str(o["error"])]
    if expect:
        if not diag:
            seen = "; ".join(f"rank {r}: " + ("hang" if o is None else "no error" if o["error"] is None
                                              else _err_text(o["error"])) for r, o in enumerate(outs))
            probs.append(("overlap:missed", f"chunks of {p.tasks[0].range_shape} on {cfg.describe()} write "
                                            f"overlapping parts of b0 ({p.tasks[0].write.mapper}) and no rank "
                                            f"reported a DiagnosticError: {seen}"))
    else:
        want = overlap_model(p)
        for r, o in enumerate(outs):
            if o is None or o["error"] is not None:
                probs.append(("overlap:spurious", f"rank {r}: one chunk cannot overlap itself, yet: "
                                                  f"{_err_text(o['error']) if o else 'hang'}"))
            else:
                d = _array_diff(o["result"], want)
                if d:
                    probs.append(("buffer", f"rank {r}: buffer b0: {d}"))
    for r, o in enumerate(outs):
        if o is not None and o["error"] is not None and not isinstance(o["error"], cl.CeleritasError):
            probs.append(("crash", f"rank {r}: {_err_text(o['error'])}"))
    if probs:
        raise Mismatch(probs)


def _bad_rows_region(rd: Read, shape, part: tuple[int, int]) -> Region:
    """What the bad access maps the kernel rows ``part`` (offset, size) to, as the runtime prints it."""
    box = bad_box(bad_rows(rd.form, rd.k, *part, shape[0]), shape)
    return Region([box] if box is not None else [])


def _task_box(t: Task, part: tuple[int, int]) -> Box:
    """Rows ``part`` (offset, size) of the bad task's range, whole in its other dimensions."""
    o, r = part
    n = len(t.range_shape)
    return Box((o,) + (0,) * (n - 1), (o + r,) + tuple(t.range_shape[1:]), n)


def bad_mapper_error(p: Program, cfg: Config, oc: BadMapperOutcome, rank: int) -> tuple[type, str]:
    """The error class and the exact message (a regex) that ``rank``, one of ``oc.failing``,
    raises: the command graph's (``_check_mapper_covers_chunks``: the first rank chunk mapped
    outside, the same on every rank) or its own instruction graph's (``_report_outside``:
    its first local chunk mapped outside)."""
    _idx, t, rd = bad_access(p)
    shape = p.shapes[rd.buffer]
    head = r'T\d+ "%s": the range mapper of its access to buffer B\d+ "b%d" maps ' % (BAD_TASK, rd.buffer)
    if oc.case == "rank_outside":
        bad = oc.outside[0]
        chunk = oc.chunks[bad]
        full = (0, t.range_shape[0])
        text = (f"rank {bad}'s chunk {_task_box(t, chunk)} to {_bad_rows_region(rd, shape, chunk)}, which is not "
                f"inside what it maps the whole range {_task_box(t, full)} to ({_bad_rows_region(rd, shape, full)}); "
                f"a range mapper must map a part of the range into what it maps the whole range to")
        return cl.DiagnosticError, head + re.escape(text) + "$"
    o, s, dev = oc.local[rank]
    chunk = oc.chunks[rank]
    box = _task_box(t, (o, s))
    part = f"device {dev}'s chunk {box}" if dev is not None else f"the chunk {box}"
    text = (f"{part} of rank {rank} to {_bad_rows_region(rd, shape, (o, s))}, which is not inside what it maps "
            f"the rank's chunk {_task_box(t, chunk)} to ({_bad_rows_region(rd, shape, chunk)}); a range mapper "
            f"must map a part of a chunk into what it maps the chunk to")
    if cfg.ranks > 1:
        return cl.RangeMapperError, head + re.escape(text) + re.escape(
            " (data moves between ranks by the rank's chunk: the part would read data that never arrived)") + "$"
    return cl.DiagnosticError, head + re.escape(text) + "$"


def _is_bad_mapper_error(exc) -> bool:
    """``exc`` is one of the range-mapper reports (command graph or instruction graph)."""
    return isinstance(exc, (cl.DiagnosticError, cl.RangeMapperError)) and "the range mapper of its access" in str(exc)


def _aborted(exc) -> bool:
    """An error a rank raises because another rank failed and ``run_cluster`` aborted the
    cluster: "rank R: internal error: CommunicatorError: " and then executor/communicator.py's
    "[rank R: ]cluster aborted" (a message, a request) or "collective aborted (another rank
    failed or timed out)" (a barrier, e.g. ``q.wait(barrier=True)``).  Narrower than
    celeritas.testing's ``_is_secondary``, which takes any "abort"."""
    return isinstance(exc, cl.CeleritasError) and re.search(
        r"CommunicatorError: (rank \d+: )?(cluster aborted$|collective aborted \()", str(exc)) is not None


def _wrong_error(kind: str, r: int, o: dict, e: BaseException, expected: str) -> tuple[str, str]:
    """A failing rank's error that is not the expected one: a crash if it is not a
    celeritas error, else ``<kind>:wrong_error``."""
    if not isinstance(e, cl.CeleritasError):
        return ("crash", f"rank {r} raised at {o['stage']}: {_err_text(e)}")
    return (f"{kind}:wrong_error", f"rank {r}: {expected}: {_err_text(e)}")


def check_bad_mapper(p: Program, want: dict, result: dict, cfg: Config) -> None:
    """The outcome ``bad_mapper_outcome`` predicts, exactly:

    * ``none``: no error on any rank, and everything ``main`` checks (``check_main``),
      including that the bad task's chunks read the model's data (``bad_reads``);
    * ``rank_outside``: every rank's command graph raises the ``DiagnosticError``
      (``bad_mapper_error``), so no rank finishes; a rank may instead be aborted (an error
      naming the abort) when another rank's error stops the cluster before its own
      scheduler reaches the task, but at least one rank raises the diagnostic;
    * ``local_outside:*``: the ranks in ``failing`` raise their own error (exactly
      ``bad_mapper_error``; one of several failing ranks may be aborted by another's).
      Every other rank either is aborted, or finishes normally; then all it observed
      must match the model (``_rank_problems``: buffers, fences, targets, the bad task's
      reads, work groups, its log's order, the master's records, partitions).  Which of
      the two is not deterministic: after the failing rank's scheduler stops, a peer that
      still needs its data (a push for a later task or fence) waits until the failing rank's
      application thread raises and ``run_cluster`` aborts the cluster; a peer that needs
      nothing more from it may finish first or be aborted first, depending on timing.
      Checks over the union of all ranks (host-task records, ``q.wait`` epochs) need every
      rank's records and are not made."""
    oc = bad_mapper_outcome(p, cfg)
    case = oc.case
    idx, t, rd = bad_access(p)
    outs = result["ranks"]
    what = (f'T{idx} ("{BAD_TASK}", {t.kind} over {t.range_shape}) reading b{rd.buffer} {p.shapes[rd.buffer]} '
            f'through {rd.form}{f"(k={rd.k})" if rd.form == "offset_eq" else ""}, rank chunks '
            f'{[(o, o + r) for o, r in oc.chunks]}, local chunks outside {oc.local} on {cfg.describe()}')
    probs: list[tuple[str, str]] = []
    if case == "none":
        for r, o in enumerate(outs):
            if o is not None and _is_bad_mapper_error(o["error"]):
                probs.append(("bad_mapper:spurious", f"rank {r}: {what}: no chunk is mapped outside what its "
                                                     f"mapper maps the whole (or its rank's chunk) to, yet: "
                                                     f"{_err_text(o['error'])}"))
        if probs:
            raise Mismatch(probs)
        check_main(p, want, result, cfg)
        return
    seen = "; ".join(f"rank {r}: " + ("hang" if o is None else "no error" if o["error"] is None
                                      else _err_text(o["error"])) for r, o in enumerate(outs))
    failing = oc.failing
    primary = []
    failing_probs = False       # a failing rank's own outcome was wrong (then that is the report)
    for r, o in enumerate(outs):
        if o is None:
            probs.append(("hang", f"rank {r} did not finish: "
                                  f"{_err_text(result['cluster_error']) if result['cluster_error'] else '?'}"))
            failing_probs = failing_probs or r in failing
            continue
        e = o["error"]
        if r in failing:
            cls, pattern = bad_mapper_error(p, cfg, oc, r)
            n_probs = len(probs)
            if e is None:
                probs.append(("bad_mapper:missed" if all(q is not None and q["error"] is None for q in outs)
                              else "bad_mapper:rank_finished",
                              f"rank {r} finished normally; {what}: it must raise {cls.__name__} ({case})"))
            elif type(e) is cls and re.fullmatch(pattern, str(e)):
                primary.append(r)
            elif _aborted(e) and (case == "rank_outside" or len(failing) > 1):
                pass    # (another rank's error stopped the cluster first)
            else:
                probs.append(_wrong_error("bad_mapper", r, o, e, f"{what}: expected {cls.__name__} matching "
                                                                 f"{pattern!r}, got"))
            failing_probs = failing_probs or len(probs) > n_probs
        elif e is None:
            probs += [(tag, f"rank {r} (finished normally while rank(s) {failing} failed): {msg}")
                      for tag, msg in _rank_problems(p, want, r, o["obs"], cfg.oversubscribe, cfg.ranks)]
        elif not _aborted(e):
            probs.append(("crash" if not isinstance(e, cl.CeleritasError) else "bad_mapper:wrong_error",
                          f"rank {r} raised at {o['stage']}, expected to be aborted or to finish ({what}): "
                          f"{_err_text(e)}"))
    if not primary and not failing_probs:
        probs.append(("bad_mapper:wrong_error", f"{what}: no rank raised the expected error ({case}): {seen}"))
    if probs:
        order = ["bad_mapper:missed", "bad_mapper:wrong_error", "crash", "hang", "bad_mapper:rank_finished",
                 *_RANK_PROBLEM_ORDER]
        probs.sort(key=lambda pr: order.index(pr[0]))
        raise Mismatch(probs)


def misuse_task(p: Program) -> tuple[int, Task]:
    for idx, t in enumerate(p.tasks):
        if t.misuse:
            return idx, t
    raise ValueError("a misuse program without a misuse task")


def _misuse_read(t: Task) -> Read:
    return next(rd for rd in t.reads if rd.form == "misuse" or rd.mapper in ("raising", "wrong_dims"))


@dataclass
class MisuseOutcome:
    """What a misuse program raises on one configuration (``misuse_error``)."""
    failing: list[int]          # the ranks that raise it: every rank (an error on the application
                                # thread: buffer, outside_kernel, the mappers), or the one holding
                                # the misbehaving chunk (outside, write_read)
    cls: type                   # the exact class
    pattern: str                # the whole message, a regex
    stage: str                  # where in run_expecting_error it is raised, a regex
    cause: type | None = None   # the class of its __cause__ (mapper_raises: the mapper's exception)
    patterns: dict | None = None    # a rank's own message where the ranks' differ (diverge), else ``pattern``
    may_finish: bool = False    # a rank at fault may finish, where another raised (diverge: a rank whose
                                # left neighbour is found out from its pending tasks, before announcing
                                # its epoch, waits for no epoch of its own and so finishes its program)


def misuse_error(p: Program, cfg: Config) -> MisuseOutcome:
    """The error of a misuse program, exactly (the messages of celeritas/buffer.py,
    accessor.py, handler.py's chunk suffix and range_mappers.py's mapper wrapper; docs/api.md
    says what each names: the buffer, the task, the rank and chunk, the mapper)."""
    idx, t = misuse_task(p)
    every = list(range(cfg.ranks))
    submit = re.escape(f"submit T{idx}")
    if t.misuse == "buffer":
        shape, dtype = p.shapes[t.fence_index], p.dtypes[t.fence_index]
        f = t.misuse_form
        text = {"shape": f"data of shape {shape} does not match shape {bad_buffer_shape(f, shape)}",
                "dtype": f"buffers hold booleans or numbers; dtype {np.dtype('U3')} is not supported",
                "not_dtype": "'no_such_dtype' is not a numpy dtype",
                "cast": f"data of dtype float64 cannot be stored in a buffer of dtype "
                        f"{'int64' if dtype != 'int64' else 'int32'}",
                "ndim": f"buffers have 0 to 3 dimensions, got shape {bad_buffer_shape(f, shape)}",
                "negative": f"negative extent in shape {bad_buffer_shape(f, shape)}"}[f]
        return MisuseOutcome(every, cl.BufferError, re.escape(text), submit)
    if t.misuse == "config":
        return MisuseOutcome(every, cl.ConfigError, config_error_pattern(t, cfg),
                             "setup" if t.misuse_form in ("env", "queue_arg", *CONFIG_START_FORMS) else submit)
    if t.misuse == "diverge":
        # the ring's check: the rank at fault compares with its left neighbour, its right neighbour
        # with it; any of them may be found out first (the others are then aborted or finish)
        n = cfg.ranks
        assert n >= 2, "a misuse diverge program runs on 2 or more ranks (program_config)"
        d = t.fence_index % n
        adj = sorted({d, (d + 1) % n})
        pats = {r: divergence_pattern(p, (r - 1) % n, r, d) for r in adj}
        return MisuseOutcome(adj, cl.DivergenceError, pats[adj[0]],
                             submit + r"|sync shutdown" + ("|sync fence" if p.sync == "fence_shutdown" else ""),
                             patterns=pats, may_finish=True)
    if t.kind == "bad_cg":
        cls, text = cg_misuse_error(p, t)
        return MisuseOutcome(every, cls, re.escape(text), submit)
    rd = _misuse_read(t)
    buf = r'B\d+ "b%d"' % rd.buffer
    what = "host task" if t.kind == "host" else "kernel"
    if t.misuse == "outside_kernel":
        return MisuseOutcome(every, cl.AccessError, f"accessor of buffer {buf} used outside its kernel or host task",
                             submit)
    if t.misuse == "mapper_raises" and rd.form:
        # (raised on the scheduler thread: at the next synchronization point, without the line of
        # the submit, as docs/api.md says)
        failing, chunk = partial_raise_outcome(p, cfg)
        if not failing:
            return MisuseOutcome([], cl.RangeMapperError, "", "")
        text = f"the mapper raised ValueError: {PARTIAL_RAISING_MSG} {rd.form} {rd.k}"
        # (or at the task's own submit where that waits for the executor: a small
        # CELERITAS_MAX_TASKS_AHEAD or CELERITAS_PAUSE_AHEAD)
        throttled = cfg.ahead is not None or cfg.pause not in (None, "0")
        return MisuseOutcome(failing, cl.RangeMapperError, _mapper_error_head(t, buf, chunk, site=False)
                             + re.escape(text), (submit + "|" if throttled else "") + r"sync \w+|final wait",
                             ValueError)
    if t.misuse in ("mapper_raises", "mapper_dims"):
        d = len(p.shapes[rd.buffer])
        head = _mapper_error_head(t, buf, (0, t.range_shape[0]), site=True)
        if t.misuse == "mapper_raises":
            return MisuseOutcome(every, cl.RangeMapperError,
                                 head + re.escape(f"the mapper raised ValueError: {RAISING_MAPPER_MSG}"), submit,
                                 ValueError)
        k = wrong_dims_of(d)
        if t.misuse_form == "mixed":
            box = Box((0,) * k, (1,) * k, k)
            text = (f"the mapper raised GeometryError: a Region's boxes must share one dimensionality: {box!r} is "
                    f"{k}-D, the boxes before it {d}-D")
            return MisuseOutcome(every, cl.RangeMapperError, head + re.escape(text), submit, cl.GeometryError)
        text = ("the mapper returned tuple; a range mapper must return a cl.Subrange, cl.Box or cl.Region"
                if t.misuse_form == "type" else f"the mapper returned a {k}-D {t.misuse_form} for a {d}-D buffer")
        return MisuseOutcome(every, cl.RangeMapperError, head + re.escape(text), submit, cl.RangeMapperError)
    # outside / write_read: the chunk holding misuse_at, on the rank whose chunk holds it
    row = t.misuse_at[0]
    chunks = bad_rank_chunks(t, cfg.ranks)
    rank = next(r for r, (o, s) in enumerate(chunks) if o <= row < o + s)
    o, s, _dev = next(c for c in bad_local_chunks(t, cfg, chunks[rank]) if c[0] <= row < c[0] + c[1])
    e = t.misuse_elem
    ebox = Box(e, tuple(x + 1 for x in e), len(e))
    if t.misuse == "outside":
        lo, hi = rd.fixed_box
        text = (f"access to {ebox} of buffer \x00 is outside what its range mapper grants this chunk "
                f"({Region([Box(lo, hi, len(lo))])}); mode read")
    else:
        text = "buffer \x00 is accessed read-only here"
    text += f" (in {what} '{MISUSE_TASK}' of task T\x01, rank {rank}, chunk {_task_box(t, (o, s))})"
    pattern = re.escape(text).replace("\x00", buf).replace("\x01", r"\d+")
    # (at the sync, or at the misuse task's own submit when that waits for the executor:
    # CELERITAS_MAX_TASKS_AHEAD, CELERITAS_PAUSE_AHEAD)
    return MisuseOutcome([rank], cl.AccessError, pattern, submit + r"|sync \w+|final wait")


def divergence_pattern(p: Program, left: int, rank: int, at_fault: int) -> str:
    """The whole message (a regex) of the DivergenceError that ``rank`` raises comparing its task
    stream with its ``left`` neighbour's (executor/mpi/divergence.py's ``_mismatch_message``, and
    ``_compare_pending``'s, which reads the same, or ``_compare_left_pending``'s, which differs in the
    parenthesis: the ids both ranks' pending tasks cover): the first differing entry by task id, a buffer
    made before task j sorting before task j.  Every rank submits the same tasks up to the misuse
    step, so both name the same task id j (not modelled: horizons take ids too), the id the rank
    at fault gives its renamed, re-ranged or extra task, or the task after its buffer, and the
    other rank its misuse task (or the task after its buffer).  Epoch #k: the k-th epoch after
    the initial one (T0), i.e. the q.shutdown() after the misuse step."""
    idx, t = misuse_task(p)
    a = t.misuse_arg
    waits = sum(1 for x in p.tasks[:idx] if x.kind == "wait")
    kind = "host_compute" if a["host"] else "device_compute"

    def entry(fault: bool) -> str:
        if "buffer" in a:
            bshape, dt, other, odt = a["buffer"]
            shape, dtype = (other, odt) if fault else (bshape, dt)
            data = (", with data" if fault else ", without data") if t.misuse_form == "host_data" else ""
            return f"buffer B{len(p.shapes) + len(p.targets)} {dtype} of shape {tuple(shape)}{data} (made before T\x00)"
        if t.misuse_form == "side_effect":  # (the log, H0: the first host object every rank makes)
            return (f"T\x00 ({kind} {MISUSE_TASK!r}, range {list(a['range'])}, accesses B{a['w']} discard_write"
                    + (", side effect on host object H0)" if fault else ")"))
        name, rng = MISUSE_TASK, a["range"]
        if fault and t.misuse_form == "name":
            name = DIVERGE_RENAMED
        elif fault and t.misuse_form == "extra":
            name = DIVERGE_EXTRA
        elif fault and t.misuse_form == "range":
            rng = a["other"]
        if t.misuse_form == "mode":    # (the accesses are named where nothing else differs)
            return f"T\x00 ({kind} {name!r}, range {list(rng)}, accesses B{a['w']} {'write' if fault else 'discard_write'})"
        return f"T\x00 ({kind} {name!r}, range {list(rng)})"
    text = (f"ranks {left} and {rank} submitted different task streams; the first differing task (\x02): "
            f"rank {left} submitted {entry(left == at_fault)}; rank {rank} submitted {entry(rank == at_fault)}")
    # where: at the epoch (q.shutdown()), or before it from the pending tasks a stalled rank sent
    # (a fence that waits, or any wait for data longer than the check's stall time)
    epoch = "0" if not waits else r"\d+"
    where = (f"(?:after epoch T{epoch}, epoch #{waits + 1}|among T\\d+\\.\\.T\\d+, which both submitted since "
             f"their last epoch, compared while a rank waited at a fence or for data)")
    pat = re.escape(text).replace("\x02", where)
    return pat.replace("\x00", r"(?P<t>\d+)", 1).replace("\x00", "(?P=t)")


def cg_misuse_error(p: Program, t: Task) -> tuple[type, str]:
    """(class, whole message) of a misuse cg_handler / cg_call / fence_region step, raised by the submit
    (or fence) on every rank: celeritas/handler.py's ``handler_of``, ``_set_kernel``, ``host_task``,
    ``_build`` and ``reduction``, buffer.py's ``access``, runtime.py's ``submit`` and ``fence``, restated."""
    a, sub = t.misuse_arg, t.misuse_form
    label = lambda k: f'B{k} "b{k}"'     # noqa: E731 - (misuse programs make every data buffer first, in order)
    if t.misuse == "fence_region":
        boxes = fence_region_boxes(p, t)
        bb = Box(boxes[0].min, boxes[-1].max, boxes[0].dims)
        return cl.CeleritasError, (f"fence of buffer {label(a['b'])}: a fence returns one array, so it takes a "
                                   f"cl.Subrange or cl.Box, not a region of {len(boxes)} boxes (fence its bounding "
                                   f"box {bb}, or one fence per box)")
    if t.misuse == "cg_handler":
        target, how = sub.split(":")
        what = {"access": f"Buffer.access of buffer {label(a['b'])}", "reduction": "cl.reduction",
                "side_effect": "cl.side_effect", "hint": "cl.hint", "constrain_split": "cl.constrain_split"}[target]
        if how == "none":
            return cl.CeleritasError, (f"{what} takes the command group handler (the cgh argument of the command "
                                       f"group function) as its cgh, got NoneType")
        return cl.CeleritasError, (f"{what}: this cgh belongs to a command group that was already submitted; use "
                                   f"the cgh the current command group function receives")
    if sub == "reduction_target":
        return cl.CeleritasError, f"cl.reduction takes a cl.Buffer as its target, got {CG_TARGETS[a['v']]}"
    if sub == "side_effect_kernel":
        return cl.CeleritasError, (f"kernel {MISUSE_TASK!r}: cl.side_effect orders host tasks only; a parallel_for's "
                                   f"chunks run on devices, concurrently (use a host_task for host object "
                                   f"<cl.HostObject H0 list>)")
    if sub == "collective_bad_group":
        return cl.CeleritasError, "cl.collective(group) takes a cl.CollectiveGroup(), got str"
    if sub.startswith("placement_called"):
        kind = "on_master_node" if sub.endswith("master") else "once"
        return cl.CeleritasError, f"cl.{kind} is a placement, not a function: write on=cl.{kind} (without parentheses)"
    if sub.startswith("host_range"):
        once = sub == "host_range_once"
        return cl.CeleritasError, (f"host_task(on=cl.{'once' if once else 'collective'}) runs "
                                   f"{'once' if once else 'once per rank'}; range={tuple(a['range'])!r} would be "
                                   f"ignored (a host task over a range takes no on=, or on=cl.on_master_node)")
    if sub == "no_init_read":
        return cl.AccessError, (f"buffer {label(a['b'])}: no_init=True discards the old contents, which a cl.read "
                                f"access reads (no_init applies to cl.write and cl.read_write)")
    if sub in CG_HINTS:
        first, second = (f"cl.{kind}({', '.join(map(str, arg))})" for kind, *arg in CG_HINTS[sub])
        rule = ("give each kind of hint once" if CG_HINTS[sub][0][0] == CG_HINTS[sub][1][0]
                else "cl.split_1d() and cl.split_2d() cannot be combined")
        return cl.CeleritasError, f"cl.hint({second}): this command group already has the hint {first}; {rule}"
    if sub == "name_type":
        v = CG_NAMES[a["v"]]
        return cl.CeleritasError, f"a kernel's or host task's name= is a str, got {type(v).__name__} {v!r}"
    if sub == "submit_noncallable":
        return cl.CeleritasError, (f"q.submit takes a command group function cgf(cgh), got "
                                   f"{type(CG_NONCALLABLES[a['v']]).__name__}")
    what = "coroutine (async def)" if sub.startswith("async") else "generator (it yields)"
    return cl.CeleritasError, (f"{'host_task' if _cg_host(t) else 'parallel_for'} {MISUSE_TASK!r}: the function "
                               f"is a {what}; a kernel or host task is a plain function, run once per chunk")


def recovers(p: Program) -> bool:
    """A misuse program whose misuse the runtime survives (cg_handler, cg_call, fence_region): run
    and checked as ``main`` is, besides the error of the misuse step."""
    return p.kind == "misuse" and any(t.kind == "bad_cg" for t in p.tasks)


def check_cg_misuse(p: Program, want: dict, result: dict, cfg: Config) -> None:
    """The misuse step raised exactly ``cg_misuse_error``'s error on every rank, at that submit,
    and everything else is what ``main`` checks (the failed submit made no task: its kernel would
    have written POISON; the runtime goes on)."""
    probs = _crash_problems(result)
    if probs:
        raise Mismatch(probs)
    idx, t = misuse_task(p)
    cls, text = cg_misuse_error(p, t)
    what = f"T{idx} ({_describe_task(t)}) on {cfg.describe()}"
    for r, o in enumerate(result["ranks"]):
        got = [e for i, e in o["obs"]["cg_errors"] if i == idx]
        if not got or got[0] is None:
            probs.append(("misuse:missed", f"rank {r}: {what}: the submit returned; it must raise {cls.__name__}: "
                                           f"{text}"))
        elif type(got[0]) is not cls or str(got[0]) != text:
            probs.append(("misuse:wrong_error", f"rank {r}: {what}: raised {_err_text(got[0])}; expected "
                                                f"{cls.__name__}: {text}"))
    if probs:
        raise Mismatch(probs)
    compare_observations(p, want, [o["obs"] for o in result["ranks"]], cfg.oversubscribe)


def config_error_pattern(t: Task, cfg: Config) -> str:
    """The whole message (a regex) of a misuse config program's ``cl.ConfigError``."""
    setting, value = config_setting(t)
    if t.misuse_form == "env":
        return re.escape(CONFIG_ENV_CASES[t.fence_index][2].format(var=setting, raw=value))
    if t.misuse_form == "queue_arg":
        return CONFIG_QUEUE_CASES[t.fence_index][2]
    if t.misuse_form == "output":
        _var, _value, folder, err = CONFIG_OUTPUT_CASES[t.fence_index]
        folder = folder.format(file=not_a_folder())
        return re.escape(f"{setting}: cannot create the folder {folder!r} ({os.strerror(err)})")
    if t.misuse_form == "device":
        return device_error_pattern(value, cfg.backend == "cuda")
    if t.misuse_form == "second_queue" and value is None:
        now = cfg.devices_setting()
        return re.escape(f"the runtime already runs on {now}; create the Queue with devices='host:{cfg.devices + 1}' "
                         f"before any Buffer")
    return re.escape(f"lookahead {value!r}; use one of none, auto, infinite")


def _mapper_error_head(t: Task, buf: str, rows: tuple[int, int], site: bool | None) -> str:
    """The start of range_mappers.py's ``RangeMapperError`` message (a regex) for the misuse
    task's mapper of buffer ``buf`` (a regex) and its chunk of ``rows`` (offset, size) along
    dim 0; ``site``: whether the line of the submit is named."""
    what = "host task" if t.kind == "host" else "kernel"
    box = _task_box(t, rows)
    at = r" \(submitted at [^()]*\)"
    return (f"{what} '{MISUSE_TASK}'{at if site else ''}: range mapper .+ for buffer {buf}, chunk "
            + re.escape(f"Subrange(offset={box.offset}, range={box.range}): "))


def partial_raise_outcome(p: Program, cfg: Config) -> tuple[list[int], tuple[int, int] | None]:
    """(the ranks that raise, the chunk ``(offset, size)`` the error names) for a misuse
    program whose mapper raises for part of the range only (``partial_raises``).  The task
    manager maps the whole range (never raising); every rank's command graph maps every rank's
    chunk (``bad_rank_chunks``), so one that raises fails every rank; else a rank whose chunk is
    cut into two or more local chunks (``bad_local_chunks``) maps each in its instruction
    graph, and the first that raises fails that rank alone; else nothing raises (a master-node
    task, one chunk, a k no chunk starts at)."""
    _idx, t = misuse_task(p)
    rd = _misuse_read(t)
    n = t.range_shape[0]
    _assert_unbatched(p, t, cfg)
    chunks = bad_rank_chunks(t, cfg.ranks)
    for c in chunks:
        if partial_raises(rd.form, rd.k, *c, n):
            return list(range(cfg.ranks)), c
    for rank, c in enumerate(chunks):
        parts = bad_local_chunks(t, cfg, c)
        for o, r, _dev in parts if len(parts) >= 2 else ():
            if partial_raises(rd.form, rd.k, o, r, n):
                return [rank], (o, r)
    return [], None


def check_misuse(p: Program, result: dict, cfg: Config, want: dict | None = None) -> None:
    """The error ``misuse_error`` predicts, of exactly that class and message (and cause),
    raised where it says, by the ranks at fault; no rank hangs.  Several ranks at fault (an
    error on the application thread, the same on every rank): each raises it, or is aborted
    by another's (but at least one raises it), and none finishes.  One rank at fault (a
    chunk in a kernel or host task): every other rank is aborted or finishes normally, as
    ``check_bad_mapper`` allows; but a rank whose sync fenced the buffer the misuse task
    writes cannot finish (the failed rank's part of it is never sent).  No rank at fault (a
    partially raising mapper no chunk makes raise): every rank finishes without error."""
    if recovers(p):
        check_cg_misuse(p, want, result, cfg)
        return
    oc = misuse_error(p, cfg)
    idx, t = misuse_task(p)
    what = f"T{idx} ({_describe_task(t)}) on {cfg.describe()}"
    outs = result["ranks"]
    probs: list[tuple[str, str]] = []
    if not oc.failing:      # (a partially raising mapper that no chunk makes raise: no error anywhere)
        for r, o in enumerate(outs):
            if o is None or o["error"] is not None:
                probs.append(("hang" if o is None else "misuse:spurious",
                              f"rank {r}: {what}: no chunk makes the mapper raise, yet: "
                              f"{_err_text(o['error']) if o else 'it did not finish'}"))
        if probs:
            raise Mismatch(probs)
        return
    primary = []
    failing_probs = False
    for r, o in enumerate(outs):
        if o is None:
            probs.append(("hang", f"rank {r} did not finish: "
                                  f"{_err_text(result['cluster_error']) if result['cluster_error'] else '?'}"))
            continue
        e = o["error"]
        if r in oc.failing:
            n = len(probs)
            pattern = oc.patterns.get(r, oc.pattern) if oc.patterns else oc.pattern
            if e is None and oc.may_finish:
                continue
            if e is None:
                probs.append(("misuse:missed" if all(q is not None and q["error"] is None for q in outs)
                              else "misuse:rank_finished",
                              f"rank {r} finished normally; {what}: it must raise {oc.cls.__name__}"))
            elif type(e) is oc.cls and re.fullmatch(pattern, str(e)):
                if not re.fullmatch(oc.stage, o["stage"]):
                    probs.append(("misuse:wrong_stage", f"rank {r}: {what}: raised at {o['stage']}, expected "
                                                        f"at {oc.stage!r}"))
                elif oc.cause is not None and type(e.__cause__) is not oc.cause:
                    probs.append(("misuse:wrong_error", f"rank {r}: {what}: the cause is {e.__cause__!r}, "
                                                        f"expected a {oc.cause.__name__}"))
                else:
                    primary.append(r)
            elif _aborted(e) and len(oc.failing) > 1:
                pass    # (another rank's error stopped the cluster first)
            else:
                probs.append(_wrong_error("misuse", r, o, e, f"{what}: expected {oc.cls.__name__} matching "
                                                             f"{pattern!r}, got at {o['stage']}"))
            failing_probs = failing_probs or len(probs) > n
        elif e is None:
            if p.sync == "fence":
                probs.append(("misuse:peer_finished", f"rank {r} finished a fence of b{t.write.buffer}, which "
                                                      f"needs rank(s) {oc.failing}'s failed part ({what})"))
        elif not _aborted(e):
            probs.append(("crash" if not isinstance(e, cl.CeleritasError) else "misuse:wrong_error",
                          f"rank {r} raised at {o['stage']}, expected to be aborted or to finish ({what}): "
                          f"{_err_text(e)}"))
    if not primary and not failing_probs:
        seen = "; ".join(f"rank {r}: " + ("hang" if o is None else "no error" if o["error"] is None
                                          else _err_text(o["error"])) for r, o in enumerate(outs))
        missed = all(o is not None and o["error"] is None for o in outs)    # (where the ranks at fault may finish)
        probs.append(("misuse:missed" if missed else "misuse:wrong_error",
                      f"{what}: no rank raised the expected error: {seen}"))
    if probs:
        order = ["misuse:missed", "misuse:wrong_error", "misuse:spurious", "misuse:wrong_stage", "crash", "hang",
                 "misuse:rank_finished", "misuse:peer_finished"]
        probs.sort(key=lambda pr: order.index(pr[0]))
        raise Mismatch(probs)


def run_and_check(p: Program, cfg: Config, timeout: float = 120.0) -> None:
    """Model, run and compare one program on one configuration (raises ``Mismatch``)."""
    assert p.kind == "main" or cfg.diagnostics == "error", \
        f"a {p.kind} program's outcome is modelled under CELERITAS_DIAGNOSTICS=error only (program_config)"
    assert p.kind == "main" or cfg.batch is None, f"a {p.kind} program is never batched (program_config)"
    assert not (p.kind == "misuse" and p.tasks[-1].misuse == "outside" and not cfg.accessor_checks), \
        "a misuse outside program needs accessor checks (program_config)"
    want = run_model(p) if p.kind in MAIN_LIKE or recovers(p) else None
    result = run_on_cluster(p, cfg, timeout)
    check(p, want, result, cfg)
