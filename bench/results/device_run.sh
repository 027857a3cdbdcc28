# Sourced by the device scripts (h100_*.sh): run LIMIT CMD... appends the command line, its
# output and its exit status (with its seconds) to the log $L, and skips the command where
# its limit would pass DEADLINE (the call's seconds, counted from the script's start);
# ncu_report NAME turns the Nsight Compute report $O/NAME.ncu-rep (if made) into its
# details page and its per-instruction source page, summarized into the log.
run() {
  local limit=$1; shift
  if [ $((SECONDS + limit)) -gt "${DEADLINE:-100000}" ]; then
    echo "===== (not run: its limit passes DEADLINE=$DEADLINE) $*" >> "$L"
    return
  fi
  echo "===== $*" >> "$L"
  local t0=$SECONDS
  timeout -s INT "$limit" "$@" >> "$L" 2>&1
  echo "rc=$? ($((SECONDS - t0)) s)" >> "$L"
}

ncu_report() {
  [ -f "$O/$1.ncu-rep" ] || return
  ncu -i "$O/$1.ncu-rep" --page details > "$O/$1.txt" 2>&1
  ncu -i "$O/$1.ncu-rep" --page source --csv --print-source sass 2>&1 | gzip > "$O/$1.sass.csv.gz"
  rm -f "$O/$1.ncu-rep"
  python3 bench/ncu_summary.py "$O/$1.sass.csv.gz" --top 25 >> "$L" 2>&1
}
