import numpy as np, time, sys
import celeritas as cl
from celeritas.testing import run_cluster

N = 32
STEPS = int(sys.argv[1]) if len(sys.argv) > 1 else 200

def ref(steps):
    a = np.arange(N * N, dtype=np.float64).reshape(N, N) % 7
    b = np.zeros_like(a)
    for _ in range(steps):
        p = np.pad(a, 1, mode="edge")
        b = (p[:-2, 1:-1] + p[2:, 1:-1] + p[1:-1, :-2] + p[1:-1, 2:] + a) / 5.0
        a, b = b, a
    return a

def prog(rank, steps=STEPS):
    q = cl.Queue(record=False)
    a = cl.Buffer(np.arange(N * N, dtype=np.float64).reshape(N, N) % 7, name="a")
    b = cl.Buffer(shape=(N, N), dtype=np.float64, name="b")
    for s in range(steps):
        src, dst = (a, b) if s % 2 == 0 else (b, a)
        def cgf(cgh, src=src, dst=dst):
            r = src.access(cgh, cl.neighborhood((1, 1), shape="along_axes"), cl.read)
            w = dst.access(cgh, cl.one_to_one(), cl.discard_write)
            @cgh.parallel_for((N, N), name="stencil")
            def k(chunk):
                (x0, y0), (x1, y1) = chunk.box.min, chunk.box.max
                xs = np.clip(np.arange(x0 - 1, x1 + 1), 0, N - 1)
                ys = np.clip(np.arange(y0 - 1, y1 + 1), 0, N - 1)
                blk = np.asarray(r[max(x0-1,0):min(x1+1,N), max(y0-1,0):min(y1+1,N)])
                # build padded block with edge clamp
                full = np.empty((len(xs), len(ys)))
                ox, oy = max(x0-1,0), max(y0-1,0)
                full[:] = blk[np.ix_(xs - ox, ys - oy)]
                c = full[1:-1, 1:-1]
                w[chunk] = (full[:-2, 1:-1] + full[2:, 1:-1] + full[1:-1, :-2] + full[1:-1, 2:] + c) / 5.0
        q.submit(cgf)
    res = q.fence(a if steps % 2 == 0 else b).result()
    stats = dict(q.runtime.scheduler.igg.memory_stats)
    rp = q.runtime.scheduler.igg.replay
    return res, stats, (rp.stats() if rp else None)

want = ref(STEPS)
cap = 2 * N * N * 8 // 3
for env in [dict(), dict(CELERITAS_HOST_DEVICE_MEMORY=str(cap)), dict(CELERITAS_HOST_DEVICE_MEMORY=str(cap), CELERITAS_REPLAY="off")]:
    for la in ["auto", "none", "infinite"]:
        t = time.time()
        (res, stats, rp), = run_cluster(prog, nodes=1, devices=2, CELERITAS_LOOKAHEAD=la, **env)
        print(env, la, "ok" if np.allclose(res, want, rtol=0, atol=1e-12) else "MISMATCH", np.abs(res-want).max(), stats, rp, round(time.time()-t,1))
