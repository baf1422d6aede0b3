# Sourced (from the checkout's root) by the launch/bench_*.sh scripts that run on a lent GPU
# machine, which has torch and triton but not the project's other packages: the wheels carried in
# .whl/ (../shared/tools/gpu-wheels.sh) installed once into /tmp/site, they and the checkout on
# PYTHONPATH; an image with only python3 gets a `python` beside it (train.sh runs `python` and
# `deepspeed`); NVLink multicast stays off on shared hosts (the lent machines' KINDS.md says why).
if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.infcl-ds-wheels ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  touch /tmp/site/.infcl-ds-wheels
fi
[ -d /tmp/site ] && export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PATH=/tmp/site/bin:$PATH
if ! command -v python >/dev/null; then
  mkdir -p /tmp/infcl-ds-bin && ln -sf "$(command -v python3)" /tmp/infcl-ds-bin/python
  export PATH=/tmp/infcl-ds-bin:$PATH
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
