"""parallel/comm.py: DeepSpeed on CPU ranks builds no shared-memory op and leaves no buffers."""
import os
import subprocess
import sys

from launch_utils import ROOT

PROBE = """
import importlib
ds_torch = importlib.import_module("deepspeed.comm.torch")  # the attribute `torch` there is torch itself
from infcl_ds.parallel.comm import without_cpu_shared_memory_op
without_cpu_shared_memory_op()
print(ds_torch.build_shm_op())
"""


def test_deepspeed_gets_no_shared_memory_op_on_cpu():
    """DeepSpeed's TorchBackend calls build_shm_op() at init_distributed: after the call it
    returns None (no compiler run, no /dev/shm buffers that nothing unlinks). Without it the
    op is compiled and returned."""
    env = dict(os.environ, DS_ACCELERATOR="cpu")
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "None", proc.stdout[-2000:]
