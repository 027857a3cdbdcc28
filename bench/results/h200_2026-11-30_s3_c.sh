#!/bin/bash
# Device run C, third set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build): A/B/C of the ws GEMM
# (128 x 256 and 128 x 128 tiles, M = 2048, 4096 x 4096) after run B found it 1.4x slower than
# in the final run of the first set, plus ncu of the first and third. Prepare, in the project root:
#   mkdir -p abtest/alt abtest/old; for f in gemm.cu gemm_wgmma.cu gemm_ws.cu; do
#     git show 2e78894:mlx_w8a8/shaders/cuda/$f > abtest/old/$f; done
#   abtest/alt/gemm_ws.cu: commit 6010e14's gemm_ws.cu with the producer's copies predicated
#   (src-size 0) instead of skipped by a branch (what the tree has since).
# "cur" = commit 6010e14 (branching copies), "alt" = predicated copies, "old" = the files
# before the header split (commit 2e78894).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/ab}
D=mlx_w8a8/shaders/cuda
ARGS="--variants --arms i8gemm[ws256p4],i8gemm[ws128p4],torch,bf16 --m 2048 --kn 4096x4096 --pairs 6"
cp $D/gemm_ws.cu /tmp/cur_ws.cu
timeout 60 python3 bench/cuda_bench.py $ARGS > "$O/ab_cur.log" 2>&1; echo "cur rc=$?"; grep -E "^M=" "$O/ab_cur.log" | cut -c1-300
timeout 45 ncu --clock-control none -k regex:gemm_ws --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats \
  python3 bench/cuda_bench.py --variants --once "i8gemm[ws256p4]" --m 2048 --kn 4096x4096 > "$O/ncu_cur.txt" 2>&1
echo "ncu cur rc=$?"
cp abtest/alt/gemm_ws.cu $D/gemm_ws.cu
timeout 60 python3 bench/cuda_bench.py $ARGS > "$O/ab_alt.log" 2>&1; echo "alt rc=$?"; grep -E "^M=" "$O/ab_alt.log" | cut -c1-300
cp abtest/old/gemm.cu abtest/old/gemm_wgmma.cu abtest/old/gemm_ws.cu $D/
timeout 60 python3 bench/cuda_bench.py $ARGS > "$O/ab_old.log" 2>&1; echo "old rc=$?"; grep -E "^M=" "$O/ab_old.log" | cut -c1-300
timeout 45 ncu --clock-control none -k regex:gemm_ws --launch-skip 1 --launch-count 1 \
  --section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
  --section WarpStateStats --section Occupancy --section LaunchStats --section SchedulerStats --section InstructionStats \
  python3 bench/cuda_bench.py --variants --once "i8gemm[ws256p4]" --m 2048 --kn 4096x4096 > "$O/ncu_old.txt" 2>&1
echo "ncu old rc=$?"
grep -hE "Duration|Compute \(SM\) Throughput|Issue Slots Busy|Warp Cycles Per Issued|Registers Per|Executed Ipc A" "$O/ncu_cur.txt" "$O/ncu_old.txt"
