#!/usr/bin/env bash
# The README's main job: set up the environment, then run the CPU demo of the exact tiled
# loss (the training quickstart replaces this once the trainer lands).
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
bash "$root/launch/setup.sh"
"$root/.venv/bin/infcl-ds" demo "$@"
