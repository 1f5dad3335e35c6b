"""A whole simulated cluster in one process: one thread and one runtime per rank."""
from __future__ import annotations

import operator
import os
import threading
import time
import traceback
from typing import Any, Callable

from scheduler.errors import CeleritasError, ConfigError

from . import context


def _divergence_timeout(env: dict) -> float | None:
    """The divergence check's timeout, as an MPI job's ranks read it from the configuration;
    with an invalid configuration the default (each rank's ``cl.Queue()`` then raises the
    ConfigError, as under MPI)."""
    from .config import DEFAULT_DIVERGENCE_TIMEOUT, from_env
    try:
        return from_env({**os.environ, **env}, warn=False).divergence_timeout
    except CeleritasError:
        return DEFAULT_DIVERGENCE_TIMEOUT


def _count(name: str, value: Any) -> int:
    """``nodes=`` / ``devices=``: an integer >= 1 (not a float, string or bool)."""
    try:
        if isinstance(value, bool):
            raise TypeError
        n = operator.index(value)
    except TypeError:
        raise ConfigError(f"run_cluster: {name}={value!r} is not an integer") from None
    if n < 1:
        raise ConfigError(f"run_cluster needs {name} >= 1, got {n}")
    return n


def _check_settings(env: dict) -> None:
    """The keyword settings of ``run_cluster`` are ``CELERITAS_*`` variables that celeritas
    reads (config.VARIABLES); anything else would be silently ignored."""
    from .config import VARIABLES, closest_variable
    for key, value in env.items():
        if key in VARIABLES:
            continue
        close = closest_variable(key if key.startswith("CELERITAS_") else "CELERITAS_" + key)
        hint = f" (did you mean {close}?)" if close else ""
        raise ConfigError(f"run_cluster: {key}={value!r} is not a celeritas setting{hint}; settings are "
                          f"given as CELERITAS_...= keywords, e.g. run_cluster(program, CELERITAS_LOOKAHEAD='none'), "
                          f"besides nodes=, devices= and timeout=")


def run_cluster(program: Callable[[int], Any], nodes: int = 2, devices: int | None = None,
                timeout: float = 300.0, **env: str) -> list:
    """Run ``program(rank)`` on ``nodes`` threads connected by the in-process communicator.

    ``devices`` gives each rank ``host:devices``; ``env`` overrides ``CELERITAS_*``
    variables (e.g. ``CELERITAS_LOOKAHEAD="none"``); a keyword that is none of them, or a
    ``nodes``/``devices`` that is not an integer >= 1, is a ConfigError.  Returns each rank's return
    value; the first rank's exception is raised after every rank has stopped.
    """
    from executor.communicator import InProcessCluster
    nodes = _count("nodes", nodes)
    if devices is not None:
        devices = _count("devices", devices)
    _check_settings(env)
    env = {k: str(v) for k, v in env.items()}
    if devices is not None:
        env["CELERITAS_DEVICES"] = f"host:{devices}"
    cluster = InProcessCluster(nodes, divergence_timeout=_divergence_timeout(env),
                               divergence_timeout_hint="CELERITAS_DIVERGENCE_TIMEOUT")
    results: list[Any] = [None] * nodes
    errors: list[BaseException | None] = [None] * nodes

    def body(rank: int) -> None:
        ctx = context.cluster
        ctx.communicator = cluster.communicator(rank)
        ctx.env = env
        ctx.runtime = None
        try:
            results[rank] = program(rank)
            rt = ctx.runtime
            if rt is not None and not rt.is_shut_down:
                rt.shutdown()
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            errors[rank] = exc
            rt = ctx.runtime
            if rt is not None:
                rt._abort()
            cluster.abort()   # peers waiting for this rank's data fail instead of hanging
        finally:
            ctx.communicator = None
            ctx.env = None
            ctx.runtime = None

    threads = [threading.Thread(target=body, args=(r,), name=f"celeritas-rank-{r}", daemon=True)
               for r in range(nodes)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + timeout   # (one deadline for the cluster, not one per rank in turn)
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    late = [r for r, t in enumerate(threads) if t.is_alive()]    # (before the abort ends them)
    if late:
        cluster.abort()
        grace = time.monotonic() + 10.0
        for t in threads:
            t.join(max(0.0, grace - time.monotonic()))
        raise CeleritasError(f"run_cluster: ranks {late} did not finish within {timeout} s")
    for r, e in enumerate(errors):
        if e is not None and not _is_secondary(e):
            raise e
    for e in errors:
        if e is not None:
            raise e
    return results


def _is_secondary(exc: BaseException) -> bool:
    """An error caused by another rank's abort rather than by this rank's own failure."""
    text = "".join(traceback.format_exception_only(type(exc), exc)).lower()
    return "abort" in text
