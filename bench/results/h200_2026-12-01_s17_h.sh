#!/bin/bash
# Device run H, seventeenth set (2026-12-01; NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-01_s17_h.sh
# Ran main at commit e55a26f with tmp_t/candidate.json (run E's table). Runs F and G
# compared the two tables in separate processes, whose bf16 arms differed by up to 30%;
# here one process times bf16, mlx-lm 8-bit, mlx_w8a8 on the candidate (sibling groups
# as one launch) and the same model with every member alone (--unlinked: what the
# sixteenth set's table ran at T <= 512), all 32 layers, paired per round.
# (tmp_t/ was an untracked copy, deleted after the set; its file is ..._s17_e_nvidia-h200.json,
# shipped since as mlx_w8a8/tables/nvidia-h200.json.)
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s17_h}
mkdir -p "$O"
timeout 300 python3 -m mlx_w8a8.bench --model llama-3-8b --layers 32 --tokens 16,128,512 \
  --decode 0 --rounds 10 --unlinked --table tmp_t/candidate.json --json "$O/model32.jsonl" \
  > "$O/model32.log" 2>&1
echo "model32 rc=$?"; tail -n 8 "$O/model32.log"
