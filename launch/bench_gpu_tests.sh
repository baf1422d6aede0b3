#!/usr/bin/env bash
# The tests marked `gpu`, whole, on a GPU host, in parts that each fit a 10-minute command
# (carry .whl: ../shared/tools/gpu-wheels.sh .whl torchao==0.18.0, which test_float8 needs),
# results into $OUT (default docs/benchmarks):
#   bash launch/bench_gpu_tests.sh durations SECONDS [LOG]   # the marked tests LOG (the log so far)
#                                      #  does not hold, for at most SECONDS, logged as each ends into
#                                      #  $OUT/gpu_test_log.jsonl; once all are logged, their times
#                                      #  into $OUT/gpu_durations.json and the pass as round 0
#   bash launch/bench_gpu_tests.sh round R K/N     # part K of N by tests/gpu_durations.json, round R:
#                                                  #  a row of $OUT/gpu_tests.json (benchmarks/gpu_tests.py),
#                                                  #  its tests logged into $OUT/round-R-part-K-of-N.jsonl
# First `durations` until the pass is whole (then copy $OUT/gpu_durations.json to tests/ and commit
# it), then each part of `round 1` and `round 2` back to back: every part passing twice in a row.
# The rounds' logs give the durations again (`python -m benchmarks.gpu_tests durations --log ...`).
# $OUT/gpu_tests.json starts from docs/benchmarks/gpu_tests.json, so that it comes back whole.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
case "${1:-}" in  # the arguments checked before anything is installed or run
  durations) { [ $# -eq 2 ] || { [ $# -eq 3 ] && [ -f "$3" ]; }; } && [[ "$2" =~ ^[1-9][0-9]*$ ]] || usage ;;
  round) [ $# -eq 3 ] && [[ "$2" =~ ^[0-9]+$ ]] && [[ "$3" =~ ^[0-9]+/[0-9]+$ ]] || usage ;;
  *) usage ;;
esac
source launch/gpu_host.sh
out=${OUT:-docs/benchmarks}
mkdir -p "$out"
[ -f "$out/gpu_tests.json" ] || [ ! -f docs/benchmarks/gpu_tests.json ] || cp docs/benchmarks/gpu_tests.json "$out/"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader || true
case "$1" in
  durations)
    log=$out/gpu_test_log.jsonl
    if [ $# -eq 3 ] && [ "$(realpath "$3")" != "$(realpath -m "$log")" ]; then cp "$3" "$log"; fi
    # SIGINT at the limit: pytest stops between tests' reports and the ranks' finally blocks run.
    # --test-log=PATH as one word: pytest takes a separate existing path for a test path, and the
    # rootdir (hence setup.cfg's options) from their common ancestor.
    rc=0
    timeout -s INT -k 30 "$2" bash tests/run.sh --gpu -p benchmarks.pytest_log --test-log="$log" || rc=$?
    if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
      echo "bench_gpu_tests.sh: cut at ${2} s; $(wc -l < "$log") tests logged; go on with: durations SECONDS $log" >&2
      exit 0
    fi
    python3 -m benchmarks.gpu_tests durations --log "$log" --durations "$out/gpu_durations.json" \
      --rows "$out/gpu_tests.json" ;;
  round)
    round=$2 part=${3%/*} parts=${3#*/}
    junit="$out/round-$round-part-$part-of-$parts.xml"
    bash tests/run.sh --gpu --part "$3" --junitxml="$junit" -p benchmarks.pytest_log \
      --test-log="$out/round-$round-part-$part-of-$parts.jsonl" || true
    python3 -m benchmarks.gpu_tests --junit "$junit" --part "$part" --parts "$parts" --round "$round" \
      --out "$out/gpu_tests.json" ;;
esac
