#!/usr/bin/env bash
# Install OpenMPI from the distribution (Debian/Ubuntu: openmpi-bin, libopenmpi-dev) when
# `mpirun` is missing; a no-op otherwise. Quiet unless it fails; needs root or sudo. Used by
# the test set-up for the mpirun launch test (tests/test_launch.py) and by launch/mpi.sh users.
#   bash launch/install_openmpi.sh
set -euo pipefail
command -v mpirun >/dev/null 2>&1 && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if ! { $sudo apt-get update -qq &&
       $sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
         openmpi-bin libopenmpi-dev; } >"$log" 2>&1; then
  cat "$log" >&2
  exit 1
fi
echo "[install_openmpi] $(mpirun --version 2>&1 | head -n1)" >&2
