"""Join the job, however it was launched: the deepspeed launcher, torchrun, mpirun or srun.

The deepspeed launcher and torchrun set RANK / WORLD_SIZE / LOCAL_RANK. Under mpirun and srun
we read OpenMPI's and SLURM's own variables rather than DeepSpeed's mpi4py discovery, which
sets MASTER_ADDR from ``hostname -I`` (the machine's external address) and so overrides a
MASTER_ADDR the user chose.
"""
import os
from datetime import timedelta
from typing import Optional

import torch

_SOURCES = {
    "RANK": ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
    "WORLD_SIZE": ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
    "LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
}


def fill_env_from_launcher() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK from MPI/SLURM variables when the launcher set none."""
    for key, sources in _SOURCES.items():
        if key in os.environ:
            continue
        for source in sources:
            if source in os.environ:
                os.environ[key] = os.environ[source]
                break
    os.environ.setdefault("MASTER_PORT", "29500")
    if "RANK" not in os.environ and "WORLD_SIZE" not in os.environ:
        # No launcher at all: one process, which needs no network.
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    if "MASTER_ADDR" not in os.environ and os.environ.get("WORLD_SIZE") == "1":
        os.environ["MASTER_ADDR"] = "127.0.0.1"


def collective_timeout_s() -> float:
    """DEEPSPEED_TIMEOUT (minutes, as DeepSpeed reads it), default 30: how long a rank waits
    in a collective (the ring's transfers included) for a peer before it fails."""
    return 60.0 * float(os.environ.get("DEEPSPEED_TIMEOUT", 30))


def init_distributed(timeout_s: Optional[float] = None) -> torch.device:
    """Initialise deepspeed.comm (NCCL on GPUs, gloo on CPUs); returns this rank's device."""
    import deepspeed
    fill_env_from_launcher()
    missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR") if k not in os.environ]
    if missing:
        raise RuntimeError(f"cannot join the job: {', '.join(missing)} not set (launch with deepspeed, torchrun, "
                           "mpirun or srun; see docs/multi-node.md)")
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    cuda = torch.cuda.is_available() and os.environ.get("DS_ACCELERATOR", "cuda") != "cpu"
    if cuda:
        torch.cuda.set_device(local_rank)
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False,
                               timeout=timedelta(seconds=timeout_s or collective_timeout_s()), verbose=False)
    return torch.device("cuda", local_rank) if cuda else torch.device("cpu")
