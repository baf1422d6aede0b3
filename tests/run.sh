#!/usr/bin/env bash
# The README's test command: set up the environment, then run the whole test suite on CPU
# (Triton kernels through TRITON_INTERPRET=1, DeepSpeed on gloo ranks over 127.0.0.1).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/launch/setup.sh"
# OpenMPI (Debian's packages) for the mpirun launch test; a no-op when mpirun exists.
bash "$root/launch/install_openmpi.sh"
cd "$root"
export TRITON_INTERPRET=1 DS_ACCELERATOR=cpu MASTER_ADDR=127.0.0.1 OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
exec "$root/.venv/bin/python" -m pytest -q "$@"
