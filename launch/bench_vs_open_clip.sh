#!/usr/bin/env bash
# docs/benchmarks/vs_open_clip.json + .png: this engine against OpenCLIP's own trainer
# (open_clip_train, eager and --torchcompile) on one GPU, same model, batch and precision, in
# parts that each fit a 10-minute command; rows accumulate in ${OUT:-docs/benchmarks}:
#   bash launch/bench_vs_open_clip.sh b16 b16-compiled b16-open-clip-train b16-zero3-profile   # ViT-B-16, 32k
#   bash launch/bench_vs_open_clip.sh l14 l14-compiled l14-open-clip-train              # ViT-L-14, 16k
#   bash launch/bench_vs_open_clip.sh l14-compiled l14-float8 l14-open-clip-train-compiled   # the towers: compiled, float8, OpenCLIP's compiled trainer
#   bash launch/bench_vs_open_clip.sh b16-256k b16-256k-open-clip-train   # ViT-B-16, 256k: open_clip_train's logits do not fit
#   bash launch/bench_vs_open_clip.sh b32 b32-compiled   # ViT-B-32, 64k: its encoder rates for the planner
#     (python -m infcl_ds.plan.calibrate --write adds them from vs_open_clip.json; until then it plans ViT-B-16's)
# Every row: the mean of 2 steps (256k: 1) after an untimed one of the same shapes; chunks chosen by the
# planner (--chunk auto); open_clip_train at --local-loss --gather-with-grad --accum-freq K.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source launch/gpu_host.sh  # the carried wheels on a lent GPU machine
out=${OUT:-docs/benchmarks}/vs_open_clip.json
bench() { python3 -m infcl_ds.cli bench train --world 1 --chunk auto --steps 2 --append --out "$out" "$@"; }
[ $# -gt 0 ] || { echo "usage: $0 PART... (b16 b16-compiled b16-open-clip-train b16-zero3 b16-zero3-profile l14 l14-compiled l14-open-clip-train l14-open-clip-train-compiled b16-open-clip-train-compiled l14-float8 b16-float8 b16-256k b16-256k-open-clip-train b32 b32-compiled)" >&2; exit 2; }
for part in "$@"; do
  case "$part" in
    # both with a profiled step after the timed ones (--profile: GPU time per kernel kind)
    b16) bench --model ViT-B-16 --batch 32k --impl infcl_ds --profile ;;
    b16-compiled) bench --model ViT-B-16 --batch 32k --impl infcl_ds --compile --profile ;;
    b16-open-clip-train) bench --model ViT-B-16 --batch 32k --impl open_clip_train --open-clip-train-batch-size 1024 ;;
    b16-zero3) bench --model ViT-B-16 --batch 32k --impl infcl_ds --zero 3 ;;
    # ZeRO-3's step profiled (GPU time per kernel kind: how its GEMMs compare with ZeRO-2's)
    b16-zero3-profile) bench --model ViT-B-16 --batch 32k --impl infcl_ds --zero 3 --profile ;;
    l14) bench --model ViT-L-14 --batch 16k --impl infcl_ds ;;
    l14-compiled) bench --model ViT-L-14 --batch 16k --impl infcl_ds --compile ;;
    l14-open-clip-train) bench --model ViT-L-14 --batch 16k --impl open_clip_train --open-clip-train-batch-size 256 ;;
    # --torchcompile only (half the part's time: the compiled-against-compiled ratio)
    l14-open-clip-train-compiled) bench --model ViT-L-14 --batch 16k --impl open_clip_train --open-clip-train-batch-size 256 --open-clip-train-modes compile ;;
    b16-open-clip-train-compiled) bench --model ViT-B-16 --batch 32k --impl open_clip_train --open-clip-train-batch-size 1024 --open-clip-train-modes compile ;;
    # model.float8 (torchao's rowwise float8 linear layers; needs torchao on the GPU machine)
    l14-float8) bench --model ViT-L-14 --batch 16k --impl infcl_ds --compile --set model.float8=true ;;
    b16-float8) bench --model ViT-B-16 --batch 32k --impl infcl_ds --compile --set model.float8=true ;;
    # one timed step (~2 min) after the untimed one: the part fits a 10-minute command
    b16-256k) bench --model ViT-B-16 --batch 256k --impl infcl_ds --compile --steps 1 ;;
    # open_clip_train's rows at 256k: "does not fit" with the size of its logits, not run
    b16-256k-open-clip-train) bench --model ViT-B-16 --batch 256k --impl open_clip_train --open-clip-train-batch-size 1024 ;;
    b32) bench --model ViT-B-32 --batch 64k --impl infcl_ds ;;
    b32-compiled) bench --model ViT-B-32 --batch 64k --impl infcl_ds --compile ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
