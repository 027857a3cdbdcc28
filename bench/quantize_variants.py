"""Experiment: launch shapes of the activation quantize at M = 512-8192, kernel time.

The shipped ``rowsum`` body runs one block per row with as few threads as keep the row
in registers (64 for a 4096-wide bfloat16 row), so at M = 2048 every block of the grid
is resident at once: all rows are read, then all are written, and the kernel measured
2.2x the copy floor where MLX's own ``astype(int8)`` of the same x measured 1.5x
(docs/cuda.md, eleventh set). This script times, with CUPTI and without MLX's CUDA
graphs (run it with ``MLX_USE_CUDA_GRAPHS=0``), against ``astype(int8)``:

- ``rowsum``: the shipped launch (``cuda_launch.quantize_spec``);
- ``rowsum_t128`` / ``rowsum_t256``: the same body with 128 / 256 threads per row;
- ``rowsum_warp``: the shipped one-warp-per-row body;
- ``stream_bB``: a body defined here (not shipped): a persistent grid of B blocks per SM,
  each walking rows ``blockIdx.x, + gridDim.x, ...`` and issuing the loads of its next
  row before it reduces and writes the current one, so reads and writes overlap.

Every variant's codes, scales and row sums are compared bit for bit with the shipped
launch before it is timed (a mismatch is printed and the variant skipped).

Usage: ``MLX_USE_CUDA_GRAPHS=0 python bench/quantize_variants.py [--m 2048,8192]
[--k 4096,14336] [--chain 40]``. Needs a CUDA GPU and torch with CUPTI.
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402

from mlx_w8a8.kernels import cuda_launch as launch  # noqa: E402
from mlx_w8a8.kernels import sources  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from chain_timeline import activations, banner, measure  # noqa: E402

SMS = 132  # H200

# The persistent variant. Same per-row functions as quantize.cu (AbsMax, RowQuantizer,
# decode8), so the same bits; the row is wholly in registers (the launcher's thread
# count guarantees chunks <= kCached * blockDim.x), and the next row's raw chunks are
# loaded into a second register set before the current row's reductions and stores.
STREAM = r"""
namespace w8a8x {
template <typename T>
__device__ __forceinline__ void quantize_rows_stream(const T* x, int M, int K, int8_t* q,
                                                     float* scale, int32_t* rsum) {
  using namespace w8a8;
  __shared__ uint32_t warp_max[32];
  __shared__ int warp_sum[32];
  constexpr int kC = sizeof(T) == 4 ? 4 : 8;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int nwarps = blockDim.x >> 5;
  const int chunks = K >> 3;
  int row = blockIdx.x;
  if (row >= M) return;  // the whole block
  Raw8<T> cur[kC], nxt[kC];
  const T* xr = x + (size_t)row * K;
#pragma unroll
  for (int i = 0; i < kC; ++i) cur[i] = load_raw8(xr + min(tid + i * (int)blockDim.x, chunks - 1) * 8);
  for (; row < M; row += gridDim.x) {
    const int next = row + gridDim.x;
    if (next < M) {  // uniform: in flight while this row is reduced and written
      const T* xn = x + (size_t)next * K;
#pragma unroll
      for (int i = 0; i < kC; ++i) nxt[i] = load_raw8(xn + min(tid + i * (int)blockDim.x, chunks - 1) * 8);
    }
    AbsMax<T> amax;
#pragma unroll
    for (int i = 0; i < kC; ++i) amax.add(cur[i]);
    amax.reduce_block(warp_max);
    const RowQuantizer qz = RowQuantizer::of(amax.value());
    int8_t* qr = q + (size_t)row * K;
    int total = 0;
#pragma unroll
    for (int i = 0; i < kC; ++i) {
      const int c = tid + i * (int)blockDim.x;
      if (c < chunks) {
        float f[8];
        decode8(cur[i], f);
        uint32_t packed[2];
        total += qz.codes8(f, packed);
        *reinterpret_cast<uint2*>(qr + c * 8) = make_uint2(packed[0], packed[1]);
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) total += __shfl_xor_sync(0xffffffffu, total, o);
    if (lane == 0) warp_sum[warp] = total;
    __syncthreads();
    if (tid == 0) {
      int r = 0;
      for (int w = 0; w < nwarps; ++w) r += warp_sum[w];
      rsum[row] = r;
      scale[row] = qz.s;
    }
    __syncthreads();  // warp_sum is written again for the next row
#pragma unroll
    for (int i = 0; i < kC; ++i) cur[i] = nxt[i];
  }
}
}  // namespace w8a8x
"""
STREAM_BODY = ("w8a8x::quantize_rows_stream<T>(x, w8a8::rows(x_shape, x_ndim), "
               "x_shape[x_ndim - 1], q, scale, rsum);\n")


def stream_kernel():
    header = launch.load("quantize.cu")[0] + STREAM
    return mx.fast.cuda_kernel(
        name=f"w8a8x_quantize_stream_{sources.digest(header, STREAM_BODY)[:12]}",
        input_names=["x"], output_names=["q", "scale", "rsum"], source=STREAM_BODY,
        header=header, ensure_row_contiguous=True)


def variants(m: int, k: int):
    """``{name: fn(x) -> (q, scale, rsum)}`` for one shape."""
    base = launch.quantize_spec(m, k, mx.bfloat16, row_sum=True)
    threads = base.threadgroup[0]
    out = {"rowsum": lambda x: base.launch(x)}
    for t in (128, 256):
        if t > threads and k // 8 <= 8 * t:
            spec = base._replace(grid=(m * t, 1, 1), threadgroup=(t, 1, 1))
            out[f"rowsum_t{t}"] = lambda x, spec=spec: spec.launch(x)
    warp = launch.quantize_spec(m, k, mx.bfloat16, row_sum=True, warp=True)
    out["rowsum_warp"] = lambda x: warp.launch(x)
    kern = stream_kernel()
    for b in (2, 4, 8):
        blocks = min(m, SMS * b)
        spec = base._replace(kernel=kern, grid=(blocks * threads, 1, 1))
        out[f"stream_b{b}"] = lambda x, spec=spec: spec.launch(x)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--m", default="512,2048,8192")
    p.add_argument("--k", default="4096,14336")
    p.add_argument("--chain", type=int, default=40)
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    rng = np.random.default_rng(0)
    banner(f"chain {args.chain}; kernel us (median), GB/s over 3 M K bytes")
    for k in [int(v) for v in args.k.split(",")]:
        for m in [int(v) for v in args.m.split(",")]:
            xs, X = activations(m, k, rng)
            fns = variants(m, k)
            want = [np.array(a) for a in fns["rowsum"](xs[0])]
            arms = {}
            for name, fn in fns.items():
                got = [np.array(a) for a in fn(xs[0])]
                bad = [i for i, (g, w) in enumerate(zip(got, want))
                       if g.shape != w.shape or g.tobytes() != w.tobytes()]
                if bad:
                    print(f"M={m:5d} K={k:6d} {name:12s} DIFFERS from rowsum in outputs {bad}; "
                          f"not timed", flush=True)
                    continue
                arms[name] = lambda c, fn=fn: mx.eval([fn(xs[i % X]) for i in range(c)])
            arms["astype(int8)"] = lambda c: mx.eval([xs[i % X].astype(mx.int8) for i in range(c)])
            for name, fn in arms.items():
                r = measure(fn, args.chain, args.rounds, False)
                print(f"M={m:5d} K={k:6d} {name:12s} kernel {r['kernel']:7.1f}  GB/s "
                      f"{3.0 * m * k / r['kernel'] / 1e3:6.0f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
