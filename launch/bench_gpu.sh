#!/usr/bin/env bash
# Run a benchmark on a GPU machine that has torch and triton but not the project's other
# packages (e.g. the lent H100/H200 image): installs carried wheels from .whl/ if present,
# then runs `infcl-ds bench ARGS...`. Results go where --out says (default docs/benchmarks).
#   bash launch/bench_gpu.sh loss --out "$OUT/loss.json"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader || true
python3 -m infcl_ds.cli bench "$@"
