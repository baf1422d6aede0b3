#!/usr/bin/env bash
# The host-memory run of docs/benchmarks/host_memory.json on one GPU machine (an H200 with a
# 128 GiB host, 16 cores), in two calls that must follow each other on the same machine:
#   bash launch/bench_host_memory.sh run      # JPEG shards, then 2 training steps at a 512k batch
#   bash launch/bench_host_memory.sh resume   # 1 more step from the checkpoint; decode throughput rows
# A 512k step takes minutes, so `run` outlasts a 10-minute command: on a lent machine, `start` runs it
# in a process session of its own (it outlives the command that started it), and `wait [SECONDS]`,
# called again while the machine is warm, waits for it, prints the log's end and copies the results
# into $OUT (exit 0 once the run has ended, 3 while it still runs):
#   bash launch/bench_host_memory.sh start --set data.decoder=hybrid    # returns at once
#   OUT=$OUT bash launch/bench_host_memory.sh wait 540                   # again, until it says ended
# Arguments after run/resume/start go to the benchmark, e.g. `run --set batch.global_size=262144`.
# Results land in ${OUT:-docs/benchmarks}: host_memory.json/.png, data.json/.png, the run's log.
# Started in the background on a lent GPU machine, whose every command copies the working tree
# over the checkout, point OUT outside the checkout (with a copy of host_memory.json in it, whose
# other rows the run keeps): a result written into docs/ is replaced by the next command's copy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-docs/benchmarks}
recipe=${HOST_MEMORY_RECIPE:-ds_configs/recipes/vit-b32-512k-1gpu.yaml}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
part=${1:-}; shift || true
# where `start` leaves its run (outside the checkout: a lent machine's next command copies the tree over it)
bg=${HOST_MEMORY_RUN_DIR:-/tmp/infcl-ds-host-memory}
make_shards() {
    [ -f data/photos/shard-000007.tar ] ||
      python3 -m infcl_ds.cli data photos --out data/photos --samples 16000 --shard-size 2000
    # 100 passes over the shard list: three steps of 524,288 draw no sample twice in their epoch.
    mkdir -p data/photos-repeated
    for r in $(seq -w 0 99); do
      for s in data/photos/shard-*.tar; do ln -sf "../photos/$(basename "$s")" "data/photos-repeated/$r-$(basename "$s")"; done
    done
}
case "$part" in
  run)
    make_shards
    # The lent GPU machines' MemTotal reads low until memory is used: plan for the host's real size.
    python3 -m benchmarks.host_memory --recipe "$recipe" --steps 2 --host-memory 128GiB --out "$out/host_memory.json" "$@" ;;
  start)
    make_shards
    mkdir -p "$bg"
    [ -f "$bg/host_memory.json" ] || cp docs/benchmarks/host_memory.json "$bg/"  # its other rows are kept
    setsid python3 -m benchmarks.host_memory --recipe "$recipe" --steps 2 --host-memory 128GiB \
      --out "$bg/host_memory.json" "$@" > "$bg/host_memory.log" 2>&1 < /dev/null &
    echo $! > "$bg/pid"
    echo "started the run (pid $(cat "$bg/pid")) in $bg; then: bash $0 wait SECONDS" ;;
  wait)
    pid=$(cat "$bg/pid") || { echo "no run started in $bg" >&2; exit 2; }
    deadline=$(( $(date +%s) + ${1:-540} ))
    while kill -0 "$pid" 2>/dev/null && [ "$(date +%s)" -lt "$deadline" ]; do sleep 5; done
    tail -n 25 "$bg/host_memory.log"
    [ -z "${OUT:-}" ] || cp "$bg"/host_memory.json "$bg"/host_memory.png "$bg"/host_memory.log "$OUT"/ 2>/dev/null || true
    if kill -0 "$pid" 2>/dev/null; then echo "still running (pid $pid)"; exit 3; fi
    echo "the run has ended" ;;
  resume)
    python3 -m benchmarks.host_memory --recipe "$recipe" --steps 3 --resume --host-memory 128GiB --out "$out/host_memory.json" "$@"
    python3 -m infcl_ds.cli bench data --shards data/photos --workers 1,4,14 --samples 4096 --out "$out/data.json" ;;
  *) echo "usage: $0 run|resume|start|wait" >&2; exit 2 ;;
esac
