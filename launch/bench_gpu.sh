#!/usr/bin/env bash
# Run a benchmark on a GPU machine that has torch and triton but not the project's other
# packages (e.g. the lent H100/H200 image): installs carried wheels from .whl/ if present,
# then runs `infcl-ds bench ARGS...`. Results go where --out says (default docs/benchmarks).
#   bash launch/bench_gpu.sh loss --out "$OUT/loss.json"
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/gpu_host.sh
nvidia-smi --query-gpu=name,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader || true
python3 -m infcl_ds.cli bench "$@"
