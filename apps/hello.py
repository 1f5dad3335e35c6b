"""Hello world: every item fixes one character of a buffer; the master node prints it."""
from __future__ import annotations

import sys

import numpy as np

import celeritas as cl

from ._common import base_parser, cli, console

SECRET = "Ifmmp-!Xpsme\""   # "Hello, World!" shifted by one


def run(queue: cl.Queue, text: str = SECRET) -> str:
    data = np.frombuffer(text.encode(), dtype=np.uint8)
    buf = cl.Buffer(data, name="str")
    n = len(data)

    def decode(cgh):
        acc = buf.access(cgh, cl.one_to_one(), cl.read_write)

        @cgh.parallel_for((n,), name="decode")
        def kernel(chunk):
            acc[chunk] = acc[chunk] - 1

    queue.submit(decode)
    out = cl.HostObject([])

    def show(cgh):
        acc = buf.access(cgh, cl.all(), cl.read)
        lines = cl.side_effect(out, cgh)

        def task(part):
            lines.append(bytes(acc[...]).decode())

        cgh.host_task(task, on=cl.on_master_node, name="print")

    queue.submit(show)
    result = bytes(queue.fence(buf).result()).decode()
    lines = queue.fence(out).result()
    if queue.rank == 0:
        for line in lines:
            print(line)
    return result


def main(argv=None) -> int:
    args = base_parser(__doc__).parse_args(argv)
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    result = run(q)
    q.shutdown()
    if args.verify:
        ok = result == "Hello, World!"
        if q.rank == 0:
            console.print("[green]verified[/green]" if ok else f"[red]wrong result {result!r}[/red]")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
