#!/bin/bash
# Device run D, fourteenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s14_d.sh
# Where the block-per-row quantize (quantize.cu rowsum, main's tree) spends its
# instructions at M = 2048, K = 4096: run B counted about 38 K warp instructions per SM
# (2.5 K per row of 4096), about twice the fast path's count. ncu's instruction
# statistics and its per-SASS-line source page (instructions executed, stall samples).
# Ran main's tree (commit 3220aa3's kernels).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s14_d}
mkdir -p "$O"
cat > "$O/one.py" <<'PY'
import sys
import mlx.core as mx
from mlx_w8a8.kernels import cuda_launch as launch
m, k = int(sys.argv[1]), int(sys.argv[2])
x = mx.random.normal((m, k)).astype(mx.bfloat16)
mx.eval(x)
for _ in range(3):
    mx.eval(launch.quantize(x, row_sum=True))
mx.synchronize()
PY
MLX_USE_CUDA_GRAPHS=0 timeout 120 ncu --clock-control none --section InstructionStats --section SourceCounters \
  --section WarpStateStats --import-source no -k regex:w8a8_quantize --launch-skip 2 --launch-count 1 \
  -o "$O/quant" python3 "$O/one.py" 2048 4096 > "$O/ncu_run.log" 2>&1
echo "ncu rc=$?"; tail -3 "$O/ncu_run.log"
ncu -i "$O/quant.ncu-rep" --print-details all > "$O/ncu_details.txt" 2>&1
grep -E "Executed Instructions|Issued Instructions|Branch|Warp Cycles|Stall" "$O/ncu_details.txt" | head -30
ncu -i "$O/quant.ncu-rep" --page source --csv --print-source sass > "$O/ncu_sass.csv" 2>&1
echo "sass rc=$? lines $(wc -l < "$O/ncu_sass.csv")"; head -3 "$O/ncu_sass.csv" | cut -c1-400
# Kept in the repository: ..._s14_d_ncu_sass_by_opcode.txt, the CSV grouped by SASS opcode
# (instructions executed and stall samples per opcode); the 1.3 MB CSV itself is not.
