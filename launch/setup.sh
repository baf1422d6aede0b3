#!/usr/bin/env bash
# Create (or refresh) the project's virtual environment in .venv with everything infcl_ds
# needs, pinned by requirements/constraints.txt. Idempotent: a stamp records what was
# installed, so a second run with unchanged files takes a second.
#   bash launch/setup.sh            # -> .venv
#   VENV=/path/to/venv bash launch/setup.sh
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
venv=${VENV:-$root/.venv}
python=${PYTHON:-$(command -v python3.11 || command -v python3)}
constraints=$root/requirements/constraints.txt
stamp=$venv/.infcl_ds-setup
want=$(cat "$constraints" "$root/setup.cfg" | sha256sum | cut -d' ' -f1)

if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
echo "[setup] creating $venv with $($python --version)" >&2
[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check -q)
"${pip[@]}" install --upgrade pip >/dev/null
# torch first, on its own: on the CPU machines it comes from local disk with triton.
"${pip[@]}" install -c "$constraints" torch torchvision
"${pip[@]}" install -c "$constraints" -e "$root[train,test,bench]"
echo "$want" > "$stamp"
echo "[setup] done: $("$venv/bin/python" -c 'import torch, triton, deepspeed; print("torch", torch.__version__, "triton", triton.__version__, "deepspeed", deepspeed.__version__)' 2>/dev/null)" >&2
