"""What one ``mx.fast.cuda_kernel`` launch costs the host, by length of its source text.

MLX's CUDA custom kernel copies the header and body into a new string on every call
(graph build) and hashes that whole string on every evaluation to find the compiled
module. This script measures both parts for a one-thread kernel whose header is padded
with comment lines to each ``--sizes`` byte count, and for the same padding reached
through ``#include "<absolute path>"`` (the text NVRTC reads from a file, so the string
MLX copies and hashes is one line). A chain of ``--launches`` launches is built (timed:
build) and evaluated (timed: eval), ``--rounds`` rounds in alternating order after one
warm-up chain per arm; an arm of MLX's own ``x + 1`` is the reference. More arms take
the one-line header and add what a GEMM launch passes: 8 integer template arguments
(``include_0_tpl8``), or ``I`` inputs and ``O`` outputs in all for each ``IxO`` of
``--io`` (``include_0_ioIxO``; the extra ones are 4-element float32 arrays, so what
differs between these arms is the count of arrays a launch names; a W8A8 linear's two
launches name 4 and 8 or 9, bf16's matmul 3).

Usage: ``python bench/custom_kernel_cost.py [--sizes 0,8192,32768] [--io 6x3]
[--launches 200] [--rounds 10]``. Prints per arm the median build and eval microseconds
per launch (p25..p75). Needs a CUDA device.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import mlx.core as mx

BODY = "y[0] = x[0] + 1.0f;\n"


def padding(size: int) -> str:
    """``size`` bytes of comment lines (80 bytes each, the last one shorter)."""
    line = "// " + "x" * 76 + "\n"
    full, rest = divmod(size, len(line))
    return line * full + ("//" + "x" * (rest - 3) + "\n" if rest >= 3 else "")


def make_arms(sizes: list[int], folder: str, io: list[tuple[int, int]]) -> dict:
    arms = {"mx_add": None}
    for s in sizes:
        text = padding(s)
        arms[f"inline_{s}"] = mx.fast.cuda_kernel(
            name=f"cost_inline_{s}", input_names=["x"], output_names=["y"],
            source=BODY, header=text)
        path = os.path.join(folder, f"pad_{s}.cuh")
        with open(path, "w") as f:
            f.write(text)
        arms[f"include_{s}"] = mx.fast.cuda_kernel(
            name=f"cost_include_{s}", input_names=["x"], output_names=["y"],
            source=BODY, header=f'#include "{path}"\n')
    empty = os.path.join(folder, "empty.cuh")
    open(empty, "w").close()
    arms["include_0_tpl8"] = (mx.fast.cuda_kernel(
        name="cost_include_tpl8", input_names=["x"], output_names=["y"], source=BODY,
        header=f'#include "{empty}"\n'), "tpl8")
    for i, o in io:
        arms[f"include_0_io{i}x{o}"] = (mx.fast.cuda_kernel(
            name=f"cost_include_io{i}x{o}", input_names=["x"] + [f"a{j}" for j in range(1, i)],
            output_names=["y"] + [f"u{j}" for j in range(1, o)], source=BODY,
            header=f'#include "{empty}"\n'), (i, o))
    return arms


TEMPLATE = [(f"C{i}", 64 * (i + 1)) for i in range(8)]


def chain(kernel, x: mx.array, n: int) -> tuple[float, float, mx.array]:
    kernel, extra = kernel if isinstance(kernel, tuple) else (kernel, None)
    i, o = extra if isinstance(extra, tuple) else (1, 1)
    more = [mx.zeros((4,), mx.float32) for _ in range(i - 1)]
    mx.eval(more)
    t0 = time.perf_counter()
    y = x
    for _ in range(n):
        if kernel is None:
            y = y + 1
        elif extra == "tpl8":
            y = kernel(inputs=[y], output_shapes=[(1,)], output_dtypes=[mx.float32],
                       grid=(1, 1, 1), threadgroup=(1, 1, 1), template=TEMPLATE)[0]
        else:  # the header arms are the I = O = 1 case of the --io ones
            y = kernel(inputs=[y, *more], output_shapes=[(1,)] + [(4,)] * (o - 1),
                       output_dtypes=[mx.float32] * o, grid=(1, 1, 1),
                       threadgroup=(1, 1, 1))[0]
    t1 = time.perf_counter()
    mx.eval(y)
    t2 = time.perf_counter()
    return t1 - t0, t2 - t1, y


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", default="0,8192,32768")
    p.add_argument("--io", default="6x3",
                   help="comma-separated IxO: arms naming I inputs and O outputs in all")
    p.add_argument("--launches", type=int, default=200)
    p.add_argument("--rounds", type=int, default=10)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")] if args.sizes else []
    try:
        io = [tuple(int(v) for v in t.split("x")) for t in args.io.split(",")] if args.io else []
    except ValueError:
        p.error(f"--io takes comma-separated IxO counts (e.g. 6x3), got {args.io!r}")
    if any(len(t) != 2 or min(t) < 1 for t in io):
        p.error(f"--io counts must be IxO with I, O >= 1, got {args.io!r}")
    if not mx.cuda.is_available():
        p.error("needs MLX's CUDA backend with a device")
    x = mx.zeros((1,), mx.float32)
    with tempfile.TemporaryDirectory() as folder:
        arms = make_arms(sizes, folder, io)
        for name, k in arms.items():  # warm-up: compile, and check the chain's value
            _, _, y = chain(k, x, args.launches)
            if float(y[0]) != args.launches:
                raise SystemExit(f"{name}: chain gave {float(y[0])}, want {args.launches}")
        samples = {n: [] for n in arms}
        names = list(arms)
        for r in range(args.rounds):
            for name in names if r % 2 == 0 else names[::-1]:
                b, e, _ = chain(arms[name], x, args.launches)
                samples[name].append((b, e))
    print(f"{args.launches} chained launches per sample, {args.rounds} alternating rounds; "
          f"microseconds per launch, median (p25..p75)")
    for name in names:
        for i, part in enumerate(("build", "eval")):
            v = [s[i] * 1e6 / args.launches for s in samples[name]]
            q = statistics.quantiles(v, n=4)
            print(f"{name:16s} {part:5s} {q[1]:7.2f} ({q[0]:.2f}..{q[2]:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
