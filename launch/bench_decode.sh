#!/usr/bin/env bash
# docs/benchmarks/decode.json + .png and decoder_zeroshot.json: the GPU's JPEG decoder through
# nvImageCodec measured beside training, in parts that each fit a 10-minute command on a warm
# four-GPU host (carry .whl with the gpu-decode wheels: ../shared/tools/gpu-wheels.sh .whl
# nvidia-nvimgcodec-cu13 nvidia-nvjpeg nvidia-nvjpeg2k-cu13 nvidia-nvtiff-cu13):
#   bash launch/bench_decode.sh decoders            # decoder rows, photos and ~100 KB photos (~4 min)
#   bash launch/bench_decode.sh decoders-compiled   # the same beside a compiled tower (decode_compiled.json),
#   bash launch/bench_decode.sh decoders-priority   #  a high-priority decoding stream (decode_priority.json),
#   bash launch/bench_decode.sh decoders-switch     #  a 0.5 ms GIL switch interval (decode_switch.json),
#   bash launch/bench_decode.sh decoders-process    #  the tower in a process of its own (decode_process.json)
#   bash launch/bench_decode.sh lanes-4             # 4 decoding threads side by side (decode_lanes-4.json;
#                                                   #  lanes-1/2/8, -sleep, -piece256, -compiled: the table below)
#   bash launch/bench_decode.sh b16-8cores          # ViT-B-16 32k on one GPU held to 8 cores (~5 min)
#   bash launch/bench_decode.sh l14-4cores          # ViT-L-14 16k on one GPU held to 4 cores (~6 min)
#   bash launch/bench_decode.sh b16-8cores-tv4      # b16-8cores through torchvision, 4 lanes (-tv1: one)
#   bash launch/bench_decode.sh zeroshot            # the quickstart, PIL and the GPU decoder, 2 seeds (~5 min)
#   HOST_MEMORY=500GiB bash launch/bench_decode.sh b32-2m   # ViT-B-32 at 2,097,152 on 4 GPUs (started;
#   timeout 560 bash launch/bench_scale.sh wait 500         #  then waited for, with the same SCALE_OUT;
#                                                           #  ~15 min in all; the wait counts from its
#                                                           #  process's start, the timeout is a backstop)
#   HOST_MEMORY=500GiB bash launch/bench_decode.sh b32-2m-moving   # the same, default library, 5 steps:
#                                                           #  auto's split moved after step 3, step 5 at
#                                                           #  it (~21 min: start + wait 540, wait 560, wait)
#   HOST_MEMORY=250GiB bash launch/bench_decode.sh b32-1m   # its load per GPU on a 2-GPU host, 2 steps
#   bash launch/bench_decode.sh b32-128k   # ViT-B-32 at 128k on a one-GPU machine, 7 steps (~6 min): auto's
#                                          #  split moved to the run's own rates (then bench_scale.sh wait)
# ViT-B-32's tower rates, measured and calibrated in the command that starts the runs planned with
# them (a later command's checkout replaces the calibration written here; the checkout holds them
# since they were measured on an H200):
#   HOST_MEMORY=500GiB bash launch/bench_decode.sh b32-rates b32-2m && bash launch/bench_scale.sh wait 300
#   bash launch/bench_decode.sh steps               # the step rows into decode.json (also on a CPU)
# The one-GPU parts at once, each on a GPU of its own (PART@GPU, or PART+PART@GPU one after
# another) and that GPU's share of the cores
# (its taskset takes the first of them), in process sessions that outlive the command; the decoder
# rows first, so that the step parts plan with their rates (calibrate: the planner's decode rates
# from decode.json, as python -m infcl_ds.plan.calibrate --decode does; it writes the checkout's
# calibration/decode_rates.json, which a lent machine's next command replaces with the sent tree:
# the parts that should plan with it start in the same command):
#   bash launch/bench_decode.sh start decoders@0 zeroshot@3; bash launch/bench_decode.sh wait 400
#   bash launch/bench_decode.sh calibrate start b16-8cores@1 l14-4cores@2
#   bash launch/bench_decode.sh wait 540   # until it says all have ended; rows, rates and logs to $OUT
#   bash launch/bench_decode.sh start decoders@0 decoders-compiled@1 decoders-priority@2 decoders-process@3
# The step parts time synthetic and JPEG steps of one model in one run (`vs_synthetic`), with
# data.decoder auto and data.decode_workers auto, so each row says what the rank's plan chose.
# Rows of bench train go to $OUT/decode_steps-PART.json and the scale row to $SCALE_OUT; `steps`
# makes decode.json's step rows of both. Shards: the photos (launch/bench_real_data.sh shards)
# under $SHARDS and 8,192 photos of ~100 KB under $LARGE, made once per host.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
[ $# -gt 0 ] || { sed -n '2,40p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
source launch/gpu_host.sh
out=${OUT:-docs/benchmarks}
shards=${SHARDS:-/tmp/infcl-ds-photos}
large=${LARGE:-/tmp/infcl-ds-photos-large}
scale_out=${SCALE_OUT:-$out/scale.json}
work=${WORK:-/tmp/infcl-ds-decode}
gpu=${GPU:-0}
gpus=$(nvidia-smi -L 2>/dev/null | wc -l) || gpus=1
cores_per_gpu=$(( $(nproc --all) / (gpus > 0 ? gpus : 1) ))
first_core=$(( gpu * cores_per_gpu ))
make_shards() {
  SHARDS=$shards bash launch/bench_real_data.sh shards
  [ -f "$large/photos.json" ] ||
    python3 -m infcl_ds.cli data photos --out "$large" --samples 8192 --shard-size 2048 --shorter 576,704
}
on_gpu() {  # COMMAND on $GPU, held to its share of the cores
  CUDA_VISIBLE_DEVICES=$gpu taskset -c "$first_core-$((first_core + cores_per_gpu - 1))" "$@"
}
one_gpu_steps() {  # $GPU held to CORES cores: synthetic and JPEG steps of MODEL at BATCH, auto decoder
  local cores=$1 model=$2 batch=$3 part=$4; shift 4  # then: recipe overrides (KEY=VALUE)
  local sets=(--set data.gpu_jpeg_library=nvimgcodec) kv
  for kv in "$@"; do sets+=(--set "$kv"); done
  CUDA_VISIBLE_DEVICES=$gpu taskset -c "$first_core-$((first_core + cores - 1))" python3 -m infcl_ds.cli bench train --world 1 \
    --model "$model" --batch "$batch" --chunk auto --compile --steps 2 --data synthetic,jpeg \
    --shards "$shards/listed/shard-{00000..00095}.tar" --decoder auto --decode-workers auto \
    "${sets[@]}" --append --out "$out/decode_steps-$part.json"
}
start_side_by_side() {  # PART@GPU... each in a process session of its own
  make_shards
  mkdir -p "$work/rows"
  local spec part
  for spec in "$@"; do
    part=${spec%@*}
    [[ $spec == *@* ]] || { echo "start: $spec needs @GPU" >&2; exit 2; }
    echo "$part on GPU ${spec#*@}, cores from $((${spec#*@} * cores_per_gpu))"
    rm -f "$work/$part.rc"
    # shellcheck disable=SC2086  # PART+PART: its parts, one after another
    (OUT=$work/rows GPU=${spec#*@} setsid bash -c 'bash launch/bench_decode.sh ${1//+/ }; echo $? > "$2.rc"' _ \
       "$part" "$work/$part" > "$work/$part.log" 2>&1 < /dev/null &)
    grep -qx "$part" "$work/parts" 2>/dev/null || echo "$part" >> "$work/parts"
  done
}
wait_side_by_side() {  # up to SECONDS for the started parts; their rows and logs into $OUT
  [ -f "$work/parts" ] || { echo "no parts started in $work" >&2; exit 2; }
  local deadline=$((SECONDS + $1)) part running
  while :; do
    running=0
    while read -r part; do [ -f "$work/$part.rc" ] || running=1; done < "$work/parts"
    [ $running = 1 ] && [ $SECONDS -lt $deadline ] || break
    sleep 5
  done
  while read -r part; do
    echo "== $part: $( [ -f "$work/$part.rc" ] && echo "ended, status $(cat "$work/$part.rc")" || echo running)"
    tail -n 15 "$work/$part.log"
  done < "$work/parts"
  if [ -n "${OUT:-}" ]; then  # one file: a command brings back few
    cp infcl_ds/calibration/decode_rates.json "$work/rows/"
    tar -czf "$OUT/decode-run.tgz" -C "$work" rows $(cd "$work" && ls *.log)
  fi
  [ $running = 0 ]
}
# The decoder rows' variants: each asks what sets the GPU decoder's pace beside training.
lanes="--trainers-backends-only"
declare -A variant=([decoders-compiled]="--towers-compile" [decoders-priority]="--stream-priority high"
                    [decoders-switch]="--switch-interval 0.0005" [decoders-process]="--towers-process"
                    [lanes-1]="$lanes" [lanes-2]="$lanes --decode-threads 2" [lanes-4]="$lanes --decode-threads 4"
                    [lanes-8]="$lanes --decode-threads 8" [lanes-1-sleep]="$lanes --blocking-sync"
                    [lanes-4-sleep]="$lanes --decode-threads 4 --blocking-sync"
                    [lanes-4-piece256]="$lanes --decode-threads 4 --piece 256"
                    [lanes-4-compiled]="$lanes --decode-threads 4 --towers-compile")
while [ $# -gt 0 ]; do
  part=$1; shift
  case "$part" in
    shards) make_shards ;;
    decoders) make_shards
              on_gpu python3 -m benchmarks.decode --shards "photos=$shards,large=$large" \
                --out "$out/decode.json" ;;
    decoders-*|lanes-*) make_shards
              [ -n "${variant[$part]:-}" ] || { echo "unknown part $part" >&2; exit 2; }
              # shellcheck disable=SC2086  # the variant's options, split on purpose
              on_gpu python3 -m benchmarks.decode --shards "photos=$shards,large=$large" ${variant[$part]} \
                --out "$out/decode_${part#decoders-}.json" ;;
    b16-8cores) make_shards; one_gpu_steps 8 ViT-B-16 32k "$part" ;;
    # the same with torchvision's binding on 1 and 4 lanes (nvImageCodec's calls do not overlap)
    b16-8cores-tv1) make_shards; one_gpu_steps 8 ViT-B-16 32k "$part" data.gpu_jpeg_library=torchvision ;;
    b16-8cores-tv4) make_shards
                    one_gpu_steps 8 ViT-B-16 32k "$part" data.gpu_jpeg_library=torchvision data.gpu_decode_lanes=4 ;;
    l14-4cores) make_shards; one_gpu_steps 4 ViT-L-14 16k "$part" ;;
    zeroshot) on_gpu python3 -m infcl_ds.cli bench decoders --decoders pil,nvjpeg --seeds 0,1 \
                --gpu-jpeg-library nvimgcodec --out "$out/decoder_zeroshot.json" ;;
    # ViT-B-32's eager and compiled tower rates (64k, one GPU), its planner entry written from them:
    # the runs after it in the same command plan at its own rate; the rows to $out/vs_open_clip-b32.json
    b32-rates) make_shards & made=$!
               OUT=$work/vs bash launch/bench_vs_open_clip.sh b32 b32-compiled
               python3 -m infcl_ds.plan.calibrate --write --compiled "$work/vs/vs_open_clip.json"
               cp "$work/vs/vs_open_clip.json" "$out/vs_open_clip-b32.json"
               wait $made ;;
    b32-2m) SCALE_OUT=$scale_out bash launch/bench_scale.sh start four-gpu-b32-2m ;;
    b32-2m-moving) SCALE_OUT=$scale_out bash launch/bench_scale.sh start four-gpu-b32-2m-moving ;;
    b32-1m) SCALE_OUT=$scale_out bash launch/bench_scale.sh start two-gpu-b32-1m ;;
    b32-128k) SCALE_OUT=$scale_out bash launch/bench_scale.sh start one-gpu-b32-128k ;;
    steps) steps_from=$(printf '%s,' "$out"/decode_steps-*.json)
           python3 -m benchmarks.decode --steps-from "$steps_from$scale_out" --out "$out/decode.json" ;;
    calibrate) python3 -m infcl_ds.plan.calibrate --decode "$work/rows/decode.json" ;;
    start) start_side_by_side "$@"; exit ;;
    wait) wait_side_by_side "${1:?seconds}"; exit ;;
    *) echo "unknown part $part" >&2; exit 2 ;;
  esac
done
