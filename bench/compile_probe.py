"""Does a model of ``mlx_w8a8.Linear`` layers give the eager result under ``mx.compile``?

Builds the two-layer model of ``tests/test_nn.py``'s compile tests (128 -> 64 with a
bias, 64 -> 32 without; float32 x of 4 rows), runs it eagerly and compiled (as a closure,
and with ``inputs=model.state``) for each kernel choice, and prints the largest
difference and the first outputs; the same for stock ``nn.QuantizedLinear`` layers (8-bit,
group 64) built from the same float weights, to tell MLX's behaviour from the layer's.
Each eager output is also compared with the float model's (the quantization error, about
a percent of the largest output, is the expected difference). The first model built
forces ``--first`` (then the same kernel runs again later in the process).

Usage: ``python bench/compile_probe.py [--rows 4] [--dtype float32] [--first mlx_qmm]``.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import mlx.nn as nn  # noqa: E402
import numpy as np  # noqa: E402

import mlx_w8a8 as w8  # noqa: E402


def host(y: mx.array) -> np.ndarray:
    return np.array(y.astype(mx.float32)).astype(np.float64)


def compare(label: str, model, x, reference: np.ndarray) -> None:
    """Eager and compiled outputs against each other and against the float model's
    (``reference``: a quantized model differs from it by its quantization error only)."""
    want = host(model(x))
    scale = float(np.max(np.abs(reference)))
    print(f"{label:28s} eager         max |eager - float model| / max |float| "
          f"{float(np.max(np.abs(want - reference))) / scale:.3g}  eager[0, :3] "
          f"{np.round(want[0, :3], 4).tolist()}", flush=True)
    for how, f in (("closure", mx.compile(lambda v: model(v))),
                   ("inputs=state", mx.compile(lambda v: model(v), inputs=model.state))):
        got = host(f(x))
        diff = float(np.max(np.abs(got - want)))
        print(f"{label:28s} {how:13s} max |compiled - eager| {diff:.3g}  "
              f"compiled[0, :3] {np.round(got[0, :3], 4).tolist()}", flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    p.add_argument("--first", default="mlx_qmm", help="the kernel forced in the first model built")
    args = p.parse_args(argv)
    dtype = getattr(mx, args.dtype)
    rng = np.random.default_rng(0)
    x = mx.array(rng.standard_normal((args.rows, 128)).astype(np.float32)).astype(dtype)
    print(f"MLX {mx.__version__}, device {mx.default_device()}, x {args.rows} x 128 {args.dtype}")
    floats = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 32, bias=False))
    floats.set_dtype(dtype)
    reference = host(floats(x))
    for kernel in (args.first, None, "exact", "mlx_qmm"):
        model = nn.Sequential(w8.Linear.from_linear(floats.layers[0]),
                              w8.Linear.from_linear(floats.layers[1]))
        for layer in model.layers:
            layer.kernel = kernel
        model(x)
        decided = [layer.decision(args.rows, dtype) for layer in model.layers]
        compare(f"mlx_w8a8.Linear {kernel or 'auto'}", model, x, reference)
        print(f"  decisions {decided}")
    stock = nn.Sequential(nn.Linear(128, 64), nn.Linear(64, 32, bias=False))
    stock.update(floats.parameters())
    nn.quantize(stock, group_size=64, bits=8)
    compare("nn.QuantizedLinear 8-bit", stock, x, reference)
    return 0


if __name__ == "__main__":
    sys.exit(main())
