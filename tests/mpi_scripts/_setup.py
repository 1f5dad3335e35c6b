"""Make the repository and tests/ importable from scripts run under mpiexec; SIGUSR2 prints
every thread's stack (``jobs`` sends it to a job's ranks before killing them at a timeout)."""
import faulthandler
import signal
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
for p in (ROOT, ROOT / "tests"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

if hasattr(signal, "SIGUSR2"):
    faulthandler.register(signal.SIGUSR2, all_threads=True)
