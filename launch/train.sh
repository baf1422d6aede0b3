#!/usr/bin/env bash
# Train a recipe through DeepSpeed's launcher, on this node or on the nodes of a hostfile,
# after the planner (infcl-ds plan) has checked it against the GPUs it will run on.
#
#   launch/train.sh RECIPE [--hostfile F] [--include S] [--exclude S] [--num_nodes N]
#                   [--num_gpus N] [--master_addr A] [--master_port P] [--no_ssh --node_rank I]
#                   [--ssh_port P] [--enable_each_rank_log DIR] [--gpu-memory 80GiB] [--host-memory 2TiB] [--cores N] [--no-plan]
#                   [--resume TAG | --restart] [--set key=value ...]
#
# Runs: deepspeed [launcher flags] --module infcl_ds.train --config RECIPE [--set ...] [--resume ... | --restart]
# With a hostfile, ./.deepspeed_env (DeepSpeed reads it from the working directory) gets
# this shell's NCCL_*, GLOO_*, TORCH_*, TRITON_*, PYTHONPATH, PYTORCH_CUDA_ALLOC_CONF,
# OMP_NUM_THREADS, DS_ACCELERATOR, DEEPSPEED_TIMEOUT, INFCL_DS_HOST_MEMORY (--host-memory: the
# planner's and every rank's node memory) and the names in INFCL_FORWARD_ENV, for
# the other nodes; the file's other lines (the user's own) are kept. A recipe the planner refuses is not launched (exit 1 or 2); --no-plan skips
# it. See docs/multi-node.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
usage() { sed -n '5,9p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,3\}//' >&2; exit "${1:-2}"; }

[ $# -ge 1 ] && [ "${1#-}" = "$1" ] || usage
recipe=$1
shift
launcher=() world=() trainer=() planner=() trainer_sets=() plan=1 hostfile=""
while [ $# -gt 0 ]; do
  case $1 in
    --hostfile) hostfile=$2; launcher+=("$1" "$2"); world+=("$1" "$2"); shift 2 ;;
    --include|--exclude|--num_nodes|--num_gpus) launcher+=("$1" "$2"); world+=("$1" "$2"); shift 2 ;;
    --master_addr|--master_port|--node_rank|--ssh_port|--enable_each_rank_log) launcher+=("$1" "$2"); shift 2 ;;
    --no_ssh) launcher+=("$1"); shift ;;
    --gpu-memory|--cores) planner+=("$1" "$2"); shift 2 ;;
    # the node's memory for the planner and for every rank's own plan (plan/machine.py)
    --host-memory) planner+=("$1" "$2"); export INFCL_DS_HOST_MEMORY=$2; shift 2 ;;
    --set) trainer+=("$1" "$2"); planner+=("$1" "$2"); trainer_sets+=("$1" "$2"); shift 2 ;;
    --resume) trainer+=("$1" "$2"); shift 2 ;;
    --restart) trainer+=("$1"); shift ;;
    --no-plan) plan=0; shift ;;
    -h|--help) usage 0 ;;
    *) echo "train.sh: unknown argument $1" >&2; usage ;;
  esac
done

# The project's environment, unless one is active already.
if [ -z "${VIRTUAL_ENV:-}" ] && [ -x "$root/.venv/bin/python" ]; then
  export PATH="$root/.venv/bin:$PATH"
fi

# Ranks launched on this node (no hostfile) run on its CPUs where it has no CUDA GPU: said once
# here, so that the planner plans CPU ranks (cores, host memory, gloo) and DeepSpeed does not
# have to guess. A hostfile's nodes may have GPUs this one lacks (a login node): left alone.
if [ -z "$hostfile" ] && [ -z "${DS_ACCELERATOR:-}" ] &&
   ! python -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
  export DS_ACCELERATOR=cpu
  echo "train.sh: no CUDA GPU on this node: the ranks run on its CPUs (DS_ACCELERATOR=cpu)" >&2
fi

# The data paths first: a typo fails here, not after every rank has built its engine.
python -m infcl_ds.cli data check --config "$recipe" ${trainer_sets[@]+"${trainer_sets[@]}"} || exit 2

if [ "$plan" = 1 ]; then
  # The planner resolves the world as the launcher will: the hostfile's slots with --include,
  # --exclude, --num_nodes, --num_gpus; without a hostfile, this node's GPUs (none on a CPU
  # machine: then --num_gpus, or a recipe named *-<N>gpu.yaml).
  pool=""
  if [ -z "$hostfile" ] && command -v nvidia-smi >/dev/null; then
    pool=$(mktemp)
    echo "localhost slots=$(nvidia-smi -L | grep -c '^GPU')" > "$pool"
    world+=(--hostfile "$pool")
  fi
  status=0
  python -m infcl_ds.plan.command --config "$recipe" ${world[@]+"${world[@]}"} ${planner[@]+"${planner[@]}"} || status=$?
  [ -z "$pool" ] || rm -f "$pool"
  if [ "$status" != 0 ]; then
    echo "train.sh: the planner refused $recipe (--no-plan launches anyway)" >&2
    exit "$status"
  fi
fi

if [ -n "$hostfile" ]; then
  forward=$(compgen -e | grep -E '^(NCCL_|GLOO_|TORCH_|TRITON_)' || true)
  forward+=" PYTHONPATH PYTORCH_CUDA_ALLOC_CONF OMP_NUM_THREADS DS_ACCELERATOR DEEPSPEED_TIMEOUT INFCL_DS_HOST_MEMORY"
  forward+=" ${INFCL_FORWARD_ENV:-}"
  next_env=$(mktemp .deepspeed_env.XXXXXX)
  # Keep the user's lines for names this script does not set; then ours.
  if [ -f .deepspeed_env ]; then
    names_re="^($(echo $forward | tr ' ' '|'))="
    grep -Ev "$names_re" .deepspeed_env >> "$next_env" || true
  fi
  for name in $forward; do
    value=${!name-}
    # DeepSpeed reads KEY=VALUE lines, one per line: skip unset and multi-line values.
    if [ -n "${!name+set}" ] && [[ "$value" != *$'\n'* ]]; then
      printf '%s=%s\n' "$name" "$value" >> "$next_env"
    fi
  done
  mv "$next_env" .deepspeed_env
fi

# exec: this script's pid becomes the deepspeed launcher's, so SIGINT/SIGTERM to it (or a job
# scheduler's) reaches the process whose death every rank watches (training/launcher_watch.py):
# the ranks agree to stop at the next step, after a checkpoint being written. A trap that
# killed the process group instead would cut ranks mid-save; a shell left waiting in between
# would die alone and leave the job running.
exec deepspeed ${launcher[@]+"${launcher[@]}"} --module infcl_ds.train --config "$recipe" \
  ${trainer[@]+"${trainer[@]}"}
