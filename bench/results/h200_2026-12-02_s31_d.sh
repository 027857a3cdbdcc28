#!/bin/bash
# Device run D, thirty-first set (a probe). Trees: branch tma-ready-maps (h200_2026-12-02_s31_tma_ready_maps.patch) with tma_touch (as
# run A's second call) in ., and in tmp_refresh/ the same but each GEMM block writing the
# ready maps back in place (copy to shared memory, tensormap.cp_fenceproxy to the same
# address) before acquiring them, as the scratch path's blocks do with their own maps:
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s31_d.sh
# test_rowsum_array_layout (the test that failed in run A) alone, serially and with 12
# workers, then the TMA tests with 12 workers, in each tree.
# Outcome: the layout test failed 6 of 10 (every case with a map) serially and with
# 12 workers in both trees; the TMA selections ran out of their 100 s.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s31_d}
mkdir -p "$O"
for v in branch refresh; do
  d=.; [ $v = refresh ] && d=tmp_refresh
  (cd $d && timeout 80 python3 -m pytest -q -p no:cacheprovider -k rowsum_array_layout tests/test_cuda.py) > "$O/${v}_layout_serial.log" 2>&1
  echo "$v layout serial rc=$?"; tail -n 1 "$O/${v}_layout_serial.log"; grep -E "^FAILED" "$O/${v}_layout_serial.log" | head -5
  (cd $d && timeout 60 python3 -m pytest -q -n 12 -p no:cacheprovider -k rowsum_array_layout tests/test_cuda.py) > "$O/${v}_layout_n12.log" 2>&1
  echo "$v layout n12 rc=$?"; tail -n 1 "$O/${v}_layout_n12.log"; grep -E "^FAILED" "$O/${v}_layout_n12.log" | head -5
  (cd $d && timeout 100 python3 -m pytest -q -n 12 -p no:cacheprovider -k "tma or rowsum" tests/test_cuda.py) > "$O/${v}_tma_n12.log" 2>&1
  echo "$v tma n12 rc=$?"; tail -n 1 "$O/${v}_tma_n12.log"; grep -E "^FAILED" "$O/${v}_tma_n12.log" | head -5
done
