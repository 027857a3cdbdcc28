#!/bin/bash
# Device run C, thirty-first set (a probe). Tree: branch tma-ready-maps (h200_2026-12-02_s31_tma_ready_maps.patch) with tma_touch (as
# run A's second call, whose test_rowsum_array_layout still failed at M = 1 / K = 4096 and
# M = 33 / K = 1088 on the tma128 tile): which TMA linear launches disagree with the
# cp.async tile on the same array.
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s31_c.sh
# Outcome: all 144 launches equal (the weight made before the activation array).
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s31_c}
mkdir -p "$O"
timeout 150 python3 bench/tma_map_probe.py > "$O/probe.log" 2>&1
echo "probe rc=$?"; grep -c " ok kept=ok" "$O/probe.log"; grep DIFF "$O/probe.log" | head -40; tail -1 "$O/probe.log"
