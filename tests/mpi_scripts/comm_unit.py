"""MpiCommunicator and EpochCheck exercised directly (3 ranks); prints ``rank R: ok``."""
import re
import sys
import time

import _setup  # noqa: F401
import numpy as np
from mpi4py import MPI

from executor.communicator import CommunicatorError
from executor.mpi import EpochCheck, MpiCommunicator, decode_pilot, encode_pilot
from scheduler.errors import DivergenceError
from scheduler.geometry import Box
from scheduler.instruction_graph import EpochInstruction, Pilot

world = MPI.COMM_WORLD
rank, size = world.Get_rank(), world.Get_size()
assert size == 3, "run on 3 ranks"
comm = MpiCommunicator(install_hooks=False)
problems = []
# the executor polls this communicator itself, testing requests without releasing the GIL
# where the MPI library can be reached through ctypes (Linux, the mpich wheel: always here)
from executor.mpi.progress import quick_test  # noqa: E402
if not (comm.notifies is False and comm.poll_spin >= 0 and comm.poll_min <= comm.poll_max):
    problems.append("polling attributes")
if sys.platform.startswith("linux") and quick_test(MPI) is None:
    problems.append("MPI_Request_get_status not found through ctypes")
if quick_test(MPI) is not None:
    # the handle is made once per request, as a ctypes value of the library's handle type
    # (an int in MPICH, a pointer in Open MPI), and the look finds the request pending, then done
    from executor.mpi.progress import handle_of  # noqa: E402
    _peer = (rank + 1) % size
    _buf = np.zeros(4, np.int64)
    _r = world.Irecv([_buf, MPI.INT64_T], (rank - 1) % size, 77)
    _h = handle_of(MPI, _r)
    if type(_h).__module__ != "ctypes" or quick_test(MPI).done(_h):
        problems.append(f"quick test of a pending receive: {_h!r}")
    world.Barrier()         # (every rank looked before any sends)
    world.Send([np.arange(4, dtype=np.int64), MPI.INT64_T], _peer, 77)
    _t0 = time.monotonic()
    while not quick_test(MPI).done(_h) and time.monotonic() - _t0 < 20:
        time.sleep(1e-4)
    _r.Wait()
    if list(_buf) != [0, 1, 2, 3]:
        problems.append(f"quick-tested receive got {_buf}")


def expect(cond, what):
    if not cond:
        problems.append(what)


def wait_all(reqs, timeout=20.0):
    t0 = time.monotonic()
    pending = list(reqs)
    while pending:
        pending = [r for r in pending if not r.test()]
        if time.monotonic() - t0 > timeout:
            raise TimeoutError(f"{len(pending)} requests did not complete")
        time.sleep(1e-4)


# ---- pilot wire format
for box in (Box((1,), (5,)), Box((0, 2), (3, 9)), Box((1, 2, 3), (4, 5, 6)), Box.empty_box(2)):
    buf = np.zeros(12, np.int64)
    p = Pilot(msg_id=2**40 + 7, to=2, transfer=(11, 3, 4), box=box)
    encode_pilot(p, buf)
    q = decode_pilot(buf)
    expect((q.msg_id, q.to, q.transfer, q.box, q.box.dims) == (p.msg_id, p.to, p.transfer, p.box, box.dims),
           f"pilot round trip {p} -> {q}")

# ---- pilots: many from two senders to rank 0 (more than the standing ring and the window).
# PILOT_WINDOW pilots per receiver go out ahead of their payloads, in order, and pilots that
# announce nothing (empty boxes) at once; the rest wait until a payload goes (then the oldest
# go, in order) or until their own payload goes (then that pilot goes first, out of turn)
from executor.mpi.wire import PILOT_WINDOW  # noqa: E402

N = 50
ANNOUNCED = [i for i in range(N) if i % 7]          # the rest announce nothing (empty boxes)
EARLY = ANNOUNCED[-1]                               # its payload goes first, before every other
assert len(ANNOUNCED) > PILOT_WINDOW + 1


def _collect(count, seconds):
    got = []
    t0 = time.monotonic()
    while len(got) < count and time.monotonic() - t0 < seconds:
        got += comm.poll_pilots()
        time.sleep(1e-4)
    return got


if rank != 0:
    for i in range(N):
        comm.send_pilot(0, Pilot(msg_id=i, to=0, transfer=(rank, i, 0),
                                 box=Box((i,), (i + rank,)) if i % 7 else Box.empty_box(1)))
    expect(comm.held_pilots == len(ANNOUNCED) - PILOT_WINDOW, f"{comm.held_pilots} pilots held back")
comm.barrier()
if rank == 0:      # the window's worth and the empty ones arrive, nothing more
    first = _collect(2 * (PILOT_WINDOW + N - len(ANNOUNCED)) + 1, 0.5)
    for src in (1, 2):
        ids = [p.msg_id for fr, p in first if fr == src]
        want = sorted(ANNOUNCED[:PILOT_WINDOW] + [i for i in range(N) if i % 7 == 0])
        expect(sorted(ids) == want, f"rank {src}: pilots before any payload {ids}, expected {want}")
comm.barrier()
if rank != 0:      # one payload out of turn, then the rest in order
    reqs = [comm.send_payload(0, i, np.full(rank, i, np.int64)) for i in [EARLY] + ANNOUNCED[:-1]]
    wait_all(reqs)
    expect(comm.held_pilots == 0, f"{comm.held_pilots} pilots still held after every payload")
else:
    rest = _collect(2 * N - len(first), 20)
    got = first + rest
    expect(len(got) == 2 * N, f"received {len(got)} of {2 * N} pilots")
    for src in (1, 2):
        ids = [p.msg_id for fr, p in got if fr == src and p.msg_id in ANNOUNCED]
        late = [i for i in ids if i != EARLY]
        expect(sorted(ids) == ANNOUNCED and late == sorted(late),
               f"announcing pilots from rank {src} out of order: {ids}")
        expect(ids.index(EARLY) == PILOT_WINDOW, f"rank {src}: the early payload's pilot came at "
                                                 f"{ids.index(EARLY)}, not with its payload")
        expect(all(p.transfer == (src, p.msg_id, 0) and p.to == 0 for fr, p in got if fr == src),
               "pilot contents")
        outs = {i: np.zeros(src, np.int64) for i in ANNOUNCED}
        wait_all([comm.receive_payload(src, i, outs[i]) for i in ANNOUNCED])
        expect(all((outs[i] == i).all() for i in ANNOUNCED), f"payloads from rank {src}")
    expect(comm.poll_pilots() == [], "extra pilots")
comm.barrier()

# ---- a batch's pilots go PILOT_BATCH to a message; held ones once a message of them fits the window
from executor.mpi.wire import PILOT_BATCH  # noqa: E402

BATCH = [5000 + i for i in range(PILOT_WINDOW + PILOT_BATCH // 2)]
if rank == 1:
    comm.send_pilots([Pilot(msg_id=i, to=0, transfer=(9, i, 0), box=Box((i,), (i + 1,))) for i in BATCH])
    expect(comm.held_pilots == PILOT_BATCH // 2, f"{comm.held_pilots} of the batch's pilots held back")
    sent = []
    for i in BATCH:
        sent.append(comm.send_payload(0, i, np.full(1, i, np.int64)))
        if i == BATCH[PILOT_BATCH // 2 - 1]:    # room for all the held ones now: they went, as one message
            expect(comm.held_pilots == 0, f"{comm.held_pilots} pilots held after {PILOT_BATCH // 2} payloads")
    wait_all(sent)
elif rank == 0:
    before = comm.pilot_messages
    got = _collect(len(BATCH), 20)
    ids = [p.msg_id for fr, p in got]
    expect(ids == BATCH and all(fr == 1 and p.transfer == (9, p.msg_id, 0) and p.box == Box((p.msg_id,), (p.msg_id + 1,))
                                for fr, p in got), f"the batch's pilots: {ids}")
    messages = comm.pilot_messages - before
    expect(messages == PILOT_WINDOW // PILOT_BATCH + 1, f"the batch's {len(BATCH)} pilots came in {messages} messages")
    outs = {i: np.zeros(1, np.int64) for i in BATCH}
    wait_all([comm.receive_payload(1, i, outs[i]) for i in BATCH])
    expect(all(outs[i][0] == i for i in BATCH), "the batch's payloads")
comm.barrier()

# ---- payloads between ranks 0 and 1, both arrival orders, contiguous and strided, both policies
base = np.arange(64 * 48, dtype=np.float32).reshape(64, 48)
cases = [("contiguous rows", np.s_[3:20, :]), ("column", np.s_[:, 5:6]), ("block", np.s_[10:40, 7:30]),
         ("3-d slab", None)]
msg = 1000
for policy in ("staging", "datatype", "auto"):
    comm._strided = policy
    for recv_first in (False, True):
        for name, sl in cases:
            msg += 1
            if sl is None:
                src = np.arange(8 * 9 * 10, dtype=np.int64).reshape(8, 9, 10)[1:7, 2:5, 3:9]
                dst_full = np.zeros((8, 9, 10), np.int64)
                dst = dst_full[2:8, 4:7, 0:6]
            else:
                src = base[sl]
                dst_full = np.zeros_like(base)
                dst = dst_full[sl]
            if recv_first:
                comm.barrier()
            if rank == 0:
                if not recv_first:
                    wait_all([comm.send_payload(1, msg, src)])
                    comm.barrier()
                else:
                    time.sleep(0.01)
                    wait_all([comm.send_payload(1, msg, src)])
            elif rank == 1:
                if not recv_first:
                    comm.barrier()
                r = comm.receive_payload(0, msg, dst)
                wait_all([r])
                expect(np.array_equal(dst, src), f"{policy}/{name}/recv_first={recv_first}: wrong data")
                untouched = dst_full.copy()
                untouched[(slice(2, 8), slice(4, 7), slice(0, 6)) if sl is None else sl] = 0
                expect(not untouched.any(), f"{policy}/{name}: wrote outside the box")
            else:
                if not recv_first:
                    comm.barrier()

comm._strided = "auto"
# typed partial result into raw gather bytes; wrong sizes are errors; huge msg ids wrap into the tag range
if rank == 1:
    _sends = [comm.send_payload(2, 5, np.array([1.5, -2.0])),
              comm.send_payload(2, 6, np.zeros(3, np.int8)),
              comm.send_payload(2, 2**45 + 3, np.arange(4, dtype=np.int32)),
              comm.send_payload(2, 9, np.zeros(16, np.int8))]
    # a send is tested once as it is made: one done at once (these small ones usually are)
    # is not kept for close(), one still in flight is
    _kept = list(comm._payload_sends._reqs)
    expect(all((r in _kept) != r.done for r in _sends), "sends kept for close()")
    wait_all(_sends)
elif rank == 2:
    slot = np.zeros(32, np.uint8)[8:24]
    wait_all([comm.receive_payload(1, 5, slot)])
    expect(np.array_equal(slot.view(np.float64), [1.5, -2.0]), "gather bytes")
    r = comm.receive_payload(1, 6, np.zeros(8, np.int8))
    try:
        wait_all([r])
        expect(False, "short message accepted")
    except CommunicatorError as exc:
        expect("received 3 bytes, expected 8" in str(exc), f"short message error: {exc}")
    out = np.zeros(4, np.int32)
    wait_all([comm.receive_payload(1, 2**45 + 3, out)])
    expect(out.tolist() == [0, 1, 2, 3], "huge msg id")
    r = comm.receive_payload(1, 9, np.zeros(8, np.int8))     # (a longer message than the box: truncated)
    try:
        wait_all([r])
        expect(False, "long message accepted")
    except CommunicatorError as exc:
        expect("receive of message 9 from rank 1" in str(exc) and "trunc" in str(exc).lower(),
               f"long message error: {exc}")
# ---- messages past an MPI count: one element of a datatype of CHUNK-byte blocks (and the
# rest), so that an MPI-3 library (C int counts) can carry 2 GiB and more; here the limits
# are lowered so that small messages take that path, through this MPI library for real
from executor.mpi import wire  # noqa: E402

saved = wire.MAX_COUNT, wire.CHUNK
wire.MAX_COUNT, wire.CHUNK = 1000, 256
try:
    big = np.arange(5000, dtype=np.uint8) * 7                      # 19 blocks and 136 bytes
    whole = np.arange(4096, dtype=np.uint8)                          # 16 blocks exactly
    rows = (np.arange(40 * 600, dtype=np.int32) % 251).reshape(40, 600)[3:9, 50:550]   # runs of 2000 bytes
    sent = [("remainder", big, np.zeros(5000, np.uint8)), ("whole blocks", whole, np.zeros(4096, np.uint8))]
    for policy in ("datatype", "staging"):
        sent.append((f"strided/{policy}", rows, np.zeros((6, 500), np.int32)))
    msg = 3000
    for name, src, dst in sent:
        msg += 1
        comm._strided = "datatype" if name == "strided/datatype" else "staging"
        spec = comm._spec(src, receive=False)[0]
        expect(spec[1] <= wire.MAX_COUNT, f"{name}: count {spec[1]} past the limit")
        if rank == 0:
            wait_all([comm.send_payload(1, msg, src)])
        elif rank == 1:
            wait_all([comm.receive_payload(0, msg, dst)])
            expect(np.array_equal(dst, src), f"{name}: wrong data past the count limit")
    if rank == 0:     # a short message into a large receive is still found out
        wait_all([comm.send_payload(1, msg + 1, big[:4000])])
    elif rank == 1:
        r = comm.receive_payload(0, msg + 1, np.zeros(5000, np.uint8))
        try:
            wait_all([r])
            expect(False, "short message past the count limit accepted")
        except CommunicatorError as exc:
            expect("received 4000 bytes, expected 5000" in str(exc), f"short large message error: {exc}")
    comm.barrier()
finally:
    wire.MAX_COUNT, wire.CHUNK = saved
    comm._strided = "auto"
try:
    comm.send_pilot(rank, Pilot(0, rank, (0, 0, 0), Box((0,), (1,))))
    expect(False, "pilot to self accepted")
except CommunicatorError:
    pass

# ---- clones: returned at once, usable collectives, distinct from COMM_WORLD
c1 = comm.clone(key=1)
c2 = c1.clone(key=2)
h1, h2 = c1.collective_handle(), c2.collective_handle()
expect(isinstance(h1, MPI.Intracomm) and h1.Get_size() == size, "clone handle")
expect(h1.allreduce(rank + 1) == size * (size + 1) // 2, "clone allreduce")
expect(MPI.Comm.Compare(h1, world) == MPI.CONGRUENT and MPI.Comm.Compare(h1, h2) == MPI.CONGRUENT,
       "clone congruence")
expect(h2.bcast("x" if rank == 0 else None) == "x", "second clone bcast")
c2.barrier()

# ---- several clones of one communicator: one Idup in flight at a time, posted in order
# (Open MPI left a rank's second of two outstanding Idups incomplete for ever), each rank
# waiting for them in its own order, none waiting for a clone made after the one it needs
from executor.mpi.communicator import _UNSTARTED  # noqa: E402

clones = [comm.clone(key=10 + k) for k in range(4)]


def in_flight():
    return sum(c._pending_dup is not None and c._pending_dup is not _UNSTARTED for c in clones)




def posted_in_order() -> bool:
    """Completed clones, then at most one in flight, then unposted ones.  (Asking for
    clones[1:] all unposted failed one run in ten: where the peers were quick, clone 0's
    Idup completed while clone 1 was made, and clone 1 was rightly posted.)"""
    states = "".join("d" if c._pending_dup is None else "u" if c._pending_dup is _UNSTARTED else "f"
                     for c in clones)
    return re.fullmatch(r"d*f?u*", states) is not None


expect(in_flight() <= 1 and posted_in_order(), "clones posted one at a time")
order = [3, 1, 0, 2] if rank == 0 else [0, 1, 2, 3] if rank == 1 else [2, 3, 0, 1]
if rank == 1:
    time.sleep(0.2)      # (the others wait meanwhile, testing what comes first)
for k in order:
    t0 = time.monotonic()
    while not clones[k].clone_completed():
        expect(in_flight() <= 1 and posted_in_order(), "one Idup in flight")
        if time.monotonic() - t0 > 20:
            problems.append(f"clone {k} did not complete")
            break
        time.sleep(1e-4)
    expect(all(c.clone_completed() for c in clones[:k]), f"clone {k} completed before an older one")
for k, c in enumerate(clones):
    expect(c.collective_handle().allreduce(k * (rank + 1)) == k * size * (size + 1) // 2, f"clone {k} allreduce")
late = comm.clone(key=20)       # (made after the others completed: posted at once)
expect(late._pending_dup is not _UNSTARTED, "a clone with none before it is posted at once")
late.wait_cloned()
expect(late.collective_handle().bcast(rank if rank == 0 else None) == 0, "late clone bcast")
comm.barrier()


# ---- divergence check on fresh duplicates
def epoch(task, action, digest, h):
    return EpochInstruction(id=task, task=task, action=action, stream_hash=h, digest=digest)


# the check looks for its neighbour's messages once a millisecond through MPI_Iprobe called
# without releasing the GIL (progress.QuickProbe), and through mpi4py only once one waits
from executor.mpi.progress import quick_probe  # noqa: E402
if sys.platform.startswith("linux"):
    expect(comm.epoch_check._quick_probe is not None, "the divergence check probes through mpi4py only")
    ch = world.Dup()
    qp = quick_probe(MPI, ch)
    expect(qp is not None, "MPI_Iprobe not found through ctypes")
    if qp is not None:
        expect(not qp((rank - 1) % size, 77), "a probe saw a message nobody sent")
        ch.Barrier()
        ch.send(("hello", rank), dest=(rank + 1) % size, tag=77)
        t0 = time.monotonic()
        while not qp((rank - 1) % size, 77) and time.monotonic() - t0 < 10:
            time.sleep(1e-4)
        expect(not qp((rank - 1) % size, 78) and not qp((rank + 1) % size, 77) or size == 2,
               "a probe saw a message of another tag or source")
        got = ch.recv(source=(rank - 1) % size, tag=77)
        expect(got == ("hello", (rank - 1) % size), f"received {got}")
        expect(not qp((rank - 1) % size, 77), "the probe still sees a message that was received")
        ch.Barrier()
        ch.Free()
    world.Barrier()

_ch = world.Dup()
chk = EpochCheck(_ch, rank, size, timeout=5.0, quick_probe=quick_probe(MPI, _ch))
d = [(1, "device_compute", "k", [8]), (2, "horizon", "horizon", [])]
chk.announce(epoch(3, "barrier", d, 1234))
t0 = time.monotonic()
while not chk.verified(epoch(3, "barrier", d, 1234)):
    expect(time.monotonic() - t0 < 10, "matching epochs never verified")
    if time.monotonic() - t0 > 10:
        break
    time.sleep(1e-3)
world.Barrier()

chk = EpochCheck(world.Dup(), rank, size, timeout=5.0)
mine = list(d) if rank != 1 else [d[0], (2, "device_compute", "extra", [4])]
chk.announce(epoch(4, "shutdown", mine, 99 if rank != 1 else 98))
err = None
t0 = time.monotonic()
try:
    while not chk.verified(epoch(4, "shutdown", mine, 0)) and time.monotonic() - t0 < 10:
        time.sleep(1e-3)
except DivergenceError as exc:
    err = str(exc)
if rank in (1, 2):   # rank 1 compares with rank 0, rank 2 with rank 1
    expect(err is not None and "'extra'" in err and "T2" in err and "horizon" in err,
           f"divergence not reported as expected: {err}")
else:
    expect(err is None, f"rank 0 reported {err}")
world.Barrier()

chk = EpochCheck(world.Dup(), rank, size, timeout=0.5)
if rank != 2:             # rank 2 never submits: rank 0 (its right neighbour) must time out
    chk.announce(epoch(5, "shutdown", [], 7))
err = None
if rank == 0:
    t0 = time.monotonic()
    try:
        while not chk.verified(epoch(5, "shutdown", [], 7)):
            time.sleep(1e-3)
            if time.monotonic() - t0 > 10:
                break
    except DivergenceError as exc:
        err = str(exc)
    expect(err is not None and "did not submit a matching epoch within 0.5 s" in err, f"timeout: {err}")
    expect(time.monotonic() - t0 < 5, "timeout took too long")
world.Barrier()

# pending tasks of stalled ranks (fences; no epoch announced): rank 1 submitted 'other' at T3000
# of a 4000-task stretch (messages past the eager size); a rank compares with its left
# neighbour's list, so ranks 1 and 2 find it, rank 0 (left: rank 2, the same stream) does not
chk = EpochCheck(world.Dup(), rank, size, timeout=2.0)
chk.PENDING_RECHECK = 0.0
stream = [(i, "device_compute", "other" if rank == 1 and i == 3000 else "k", [64]) for i in range(1, 4001)]
chk.pending_tasks = lambda after=None: stream
err = None
t0 = time.monotonic()
while time.monotonic() - t0 < 3.0:
    try:
        chk.poll(stalled=10.0)
    except DivergenceError as exc:
        err = str(exc)
        break
    time.sleep(1e-3)
if rank in (1, 2):
    one, other = "T3000 (device_compute 'other', range [64])", "T3000 (device_compute 'k', range [64])"
    expect(err is not None and f"rank {rank - 1} submitted {one if rank == 2 else other}; "
           f"rank {rank} submitted {other if rank == 2 else one}" in err, f"pending divergence: {err}")
else:
    expect(err is None, f"rank 0 reported {err}")
world.Barrier()
chk.close()

for p in problems:
    print(f"rank {rank}: FAIL {p}", flush=True)
if not problems:
    print(f"rank {rank}: ok", flush=True)
comm.close()
sys.exit(1 if problems else 0)
