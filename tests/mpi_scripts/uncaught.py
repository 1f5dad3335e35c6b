"""An uncaught exception in the user's script on rank 1 must end the whole job."""
import _setup  # noqa: F401
import numpy as np

import celeritas as cl

q = cl.Queue()
b = cl.Buffer(np.arange(16, dtype=np.float32), name="b")
if q.rank == 1:
    raise RuntimeError("user bug on rank 1")
print(f"rank {q.rank}: {q.fence(b).result().sum()}", flush=True)
q.wait(barrier=True)    # rank 1 never gets here: this rank must not hang
q.shutdown()
print(f"rank {q.rank}: finished normally", flush=True)
