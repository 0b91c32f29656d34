#!/bin/bash
# The independent benchmark's cells at reduced scale, hivejobs and procrastinate, through the
# benchmark's own harness run natively (run_harness.py + the docker shim). One harness run per
# cell, both systems in it (each on a fresh cluster); OUT/index.tsv maps cells to run folders.
#   PJQB_DIR=/tmp/pjqb bench/independent/native/sweep.sh OUT [CELL ...]
# Cells: clean-w8 clean-w32 clean-w64 chaos-postgres-restart chaos-pg-backend-kill
#        chaos-pool-exhaustion chaos-crash-recovery chaos-repeated-kills
#        pressure-idle-in-tx pressure-active-readers pressure-high-load
set -u
here=$(cd "$(dirname "$0")" && pwd)
out=$1; shift
mkdir -p "$out"
pjqb=${PJQB_DIR:-/tmp/pjqb}
systems=${SYSTEMS:-hivejobs,procrastinate}
rate=${RATE:-200}          # offered jobs/s in the chaos and pressure cells
workers=${WORKERS:-32}     # the harness's default worker count
export PRODUCER_PACING=adapter  # both adapters pace themselves and honour the high-load file
all="clean-w8 clean-w32 clean-w64 chaos-postgres-restart chaos-pg-backend-kill
chaos-pool-exhaustion chaos-crash-recovery chaos-repeated-kills pressure-idle-in-tx
pressure-active-readers pressure-high-load"
cells=${*:-$all}
base=(--phase warmup=warmup:10s --phase baseline=clean:30s)
for cell in $cells; do
  case $cell in
    clean-w*) args=(--producer-mode depth-target --target-depth 2000 --worker-count "${cell#clean-w}"
                    --phase warmup=warmup:15s --phase clean_1=clean:45s) ;;
    chaos-postgres-restart) args=("${base[@]}" --phase restart=postgres-restart:30s
                                  --phase recovery=clean:40s) ;;
    chaos-pg-backend-kill) args=("${base[@]}" --phase "kills=pg-backend-kill(rate=2):30s"
                                 --phase recovery=clean:40s) ;;
    chaos-pool-exhaustion) args=("${base[@]}" --phase "exhaustion=pool-exhaustion(idle_conns=300):30s"
                                 --phase recovery=clean:40s) ;;
    chaos-crash-recovery) args=("${base[@]}" --phase "kill=kill-worker(instance=0):20s"
                                --phase "restart=start-worker(instance=0):30s" --phase recovery=clean:40s) ;;
    chaos-repeated-kills) args=("${base[@]}" --phase "repeated=repeated-kill(instance=0,period=15s):45s"
                                --phase recovery=clean:40s) ;;
    pressure-idle-in-tx) args=("${base[@]}" --phase idle_1=idle-in-tx:60s --phase recovery=recovery:40s) ;;
    pressure-active-readers) args=("${base[@]}" --phase readers_1=active-readers:45s --phase recovery=clean:40s) ;;
    pressure-high-load) args=("${base[@]}" --phase pressure_1=high-load:45s --phase recovery=clean:40s) ;;
    *) echo "unknown cell $cell" >&2; exit 2 ;;
  esac
  case $cell in clean-w*) ;; *) args+=(--producer-rate "$rate" --worker-count "$workers") ;; esac
  start=$(date -u +%FT%TZ)
  timeout --signal=KILL 15m "$pjqb/.venv/bin/python" "$here/run_harness.py" run --systems "$systems" \
    --sample-every 2 "${args[@]}" > "$out/$cell.log" 2>&1
  rc=$?
  run=$(sed -n 's/.*results at: //p' "$out/$cell.log" | tail -1)
  printf '%s\t%s\t%s\t%s\t%s\n' "$cell" "$rc" "$start" "$(date -u +%FT%TZ)" "$run" >> "$out/index.tsv"
  echo "$cell rc=$rc $run"
done
