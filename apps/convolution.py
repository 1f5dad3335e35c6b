"""Image convolution: a Gaussian blur, then a 3x3 sharpen, written out as a PNG.

The image is a 3-D buffer (rows, columns, channels) so the kernels run over a
3-D range and the split cuts rows only.  Each stage reads its input through
``neighborhood(r, r, 0)``: ranks exchange ``r`` halo rows per neighbour.  At the
image borders a chunk pads its block by repeating the edge pixels, which is
exactly what the numpy reference does with ``np.pad(mode="edge")`` on the whole
image, and every pixel is summed tap by tap in the same order in both, so the
result is bit-identical for any split.  After each sharpen the pixels are
rounded and clipped to 0..255, so the output is integer-valued.
"""
from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np

import celeritas as cl

from ._common import (Timer, base_parser, cli, console, image_output, input_file, nonnegative, positive, positive_float,
                      print_timing, progress_bar, report_verification)

log = logging.getLogger("celeritas.apps")

SHARPEN = np.array([[0, -1, 0], [-1, 5, -1], [0, -1, 0]], dtype=np.float32)



def gaussian_weights(radius: int, sigma: float | None = None) -> np.ndarray:
    """Normalized (2r+1)^2 Gaussian taps in float32 (the dtype the kernels multiply with)."""
    sigma = sigma if sigma is not None else max(radius / 2.0, 0.5)
    ax = np.arange(-radius, radius + 1, dtype=np.float64)
    g = np.exp(-(ax[:, None] ** 2 + ax[None, :] ** 2) / (2 * sigma * sigma))
    return (g / g.sum()).astype(np.float32)


def synthetic_image(height: int, width: int, channels: int = 3) -> np.ndarray:
    """A deterministic RGB test picture with edges, gradients and texture (uint8)."""
    y, x = np.mgrid[0:height, 0:width]
    r = (x * 255 // max(1, width - 1)).astype(np.int64)
    g = (y * 255 // max(1, height - 1)).astype(np.int64)
    cy, cx = height / 2, width / 2
    disc = ((y - cy) ** 2 + (x - cx) ** 2) < (min(height, width) / 3) ** 2
    checker = ((y // 8 + x // 8) % 2) * 60
    b = np.where(disc, 220, 40) + checker - 30
    img = np.stack([r, g, b, (r + g) // 2][:channels], axis=-1)
    noise = (x * 7919 + y * 104729) % 23 - 11
    return np.clip(img + noise[..., None], 0, 255).astype(np.uint8)


def load_image(path: str | Path) -> np.ndarray:
    from PIL import Image
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.uint8)


def save_png(image: np.ndarray, path: str | Path) -> None:
    from PIL import Image
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.ascontiguousarray(image.astype(np.uint8))).save(path)


def _apply(xp, padded, weights: np.ndarray, h: int, w: int):
    """Sum of taps in a fixed order: the same float operations per pixel for any block size."""
    out = xp.zeros((h, w) + tuple(padded.shape[2:]), dtype=np.float32)
    kh, kw = weights.shape
    for dy in range(kh):
        for dx in range(kw):
            wt = weights[dy, dx]
            if wt != 0:
                out += wt * padded[dy:dy + h, dx:dx + w]
    return out


def _finish(xp, values, sharpen: bool):
    return xp.clip(xp.rint(values), 0, 255).astype(np.float32) if sharpen else values


def reference(image: np.ndarray, radius: int = 2, sigma: float | None = None, iterations: int = 1) -> np.ndarray:
    """The sequential numpy pipeline (uint8 result)."""
    cur = image.astype(np.float32)
    h, w = cur.shape[:2]
    gw = gaussian_weights(radius, sigma)
    for _ in range(iterations):
        for weights, r, sharpen in ((gw, radius, False), (SHARPEN, 1, True)):
            padded = np.pad(cur, ((r, r), (r, r), (0, 0)), mode="edge")
            cur = _finish(np, _apply(np, padded, weights, h, w), sharpen)
    return cur.astype(np.uint8)


def submit_stage(q: cl.Queue, src: cl.Buffer, dst: cl.Buffer, weights: np.ndarray, sharpen: bool,
                 name: str) -> None:
    h, w, c = src.shape
    r = weights.shape[0] // 2

    def cgf(cgh):
        rs = src.access(cgh, cl.neighborhood(r, r, 0), cl.read)
        wd = dst.access(cgh, cl.one_to_one(), cl.discard_write)

        @cgh.parallel_for((h, w, c), name=name)
        def kernel(chunk):
            (y0, x0, c0), (y1, x1, c1) = chunk.box.min, chunk.box.max
            xp = chunk.xp
            ya, yb, xa, xb = max(0, y0 - r), min(h, y1 + r), max(0, x0 - r), min(w, x1 + r)
            block = rs[ya:yb, xa:xb, c0:c1]
            pads = ((r - (y0 - ya), r - (yb - y1)), (r - (x0 - xa), r - (xb - x1)), (0, 0))
            if any(p for pair in pads for p in pair):
                block = xp.pad(block, pads, mode="edge")
            wd[chunk] = _finish(xp, _apply(xp, block, weights, y1 - y0, x1 - x0), sharpen)

    q.submit(cgf)


def _write_png(q: cl.Queue, buf: cl.Buffer, path: str) -> None:
    """A master-node host task writes the file, so no rank but 0 needs the whole image."""
    def cgf(cgh):
        acc = buf.access(cgh, cl.all(), cl.read)

        def task(part):
            save_png(np.asarray(acc[...]), path)
            log.info("wrote %s", path)

        cgh.host_task(task, on=cl.on_master_node, name="write_png")

    q.submit(cgf)


def run(q: cl.Queue, image: np.ndarray | int, *, radius: int = 2, sigma: float | None = None, iterations: int = 1,
        output: str | None = None, fetch: bool = True, progress: bool = False) -> np.ndarray | None:
    """Blur and sharpen ``image`` (an array, or an edge length for the synthetic one) ``iterations`` times.

    Returns the uint8 result on every rank, or None with ``fetch=False`` (the scaling
    harness times the computation without gathering the image to every rank).
    """
    if isinstance(image, (int, np.integer)):
        image = synthetic_image(int(image), int(image))
    if image.ndim == 2:
        image = image[..., None]
    h, w, c = image.shape
    gw = gaussian_weights(radius, sigma)
    a = cl.Buffer(image.astype(np.float32), name="image")
    tmp = cl.Buffer(shape=(h, w, c), dtype=np.float32, name="blurred")
    b = cl.Buffer(shape=(h, w, c), dtype=np.float32, name="sharpened")
    with progress_bar(progress and q.rank == 0) as bar:
        task = bar.add_task("convolution", total=2 * iterations)
        for _ in range(iterations):
            submit_stage(q, a, tmp, gw, False, "blur")
            bar.advance(task)
            submit_stage(q, tmp, b, SHARPEN, True, "sharpen")
            bar.advance(task)
            a, b = b, a
    if output:
        out8 = cl.Buffer(shape=(h, w, c), dtype=np.uint8, name="png")

        def to_u8(cgh):
            r = a.access(cgh, cl.one_to_one(), cl.read)
            wo = out8.access(cgh, cl.one_to_one(), cl.discard_write)
            cgh.parallel_for((h, w, c), lambda chunk: wo.__setitem__(chunk, r[chunk].astype(np.uint8)),
                             name="to_uint8")

        q.submit(to_u8)
        _write_png(q, out8, output)
    if not fetch:
        return None
    return q.fence(a).result().astype(np.uint8)


def main(argv=None) -> int:
    p = base_parser(__doc__, timed=True)
    p.add_argument("-N", "--size", type=positive, default=1024, help="edge length of the synthetic image")
    p.add_argument("--input", type=input_file, default=None, help="a picture to filter instead of the synthetic one")
    p.add_argument("--output", type=image_output, default="convolution.png",
                   help="picture (.png, .jpg, ...) written by rank 0 ('' for none)")
    p.add_argument("--radius", type=nonnegative, default=2, help="Gaussian radius in pixels")
    p.add_argument("--sigma", type=positive_float, default=None,
                   help="Gaussian width in pixels (default: radius / 2, at least 0.5)")
    p.add_argument("-T", "--iterations", type=positive, default=1, help="blur + sharpen passes")
    args = p.parse_args(argv)
    image = load_image(args.input) if args.input else synthetic_image(args.size, args.size)
    q = cl.Queue(devices=args.devices, lookahead=args.lookahead)
    with Timer() as t:
        result = run(q, image, radius=args.radius, sigma=args.sigma, iterations=args.iterations,
                     output=args.output or None, progress=not args.no_progress)
        q.wait()
    rank, nranks, ndev = q.rank, q.num_ranks, q.num_devices
    q.shutdown()
    h, w = image.shape[:2]
    if rank == 0:
        console.print(f"convolution {h}x{w}, radius {args.radius}, {args.iterations} pass(es) on {nranks} rank(s): "
                      f"{t.seconds:.3f} s" + (f", wrote {args.output}" if args.output else ""), soft_wrap=True)
        if args.json:
            print_timing("convolution", nranks, ndev, h, args.iterations, t.seconds)
    if args.verify:
        ok = np.array_equal(result, reference(image, args.radius, args.sigma, args.iterations))
        return report_verification(ok, rank)
    return 0


if __name__ == "__main__":
    sys.exit(cli(main))
