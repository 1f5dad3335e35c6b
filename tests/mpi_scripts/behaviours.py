"""BEHAVIOURS.md 5 and 11 from each rank's own graph records, then collective host tasks.

Run on 2 ranks with one device each.  Every rank checks what its record holds
(its own commands and instructions) and prints ``rank R: ok``; a failed check
makes that rank exit 1 after shutdown.
"""
import sys

import _setup  # noqa: F401
import numpy as np
from mpi4py import MPI

import celeritas as cl


def ancestors(instrs: dict, iid: int) -> set:
    seen, todo = set(), [iid]
    while todo:
        for d in instrs[todo.pop()]["deps"]:
            if d["id"] not in seen:
                seen.add(d["id"])
                todo.append(d["id"])
    return seen


def check_graphs(q, problems: list) -> None:
    rank, other = q.rank, 1 - q.rank
    b = cl.Buffer(shape=(256,), dtype=np.float32, name="b")

    def writer(cgh):
        b.access(cgh, cl.one_to_one(), cl.discard_write)
        cgh.parallel_for((256,), lambda chunk: None, name="writer")

    def reader(cgh):
        b.access(cgh, cl.all(), cl.read)
        cgh.parallel_for((256,), lambda chunk: None, name="reader")

    q.submit(writer)
    q.submit(reader)
    q.wait()
    g = q.graphs()
    own = [[128 * rank], [128 * rank + 128]]
    peer = [[128 * other], [128 * other + 128]]

    def expect(cond, what):
        if not cond:
            problems.append(what)

    # 5: exactly one push (own half, to the other rank) and one await_push (the other half)
    expect(set(g["commands"]) == {rank}, f"record holds commands of ranks {sorted(g['commands'])}")
    cmds = g["commands"].get(rank, [])
    pushes = [c for c in cmds if c["kind"] == "push"]
    awaits = [c for c in cmds if c["kind"] == "await_push"]
    expect(len(pushes) == 1, f"B5: {len(pushes)} pushes")
    expect(len(awaits) == 1, f"B5: {len(awaits)} await_pushes")
    if pushes:
        expect(pushes[0]["targets"] == [{"rank": other, "region": [own]}], f"B5: push {pushes[0]}")
    if awaits:
        expect(awaits[0]["region"] == [peer], f"B5: await_push {awaits[0]}")

    # 11: one send (own half) with a matching pilot, one receive (peer half), concurrent
    instrs = {i["id"]: i for i in g["instructions"]}
    sends = [i for i in instrs.values() if i["kind"] == "send"]
    recvs = [i for i in instrs.values() if i["kind"] in ("receive", "split_receive")]
    expect(len(sends) == 1, f"B11: {len(sends)} sends")
    expect(len(recvs) == 1, f"B11: {len(recvs)} receives")
    if sends:
        s = sends[0]
        expect(s["to"] == other and s["box"] == own, f"B11: send {s}")
        pil = [p for p in g["pilots"] if p["msg_id"] == s["msg_id"]]
        expect(len(pil) == 1 and pil[0]["to"] == other and pil[0]["box"] == own, f"B11: pilots {g['pilots']}")
    if recvs:
        expect(recvs[0]["region"] == [peer], f"B11: receive {recvs[0]}")
    if sends and recvs:
        s, r = sends[0]["id"], recvs[0]["id"]
        expect(r not in ancestors(instrs, s) and s not in ancestors(instrs, r),
               "B11: send and receive are not concurrent")


def check_collectives(q, problems: list) -> None:
    n = q.num_ranks
    group = cl.CollectiveGroup()
    seen = cl.HostObject([])

    def collective(on, tag):
        def cgf(cgh):
            lst = cl.side_effect(seen, cgh)

            def task(part):
                comm = part.comm
                lst.append((tag, isinstance(comm, MPI.Intracomm), comm.Get_size(), comm.Get_rank(),
                            comm.allreduce(comm.Get_rank() + 1), MPI.Comm.Compare(comm, MPI.COMM_WORLD),
                            comm.py2f()))
            cgh.host_task(task, on=on, name=f"collective_{tag}")
        return cgf

    q.submit(collective(cl.collective, "default"))
    q.submit(collective(cl.collective(group), "own"))
    q.submit(collective(cl.collective, "default_again"))
    got = q.fence(seen).result()
    q.wait(barrier=True)
    if [t[0] for t in got] != ["default", "own", "default_again"]:
        problems.append(f"collective tasks ran as {got}")
        return
    for tag, is_comm, size, crank, total, cmp, _h in got:
        if not (is_comm and size == n and crank == q.rank and total == n * (n + 1) // 2):
            problems.append(f"collective {tag}: {got}")
        if cmp != MPI.CONGRUENT:
            problems.append(f"collective {tag}: communicator is not a duplicate of COMM_WORLD ({cmp})")
    if got[0][6] != got[2][6] or got[0][6] == got[1][6]:
        problems.append(f"one communicator per collective group expected: {got}")


def main() -> int:
    q = cl.Queue(record=True, lookahead="none")
    problems: list = []
    check_graphs(q, problems)
    check_collectives(q, problems)
    rank = q.rank
    q.shutdown()
    for p in problems:
        print(f"rank {rank}: FAIL {p}", flush=True)
    if not problems:
        print(f"rank {rank}: ok", flush=True)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
