#!/bin/bash
# Device run E, thirty-second set. Trees: branch tma-own-maps with its re-measured table;
# main's package in tmp_main/ (as run C, plus bench/chain_timeline.py, gpu_timeline.py and
# cuda_bench.py, which host_split.py imports: run D's main arm lacked them); the
# thirty-first set's branch tma-ready-maps in tmp_old/ (its patch on c9d162d):
#   . .device-mlx/mlx-env.sh && OUT=<dir> bash bench/results/h200_2026-12-02_s32_e.sh
# 1) bench/host_split.py --m 2048, main then branch (run D's branch arm ran alone);
# 2) bench/tma_map_probe2.py on tmp_old: do the kept maps hold the addresses of the
#    arrays they describe after the host read them (the thirty-first set's explanation
#    of its failures, not confirmed then)?
# Outcome: both host-split arms ran; the probe's first call imported the branch's package
# (..._s32_e_first_probe2.log), the second (PROBE_ONLY=1, the path fixed) ran tmp_old's.
set -u
export PYTHONUNBUFFERED=1
O=${OUT:-/tmp/s32_e}
mkdir -p "$O"
[ "${PROBE_ONLY:-0}" = 1 ] || for v in main branch; do
  d=.; [ $v = main ] && d=tmp_main
  (cd $d && timeout 100 python3 bench/host_split.py --m 2048 --chain 40 --rounds 7) > "$O/host_split_$v.log" 2>&1
  echo "host split $v rc=$?"; grep -E "^M=" "$O/host_split_$v.log"
done
# (tmp_old first on the path: the environment puts the repository root there, and the
# first call of this script ran the probe on the branch's package, which has no
# weight_map: ..._s32_e_first_probe2.log)
(cd tmp_old && PYTHONPATH=$PWD:$PYTHONPATH timeout 120 python3 bench/tma_map_probe2.py) > "$O/probe2.log" 2>&1
echo "probe2 rc=$?"; cat "$O/probe2.log" | tail -25
