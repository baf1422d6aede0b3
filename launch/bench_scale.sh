#!/usr/bin/env bash
# docs/benchmarks/scale.json + .png on a GPU host: benchmarks/scale.py's parts (ViT-B-16 from the
# photos shards through launch/train.sh, each run beside the planner's figures) in a process
# session of their own, so that a run longer than one command goes on between commands:
#   bash launch/bench_scale.sh start PART...   # install carried wheels (.whl/), then start
#   bash launch/bench_scale.sh wait SECONDS    # wait up to SECONDS; rows, plot and log into $OUT
# The four-GPU runs on one warm 4-GPU host, as two sets of about 22 and 20 minutes: the baseline,
# the 1M run and its checkpoint on two GPUs (about 5, 10 and 7 minutes); the baseline again and the
# paper's per-GPU load (about 5 and 15):
#   HOST_MEMORY=500GiB bash launch/bench_scale.sh start four-gpu-128k four-gpu-1m resume-two-gpu-1m
#   HOST_MEMORY=500GiB bash launch/bench_scale.sh start four-gpu-128k four-gpu-2m
#   bash launch/bench_scale.sh wait 540    # repeated until it says the run has ended
# HOST_MEMORY: the host's memory for the planner and every rank's own plan (train.sh --host-memory),
# where MemTotal is not it (a VM whose memory grows as it is used reads far less at the start).
# Shards are made once per host under $SHARDS; runs and logs go under $WORK.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/gpu_host.sh
work=${WORK:-/tmp/infcl-ds-scale}
out=${SCALE_OUT:-docs/benchmarks/scale.json}
common=(--work "$work" --shards "${SHARDS:-/tmp/infcl-ds-photos}" --out "$out")
[ -z "${HOST_MEMORY:-}" ] || common+=(--host-memory "$HOST_MEMORY")
case ${1:-} in
  start)
    shift
    nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
    python3 -m benchmarks.scale --start "$@" "${common[@]}" ;;
  wait)
    python3 -m benchmarks.scale --wait "${2:?seconds}" "${common[@]}" ;;
  *) sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2 ;;
esac
