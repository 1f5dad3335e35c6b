"""Contrast stretch: find an image's minimum and maximum with reductions, then rescale to 0..255.

One kernel carries two reductions: ``cl.minimum`` into a 0-D buffer and
``cl.maximum`` into a 1-element buffer (both shapes are reduction targets).  The
stretch kernel reads both through ``cl.all()``.  Pixels are integer-valued, so
minimum and maximum are exact whatever the split, and the stretch is elementwise
(the same float operations per pixel on every rank), so the output is
bit-identical to the numpy reference.
"""
from __future__ import annotations

import logging
import sys

import numpy as np

import celeritas as cl

from ._common import (Timer, base_parser, cli, console, image_output, positive, print_timing, progress_bar,
                      report_verification)

log = logging.getLogger("celeritas.apps")



def low_contrast_image(height: int, width: int, seed: int = 0, frame: int = 0) -> np.ndarray:
    """Integer-valued float32 grey image squeezed into a narrow band (what a stretch repairs).

    ``frame`` varies the band so that repeated passes see different extremes.
    """
    y, x = np.mgrid[0:height, 0:width]
    base = (np.sin(x / 17.0 + frame) + np.cos(y / 23.0)) * 20 + 100 + (x * 31 + y * 17 + seed) % 9
    lo = 60 + (frame * 7) % 20
    return np.clip(np.rint(base), lo, lo + 80).astype(np.float32)


def stretch(xp, values, lo, hi):
    """The per-pixel formula, shared by kernel and reference so both round identically."""
    lo = lo.reshape(()) if hasattr(lo, "reshape") else lo
    hi = hi.reshape(()) if hasattr(hi, "reshape") else hi
    span = xp.maximum(hi - lo, np.float32(1))
    scale = np.float32(255) / span
    return xp.clip(xp.rint((values - lo) * scale), 0, 255).astype(np.float32)


def reference(image: np.ndarray) -> tuple[np.ndarray, float, float]:
    lo, hi = np.float32(image.min()), np.float32(image.max())
    return stretch(np, image, np.asarray(lo), np.asarray(hi)), float(lo), float(hi)


def submit_minmax(q: cl.Queue, img: cl.Buffer, lo: cl.Buffer, hi: cl.Buffer) -> None:
    def cgf(cgh):
        r = img.access(cgh, cl.one_to_one(), cl.read)
        rmin = cl.reduction(lo, cgh, cl.minimum, initialize_to_identity=True)
        rmax = cl.reduction(hi, cgh, cl.maximum, initialize_to_identity=True)

        @cgh.parallel_for(img.shape, name="minmax", reductions=(rmin, rmax))
        def kernel(chunk, mn, mx):
            block = r[chunk]
            mn.combine(block.min())
            mx.combine(block.max())

    q.submit(cgf)


def submit_stretch(q: cl.Queue, img: cl.Buffer, lo: cl.Buffer, hi: cl.Buffer, out: cl.Buffer) -> None:
    def cgf(cgh):
        r = img.access(cgh, cl.one_to_one(), cl.read)
        rlo = lo.access(cgh, cl.all(), cl.read)
        rhi = hi.access(cgh, cl.all(), cl.read)
        w = out.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for(img.shape, name="stretch")
        def kernel(chunk):
            w[chunk] = stretch(chunk.xp, r[chunk], rlo[...], rhi[...])

    q.submit(cgf)


def run(q: cl.Queue, image: np.ndarray | int, *, repeat: int = 1, output: str | None = None, fetch: bool = True,
        progress: bool = False) -> tuple[np.ndarray, float, float] | None:
    """Stretch ``image`` (or a synthetic one of that edge length); returns (stretched, min, max).

    With ``repeat`` > 1 a new frame is stretched each pass (the video case); the
    result is that of the last frame.  ``fetch=False`` returns None without
    gathering anything (for the scaling harness).
    """
    if isinstance(image, (int, np.integer)):
        n = int(image)
        frames = [low_contrast_image(n, n, frame=f) for f in range(repeat)]
    else:
        frames = [np.asarray(image, dtype=np.float32)] * repeat
    shape = frames[0].shape
    lo = cl.Buffer(shape=(), dtype=np.float32, name="min")
    hi = cl.Buffer(shape=(1,), dtype=np.float32, name="max")
    out = cl.Buffer(shape=shape, dtype=np.float32, name="stretched")
    img = None
    with progress_bar(progress and q.rank == 0) as bar:
        task = bar.add_task("contrast stretch", total=repeat)
        for i, frame in enumerate(frames):
            if img is None or frame is not frames[i - 1]:     # a new frame needs a new buffer (a host copy)
                img = cl.Buffer(frame, name="image")
            submit_minmax(q, img, lo, hi)
            submit_stretch(q, img, lo, hi, out)
            bar.advance(task)
    if output:
        _write_png(q, out, output)
    if not fetch:
        return None
    return q.fence(out).result(), float(q.fence(lo).result()), float(q.fence(hi).result()[0])


def _write_png(q: cl.Queue, buf: cl.Buffer, path: str) -> None:
    """A master-node host task writes the file: no rank but 0 needs the whole image."""
    from .convolution import save_png

    def cgf(cgh):
        acc = buf.access(cgh, cl.all(), cl.read)

        def task(part):
            save_png(np.asarray(acc[...]).astype(np.uint8), path)
            log.info("wrote %s", path)

        cgh.host_task(task, on=cl.on_master_node, name="write_png")

    q.submit(cgf)


def main(argv=None) -> int:
    p = base_parser(__doc__, timed=True)
    p.add_argument("-N", "--size", type=positive, default=2048, help="edge length of the synthetic image")
    p.add_argument("-T", "--repeat", type=positive, default=1, help="frames to stretch")
    p.add_argument("--output", type=image_output, default="", help="PNG of the last stretched frame, written by rank 0")
    args = p.parse_args(argv)
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    with Timer() as t:
        result = run(q, args.size, repeat=args.repeat, output=args.output or None, progress=not args.no_progress)
        q.wait()
    rank, nranks, ndev = q.rank, q.num_ranks, q.num_devices
    q.shutdown()
    out, lo, hi = result
    if rank == 0:
        console.print(f"reduction (contrast stretch) {args.size}x{args.size} x{args.repeat} on {nranks} rank(s): "
                      f"{t.seconds:.3f} s, last frame min {lo:g} max {hi:g}", soft_wrap=True)
        if args.json:
            print_timing("reduction", nranks, ndev, args.size, args.repeat, t.seconds)
    if args.verify:
        ref, rlo, rhi = reference(low_contrast_image(args.size, args.size, frame=args.repeat - 1))
        ok = np.array_equal(out, ref) and (lo, hi) == (rlo, rhi)
        return report_verification(ok, rank)
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
