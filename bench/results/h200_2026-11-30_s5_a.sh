#!/bin/bash
# Device run A, fifth set of 2026-11-30 (NVIDIA H200, MLX 0.32.4 CUDA build), project root:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-11-30_s5_a.sh
# First run of the TMA producer (gemm_ws.cu tma_* bodies, tensor maps patched on the
# device): its CUDA tests (exactness against the oracle and bit-identity with the
# cp.async producer), then, only if they pass, the TMA arms against the cp.async ones,
# bf16 and cuBLASLt, paired.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s5_a}
mkdir -p "$O"
python3 -c "from mlx_w8a8.kernels import tensormap; print('tensormap unavailable:', tensormap.unavailable())"
timeout 270 python3 -m pytest -q -rs -x -n 8 -p no:cacheprovider tests/test_cuda.py -k "tma" \
  > "$O/tests_tma.log" 2>&1
rc=$?
echo "tma tests rc=$rc"; tail -15 "$O/tests_tma.log"
if [ $rc -eq 0 ]; then
  timeout 240 python3 bench/cuda_bench.py --m 512,2048 --kn 4096x4096,14336x4096,4096x14336 \
    --arms bf16,w8a8_ws,w8a8_tma,w8a8_mm_ws,w8a8_mm_tma,i8gemm_ws,i8gemm_tma,torch \
    --pairs 8 --out "$O" > "$O/bench.log" 2>&1
  echo "bench rc=$?"; tail -12 "$O/bench.log"
fi
