#!/usr/bin/env bash
# The README's main job: set up .venv, build image-caption shards from scikit-learn's digits
# (no download), train a tiny CLIP on 2 ranks through DeepSpeed's launcher and the full engine
# (chunked steps, ring loss, ZeRO-2, global batch 512), evaluate zero-shot on the held-out
# digits. Ends with the line `zero-shot top-1: X`. On a machine without GPUs the ranks are
# CPU processes (gloo over 127.0.0.1); with GPUs the same recipe runs on 2 of them.
# Each invocation writes a new run directory, runs/quickstart-<UTC time> (its log there as
# quickstart.log), so no earlier run is overwritten or deleted, and the README's training
# example (runs/tiny-cpu) is not in its way.
#   bash launch/quickstart.sh [--set key=value ...]
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
start=$(date +%s)
bash launch/setup.sh
export PATH="$root/.venv/bin:$PATH"
if ! python -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  export DS_ACCELERATOR=cpu OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
fi
[ -f data/digits/zeroshot.json ] || infcl-ds data digits --out data/digits
trained=$(date +%s)
run=runs/quickstart-$(date -u +%Y%m%dT%H%M%SZ)
mkdir -p runs && mkdir "$run"  # fails, touching nothing, if that second's directory exists
echo "[quickstart] set-up and data: $((trained - start)) s; training into $run..." >&2
bash launch/train.sh ds_configs/recipes/tiny-cpu.yaml --num_gpus 2 --master_addr 127.0.0.1 \
  --set output_dir="$run" "$@" 2>&1 |
  grep --line-buffered -v -E "^\[20[0-9-]+ [0-9:,]+\] \[(INFO|WARNING)\]" | tee "$run/quickstart.log" |
  grep --line-buffered -E "^(step [0-9]+/|zero-shot|image->text|text->image|run directory|train time)|Error|error" || true
end=$(date +%s)
echo "[quickstart] training + evaluation: $((end - trained)) s; whole command: $((end - start)) s" >&2
echo "[quickstart] log: $run/quickstart.log; the README's next commands, in a new shell, start with: source .venv/bin/activate" >&2
grep -q "^zero-shot top-1:" "$run/quickstart.log"
