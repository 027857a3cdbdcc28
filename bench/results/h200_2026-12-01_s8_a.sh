#!/bin/bash
# Device run A, eighth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s8_a.sh
# GPU timelines (CUPTI through torch.profiler) of the 4-layer model's prefill at T = 128
# and 512 and of its decode, bf16 against mlx_w8a8 on the shipped table; and whether a
# thread-block cluster reaches the GPU through mx.fast.cuda_kernel.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_a}
mkdir -p "$O"
timeout 60 python3 bench/cluster_probe.py --cluster 4 > "$O/cluster_probe.log" 2>&1
echo "cluster probe rc=$?"; tail -3 "$O/cluster_probe.log"
timeout 60 python3 bench/cluster_probe.py --cluster 8 >> "$O/cluster_probe.log" 2>&1
echo "cluster probe 8 rc=$?"; tail -2 "$O/cluster_probe.log"
timeout 420 python3 bench/gpu_timeline.py --model llama-3-8b --layers 4 --tokens 128,512 --decode 32 \
  --prompt 128 --rounds 8 --variants bf16,mlx-lm-8bit,mlx_w8a8 \
  --table mlx_w8a8/tables/nvidia-h200.json --out "$O/timeline.jsonl" > "$O/timeline.log" 2>&1
echo "timeline rc=$?"; grep -v "^    " "$O/timeline.log" | tail -80
