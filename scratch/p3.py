import sys; sys.path.insert(0, "tests")
from test_probing_out_of_core import *
import test_probing_out_of_core as t
n=64
def program(rank):
    q = cl.Queue(record=True)
    keep = cl.Buffer(np.arange(n, dtype=np.float64), name="keep")
    for r in range(6):
        tmp = cl.Buffer(np.full(n, float(r)), name=f"tmp{r}")
        def cgf(cgh, tmp=tmp):
            rk = keep.access(cgh, cl.one_to_one(), cl.read_write)
            rt = tmp.access(cgh, cl.one_to_one(), cl.read_write)
            @cgh.parallel_for((n,), name="pair")
            def kernel(chunk):
                rt[chunk] = rt[chunk] * 2 + rk[chunk]
                rk[chunk] = rk[chunk] + 1
        q.submit(cgf)
        del tmp
        gc.collect()
    got = q.fence(keep).result()
    q.wait()
    return got, q.graphs()["instructions"]
got, ins = t._run1(program, CELERITAS_HOST_DEVICE_MEMORY=str(2*n*8))
for i in ins:
    if i["id"] > 24: print({k:v for k,v in i.items() if k in ("id","kind","allocation","memory","buffer","box","source","dest","evict","deps")})
