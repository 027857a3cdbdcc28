#!/bin/bash
# Device run E, thirty-first set (a probe). Tree: branch tma-ready-maps (h200_2026-12-02_s31_tma_ready_maps.patch) as run D's ".":
# run D reproduced test_rowsum_array_layout's failure serially (6 of 10), where probe C
# (no poisoned outputs) found no differing launch. The probe again on the test's shapes,
# outputs poisoned as the tests poison them, then not.
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s31_e.sh
# Outcome: 0 differing launches either way (the weight made before the array).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s31_e}
mkdir -p "$O"
for v in poison plain; do
  flag=""; [ $v = poison ] && flag=--poison
  timeout 60 python3 bench/tma_map_probe.py --test-shapes $flag > "$O/probe_$v.log" 2>&1
  echo "probe $v rc=$?"; grep DIFF "$O/probe_$v.log" | head -12; tail -1 "$O/probe_$v.log"
done
