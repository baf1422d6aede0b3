#!/usr/bin/env bash
# docs/benchmarks/decode.json + .png and decoder_zeroshot.json: the GPU's JPEG decoder through
# nvImageCodec measured beside training, in parts that each fit a 10-minute command on a warm
# four-GPU host (carry .whl with the gpu-decode wheels: ../shared/tools/gpu-wheels.sh .whl
# nvidia-nvimgcodec-cu13 nvidia-nvjpeg nvidia-nvjpeg2k-cu13 nvidia-nvtiff-cu13):
#   bash launch/bench_decode.sh decoders            # decoder rows, photos and ~100 KB photos (~6 min)
#   bash launch/bench_decode.sh b16-8cores          # ViT-B-16 32k on GPU 0 held to 8 cores (~6 min)
#   bash launch/bench_decode.sh l14-4cores          # ViT-L-14 16k on GPU 0 held to 4 cores (~7 min)
#   bash launch/bench_decode.sh zeroshot            # the quickstart, PIL and the GPU decoder, 2 seeds
#   HOST_MEMORY=500GiB bash launch/bench_decode.sh b32-2m   # ViT-B-32 at 2,097,152 on 4 GPUs (started;
#   SCALE_OUT=... bash launch/bench_scale.sh wait 540       #  then waited for, with the same SCALE_OUT)
#   bash launch/bench_decode.sh steps               # the step rows into decode.json (also on a CPU)
# The step parts time synthetic and JPEG steps of one model in one run (`vs_synthetic`), with
# data.decoder auto and data.decode_workers auto, so each row says what the rank's plan chose.
# Rows of bench train go to $OUT/decode_steps.json and the scale row to $SCALE_OUT; `steps` makes
# decode.json's step rows of both. Shards: the photos (launch/bench_real_data.sh shards) under
# $SHARDS and 8,192 photos of ~100 KB under $LARGE, made once per host.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -gt 0 ] || { sed -n '2,18p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
source launch/gpu_host.sh
out=${OUT:-docs/benchmarks}
shards=${SHARDS:-/tmp/infcl-ds-photos}
large=${LARGE:-/tmp/infcl-ds-photos-large}
scale_out=${SCALE_OUT:-$out/scale.json}
make_shards() {
  SHARDS=$shards bash launch/bench_real_data.sh shards
  [ -f "$large/photos.json" ] ||
    python3 -m infcl_ds.cli data photos --out "$large" --samples 8192 --shard-size 2048 --shorter 576,704
}
one_gpu_steps() {  # one GPU held to CORES cores: synthetic and JPEG steps of MODEL at BATCH, auto decoder
  local cores=$1 model=$2 batch=$3
  CUDA_VISIBLE_DEVICES=0 taskset -c "0-$((cores - 1))" python3 -m infcl_ds.cli bench train --world 1 \
    --model "$model" --batch "$batch" --chunk auto --compile --steps 2 --data synthetic,jpeg \
    --shards "$shards/listed/shard-{00000..00095}.tar" --decoder auto --decode-workers auto \
    --set data.gpu_jpeg_library=nvimgcodec --append --out "$out/decode_steps.json"
}
for part in "$@"; do
  case "$part" in
    shards) make_shards ;;
    decoders) make_shards
              CUDA_VISIBLE_DEVICES=0 python3 -m benchmarks.decode --shards "photos=$shards,large=$large" \
                --out "$out/decode.json" ;;
    b16-8cores) make_shards; one_gpu_steps 8 ViT-B-16 32k ;;
    l14-4cores) make_shards; one_gpu_steps 4 ViT-L-14 16k ;;
    zeroshot) CUDA_VISIBLE_DEVICES=0 python3 -m infcl_ds.cli bench decoders --decoders pil,nvjpeg --seeds 0,1 \
                --gpu-jpeg-library nvimgcodec --out "$out/decoder_zeroshot.json" ;;
    b32-2m) SCALE_OUT=$scale_out bash launch/bench_scale.sh start four-gpu-b32-2m ;;
    steps) python3 -m benchmarks.decode --steps-from "$out/decode_steps.json,$scale_out" --out "$out/decode.json" ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
