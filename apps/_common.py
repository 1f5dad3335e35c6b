"""Shared command-line plumbing of the apps."""
from __future__ import annotations

import argparse
import time

from rich.console import Console

console = Console(stderr=True)


def base_parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--devices", default=None, help="CELERITAS_DEVICES for this run (host:N, cuda, opencl, ...)")
    p.add_argument("--lookahead", default=None, choices=["none", "auto", "infinite"])
    p.add_argument("--verify", action="store_true", help="compare the result with a sequential numpy run")
    return p


class Timer:
    def __enter__(self):
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        self.seconds = time.perf_counter() - self.t0
