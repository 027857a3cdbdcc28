#!/bin/bash
# Device run A, twelfth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s12_a.sh
# Where a small-M GEMM's time goes (an experiment; no kernel change): the narrow tiles'
# kernel time (CUPTI, each call evaluated alone, warm weights) against K at a fixed 32
# tiles (N = 1024 with 32-column tiles: the per-block rate), against N at K = 4096
# (32-256 tiles: when the blocks share a limit), and ncu of the 128 x 32 TMA tile at
# M = 16 and 128 on 4096 x 4096 (stall reasons, memory throughput).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s12_a}
mkdir -p "$O"
MLX_USE_CUDA_GRAPHS=0 timeout 150 python3 bench/tile_gpu_time.py --m 16,128 \
  --kn 1024x1024,2048x1024,4096x1024,8192x1024,16384x1024 --tiles ws32p4,tma32,tma64 --reps 7 > "$O/ksweep.log" 2>&1
echo "ksweep rc=$?"; grep -E "^(M=|MLX)" "$O/ksweep.log"; grep -iE "error|Traceback" "$O/ksweep.log" | head -5
MLX_USE_CUDA_GRAPHS=0 timeout 120 python3 bench/tile_gpu_time.py --m 16,128 \
  --kn 4096x2048,4096x4096,4096x8192 --tiles ws32p4,tma32,tma64 --reps 7 > "$O/nsweep.log" 2>&1
echo "nsweep rc=$?"; grep -E "^(M=|MLX)" "$O/nsweep.log"; grep -iE "error|Traceback" "$O/nsweep.log" | head -5
cat > "$O/one_tile.py" <<'PY'
import sys
import mlx.core as mx
import numpy as np
from mlx_w8a8.kernels import cuda_launch as launch
from mlx_w8a8.weight import QuantizedWeight
m, k, n, tile = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = np.random.default_rng(0)
w = mx.array(rng.standard_normal((n, k)).astype(np.float32) / np.sqrt(k)).astype(mx.bfloat16)
qw = QuantizedWeight.from_float(w, 64, per_channel=True)
x = mx.array(rng.standard_normal((m, k)).astype(np.float32)).astype(mx.bfloat16)
xq, xs, xr = launch.quantize(x, row_sum=True)
mx.eval(qw.q, xq, xs, xr)
cfg = {**launch.WS_CONFIGS, **launch.TMA_CONFIGS}[tile]
for _ in range(4):
    mx.eval(launch.gemm_per_channel(xq, xs, qw, None, mx.bfloat16, cfg, row_sums=xr))
    mx.synchronize()
PY
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats"
for mm in 16 128; do
  MLX_USE_CUDA_GRAPHS=0 timeout 60 ncu --clock-control none $SEC -k regex:gemm_ws --launch-skip 2 --launch-count 1 \
    python3 "$O/one_tile.py" $mm 4096 4096 tma32 > "$O/ncu_tma32_m$mm.txt" 2>&1
  echo "ncu m=$mm rc=$?"; grep -E "Duration|SM Frequency|Throughput|Busy|Issue Slots|Hit Rate|Stall|Warp Cycles|Eligible|No Eligible" "$O/ncu_tma32_m$mm.txt" | head -30
done
