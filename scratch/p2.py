import numpy as np, time, sys
sys.argv = ["x", "30"]
exec(open("scratch/p1.py").read().split("want = ref")[0])
want = ref(30)
for devices in (1, 2):
  for cap in [N*8, N*8*3, N*8*4, 1000, 2000, 3000, 4000, 4352, 5000, 6000, 8000, 8192, 8448, 8704, 9000, 12000, 16384, 16896, 17000, 20000]:
    try:
        (res, stats, rp), = run_cluster(lambda r: prog(r, 30), nodes=1, devices=devices, CELERITAS_HOST_DEVICE_MEMORY=str(cap))
        print(devices, cap, "ok" if np.array_equal(res, want) else "MISMATCH", stats["evictions"], stats["batches"], rp)
    except Exception as e:
        print(devices, cap, type(e).__name__, str(e)[:300])
