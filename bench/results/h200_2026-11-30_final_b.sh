#!/bin/bash
# Device run B (two NVIDIA H200s of one host, MLX 0.32.4 CUDA build), from the project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_final_b.sh
# 1. the accuracy run (a small byte-level Llama trained here on the Python standard
#    library's sources, then perplexity of every variant) on GPU 0; 2. the two-rank
#    tensor-parallel check and benchmark over NCCL, ranks started by hand.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/final_b}
STDLIB=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["stdlib"])')
CUDA_VISIBLE_DEVICES=0 timeout 230 python3 bench/train_small_llama.py --text "$STDLIB" --out /tmp/acc \
  --results "$O/accuracy.jsonl" --max-train-seconds 100 > "$O/accuracy.log" 2>&1
echo "accuracy rc=$?"; tail -25 "$O/accuracy.log"
if [ "$(nvidia-smi -L | wc -l)" -ge 2 ]; then
  for r in 0 1; do
    MLX_RANK=$r MLX_WORLD_SIZE=2 NCCL_HOST_IP=127.0.0.1 NCCL_PORT=12345 CUDA_VISIBLE_DEVICES=$r \
      timeout 150 python3 bench/tp_bench.py --backend nccl --check --out "$O/tp.json" > "$O/tp_rank$r.log" 2>&1 &
  done
  wait
  echo "tp done"; cat "$O/tp_rank0.log" | tail -30; tail -3 "$O/tp_rank1.log"
else
  echo "one GPU here: the two-rank run needs two"
fi
