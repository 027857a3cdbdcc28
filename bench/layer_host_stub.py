"""Host (Python) cost of one transformer layer's projections: bf16 ``nn.Linear`` vs
``mlx_w8a8.Linear`` with sibling launches (q/k/v, gate/up as one launch) and without.

Runs on any machine: ``mx.fast.cuda_kernel`` is stubbed (a launch returns new lazy
zeros of its output shapes), every W8A8 layer
decides the warp-specialized GEMM (as on an H200 at prefill), and the layer's seven
projections are called the way mlx-lm's Llama calls them (q, k, v on one x; o; gate, up on
one x; down), building the graph only (nothing is evaluated). What is timed is the Python
of the call path plus MLX's graph building of the bf16 arm's ops and of the stub's
returns; MLX's own custom-kernel node (its C++ build, about 3 us per launch on an H200
host, ``bench/launch_overhead.py``) is not included, so this bounds what the Python side
costs, not the whole host cost of a W8A8 layer.

Arms alternate block by block (A B C, then C B A, ...); per-layer time = block time /
calls. Reported: median and p25..p75 per arm and the per-block ratios to bf16.

With ``--real`` (on a CUDA device) nothing is stubbed: the launches are MLX's own
custom-kernel calls (still only built, never evaluated), so the arms include what MLX's
C++ does per launch; ``--hidden``, ``--inter``, ``--kv`` set the projections' sizes.

With ``--new-shapes N``, every call meets an input shape nothing ran before (lengths
T + 1, T + 2, ...), as a server's prompts do: ``--layers L`` blocks of one shape are
called in turn per length (the bf16 and linked W8A8 arms alternating), and the time per
layer includes what a W8A8 layer does on its first call at a shape (deciding, binding,
tracing); N lengths are timed after one untimed.

Usage: ``python bench/layer_host_stub.py [--blocks 40] [--calls 300] [--tokens 128]
[--real] [--hidden 512 --inter 1024 --kv 128] [--new-shapes N --layers L]
[--out FILE.jsonl]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import attrs  # noqa: E402
import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402

import mlx_w8a8  # noqa: E402
from mlx_w8a8 import siblings  # noqa: E402
from mlx_w8a8.kernels import registry  # noqa: E402
from mlx_w8a8.kernels.cuda import launch  # noqa: E402
from mlx_w8a8.tuning import render  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dispatch_cuda_stub import time_blocks  # noqa: E402

def stub_cuda_kernel(**build):
    """Stands in for ``mx.fast.cuda_kernel``: a launch returns zeros of its output shapes
    and dtypes, new lazy arrays on every call (never evaluated). They must be new: a
    launch traced by ``mx.compile`` (the layers' compiled calls) that returned arrays
    made outside the trace fails in MLX's compiler (``_Map_base::at``)."""
    def launch_stub(*, output_shapes, output_dtypes, **_):
        return [mx.zeros(s, dtype=d) for s, d in zip(output_shapes, output_dtypes)]
    return launch_stub


class Projections(nn.Module):
    """A Llama layer's seven projections, called as mlx-lm calls them (no attention,
    norms or activations: those are the same in every arm)."""

    def __init__(self, hidden: int, inter: int, kv: int):
        super().__init__()
        self.q_proj = nn.Linear(hidden, hidden, bias=False)
        self.k_proj = nn.Linear(hidden, kv, bias=False)
        self.v_proj = nn.Linear(hidden, kv, bias=False)
        self.o_proj = nn.Linear(hidden, hidden, bias=False)
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def __call__(self, x):
        q = self.q_proj(x)
        self.k_proj(x), self.v_proj(x)  # attention would use them; not built here
        h = self.o_proj(q)
        return self.down_proj(self.gate_proj(h) * self.up_proj(h))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--blocks", type=int, default=40)
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--out", help="append the JSON line to this file")
    p.add_argument("--real", action="store_true",
                   help="MLX's own custom-kernel calls (needs a CUDA device; graph build only)")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--inter", type=int, default=1024)
    p.add_argument("--kv", type=int, default=128)
    p.add_argument("--new-shapes", type=int, default=0,
                   help="time N calls, each at a length not run before")
    p.add_argument("--layers", type=int, default=8, help="blocks of one shape (--new-shapes)")
    args = p.parse_args(argv)
    if args.new_shapes < 0 or args.layers < 1:
        p.error(f"--new-shapes must be >= 0 and --layers >= 1, got {args.new_shapes}, "
                f"{args.layers}")
    if args.real:
        if not launch.cuda_available() or not launch.is_sm90():
            p.error("--real needs MLX's CUDA backend on a compute capability 9.x GPU")
    else:
        mx.set_default_device(mx.cpu)
        mx.fast.cuda_kernel = stub_cuda_kernel
        for c in [c for c in registry.all_candidates() if c.backend == "cuda"]:
            registry.register(attrs.evolve(c, available=lambda: True))
        launch.is_sm90 = lambda: True
    ws = registry.get("linear", "cuda_w8a8_gemm_ws")
    registry.set_chooser(lambda problem, found: (ws, "stub") if ws in found else None)

    hidden, inter, kv = args.hidden, args.inter, args.kv  # the Python path does not depend on them
    bf16 = Projections(hidden, inter, kv)
    bf16.set_dtype(mx.bfloat16)
    w8 = Projections(hidden, inter, kv)
    w8.update(bf16.parameters())
    mlx_w8a8.quantize(w8)
    if args.new_shapes:
        return new_shapes(args, bf16, w8, hidden, inter, kv)
    # A model feeds every forward a new x: rotating through more inputs than the
    # activation memo holds (plans._SHARED_SLOTS) keeps a call from reusing the quantized x
    # of an earlier call, which one fixed x let the unlinked arm do.
    xs = [mx.zeros((1, args.tokens, hidden), dtype=mx.bfloat16) for _ in range(8)]
    mx.eval(bf16.parameters(), w8.parameters(), *xs)
    turn = [0]

    def next_x():
        turn[0] = (turn[0] + 1) % len(xs)
        return xs[turn[0]]

    def linked():
        siblings.launch_together(True)
        return w8(next_x())

    def unlinked():
        siblings.launch_together(False)
        return w8(next_x())

    arms = {"bf16": lambda: bf16(next_x()), "w8a8_linked": linked, "w8a8_unlinked": unlinked}
    for f in arms.values():  # decisions made, launches bound, alone plans made
        for _ in range(3):
            f()
    times = time_blocks(arms, args.blocks, args.calls)
    siblings.launch_together(True)
    head = ["arm", "per layer (median)", "p25..p75", "ratio to bf16 (p25..p75)"]
    body, stats = [], {}
    for arm, ts in times.items():
        med, lo, hi = render.spread(ts)
        r = render.spread([a / b for a, b in zip(ts, times["bf16"])])
        stats[arm] = {"median_us": round(med * 1e6, 2), "p25_us": round(lo * 1e6, 2),
                      "p75_us": round(hi * 1e6, 2), "ratio_to_bf16": [round(v, 3) for v in r]}
        body.append([arm, f"{med * 1e6:.1f} us", f"{lo * 1e6:.1f}..{hi * 1e6:.1f}",
                     f"{r[0]:.2f}x ({r[1]:.2f}..{r[2]:.2f})"])
    print(render.columns(head, body, right=range(1, len(head))))
    return report(args, {"real": args.real, "tokens": args.tokens, "sizes": [hidden, inter, kv],
                         "blocks": args.blocks, "calls_per_block": args.calls,
                         "per_layer": stats})


def report(args, fields: dict) -> int:
    """Print the run's JSON line (``fields`` and the machine), appended to ``--out``."""
    record = {"bench": "layer_host_stub", **fields,
              "machine": platform.processor() or platform.machine(), "mlx": mx.__version__}
    print(json.dumps(record))
    if args.out:
        with open(args.out, "a") as f:
            f.write(json.dumps(record) + "\n")
    return 0


def new_shapes(args, bf16, w8, hidden: int, inter: int, kv: int) -> int:
    """``--new-shapes``: per layer, the host time of a call at an input shape not met
    before, ``--layers`` W8A8 blocks of one shape (each its own weights, as a model's
    layers) against the bf16 block called as many times."""
    blocks = [w8]
    for _ in range(args.layers - 1):
        block = Projections(hidden, inter, kv)
        block.update(bf16.parameters())
        mlx_w8a8.quantize(block)
        mx.eval(block.parameters())
        blocks.append(block)
    siblings.launch_together(True)
    lengths = iter(range(args.tokens + 1, args.tokens + 3 + 2 * args.new_shapes))

    def run(arm):
        x = mx.zeros((1, next(lengths), hidden), dtype=mx.bfloat16)
        start = time.perf_counter()
        for block in (blocks if arm == "w8a8_linked" else [bf16] * len(blocks)):
            block(x)
        return (time.perf_counter() - start) / len(blocks)

    run("bf16"), run("w8a8_linked")  # untimed: the first shape of each arm
    times = {"bf16": [], "w8a8_linked": []}
    for r in range(args.new_shapes):
        for arm in (times if r % 2 == 0 else list(times)[::-1]):
            times[arm].append(run(arm))
    stats = {}
    for arm, ts in times.items():
        med, lo, hi = render.spread(ts)
        stats[arm] = {"median_us": round(med * 1e6, 2), "p25_us": round(lo * 1e6, 2),
                      "p75_us": round(hi * 1e6, 2)}
        print(f"{arm:12s} per layer at a new shape {med * 1e6:8.1f} us ({lo * 1e6:.1f}.."
              f"{hi * 1e6:.1f})")
    return report(args, {"mode": "new_shapes", "real": args.real, "tokens": args.tokens,
                         "new_shapes": args.new_shapes, "layers": args.layers,
                         "sizes": [hidden, inter, kv], "per_layer": stats})


if __name__ == "__main__":
    sys.exit(main())
