#!/bin/bash
# Device run A, twenty-ninth set. Tree: main at 05d17a6 (the tie-free quantize merged, its
# table shipped; no code change since):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s29_a.sh
# 1) every CUDA test on the final tree (the twenty-eighth set ran only the quantize and
#    GEMV tests on it);
# 2) where the 4096 x 4096 linear at M = 2048 loses its wall-clock ratio to bf16: the
#    W8A8 linear (TMA and warp-specialized GEMMs, as mlx_w8a8.Linear runs them) and bf16
#    mx.matmul as chains of 12 launches (the chain `bench --cider` picks at this shape)
#    and of 40, independent / dependent / fed, CUDA graphs on (as the bench runs) and
#    off: per launch the kernels' summed time, the GPU span and the wall clock.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s29_a}
mkdir -p "$O"
timeout 260 python3 -m pytest -q -n 12 -p no:cacheprovider tests/test_cuda.py > "$O/tests_cuda.log" 2>&1
echo "cuda tests rc=$?"; tail -n 2 "$O/tests_cuda.log"; grep -E "^(FAILED|ERROR)" "$O/tests_cuda.log" | head
for c in 12 40; do
  timeout 90 python3 bench/chain_timeline.py --linear --m 2048 --kn 4096x4096 --chain $c --rounds 7 \
    > "$O/linear_graphs_chain$c.log" 2>&1
  echo "graphs chain $c rc=$?"; grep -E "^M=" "$O/linear_graphs_chain$c.log"
done
MLX_USE_CUDA_GRAPHS=0 timeout 90 python3 bench/chain_timeline.py --linear --m 2048 --kn 4096x4096 \
  --chain 12 --rounds 7 > "$O/linear_nographs_chain12.log" 2>&1
echo "no graphs rc=$?"; grep -E "^M=" "$O/linear_nographs_chain12.log"
