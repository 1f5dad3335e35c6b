"""Configuration from the environment (and Queue arguments), validated up front.

Every invalid value raises ``ConfigError`` naming the variable and the accepted
values, so a typo in a job script fails at start-up instead of mid-run.
"""
from __future__ import annotations

import difflib
import logging
import math
import os
import re
from dataclasses import dataclass, field, replace
from typing import Mapping

from executor.communicator import DEFAULT_DIVERGENCE_TIMEOUT
from scheduler.errors import ConfigError
from scheduler.scheduler import LOOKAHEAD_MODES

DIAGNOSTICS = ("off", "warn", "error")
MPI_DEVICE_MEMORY = ("auto", "direct", "staged")
GC_POLICIES = ("tuned", "default")
HOST_ALLOCATORS = ("tuned", "default")
MPI_STRIDED = ("auto", "datatype", "staging")
REPLAY_MODES = ("on", "off")
HUGE_PAGES_DEFAULT = 2 << 20     # one x86-64 / arm64 transparent huge page
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR}

log = logging.getLogger("celeritas.config")

# Every CELERITAS_* variable the runtime reads (docs/api.md's configuration table): any
# other CELERITAS_* variable in the environment is reported as unknown (unknown_variables).
VARIABLES = (
    "CELERITAS_DEVICES", "CELERITAS_LOOKAHEAD", "CELERITAS_HORIZON_STEP", "CELERITAS_HORIZON_MAX_PARALLELISM",
    "CELERITAS_MAX_TASKS_AHEAD", "CELERITAS_PAUSE_AHEAD", "CELERITAS_DRY_RUN_NODES", "CELERITAS_PRINT_GRAPHS",
    "CELERITAS_TRACE", "CELERITAS_RECORD", "CELERITAS_DIAGNOSTICS", "CELERITAS_ACCESSOR_CHECKS",
    "CELERITAS_LOG_LEVEL", "CELERITAS_SUMMARY", "CELERITAS_HOST_DEVICE_MEMORY", "CELERITAS_HUGE_PAGES",
    "CELERITAS_DEVICE_MEMORY_LIMIT", "CELERITAS_OUT_OF_CORE_OVERLAP", "CELERITAS_REPLAY",
    "CELERITAS_WAIT_WARNING", "CELERITAS_GC", "CELERITAS_MPI_DEVICE_MEMORY", "CELERITAS_MPI_CUDA_AWARE",
    "CELERITAS_MPI_STRIDED", "CELERITAS_MPI_POLL_MAX_US", "CELERITAS_MPI_SPIN_US", "CELERITAS_INLINE_US",
    "CELERITAS_SWITCH_INTERVAL_US", "CELERITAS_DIVERGENCE_TIMEOUT", "CELERITAS_HOST_ALLOCATOR",
)
# read by the test suite, not by the runtime (hypothesis example counts, the fuzzer): not reported
TEST_VARIABLES = re.compile(r"CELERITAS_[A-Z0-9_]*_EXAMPLES|CELERITAS_FUZZ_[A-Z0-9_]+")


def closest_variable(name: str) -> str | None:
    """The known variable ``name`` is probably a misspelling of (None if none is close)."""
    close = difflib.get_close_matches(name, VARIABLES, n=1)
    return close[0] if close else None


def unknown_variables(env: Mapping[str, str] | None = None) -> dict[str, str | None]:
    """The ``CELERITAS_*`` variables of ``env`` that celeritas does not read (a typo, or one
    from another version), each with the known variable it is closest to (or None)."""
    env = os.environ if env is None else env
    return {k: closest_variable(k) for k in sorted(env) if k.startswith("CELERITAS_") and k not in VARIABLES
            and not TEST_VARIABLES.fullmatch(k)}


def describe_unknown(name: str, close: str | None) -> str:
    return f"{name} is not a celeritas setting and is ignored" + (f" (did you mean {close}?)" if close else "")


def warn_unknown_variables(env: Mapping[str, str] | None = None) -> None:
    """Log a warning for every unknown ``CELERITAS_*`` variable (each time a runtime reads the
    settings; as Celerity warns about unknown ``CELERITY_*`` ones): a misspelt setting is otherwise
    silently ignored."""
    for name, close in unknown_variables(env).items():
        log.warning("%s", describe_unknown(name, close))


@dataclass(frozen=True, slots=True)
class DeviceSpec:
    """Parsed ``CELERITAS_DEVICES``: a backend name and which devices."""

    backend: str                      # "host" | "cuda" | "opencl" | "default"
    count: int | None = None          # host:N
    ids: tuple = ()                   # cuda:0,1 -> (0, 1); opencl:P:D -> ((P, D), ...)

    @staticmethod
    def parse(value: str, var: str = "CELERITAS_DEVICES") -> "DeviceSpec":
        v = value.strip().lower()
        if v in ("", "default"):
            return DeviceSpec("default")
        m = re.fullmatch(r"host(?::(\d+))?", v)
        if m:
            n = int(m.group(1)) if m.group(1) else 1
            if n < 1 or n > 64:
                raise ConfigError(f"{var}={value!r}: host:N needs 1 <= N <= 64")
            return DeviceSpec("host", n)
        m = re.fullmatch(r"cuda(?::(\d+(?:,\d+)*))?", v)
        if m:
            ids = tuple(int(x) for x in m.group(1).split(",")) if m.group(1) else ()
            return DeviceSpec("cuda", None, ids)
        m = re.fullmatch(r"opencl(?::(\d+:\d+(?:,\d+:\d+)*))?", v)
        if m:
            ids = tuple(tuple(int(y) for y in x.split(":")) for x in m.group(1).split(",")) if m.group(1) else ()
            return DeviceSpec("opencl", None, ids)
        raise ConfigError(f"{var}={value!r} is not a device list; use host:N, cuda, cuda:0,1, opencl or "
                          f"opencl:P:D,...")

    def __str__(self) -> str:
        if self.backend == "host":
            return f"host:{self.count}"
        if self.backend == "cuda":
            return "cuda" + (":" + ",".join(map(str, self.ids)) if self.ids else "")
        if self.backend == "opencl":
            return "opencl" + (":" + ",".join(f"{p}:{d}" for p, d in self.ids) if self.ids else "")
        return self.backend


@dataclass(frozen=True, slots=True)
class Config:
    devices: DeviceSpec = field(default_factory=lambda: DeviceSpec("default"))
    devices_setting: str = "CELERITAS_DEVICES"   # where ``devices`` came from, as errors name it
    lookahead: str = "auto"
    horizon_step: int = 4
    horizon_max_parallelism: int = 64
    # tasks the application thread may run ahead of the executor before submit waits (what
    # runs ahead stays alive: at 4096, CPython's collector walked ~50 000 young objects per
    # collection, 20-40 ms on whichever thread allocated; docs/benchmarks.md, fourteenth session)
    max_tasks_ahead: int = 512
    # past this many tasks ahead of the executor the application thread pauses (at most
    # 2 ms, once every pause_ahead // 2 tasks) to let the other threads have the GIL; 0: never
    pause_ahead: int = 128
    dry_run_nodes: int | None = None
    print_graphs: str | None = None
    trace: str | None = None
    record: bool = False
    diagnostics: str = "warn"
    accessor_checks: bool = False
    log_level: str = "warning"
    summary: bool = False
    host_device_memory: int | None = None   # bytes per simulated device memory (host:N)
    # host allocations of at least this many bytes get their own 2 MiB-aligned mapping
    # advised for transparent huge pages (executor.backends.host.host_empty); None: never
    huge_pages: int | None = HUGE_PAGES_DEFAULT
    replay: bool = True                     # reuse the lowering of repeating steps (scheduler/replay.py)
    # cap on every device memory the runtime plans with: bytes (int) or a fraction (float in (0, 1])
    # of what the backend reports (CUDA: free memory at start-up, OpenCL: global memory)
    device_memory_limit: int | float | None = None
    # batches of a chunk larger than its device overlap (next batch's copies during this kernel)
    out_of_core_overlap: bool = True
    # sends/receives straight from/into device memory ("direct", CUDA-aware MPI) or
    # staged through host memory ("staged"); "auto": direct where MPI reports CUDA support
    mpi_device_memory: str = "auto"
    gc: str = "tuned"     # CPython's cyclic GC thresholds while the runtime runs (see Runtime)
    host_allocator: str = "tuned"   # glibc malloc for large arrays (see runtime.tune_host_allocator)
    # CPython's GIL switch interval while the runtime runs, in µs (None: leave it alone;
    # see Runtime._tune_switch_interval)
    switch_interval_us: float | None = None
    # MPI tuning, handed to the MPI communicator (which reads no environment itself):
    # how strided boxes travel, the executor's longest pause between polls while payloads are
    # in flight, how long a shutdown/barrier epoch waits for the peers' matching epoch
    # (None: forever), and whether MPI takes CUDA pointers (None: ask the library)
    mpi_strided: str = "auto"
    mpi_poll_max_us: float = 2000.0
    # how long the executor polls MPI without pause once nothing but the network is
    # left to wait for, before it sleeps between polls (0: never)
    mpi_spin_us: float = 500.0
    # kernels measured to run in under this many µs (and copies up to 128 KiB) run on the
    # executor thread itself, not handed to their lane, where the backend's lanes are
    # plain threads (host backend); 0: never
    inline_us: float = 100.0
    divergence_timeout: float | None = DEFAULT_DIVERGENCE_TIMEOUT
    mpi_cuda_aware: bool | None = None
    # seconds a wait(), fence result or shutdown may block before the rank says what it
    # waits for (then again at a slow repeat); None: never
    wait_warning: float | None = 10.0

    def with_overrides(self, **kw) -> "Config":
        kw = {k: v for k, v in kw.items() if v is not None}
        if "devices" in kw:
            kw["devices_setting"] = "devices"   # (a Queue argument, not the environment)
            if isinstance(kw["devices"], str):
                kw["devices"] = DeviceSpec.parse(kw["devices"], "devices")
            elif not isinstance(kw["devices"], DeviceSpec):
                raise ConfigError(f"devices={kw['devices']!r} is not a device list; use a string such as 'host:2', "
                                  f"'cuda', 'cuda:0,1', 'opencl' or 'opencl:P:D,...'")
        if "lookahead" in kw and kw["lookahead"] not in LOOKAHEAD_MODES:
            raise ConfigError(f"lookahead={kw['lookahead']!r}; use one of {', '.join(LOOKAHEAD_MODES)}")
        return replace(self, **kw)


def _int(env: Mapping[str, str], var: str, default: int | None, minimum: int = 1) -> int | None:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        v = int(raw.strip())
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not an integer") from None
    if v < minimum:
        raise ConfigError(f"{var}={raw!r} must be >= {minimum}")
    return v


def _choice(env: Mapping[str, str], var: str, choices, default: str) -> str:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if v not in choices:
        raise ConfigError(f"{var}={raw!r}; use one of {', '.join(choices)}")
    return v


def _flag(env: Mapping[str, str], var: str) -> bool:
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return False
    v = raw.strip().lower()
    if v in ("1", "true", "yes", "on"):
        return True
    if v in ("0", "false", "no", "off"):
        return False
    raise ConfigError(f"{var}={raw!r}; use 1 or 0")


def _memory_limit(env: Mapping[str, str], var: str, fractions: bool = True) -> int | float | None:
    """Bytes (an integer, optionally with a K/M/G suffix) or, with ``fractions``, a fraction
    in (0, 1].  (Every byte count of device memory takes the same spellings: a user who
    writes ``2M`` for one variable writes it for the other.)"""
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return None
    v = raw.strip().upper().removesuffix("B")
    if v[-2:] in ("KI", "MI", "GI", "TI"):      # (2GiB, 512MiB: the same binary units)
        v = v[:-1]
    scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}.get(v[-1:], 1)
    if scale != 1:
        v = v[:-1].strip()
    real = scale != 1 or "." in v or "E" in v      # (a unit, a point or an exponent)
    try:
        x = float(v) if real else int(v)
        if real and not math.isfinite(x):
            raise ValueError(v)
    except ValueError:
        if not fractions:
            raise ConfigError(f"{var}={raw!r} is not a number of bytes (e.g. 65536 or 64K)") from None
        raise ConfigError(f"{var}={raw!r} is neither a number of bytes (e.g. 2G) nor a fraction "
                          f"such as 0.8") from None
    # a plain number with a point is a fraction; with a unit (1.5G) bytes; with an exponent
    # bytes from 1 up (1e9), a fraction below (2.4e-07, as repr() writes a small one)
    fraction = scale == 1 and real and ("E" not in v or x < 1)
    if fraction and not fractions:
        raise ConfigError(f"{var}={raw!r} is not a number of bytes (e.g. 65536 or 64K)")
    n = x if fraction or not real else int(x * scale)     # (whole bytes: 1.5K is 1536, 0.3K 307)
    if fraction:
        if not 0 < n <= 1:
            raise ConfigError(f"{var}={raw!r}: a fraction of the device memory must be in (0, 1]")
        return n
    if n < 1:
        raise ConfigError(f"{var}={raw!r} must be at least 1 byte" if fractions else f"{var}={raw!r} must be >= 1")
    return n


def _positive_float(env: Mapping[str, str], var: str, default: float | None, unit: str,
                    off: bool = False) -> float | None:
    """A number > 0 (``unit`` names it in errors); with ``off``, 0/none/off/inf mean None."""
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    v = raw.strip().lower()
    if off and v in ("0", "none", "off", "inf"):
        return None
    alternative = " (or 'none')" if off else ""
    try:
        x = float(v)
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a number of {unit}{alternative}") from None
    if not x > 0 or x != x or x == float("inf"):
        raise ConfigError(f"{var}={raw!r} must be > 0{alternative}")
    return x


def _nonnegative_float(env: Mapping[str, str], var: str, default: float, unit: str) -> float:
    """A finite number >= 0 (``unit`` names it in errors)."""
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return default
    try:
        x = float(raw.strip())
    except ValueError:
        raise ConfigError(f"{var}={raw!r} is not a number of {unit}") from None
    if not x >= 0 or x == float("inf"):
        raise ConfigError(f"{var}={raw!r} must be a finite number >= 0")
    return x


def _huge_pages(env: Mapping[str, str], var: str) -> int | None:
    """``on`` (2 MiB and up), ``off``, or the smallest allocation in bytes (0: every one)."""
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return HUGE_PAGES_DEFAULT
    v = raw.strip().lower()
    if v in ("on", "auto"):
        return HUGE_PAGES_DEFAULT
    if v in ("off", "none", "never"):
        return None
    try:
        n = int(v)
    except ValueError:
        raise ConfigError(f"{var}={raw!r}; use on, off or a size in bytes") from None
    if n < 0:
        raise ConfigError(f"{var}={raw!r}: a size in bytes must be >= 0")
    return n


def _tristate(env: Mapping[str, str], var: str) -> bool | None:
    """1 / 0, or None when unset."""
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return None
    v = raw.strip()
    if v not in ("0", "1"):
        raise ConfigError(f"{var}={raw!r}; use 1 or 0")
    return v == "1"


def check_output_paths(config: Config) -> None:
    """The graph-dump folder and the trace file's folder can be written: found out when
    the runtime starts (the folders are made then), not at shutdown after the whole run."""
    if config.trace and os.path.isdir(config.trace):
        raise ConfigError(f"CELERITAS_TRACE={config.trace!r} is a folder; name the trace file to write "
                          f"(e.g. {os.path.join(config.trace, 'trace.json')!r})")
    if config.trace and os.path.exists(config.trace) and not os.access(config.trace, os.W_OK):
        raise ConfigError(f"CELERITAS_TRACE={config.trace!r}: the file exists and is not writable")
    for var, folder in (("CELERITAS_PRINT_GRAPHS", config.print_graphs),
                        ("CELERITAS_TRACE", os.path.dirname(os.path.abspath(config.trace)) if config.trace else None)):
        if not folder:
            continue
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"{var}: cannot create the folder {folder!r} ({exc.strerror or exc})") from None
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            raise ConfigError(f"{var}: the folder {folder!r} is not writable")


def collective_settings(config: Config, summary: bool) -> dict:
    """What the ranks of one job must agree on, as this rank has it (``summary``: whether
    this rank asks for the shutdown summary).  The horizon settings decide where horizon
    tasks go, so ranks that differ number their later tasks differently and no transfer
    matches; graph dumps, trace and summary are gathered at shutdown, a collective every
    rank must join.  The rest of the configuration may differ between ranks."""
    return {"CELERITAS_HORIZON_STEP": config.horizon_step,
            "CELERITAS_HORIZON_MAX_PARALLELISM": config.horizon_max_parallelism,
            "CELERITAS_PRINT_GRAPHS": config.print_graphs is not None,
            "CELERITAS_TRACE": config.trace is not None,
            "summary": bool(summary)}


def _ranks_text(ranks: list[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def agree_across_ranks(per_rank: list[dict]) -> bool:
    """Check the ``collective_settings`` of every rank (in rank order) and return whether
    the job prints the summary: when any rank asks for it (CELERITAS_SUMMARY, or a log
    level of info or debug, which one rank may well have alone), every rank joins its
    gather and rank 0 prints it.  A horizon setting that differs, or a graph folder or
    trace file named on some ranks only, is a ConfigError naming it and the ranks."""
    first = per_rank[0]
    for var in first:
        if var == "summary":
            continue
        by_value: dict = {}
        for rank, settings in enumerate(per_rank):
            by_value.setdefault(settings[var], []).append(rank)
        if len(by_value) == 1:
            continue
        if isinstance(first[var], bool):
            raise ConfigError(f"{var} is set on {_ranks_text(by_value[True])} but not on "
                              f"{_ranks_text(by_value[False])}; every rank takes part in writing it at "
                              f"shutdown, so set it on every rank or on none (the paths may differ)")
        values = ", ".join(f"{_ranks_text(ranks)}: {value}" for value, ranks in by_value.items())
        raise ConfigError(f"{var} differs between ranks ({values}); it decides where horizon tasks go, "
                          f"and every rank must submit the same tasks: give it the same value on every rank")
    return any(settings["summary"] for settings in per_rank)


def check_dry_run(config: Config, num_ranks: int) -> None:
    """A dry run (CELERITAS_DRY_RUN_NODES) simulates the whole cluster in one process; in a
    job of several ranks (``num_ranks``, or what an MPI launcher announced) every rank would
    run as rank 0 and write the same outputs."""
    if config.dry_run_nodes is None:
        return
    ranks = num_ranks
    if ranks <= 1:
        try:
            from executor.mpi.launch import launched_world_size
        except ImportError:
            pass
        else:
            ranks = launched_world_size() or 1
    if ranks > 1:
        raise ConfigError(f"CELERITAS_DRY_RUN_NODES={config.dry_run_nodes}: a dry run simulates the "
                          f"{config.dry_run_nodes}-node cluster in one process, but this job runs {ranks} "
                          f"ranks (every one would be rank 0); start it as a single process")


def _path(env: Mapping[str, str], var: str) -> str | None:
    """A file or folder name; unset, empty or whitespace only: None."""
    raw = env.get(var)
    if raw is None or raw.strip() == "":
        return None
    return raw


SWITCH_INTERVAL_MAX_US = 2**32 - 1    # CPython keeps the interval in whole µs in a C unsigned long


def _switch_interval(env: Mapping[str, str], var: str) -> float | None:
    """µs, as ``sys.setswitchinterval`` can hold it: 1 µs (it truncates to whole µs, so less
    would be 0) up to 2**32 - 1 µs (beyond, it overflows, to 0 on 64-bit Linux); 0, none,
    off or inf: leave the interpreter's interval alone."""
    us = _positive_float(env, var, None, "microseconds", off=True)
    if us is None:
        return None
    if not 1 <= us <= SWITCH_INTERVAL_MAX_US:
        raise ConfigError(f"{var}={env[var]!r} is out of range: CPython's switch interval takes 1 to "
                          f"{SWITCH_INTERVAL_MAX_US} whole microseconds (or 'off')")
    return us


def from_env(env: Mapping[str, str] | None = None, warn: bool = True) -> Config:
    """The configuration ``env`` (default: the environment) gives; ConfigError for an invalid
    value.  With ``warn``, unknown ``CELERITAS_*`` variables are logged."""
    env = os.environ if env is None else env
    if warn:
        warn_unknown_variables(env)
    devices = DeviceSpec.parse(env["CELERITAS_DEVICES"]) if env.get("CELERITAS_DEVICES") else DeviceSpec("default")
    return Config(
        devices=devices,
        lookahead=_choice(env, "CELERITAS_LOOKAHEAD", LOOKAHEAD_MODES, "auto"),
        horizon_step=_int(env, "CELERITAS_HORIZON_STEP", 4),
        horizon_max_parallelism=_int(env, "CELERITAS_HORIZON_MAX_PARALLELISM", 64),
        max_tasks_ahead=_int(env, "CELERITAS_MAX_TASKS_AHEAD", 512, minimum=2),
        pause_ahead=_int(env, "CELERITAS_PAUSE_AHEAD", 128, minimum=0),
        dry_run_nodes=_int(env, "CELERITAS_DRY_RUN_NODES", None),
        print_graphs=_path(env, "CELERITAS_PRINT_GRAPHS"),
        trace=_path(env, "CELERITAS_TRACE"),
        record=_flag(env, "CELERITAS_RECORD"),
        diagnostics=_choice(env, "CELERITAS_DIAGNOSTICS", DIAGNOSTICS, "warn"),
        accessor_checks=_flag(env, "CELERITAS_ACCESSOR_CHECKS"),
        log_level=_choice(env, "CELERITAS_LOG_LEVEL", tuple(LOG_LEVELS), "warning"),
        summary=_flag(env, "CELERITAS_SUMMARY"),
        host_device_memory=_memory_limit(env, "CELERITAS_HOST_DEVICE_MEMORY", fractions=False),
        huge_pages=_huge_pages(env, "CELERITAS_HUGE_PAGES"),
        mpi_device_memory=_choice(env, "CELERITAS_MPI_DEVICE_MEMORY", MPI_DEVICE_MEMORY, "auto"),
        gc=_choice(env, "CELERITAS_GC", GC_POLICIES, "tuned"),
        host_allocator=_choice(env, "CELERITAS_HOST_ALLOCATOR", HOST_ALLOCATORS, "tuned"),
        switch_interval_us=_switch_interval(env, "CELERITAS_SWITCH_INTERVAL_US"),
        mpi_strided=_choice(env, "CELERITAS_MPI_STRIDED", MPI_STRIDED, "auto"),
        mpi_poll_max_us=_positive_float(env, "CELERITAS_MPI_POLL_MAX_US", 2000.0, "microseconds"),
        mpi_spin_us=_nonnegative_float(env, "CELERITAS_MPI_SPIN_US", 500.0, "microseconds"),
        inline_us=_nonnegative_float(env, "CELERITAS_INLINE_US", 100.0, "microseconds"),
        divergence_timeout=_positive_float(env, "CELERITAS_DIVERGENCE_TIMEOUT", DEFAULT_DIVERGENCE_TIMEOUT,
                                           "seconds", off=True),
        mpi_cuda_aware=_tristate(env, "CELERITAS_MPI_CUDA_AWARE"),
        wait_warning=_positive_float(env, "CELERITAS_WAIT_WARNING", 10.0, "seconds", off=True),
        replay=_choice(env, "CELERITAS_REPLAY", REPLAY_MODES, "on") == "on",
        device_memory_limit=_memory_limit(env, "CELERITAS_DEVICE_MEMORY_LIMIT"),
        out_of_core_overlap=_choice(env, "CELERITAS_OUT_OF_CORE_OVERLAP", REPLAY_MODES, "on") == "on",
    )
