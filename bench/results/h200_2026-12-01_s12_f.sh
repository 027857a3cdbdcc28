#!/bin/bash
# Device run F, twelfth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s12_f.sh
# wgmma groups in flight (WsConfig.inflight, an experiment): every TMA tile and the
# cp.async 128 x 32 tile with 1, 2 and 3 groups (named <tile>m<groups>; the bare name is
# the config's own, 1), GPU time (CUPTI, each call evaluated alone, graphs off) at
# M = 16-2048 on 4096², gate/up and down_proj; then the exactness tests of the groups.
# WsConfig.inflight, the kernel's MI and tile_gpu_time's --inflight exist at commit
# d4a3683 only (no gain measured; reverted in the next commit): run this from there.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s12_f}
mkdir -p "$O"
N=""
python3 -c "import xdist" 2>/dev/null && N="-n 4"
timeout 90 python3 -m pytest -q -p no:cacheprovider $N tests/test_cuda.py -k "groups_in_flight" > "$O/tests.log" 2>&1
echo "tests rc=$?"; tail -2 "$O/tests.log"; grep -E "^(FAILED|ERROR)" "$O/tests.log" | head -20
MLX_USE_CUDA_GRAPHS=0 timeout 200 python3 bench/tile_gpu_time.py --m 16,128,512,2048 \
  --kn 4096x4096,4096x14336,14336x4096 --tiles ws32p4,tma32,tma64,tma128pp,tma256 \
  --inflight 1,2,3 --reps 5 > "$O/tiles_inflight.log" 2>&1
echo "tiles rc=$?"; grep -E "^(M=|MLX)" "$O/tiles_inflight.log"; grep -iE "error|Traceback" "$O/tiles_inflight.log" | head -5
