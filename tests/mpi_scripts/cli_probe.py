"""What ``python -m celeritas run`` gives each rank."""
import os
import sys

import _setup  # noqa: F401
import numpy as np

import celeritas as cl

q = cl.Queue()
b = cl.Buffer(np.arange(8, dtype=np.int64))
total = int(q.fence(b).result().sum())
print(f"rank={q.rank} ranks={q.num_ranks} devices={q.num_devices} comm={type(q.runtime.communicator).__name__} "
      f"env={os.environ.get('CELERITAS_DEVICES')} args={sys.argv[1:]} total={total}", flush=True)
q.shutdown()
