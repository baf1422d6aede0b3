#!/usr/bin/env bash
# The planner against measurement on ONE GPU, in configurations it was not fitted on (it was
# fitted on ViT-B-16, chunk 256, no checkpointing, ZeRO-2; docs/planner.md):
#   l14    ViT-L-14, chunk 128, ZeRO-2             (another model: the activation count's transfer)
#   ckpt   ViT-B-16, chunk 512, grad checkpointing (the checkpointed count, a larger chunk)
#   zero3  ViT-B-16, chunk 256, ZeRO-3             (sharded parameters, ZeRO-3's buffers)
# Each writes DIR/planner_check_NAME.json (rows of `infcl-ds bench train`, with the planner's
# prediction beside the measured peaks); `python -m infcl_ds.plan.calibrate --check DIR/...`
# prints the comparison table.
#   bash launch/bench_planner_check.sh DIR [NAME ...]
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
out=${1:?usage: bench_planner_check.sh DIR [NAME ...]}; shift || true
names=("$@"); [ ${#names[@]} -gt 0 ] || names=(l14 ckpt zero3)
mkdir -p "$out"
status=0
for name in "${names[@]}"; do
  case $name in
    l14)   args=(--model ViT-L-14 --chunk 128 --zero 2 --batch 4k,8k) ;;
    ckpt)  args=(--model ViT-B-16 --chunk 512 --zero 2 --grad-checkpointing --batch 8k,16k) ;;
    zero3) args=(--model ViT-B-16 --chunk 256 --zero 3 --batch 8k,16k) ;;
    *) echo "unknown configuration $name" >&2; exit 2 ;;
  esac
  echo "== $name: ${args[*]}"
  timeout "${CHECK_TIMEOUT_S:-170}" bash launch/bench_gpu.sh train --world 1 "${args[@]}" \
    --out "$out/planner_check_$name.json" || { echo "== $name failed ($?)"; status=1; }
done
exit $status
