#!/usr/bin/env bash
# The tests marked `gpu`, whole, on a GPU host, in parts that each fit a 10-minute command
# (carry .whl: ../shared/tools/gpu-wheels.sh .whl), results into $OUT (default docs/benchmarks):
#   bash launch/bench_gpu_tests.sh durations K/N   # part K of N split by count (no durations yet),
#                                                  #  its tests' times into $OUT/gpu_durations-K-of-N.json,
#                                                  #  all parts' so far merged into $OUT/gpu_durations.json
#   bash launch/bench_gpu_tests.sh round R K/N     # part K of N by tests/gpu_durations.json, round R:
#                                                  #  a row of $OUT/gpu_tests.json (benchmarks/gpu_tests.py)
# First every part of `durations` (then copy $OUT/gpu_durations.json to tests/ and commit it), then
# each part of `round 1` and `round 2` back to back: every part passing twice in a row. Each
# durations part splits by count from a file of its own, absent when it starts (pytest-split
# reads the split from the file it writes), so that the N parts are the whole set.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
usage() { sed -n '2,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
case "${1:-}" in  # the arguments checked before anything is installed or run
  durations) [ $# -eq 2 ] && [[ "$2" =~ ^[0-9]+/[0-9]+$ ]] || usage ;;
  round) [ $# -eq 3 ] && [[ "$2" =~ ^[0-9]+$ ]] && [[ "$3" =~ ^[0-9]+/[0-9]+$ ]] || usage ;;
  *) usage ;;
esac
source launch/gpu_host.sh
out=${OUT:-docs/benchmarks}
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
case "$1" in
  durations)
    # a later --durations-path wins over tests/run.sh's
    mine="$out/gpu_durations-${2/\//-of-}.json"
    rm -f "$mine"
    bash tests/run.sh --gpu --part "$2" --store-durations --durations-path "$mine" \
      --junitxml="$out/durations-${2/\//-of-}.xml" || true
    python3 -c 'import json, sys; merged = {}
for path in sys.argv[2:]: merged.update(json.load(open(path)))
json.dump(merged, open(sys.argv[1], "w"), indent=4, sort_keys=True)' "$out/gpu_durations.json" \
      "$out"/gpu_durations-*-of-"${2#*/}".json ;;
  round)
    round=$2 part=${3%/*} parts=${3#*/}
    junit="$out/round-$round-part-$part-of-$parts.xml"
    bash tests/run.sh --gpu --part "$3" --junitxml="$junit" || true
    python3 -m benchmarks.gpu_tests --junit "$junit" --part "$part" --parts "$parts" --round "$round" \
      --out "$out/gpu_tests.json" ;;
esac
