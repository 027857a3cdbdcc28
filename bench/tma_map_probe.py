"""Which TMA linear launches disagree with the cp.async tile on the same activation array:
a grid over M, K, the tile, the quantize body and a host read of the array before the
GEMM; each TMA launch is made twice (``kept=``: on a branch that
kept a weight's map across launches, the second read the map the first made; main makes
every map in the launch that uses it, writing it over the same bytes of the activation
array and of the weight's map array each time). Prints one line per case (``ok`` / ``DIFF`` with
the largest difference); needs an sm_90 GPU with tensor maps.
``python bench/tma_map_probe.py [--test-shapes] [--poison]``"""

import itertools
import sys

import mlx.core as mx
import numpy as np

from mlx_w8a8.kernels.cuda import (
    gemm as cuda_gemm,
    launch,
    quantize as cuda_quantize,
    tiles as cuda_tiles,
)
from mlx_w8a8.weight import QuantizedWeight


def poison_outputs() -> None:
    """Every kernel launch fills its outputs with -128 first (``init_value``), as
    tests/test_cuda.py's ``poison`` fixture does."""
    real = mx.fast.cuda_kernel

    def poisoned(**build):
        kernel = real(**build)

        def run(**call):
            call.setdefault("init_value", -128.0)
            return kernel(**call)
        return run

    mx.fast.cuda_kernel = poisoned
    launch._kernel.cache_clear()


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--poison" in argv:
        poison_outputs()
    rng = np.random.default_rng(0)
    bad = 0
    shapes = ((4096, 1), (1088, 33), (18944, 7)) if "--test-shapes" in argv else tuple(
        itertools.product((320, 1088, 4096), (1, 33, 300)))
    for (k, m), tile, warp, host in itertools.product(
            shapes, ("tma128", "tma128pp", "tma256", "tma32"), (False, True), (False, True)):
        w = QuantizedWeight.from_float(mx.array(rng.standard_normal((200, k)).astype(np.float32)),
                                       32, per_channel=True)
        x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
        xa = cuda_quantize.quantize_rowsum(x, warp)
        mx.eval(xa)
        if host:
            np.array(xa)
        cfg = cuda_tiles.TMA_CONFIGS[tile]
        cp = cuda_tiles.WS_CONFIGS[f"ws{cfg.bn}p4"]
        got = cuda_gemm.gemm_rowsum(xa, w, None, mx.bfloat16, cfg)
        want = cuda_gemm.gemm_rowsum(xa, w, None, mx.bfloat16, cp)
        again = cuda_gemm.gemm_rowsum(xa, w, None, mx.bfloat16, cfg)  # the launch again
        mx.eval(got, want, again)
        same = mx.array_equal(got, want).item()
        same2 = mx.array_equal(again, want).item()
        d = float(mx.abs(got.astype(mx.float32) - want.astype(mx.float32)).max().item())
        print(f"K={k:5d} M={m:4d} {tile:9s} warp={warp:d} host={host:d}: "
              f"{'ok' if same else 'DIFF'} kept={'ok' if same2 else 'DIFF'} max|d|={d:.3g}",
              flush=True)
        bad += (not same) + (not same2)
    print(f"{bad} differing launches")
    return 0


if __name__ == "__main__":
    sys.exit(main())
