#!/usr/bin/env bash
# The README's test command: set up the environment, then run the whole test suite on CPU
# (Triton kernels through TRITON_INTERPRET=1, DeepSpeed on gloo ranks over 127.0.0.1).
#
#   bash tests/run.sh [PYTEST ARGS]          # the whole suite on CPU
#   bash tests/run.sh --gpu [PYTEST ARGS]    # the tests marked gpu, on CUDA
#   bash tests/run.sh --gpu --part K/N [PYTEST ARGS]   # the K-th of N parts of them
#
# --gpu: the tests marked `gpu` (kernels, rings, losses and drop-ins, engine, towers;
# tests/README.md lists them) against the same float64 references, but compiled (no interpreter),
# bf16 on the tensor cores, NCCL ranks one GPU each (tests/devices.py); tests needing more
# ranks than there are GPUs are skipped (the ring goes up to 4 ranks, the engine uses 2), and
# so are the marked files' gloo-only cases. A marker, not a file list: tests/test_gpu_marker.py
# fails when a test file of the kernels, rings, losses or engine carries none.
#
# --part K/N: the marked tests split into N parts of about equal time (pytest-split, with the
# durations measured on a four-GPU machine in tests/gpu_durations.json), so that each part fits a
# bounded command; the N parts together are the whole marked set. launch/bench_gpu_tests.sh
# `durations` measures them again.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
gpu=0
part=()
if [ "${1:-}" = "--gpu" ]; then
  gpu=1
  shift
  if [ "${1:-}" = "--part" ]; then
    if ! [[ "${2:-}" =~ ^([1-9][0-9]*)/([1-9][0-9]*)$ ]] || [ "${BASH_REMATCH[1]}" -gt "${BASH_REMATCH[2]}" ]; then
      echo "tests/run.sh: --part takes K/N with 1 <= K <= N, got '${2:-}'" >&2
      exit 2
    fi
    part=(--splits "${BASH_REMATCH[2]}" --group "${BASH_REMATCH[1]}" --splitting-algorithm least_duration
          --durations-path "$root/tests/gpu_durations.json")
    shift 2
  fi
fi
cd "$root"
export MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
# DeepSpeed's ops built for this checkout's environment, not in the user-wide cache: another
# checkout's venv building the same op there makes the next start here rebuild it (minutes).
export TORCH_EXTENSIONS_DIR=${TORCH_EXTENSIONS_DIR:-$root/.venv/torch_extensions}
if [ "$gpu" = 1 ]; then
  # A GPU machine's own Python when it already has CUDA torch and the packages (lent GPU machines
  # cannot reach a package index, and a venv would fetch a CPU torch); else the project's venv.
  python=${PYTHON:-python3}
  if "$python" -c 'import torch, triton, deepspeed, open_clip, pytest, pytest_split; assert torch.cuda.is_available()' 2>/dev/null; then
    export PYTHONPATH=$root${PYTHONPATH:+:$PYTHONPATH}
  else
    bash "$root/launch/setup.sh"
    python=$root/.venv/bin/python
  fi
  unset TRITON_INTERPRET DS_ACCELERATOR
  export INFCL_DS_TEST_DEVICE=cuda
  exec "$python" -m pytest -q -m gpu ${part[@]+"${part[@]}"} "$@"
fi
bash "$root/launch/setup.sh"
# OpenMPI (Debian's packages) for the mpirun launch test; a no-op when mpirun exists.
bash "$root/launch/install_openmpi.sh"
export TRITON_INTERPRET=1 DS_ACCELERATOR=cpu
# --durations: the slowest tests at the end of every run, the ones tests/README.md accounts for
exec "$root/.venv/bin/python" -m pytest -q --durations=12 "$@"
