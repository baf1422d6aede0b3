#!/usr/bin/env bash
# Train a recipe with OpenMPI's mpirun, one process per GPU, after the planner has checked it.
#
#   launch/mpi.sh RECIPE -np N [--hostfile F] [--master_addr A] [--master_port P]
#                 [--gpu-memory 80GiB] [--host-memory 2TiB] [--cores N] [--no-plan]
#                 [--resume TAG | --restart] [--set key=value ...] [-- more mpirun arguments]
#
# Each process runs `python -m infcl_ds.train` and joins the job from OpenMPI's
# OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK (infcl_ds/training/distributed.py) with the
# MASTER_ADDR:MASTER_PORT given here: by default the hostfile's first host, or 127.0.0.1
# without a hostfile. The hostfile format is DeepSpeed's and OpenMPI's (`node1 slots=8`);
# ranks fill a node's slots before the next node's (node-major, as the ring wants).
# Forwarded to every rank: NCCL_*, GLOO_*, TORCH_*, TRITON_*, PATH, PYTHONPATH,
# OMP_NUM_THREADS, DS_ACCELERATOR, DEEPSPEED_TIMEOUT and the names in INFCL_FORWARD_ENV.
# As root, OpenMPI wants OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '4,6p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,3\}//' >&2; exit "${1:-2}"; }

[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
recipe=$1
shift
np="" hostfile="" master_addr="" master_port=${MASTER_PORT:-29500} plan=1
trainer=() planner=() extra=()
while [ $# -gt 0 ]; do
  case $1 in
    -np|-n) np=$2; shift 2 ;;
    --hostfile) hostfile=$2; shift 2 ;;
    --master_addr) master_addr=$2; shift 2 ;;
    --master_port) master_port=$2; shift 2 ;;
    --gpu-memory|--host-memory|--cores) planner+=("$1" "$2"); shift 2 ;;
    --set) trainer+=("$1" "$2"); planner+=("$1" "$2"); shift 2 ;;
    --resume) trainer+=("$1" "$2"); shift 2 ;;
    --restart) trainer+=("$1"); shift ;;
    --no-plan) plan=0; shift ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) usage 0 ;;
    *) echo "mpi.sh: unknown argument $1" >&2; usage ;;
  esac
done
[ -n "$np" ] || { echo "mpi.sh: -np N is required" >&2; usage; }

if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$root/.venv/bin/python" ]; then
  export PATH="$root/.venv/bin:$PATH"
fi

per_node=$np
if [ -n "$hostfile" ]; then
  first_host=$(awk '!/^[[:space:]]*(#|$)/ {print $1; exit}' "$hostfile")
  per_node=$(awk '!/^[[:space:]]*(#|$)/ {split($2, s, "="); if (s[2] > m) m = s[2]} END {print m}' "$hostfile")
  master_addr=${master_addr:-$first_host}
fi
export MASTER_ADDR=${master_addr:-127.0.0.1} MASTER_PORT=$master_port

# The data paths first: a typo fails here, not after every rank has built its engine.
sets=()
for i in "${!planner[@]}"; do
  [ "${planner[$i]}" != "--set" ] || sets+=(--set "${planner[$((i + 1))]}")
done
python -m infcl_ds.cli data check --config "$recipe" ${sets[@]+"${sets[@]}"} || exit 2

if [ "$plan" = 1 ]; then
  python -m infcl_ds.plan.command --config "$recipe" --gpus "$np" --gpus-per-node "$per_node" \
    ${planner[@]+"${planner[@]}"} || { status=$?; echo "mpi.sh: the planner refused $recipe" >&2; exit "$status"; }
fi

exports=(-x MASTER_ADDR -x MASTER_PORT)
for name in $(compgen -e | grep -E '^(NCCL_|GLOO_|TORCH_|TRITON_)' || true) PATH PYTHONPATH OMP_NUM_THREADS \
            DS_ACCELERATOR DEEPSPEED_TIMEOUT ${INFCL_FORWARD_ENV:-}; do
  [ -z "${!name+set}" ] || exports+=(-x "$name")
done
hosts=()
[ -z "$hostfile" ] || hosts=(--hostfile "$hostfile")

# --bind-to none: the trainer picks its GPU from the local rank; OpenMPI's default core
# binding would pin each rank (and its data workers) to one core.
exec mpirun -np "$np" ${hosts[@]+"${hosts[@]}"} --map-by slot --bind-to none "${exports[@]}" \
  ${extra[@]+"${extra[@]}"} python -u -m infcl_ds.train --config "$recipe" ${trainer[@]+"${trainer[@]}"}
