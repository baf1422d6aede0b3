#!/usr/bin/env bash
# The host-memory run of docs/benchmarks/host_memory.json on one GPU machine (an H200 with a
# 128 GiB host, 16 cores), in two calls that must follow each other on the same machine:
#   bash launch/bench_host_memory.sh run      # JPEG shards, then 2 training steps at a 512k batch
#   bash launch/bench_host_memory.sh resume   # 1 more step from the checkpoint; decode throughput rows
# Arguments after run/resume go to the benchmark, e.g. `run --set batch.global_size=262144`.
# Results land in ${OUT:-docs/benchmarks}: host_memory.json/.png, data.json/.png, the run's log.
# Started in the background on a lent GPU machine, whose every command copies the working tree
# over the checkout, point OUT outside the checkout (with a copy of host_memory.json in it, whose
# other rows the run keeps): a result written into docs/ is replaced by the next command's copy.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${OUT:-docs/benchmarks}
recipe=ds_configs/recipes/vit-b32-512k-1gpu.yaml
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
part=${1:-}; shift || true
case "$part" in
  run)
    python3 -m infcl_ds.cli data photos --out data/photos --samples 16000 --shard-size 2000
    # 100 passes over the shard list: three steps of 524,288 draw no sample twice in their epoch.
    mkdir -p data/photos-repeated
    for r in $(seq -w 0 99); do
      for s in data/photos/shard-*.tar; do ln -sf "../photos/$(basename "$s")" "data/photos-repeated/$r-$(basename "$s")"; done
    done
    # The lent GPU machines' MemTotal reads low until memory is used: plan for the host's real size.
    python3 -m benchmarks.host_memory --recipe "$recipe" --steps 2 --host-memory 128GiB --out "$out/host_memory.json" "$@" ;;
  resume)
    python3 -m benchmarks.host_memory --recipe "$recipe" --steps 3 --resume --host-memory 128GiB --out "$out/host_memory.json" "$@"
    python3 -m infcl_ds.cli bench data --shards data/photos --workers 1,4,14 --samples 4096 --out "$out/data.json" ;;
  *) echo "usage: $0 run|resume" >&2; exit 2 ;;
esac
