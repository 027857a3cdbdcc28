# Sourced by the device scripts (h100_*.sh): run LIMIT CMD... appends the command line, its
# output and its exit status (with its seconds) to the log $L, and skips the command where
# its limit would pass DEADLINE (the call's seconds, counted from the script's start).
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
