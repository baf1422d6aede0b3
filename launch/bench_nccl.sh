#!/usr/bin/env bash
# The NCCL paths on a four-GPU host, in parts that each fit a 10-minute command (carry .whl, and
# .whl-wds with webdataset==0.2.86 alone for open_clip_train's loader: ../shared/tools/gpu-wheels.sh
# .whl-wds webdataset==0.2.86 braceexpand), results into $OUT (default docs/benchmarks):
#   bash launch/bench_nccl.sh faults-1 ... faults-4   # two scenarios each of the fault matrix on 4 NCCL
#                                                     #  ranks: $OUT/faults_nccl-K.json (benchmarks/faults.py)
#   HOST_MEMORY=500GiB bash launch/bench_nccl.sh engine-128k   # this engine, ViT-B-16 at 131,072 through
#   SCALE_OUT=$OUT/scale.json bash launch/bench_scale.sh wait 540   #  train.sh (started, then waited for)
#   bash launch/bench_nccl.sh open-clip-train-128k    # open_clip_train under torchrun, same shards and GPUs:
#                                                     #  its row beside the engine's in scale.json
#   bash launch/bench_nccl.sh siglip-ring             # the SigLIP ring at 1M and 4M, D 768 and 1152, with
#                                                     #  one GPU at equal work: $OUT/siglip_ring_4gpu.json;
#                                                     #  at 256k too, where open_clip's SigLipLoss fits
#   bash launch/bench_nccl.sh siglip-ring-1gpu        # on one GPU, the four-GPU part's per-GPU rows (64k,
#                                                     #  512k, 2M): that they fit, and their seconds
# The engine's and open_clip_train's runs go back to back on one warm machine (one run's ratio).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
usage() { sed -n '2,16p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2; exit 2; }
[ $# -gt 0 ] || usage
for part in "$@"; do
  case "$part" in faults-[1-4]|engine-128k|open-clip-train-128k|siglip-ring|siglip-ring-1gpu) ;; *) usage ;; esac
done
source launch/gpu_host.sh
out=${OUT:-docs/benchmarks}
shards=${SHARDS:-/tmp/infcl-ds-photos}
scenarios=(kill-rank:step,kill-rank:save stop-rank:step,stop-rank:save term-launcher:step,term-launcher:save
           int-launcher:step,int-launcher:save)
for part in "$@"; do
  case "$part" in
    faults-*) k=${part#faults-}
              python3 -m benchmarks.faults --accelerator cuda --ranks 4 --rank 3 --timeout-min 1 \
                --only "${scenarios[$((k - 1))]}" --out "$out/faults_nccl-$k.json" ;;
    engine-128k) SCALE_OUT=$out/scale.json bash launch/bench_scale.sh start four-gpu-128k ;;
    open-clip-train-128k)
      # the shards four-gpu-128k listed (benchmarks/scale.py: five global batches of them)
      listed=$(ls "$shards"/listed/shard-*.tar | wc -l)
      wds=/tmp/site-wds
      if ls .whl-wds/*.whl >/dev/null 2>&1 && [ ! -d "$wds" ]; then
        python3 -m pip install -q --no-index --no-deps --no-compile --target "$wds" .whl-wds/*.whl
      fi
      PYTHONPATH=$wds:$PYTHONPATH python3 -m infcl_ds.cli bench train --world 4 --model ViT-B-16 --batch 128k \
        --impl open_clip_train --data jpeg --shards "$shards/listed/shard-{00000..$(printf %05d $((listed - 1)))}.tar" \
        --open-clip-train-modes compile --open-clip-train-batch-size 1024 --open-clip-train-workers 14 \
        --steps 2 --out "$out/open_clip_train_4gpu.json"
      python3 -m benchmarks.scale_vs_open_clip_train --rows "$out/open_clip_train_4gpu.json" --out "$out/scale.json" ;;
    siglip-ring) python3 -m infcl_ds.cli bench ring --loss siglip --batch 256k,1m,4m --dim 768,1152 \
                   --out "$out/siglip_ring_4gpu.json" ;;
    siglip-ring-1gpu) python3 -m infcl_ds.cli bench ring --loss siglip --world 1 --no-single --batch 64k,512k,2m \
                        --dim 768,1152 --open-clip-max-batch 64k --out "$out/siglip_ring_1gpu.json" ;;
  esac
done
