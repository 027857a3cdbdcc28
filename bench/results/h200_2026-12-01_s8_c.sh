#!/bin/bash
# Device run C, eighth set: is the failure of run B order-dependent (a cluster kernel, then
# an unclustered one of the same graph shape), and does it go with CUDA graphs off?
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s8_c}; mkdir -p "$O"
K="tests/test_cuda.py::test_int8_gemm_ws_bit_exact"
echo "== tma256 alone"; timeout 60 python3 -m pytest -q -p no:cacheprovider "$K[300-392-1040-tma256]" 2>&1 | tail -1
echo "== tma128s4 then tma256"; timeout 60 python3 -m pytest -q -p no:cacheprovider "$K[300-392-1040-tma128s4]" "$K[300-392-1040-tma256]" 2>&1 | tail -1
echo "== same, MLX_USE_CUDA_GRAPHS=0"; MLX_USE_CUDA_GRAPHS=0 timeout 60 python3 -m pytest -q -p no:cacheprovider "$K[300-392-1040-tma128s4]" "$K[300-392-1040-tma256]" 2>&1 | tail -1
echo "== tma256 then tma128s4"; timeout 60 python3 -m pytest -q -p no:cacheprovider "$K[300-392-1040-tma256]" "$K[300-392-1040-tma128s4]" 2>&1 | tail -1
echo "== tma128s2 then tma128s4 then tma64s8"; timeout 60 python3 -m pytest -q -p no:cacheprovider "$K[300-392-1040-tma128s2]" "$K[300-392-1040-tma128s4]" "$K[300-392-1040-tma64s8]" "$K[300-392-1040-tma128s2]" 2>&1 | tail -1
