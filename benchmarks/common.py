"""What every benchmark shares: the run's identity, its ranks, batch sizes and JSON rows (the loss
benchmarks' timing and row schema: harness.py)."""
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Dict, List

import torch


def run_identity() -> Dict[str, str]:
    """Device, versions and commit, stamped on every row of a run."""
    # INFCL_DS_COMMIT first: a copied working tree (GPU machines) may carry stale git metadata.
    commit = os.environ.get("INFCL_DS_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
    import triton
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.processor() or platform.machine()})"
    return {"device": device, "torch": torch.__version__, "triton": triton.__version__,
            "commit": commit or "unknown"}


def free_port() -> int:
    """A free TCP port on the loopback interface (benchmarks never leave this machine)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def write_rows(path: Path, rows: List[dict], meta: dict) -> None:
    """Replace ``path`` by this run's rows: one run per file keeps every ratio same-run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    tmp.replace(path)


def parse_sizes(text: str) -> List[int]:
    """'16k,1m' -> [16384, 1048576] (k = 1024, m = 1024^2)."""
    out = []
    for tok in text.split(","):
        tok = tok.strip().lower()
        mult = {"k": 1 << 10, "m": 1 << 20}.get(tok[-1:], 1)
        out.append(int(tok.rstrip("km")) * mult)
    return out


def join_ranks(rank: int, world: int, port: int):
    """Join a benchmark's spawned ranks on 127.0.0.1 (NCCL on GPUs, gloo on CPUs).

    Returns this rank's device and ``group_max(x)``, the maximum of a number over the ranks
    (a row reports its slowest rank and its largest peak)."""
    import deepspeed
    import torch.distributed as torch_dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False, verbose=False)

    def group_max(x):
        t = torch.tensor(float(x or 0.0), device=device)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return t.item()

    return device, group_max
