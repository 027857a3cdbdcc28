#!/bin/bash
# Device run E, 2026-12-05: activation groups on the H200, where MLX runs float32 matmuls
# in TF32 (exact_act_groups, MLX ops; no CUDA kernel takes activation groups):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-05_e.sh
# the reference tests of the activation-group math and the check's cases, on the GPU.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/h200_e}
mkdir -p "$O"
python3 -c "import mlx.core as mx; print(mx.default_device(), mx.cuda.is_available())" > "$O/e.log" 2>&1
timeout 150 python3 -m pytest -q -p no:cacheprovider tests/test_reference.py tests/test_check.py \
  tests/test_nn.py -k "act_groups or act_scales or activation_groups or act_group" >> "$O/e.log" 2>&1
echo "pytest rc=$?" >> "$O/e.log"
tail -n 6 "$O/e.log"
