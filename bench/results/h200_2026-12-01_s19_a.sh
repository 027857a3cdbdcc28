#!/bin/bash
# Device run A, nineteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s19_a.sh
# Ran main at commit 3a19af2 plus (committed after this run) the compile tests' comparison
# up to FMA contraction, the one-group-per-row test and qmm_probe.py --verbose.
#  1. the layer's, ops', reference and registry tests on the GPU: the qmm guard
#     (reference.qmm_supports) had not run there since it was added;
#  2. bench/qmm_probe.py on what the eighteenth set did not reach, six processes side by
#     side (MLX compiles a kernel per shape, on the host's cores): float32 at K >= 128,
#     group size 128, float16, K = group size = 32, and M = 2, 3, 8 at K = 64.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s19_a}
mkdir -p "$O"
P="timeout 280 python3 bench/qmm_probe.py --verbose"
$P --dtype float32 --group-size 64 --m 4,32 --n 64,1024 --k 128,256,512,1024,4096 > "$O/probe_f32_g64.log" 2>&1 &
$P --dtype bfloat16 --group-size 128 --m 1,4,32 --n 64,1024 --k 128,256,512,4096 > "$O/probe_bf16_g128.log" 2>&1 &
$P --dtype float32 --group-size 128 --m 1,4,32 --n 64,1024 --k 128,256,512 > "$O/probe_f32_g128.log" 2>&1 &
$P --dtype float16 --group-size 64 --m 1,4,32 --n 64,1024 --k 64,128,256,4096 > "$O/probe_f16_g64.log" 2>&1 &
$P --dtype bfloat16,float32 --group-size 32 --m 1,4,32 --n 64,1024 --k 32 > "$O/probe_g32_k32.log" 2>&1 &
$P --dtype bfloat16 --group-size 64 --m 2,3,8 --n 64,1024 --k 64 > "$O/probe_small_m.log" 2>&1 &
timeout 300 python3 -m pytest -q -p no:cacheprovider tests/test_nn.py tests/test_ops.py \
  tests/test_reference.py tests/test_registry.py > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -n 3 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
wait
for f in "$O"/probe_*.log; do echo "== $(basename $f)"; grep -c "^ok" "$f"; grep -E "^WRONG|cases wrong" "$f"; done
