"""Does a thread-block cluster reach the GPU through ``mx.fast.cuda_kernel``?

MLX launches custom kernels with plain launch parameters (no launch attributes), so
the only way to get a cluster is the compile-time ``__cluster_dims__`` attribute on the
kernel, put there by redefining ``__global__`` in the header (as gemm_ws.cu does for its
launch bounds). This probe launches 4 clusters of ``--cluster`` blocks; every block
writes its cluster rank and cluster id as the hardware reports them
(``%cluster_ctarank``, ``%clusterid.x``), stores its block index in its own shared
memory, passes a cluster barrier (``barrier.cluster.arrive.release`` /
``wait.acquire``) and reads the next rank's shared word through distributed shared
memory (``mapa`` + ``ld.shared::cluster``). With clusters working, block b reports rank
b % C, cluster b // C and neighbour C * (b // C) + (b + 1) % C.

Usage: ``python bench/cluster_probe.py [--cluster 4]``. Prints the table and ``ok`` or
what differed. Needs a CUDA device of compute capability 9.0 or later.
"""

from __future__ import annotations

import argparse
import sys

import mlx.core as mx

HEADER = """
#undef __global__
#define __global__ __attribute__((global)) __cluster_dims__({C}, 1, 1)
"""

BODY = """
__shared__ int mine;
if (threadIdx.x == 0) mine = blockIdx.x;
uint32_t rank, cid;
asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(rank));
asm volatile("mov.u32 %0, %%clusterid.x;" : "=r"(cid));
__syncthreads();
asm volatile("barrier.cluster.arrive.release.aligned;\\n" ::: "memory");
asm volatile("barrier.cluster.wait.acquire.aligned;\\n" ::: "memory");
uint32_t local = static_cast<uint32_t>(__cvta_generic_to_shared(&mine));
uint32_t remote;
uint32_t peer = (rank + 1) % C;
asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(remote) : "r"(local), "r"(peer));
int got;
asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(got) : "r"(remote) : "memory");
// keep every block's shared memory alive until its peers have read it
asm volatile("barrier.cluster.arrive.release.aligned;\\n" ::: "memory");
asm volatile("barrier.cluster.wait.acquire.aligned;\\n" ::: "memory");
if (threadIdx.x == 0) {
  out[3 * blockIdx.x + 0] = rank;
  out[3 * blockIdx.x + 1] = cid;
  out[3 * blockIdx.x + 2] = got;
}
"""


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cluster", type=int, default=4)
    args = p.parse_args(argv)
    c = args.cluster
    blocks = 4 * c
    kern = mx.fast.cuda_kernel(
        name=f"w8a8_cluster_probe_{c}", input_names=["x"], output_names=["out"],
        source=BODY, header=HEADER.format(C=c))
    x = mx.zeros((1,), mx.int32)
    (out,) = kern(inputs=[x], template=[("C", c)], output_shapes=[(blocks * 3,)],
                  output_dtypes=[mx.int32], grid=(blocks * 32, 1, 1), threadgroup=(32, 1, 1))
    got = out.reshape(blocks, 3).tolist()
    bad = 0
    for b, (rank, cid, peer) in enumerate(got):
        want = (b % c, b // c, c * (b // c) + (b + 1) % c)
        flag = "" if (rank, cid, peer) == want else f"  expected {want}"
        bad += bool(flag)
        print(f"block {b:3d}: rank {rank} cluster {cid} neighbour {peer}{flag}")
    print("ok" if bad == 0 else f"{bad} blocks differ")
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
