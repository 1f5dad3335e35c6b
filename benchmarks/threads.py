"""CPU time of the runtime's threads, by role: where a step's time goes on a rank.

On a machine with fewer cores than busy threads (2 ranks on 2 cores: each rank's
application, scheduler and executor threads share about one core), a step takes at
least the CPU its threads spend on it together, so per-thread CPU per step says which
thread to make cheaper; wall time alone does not.  Read through
``pthread_getcpuclockid`` (nanoseconds; /proc's ticks are 10 ms).
"""
from __future__ import annotations

import threading
import time

ROLES = ("application", "scheduler", "executor", "lanes", "waiters", "other")


def role(name: str) -> str:
    """The role of a thread named ``name`` (celeritas names its threads ``celeritas-<what>[-rank]``)."""
    if name == "MainThread":
        return "application"
    if not name.startswith("celeritas-"):
        return "other"
    if name.startswith("celeritas-scheduler"):
        return "scheduler"
    if name.startswith("celeritas-executor"):
        return "executor"
    if "-waiter" in name:
        return "waiters"
    if ".lane" in name:
        return "lanes"
    return "other"


def thread_cpu() -> dict[int, tuple[str, float]]:
    """CPU seconds so far of each live thread of this process: ident -> (role, seconds)."""
    out = {}
    for t in threading.enumerate():
        if t.ident is None:
            continue
        try:
            s = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, AttributeError):      # (gone meanwhile; a platform without the call)
            continue
        out[t.ident] = (role(t.name), s)
    return out


def cpu_per_step(before: dict[int, tuple[str, float]], after: dict[int, tuple[str, float]],
                 steps: int) -> dict[str, float]:
    """µs of CPU per step by role between two ``thread_cpu`` readings (threads started in
    between count from zero; threads that ended in between are lost, which the runtime's
    long-lived threads never do)."""
    per = dict.fromkeys(ROLES, 0.0)
    for ident, (r, s) in after.items():
        s0 = before.get(ident, (r, 0.0))[1]
        per[r] += (s - s0) / steps * 1e6
    return per


def format_cpu(per: dict[str, float]) -> str:
    """``app 31 · sched 45 · exec 160`` (µs per step; lanes and waiters where they ran)."""
    short = {"application": "app", "scheduler": "sched", "executor": "exec", "lanes": "lanes",
             "waiters": "waiters"}
    parts = [f"{short[r]} {per[r]:.0f}" for r in ROLES[:3]]
    parts += [f"{short[r]} {per[r]:.0f}" for r in ("lanes", "waiters") if per[r] >= 0.5]
    return " · ".join(parts)
