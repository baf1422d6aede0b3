#!/usr/bin/env bash
# docs/benchmarks/real_data.json + .png: whole steps from JPEG shards beside synthetic data, this
# engine and OpenCLIP's trainer on the same shards, in parts that each fit a 10-minute command:
#   bash launch/bench_real_data.sh b16 b16-open-clip-train      # ViT-B-16, 32k, compiled
#   bash launch/bench_real_data.sh l14                           # ViT-L-14, 16k, compiled
#   bash launch/bench_real_data.sh b16-decoders                  # ViT-B-16: pil, nvjpeg, hybrid
#   bash launch/bench_real_data.sh b16-nvimgcodec                # nvjpeg, hybrid through nvImageCodec
#   bash launch/bench_real_data.sh b16-2gpu b16-2gpu-open-clip-train   # both trainers on 2 GPUs, 64k
#   bash launch/bench_real_data.sh data-decoders zeroshot-decoders
#     decode rows per decoder (docs/benchmarks/data.json) and the quickstart's zero-shot top-1
#     trained with each decoder (docs/benchmarks/decoder_zeroshot.json)
# The shards are made here first (infcl-ds data photos: 16,000 photos of ~30 KB in 8 shards, listed
# 12 times as 96 shards so that an epoch holds six 32k batches), once per machine, under $SHARDS;
# `bash launch/bench_real_data.sh shards` makes only them (benchmarks/scale.py does, with
# LISTED=N for more passes, PHOTOS_SAMPLES and PHOTOS_SHARD_SIZE for other sizes).
# This engine: data.decode_workers 14 (PIL, open_clip's pixels), keep_decoded_gib auto, every row
# the mean of 2 steps after an untimed one; open_clip_train: --workers 14 --torchcompile (its
# WebDataset loader needs webdataset<=0.2.86; this project works with that version too).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-docs/benchmarks}/real_data.json
shards=${SHARDS:-/tmp/infcl-ds-photos}
[ $# -gt 0 ] || { echo "usage: $0 PART... (shards b16 b16-open-clip-train l14 l14-open-clip-train b16-decoders b16-nvimgcodec b16-2gpu b16-2gpu-open-clip-train data-decoders zeroshot-decoders)" >&2; exit 2; }
# The photos once (photos.json is written last: a cut-short making is made again), then the
# list: $SHARDS/listed/shard-00000.tar ... as ${LISTED:-96} links cycling over the made shards.
make_shards() {
  [ -f "$shards/photos.json" ] ||
    python3 -m infcl_ds.cli data photos --out "$shards" --samples "${PHOTOS_SAMPLES:-16000}" \
      --shard-size "${PHOTOS_SHARD_SIZE:-2000}"
  local made=("$shards"/shard-*.tar) listed=${LISTED:-96} i
  [ ! -e "$shards/listed/shard-$(printf %05d $((listed - 1))).tar" ] || return 0
  mkdir -p "$shards/listed"
  for ((i = 0; i < listed; i++)); do
    ln -sf "${made[i % ${#made[@]}]}" "$shards/listed/shard-$(printf %05d "$i").tar"
  done
}
make_shards
pattern="$shards/listed/shard-{00000..00095}.tar"
bench() {
  python3 -m infcl_ds.cli bench train --world 1 --chunk auto --steps 2 --append --out "$out" \
    --shards "$pattern" --decode-workers 14 --open-clip-train-workers 14 --open-clip-train-modes compile "$@"
}
for part in "$@"; do
  case "$part" in
    shards) ;;  # made above
    b16) bench --model ViT-B-16 --batch 32k --impl infcl_ds --compile --data synthetic,jpeg ;;
    b16-open-clip-train) bench --model ViT-B-16 --batch 32k --impl open_clip_train --data jpeg \
                           --open-clip-train-batch-size 1024 ;;
    l14) bench --model ViT-L-14 --batch 16k --impl infcl_ds --compile --data synthetic,jpeg ;;
    l14-open-clip-train) bench --model ViT-L-14 --batch 16k --impl open_clip_train --data jpeg \
                           --open-clip-train-batch-size 256 ;;
    b16-decoders) bench --model ViT-B-16 --batch 32k --impl infcl_ds --compile --data synthetic,jpeg \
                    --decoder pil,nvjpeg,hybrid ;;
    # the GPU decoder through nvImageCodec (the gpu-decode extra installed on the machine)
    b16-nvimgcodec) bench --model ViT-B-16 --batch 32k --impl infcl_ds --compile --data jpeg --decoder nvjpeg,hybrid \
                      --set data.gpu_jpeg_library=nvimgcodec ;;
    # two GPUs of one host (14 decode processes per rank): both trainers at 32k per GPU
    b16-2gpu) bench --world 2 --model ViT-B-16 --batch 64k --impl infcl_ds --compile --data synthetic,jpeg ;;
    b16-2gpu-open-clip-train) bench --world 2 --model ViT-B-16 --batch 64k --impl open_clip_train --data jpeg \
                                --open-clip-train-batch-size 1024 ;;
    data-decoders) python3 -m infcl_ds.cli bench data --shards "$shards" --workers 1,4,14 --decoders pil,torchvision \
                     --samples 4096 --out "${OUT:-docs/benchmarks}/data.json" ;;
    zeroshot-decoders) python3 -m infcl_ds.cli bench decoders --decoders pil,nvjpeg --seeds 0,1 \
                         --out "${OUT:-docs/benchmarks}/decoder_zeroshot.json" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
