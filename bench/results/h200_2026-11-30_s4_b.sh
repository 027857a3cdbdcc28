#!/bin/bash
# Device run B, fourth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s4_b.sh
# Run A's CUDA suite stopped at its time limit after 84% of the tests (all passed): the
# rest of the file (GEMV, grouped, stages, sibling launches, [..., K] activations), then
# the shipped table re-measured for the prefill buckets (every digest changed), now
# with the sibling groups' summed shapes (q+k+v 6144 x 4096, gate+up 28672 x 4096).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s4_b}
mkdir -p "$O"
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py \
  -k "grouped or gemv or stages or rowsum_activations or gate_accepts or capabilities or sibling or leading_shape" \
  > "$O/cuda_tests_rest.log" 2>&1
echo "cuda tests rc=$?"; tail -6 "$O/cuda_tests_rest.log"
T="$O/nvidia-h200.json"
timeout -s INT 380 python3 -m mlx_w8a8.tune --model llama-3-8b --m 64,128,512,2048 --pairs 10 \
  --table "$T" --no-progress > "$O/tune_prefill.log" 2>&1
echo "tune prefill rc=$?"; tail -3 "$O/tune_prefill.log"
python3 -m mlx_w8a8.tune --show "$T" > "$O/table_show.txt" 2>&1; cat "$O/table_show.txt" | cut -c1-170
