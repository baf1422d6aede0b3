"""Join the job, however it was launched: the deepspeed launcher, torchrun, mpirun or srun.

The deepspeed launcher and torchrun set RANK / WORLD_SIZE / LOCAL_RANK. Under mpirun and srun
we read OpenMPI's and SLURM's own variables rather than DeepSpeed's mpi4py discovery, which
sets MASTER_ADDR from ``hostname -I`` (the machine's external address) and so overrides a
MASTER_ADDR the user chose.

The collective timeout (recipe key ``distributed.timeout`` or ``DEEPSPEED_TIMEOUT``, minutes)
bounds every wait on a peer, so that a stopped or wedged rank makes the others fail instead of
holding the allocation: it is the default group's timeout and, through torch's default, every
later group's (DeepSpeed's ZeRO groups would otherwise get torch's 30 minutes); NCCL's watchdog
tears a timed-out process down. Joining waits up to ``max(timeout, JOIN_TIMEOUT_MIN)``: ranks
start with some skew (imports, DeepSpeed's JIT builds). On gloo the group is created here, on a
store with that longer wait, because gloo's point-to-point receives (the ring's) wait for the
timeout the group was created with, whatever ``set_timeout`` says later.
"""
import math
import os
import warnings
from datetime import timedelta
from typing import Optional

import torch

from ..config.recipe import MAX_TIMEOUT_MIN
from ..parallel.comm import without_cpu_shared_memory_op
from ..shown import shown
from .preflight import StartupError

LAUNCHER_VARIABLES = {
    "RANK": ("OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"),
    "WORLD_SIZE": ("OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "SLURM_NTASKS"),
    "LOCAL_RANK": ("OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"),
}


def fill_env_from_launcher() -> None:
    """RANK, WORLD_SIZE, LOCAL_RANK from MPI/SLURM variables when the launcher set none."""
    for key, sources in LAUNCHER_VARIABLES.items():
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


DEFAULT_TIMEOUT_MIN = 30.0
# TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC: after a collective timed out, torch's watchdog waits for
# its debug dump and then sleeps NCCL_DUMP_WAITS times this before it takes the process down
# (Watchdog::runLoop; docs/reliability.md has the run that showed it): a stopped peer ends the
# job within its timeout plus NCCL_DUMP_WAITS x NCCL_DUMP_WAIT_MS = 10 s.
NCCL_DUMP_WAIT_MS = 2_500
NCCL_DUMP_WAITS = 4
JOIN_TIMEOUT_MIN = 10.0
_env_timeout_min: Optional[float] = None  # DEEPSPEED_TIMEOUT as given, before make_timeout_env_importable


def parse_timeout_minutes(text: str) -> float:
    try:
        minutes = float(text)
    except ValueError:
        minutes = float("nan")
    if not 1 / 60 <= minutes <= MAX_TIMEOUT_MIN:  # the recipe key's bounds (NaN fails too)
        raise ValueError(f"DEEPSPEED_TIMEOUT={shown(text)}: the collective timeout must be a number of minutes from "
                         f"1/60 (one second) to {MAX_TIMEOUT_MIN:,} (a year)")
    return minutes


def make_timeout_env_importable() -> None:
    """DeepSpeed reads DEEPSPEED_TIMEOUT with ``int()`` when imported, so a fractional value
    (0.5 minutes) would crash the import: keep the value for ``collective_timeout_s`` and
    leave DeepSpeed a whole number (unused: the timeout is passed explicitly). Call before
    deepspeed is imported; ValueError for a value that is not a positive number."""
    global _env_timeout_min
    text = os.environ.get("DEEPSPEED_TIMEOUT")
    if text is None or _env_timeout_min is not None:
        return
    _env_timeout_min = parse_timeout_minutes(text)
    os.environ["DEEPSPEED_TIMEOUT"] = str(max(1, math.ceil(_env_timeout_min)))


def collective_timeout_s(minutes: Optional[float] = None) -> float:
    """How long a rank waits in a collective (the ring's transfers included) for a peer:
    ``minutes`` (the recipe's distributed.timeout) if given, else DEEPSPEED_TIMEOUT, else 30 min."""
    if minutes is not None:
        return 60.0 * minutes
    if _env_timeout_min is not None:
        return 60.0 * _env_timeout_min
    text = os.environ.get("DEEPSPEED_TIMEOUT")
    return 60.0 * (parse_timeout_minutes(text) if text is not None else DEFAULT_TIMEOUT_MIN)


def ignore_deepspeeds_deprecated_calls() -> None:
    """DeepSpeed's ZeRO gathers with ``torch.distributed.all_gather_into_tensor``, which newer
    torch deprecates (FutureWarning, two lines on every rank of every run): nothing the user or
    this package can change, so that one warning is not shown."""
    warnings.filterwarnings("ignore", message=r"`torch\.distributed\.all_gather_into_tensor` is deprecated",
                            category=FutureWarning)


def _set_default_group_timeout(timeout: timedelta) -> None:
    """The joined default group's collective timeout. ``torch.distributed.set_timeout`` where
    torch has it: its older private name warns (FutureWarning) on every rank of newer torch."""
    set_timeout = getattr(torch.distributed, "set_timeout", None)
    if set_timeout is None:  # torch before set_timeout was public
        from torch.distributed import distributed_c10d
        set_timeout = distributed_c10d._set_pg_timeout
    set_timeout(timeout)


def _timeout_for_later_groups(timeout: timedelta) -> None:
    """torch gives a group created without a timeout its module default (30 min), read when
    the group is made: set it to ours, for DeepSpeed's new_group() calls."""
    from torch.distributed import distributed_c10d
    distributed_c10d.default_pg_timeout = timeout
    distributed_c10d.default_pg_nccl_timeout = timeout


def _join_gloo(timeout: timedelta, join: timedelta) -> None:
    """The default gloo group with the collective ``timeout``, after a rendezvous on a store
    that waits up to ``join`` for every rank."""
    from torch.distributed.rendezvous import rendezvous
    # torch's own env:// rendezvous (MASTER_ADDR/PORT, torchrun's agent store), only with a longer wait.
    store, rank, world = next(rendezvous("env://", rank=int(os.environ["RANK"]),
                                         world_size=int(os.environ["WORLD_SIZE"]), timeout=join))
    torch.distributed.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)


def nccl_watchdog_env() -> None:
    """NCCL's watchdog set (where the user has not) to take a timed-out rank down soon after the
    timeout, read by torch when the process group is made."""
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "3")  # a timed-out NCCL rank exits
    # ...soon: after a timeout torch's watchdog waits NCCL_DUMP_WAITS x this (60 s by default,
    # four minutes in all) before taking the process down.
    os.environ.setdefault("TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC", str(NCCL_DUMP_WAIT_MS))
    # ...and does not print its C++ stack on the way out: torch marks that symbolisation as one
    # that may hang (it can need the interpreter lock), which would keep a dead rank alive.
    os.environ.setdefault("TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN", "0")


def init_distributed(timeout_s: Optional[float] = None) -> torch.device:
    """Initialise deepspeed.comm (NCCL on GPUs, gloo on CPUs) with the collective timeout
    (``collective_timeout_s()`` unless given); returns this rank's device."""
    make_timeout_env_importable()
    ignore_deepspeeds_deprecated_calls()
    nccl_watchdog_env()
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
    timeout = timedelta(seconds=timeout_s or collective_timeout_s())
    join = max(timeout, timedelta(minutes=JOIN_TIMEOUT_MIN))
    try:
        if not cuda:
            without_cpu_shared_memory_op()
        if not cuda and not torch.distributed.is_initialized():
            _join_gloo(timeout, join)  # deepspeed.comm then drives this group
        deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False,
                                   timeout=join, verbose=False)
    except RuntimeError as err:  # torch's DistNetworkError among them
        if "EADDRINUSE" in str(err) or "address already in use" in str(err).lower():
            # Rank 0 could not open the job's store: not a peer's failure, this machine's port.
            raise StartupError(f"MASTER_PORT {os.environ.get('MASTER_PORT')} on {os.environ['MASTER_ADDR']} is "
                               "taken by another process: pick a free port (the launcher's --master_port, or "
                               "MASTER_PORT)") from None
        raise
    _set_default_group_timeout(timeout)  # the default group, once joined
    _timeout_for_later_groups(timeout)
    return torch.device("cuda", local_rank) if cuda else torch.device("cpu")


def leave_distributed() -> None:
    """Leave the job once this rank's run is done: a barrier, then the process group torn down.

    Without the teardown a gloo rank can abort as its interpreter exits (SIGABRT, "terminate
    called without an active exception": the group's worker threads still hold finished work
    when the interpreter goes, a known PyTorch behaviour), and the launcher then reports a run that
    finished as failed and kills the ranks still writing. The barrier first: no rank tears its
    end down while a peer may still send to it. Only after success: with a peer gone, the
    barrier fails within the collective timeout (exit 3), where a teardown would wait on it."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
