"""What the planner reads off the node it runs on: its GPUs' memory, its host memory and the
cores this process may use; and what a rank reads off its node at start-up: the cores of its
share (`rank_cores`, for `data.decode_workers: auto`).

`launch/train.sh` runs the planner on the node that then trains (one node, or the first of a
hostfile's), so what this node has is what a rank there will have; a node without a CUDA GPU (a
login node) says nothing about the training nodes, and the planner assumes sizes there instead,
saying so. With DS_ACCELERATOR=cpu the ranks run on CPUs like this node's (`ranks_on_cpu`): its
memory and cores are theirs. Flags (`--gpu-memory`, `--host-memory`, `--cores`) always win.
"""
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# cgroup v2, then v1: a job scheduler's memory limit, which is what the ranks may use.
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")
# cgroup v2, then v1: a CPU quota (a container's --cpus, a Kubernetes CPU limit): the cores' worth
# of time the job's processes get, whatever their affinity allows.
_CGROUP_QUOTAS = ("/sys/fs/cgroup/cpu.max", "/sys/fs/cgroup/cpu/cpu.cfs_quota_us")
# Ranks on this node, as each launcher says: torchrun, the deepspeed launcher, OpenMPI, MPICH,
# srun (launch/slurm.sbatch passes --ntasks-per-node).
_LOCAL_RANKS = ("LOCAL_WORLD_SIZE", "LOCAL_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS",
                "SLURM_NTASKS_PER_NODE")


# The accelerator DeepSpeed and the trainer (training/distributed.py) use on every rank of a
# launch; the launchers forward it to every node. `cpu`: the ranks run on their CPUs over gloo,
# whatever GPUs their nodes have.
ACCELERATOR_ENV = "DS_ACCELERATOR"


def ranks_on_cpu() -> bool:
    """Whether the ranks this process plans or launches will run on their CPUs (DS_ACCELERATOR=cpu)."""
    return os.environ.get(ACCELERATOR_ENV) == "cpu"  # as the trainer compares it


@dataclass(frozen=True)
class Node:
    gpu_count: int                  # CUDA GPUs visible to this process
    gpu_name: str                   # the first one's name ("" without GPUs)
    gpu_memory_bytes: int           # the smallest visible GPU's total memory (0 without GPUs)
    host_memory_bytes: int          # MemTotal, or the cgroup's limit where lower
    host_memory_source: str         # "MemTotal" or "cgroup limit"
    cores: int                      # cores this process may use (usable_cores: affinity, CPU quota)

    @property
    def has_gpus(self) -> bool:
        return self.gpu_count > 0

    def gpu_text(self) -> str:
        return f"{self.gpu_count} x {self.gpu_name}, {self.gpu_memory_bytes / 2**30:.1f} GiB each"


def _gpus():
    """(count, name of the first, smallest total memory) of the visible CUDA GPUs."""
    try:
        import torch
        if not torch.cuda.is_available():
            return 0, "", 0
        props = [torch.cuda.get_device_properties(i) for i in range(torch.cuda.device_count())]
    except (ImportError, RuntimeError):  # no torch, or a driver that answers with an error
        return 0, "", 0
    return len(props), props[0].name, min(p.total_memory for p in props)


def _mem_total(meminfo: Path = Path("/proc/meminfo")) -> int:
    for line in meminfo.read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise ValueError(f"{meminfo} has no MemTotal line")


def _cgroup_limit(paths=_CGROUP_LIMITS) -> Optional[int]:
    """The memory limit of this process's cgroup, or None where there is none ('max', or v1's
    huge sentinel) or it cannot be read."""
    for path in paths:
        try:
            text = Path(path).read_text().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) < 1 << 60:
            return int(text)
        return None
    return None


# The node's memory where MemTotal is not it (a VM whose memory grows as it is used, a share of a
# node): a size such as 500GiB. launch/train.sh --host-memory sets it for the ranks.
HOST_MEMORY_ENV = "INFCL_DS_HOST_MEMORY"

_UNITS = {"b": 1, "k": 10 ** 3, "kb": 10 ** 3, "m": 10 ** 6, "mb": 10 ** 6, "g": 10 ** 9, "gb": 10 ** 9,
          "t": 10 ** 12, "tb": 10 ** 12, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def parse_size(text: str) -> int:
    """'80GiB' -> 85899345920, '141GB' -> 141e9, '2TiB', '1024B'. ValueError otherwise, a bare
    number included: `--gpu-memory 80` meant 80 GiB, not the 80 bytes a plan would then refuse."""
    match = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([a-zA-Z]*)\s*", text)
    if match and not match.group(2):
        raise ValueError(f"not a size: {text!r} has no unit (e.g. {match.group(1)}GiB or {match.group(1)}GB)")
    if not match or match.group(2).lower() not in _UNITS:
        raise ValueError(f"not a size: {text!r} (e.g. 80GiB, 141GB, 2TiB)")
    return int(float(match.group(1)) * _UNITS[match.group(2).lower()])


def host_memory() -> tuple:
    """(bytes, source) of the memory this node gives its processes: INFCL_DS_HOST_MEMORY where
    set, else MemTotal or the cgroup's limit where lower."""
    given = os.environ.get(HOST_MEMORY_ENV)
    if given:
        try:
            return parse_size(given), HOST_MEMORY_ENV
        except ValueError as err:
            raise ValueError(f"{HOST_MEMORY_ENV}: {err}") from None
    total = _mem_total()
    limit = _cgroup_limit()
    if limit is not None and limit < total:
        return limit, "cgroup limit"
    return total, "MemTotal"


def _cgroup_cores(paths=_CGROUP_QUOTAS) -> Optional[int]:
    """The CPU quota of this process's cgroup in whole cores (rounded up), or None where there is
    none ('max', v1's -1) or it cannot be read. v2 writes 'quota period'; v1's period is beside
    its quota."""
    for path in paths:
        try:
            fields = Path(path).read_text().split()
            if path.endswith("cfs_quota_us"):
                fields += Path(path).with_name("cpu.cfs_period_us").read_text().split()
        except OSError:
            continue
        try:
            quota, period = int(fields[0]), int(fields[1])
        except (ValueError, IndexError):  # 'max', or an unreadable line
            return None
        return -(-quota // period) if quota > 0 and period > 0 else None
    return None


def usable_cores(pid: int = 0) -> int:
    """Cores process `pid` (0: this one) may run on: its affinity (`taskset`, a scheduler's
    cpuset, a launcher's `--bind-to` shrink it; os.cpu_count does not see them), at most the
    cgroup's CPU quota."""
    try:
        cores = len(os.sched_getaffinity(pid))
    except AttributeError:  # not Linux
        cores = os.cpu_count() or 1
    quota = _cgroup_cores()
    return min(cores, quota) if quota else cores


def _launcher_cores() -> Optional[int]:
    """usable_cores of the process that started this one (the launcher), or None if it is gone
    or unreadable."""
    try:
        return usable_cores(os.getppid())
    except OSError:
        return None


def local_ranks(default: int = 1) -> int:
    """Ranks on this node, as the launcher says (_LOCAL_RANKS); `default` where none does."""
    for name in _LOCAL_RANKS:
        text = os.environ.get(name, "").split("(")[0]  # srun may write "8(x4)"
        if text.isdigit() and int(text) > 0:
            return int(text)
    return default


@dataclass(frozen=True)
class CoreShare:
    """The cores one rank may keep busy, and the words that say how they were found."""
    cores: int
    text: str    # "16 cores of this rank's share, 128 usable on this node / 8 ranks"


def _cores(n: int) -> str:
    return f"{n} core{'s' if n != 1 else ''}"


def split_cores(node_cores: int, ranks: int, whose: str = "this rank's share",
                node: str = "usable on this node") -> CoreShare:
    """A node's cores split evenly over its ranks (at least one each)."""
    share = max(1, node_cores // ranks)
    how = f", {node_cores} {node} / {ranks} ranks" if ranks > 1 else ""
    return CoreShare(share, f"{_cores(share)} of {whose}{how}")


def rank_cores(default_ranks: int = 1) -> CoreShare:
    """This rank's share of its node's cores; `default_ranks`: ranks on the node where no
    launcher says (local_ranks).

    The ranks of a node start with the affinity their launcher had, and share it: each gets its
    part. A launcher that binds each rank to its own cores (deepspeed --bind_cores_to_rank,
    mpirun --bind-to core, srun --cpu-bind=cores) leaves the rank fewer cores than it has itself:
    those are the rank's share already. A `taskset` or a scheduler's cpuset around the whole
    launch narrows the launcher too, so its ranks still split what it has."""
    cores, ranks = usable_cores(), local_ranks(default_ranks)
    launcher = _launcher_cores() if ranks > 1 else None
    if launcher is not None and cores < launcher:
        return CoreShare(cores, f"{_cores(cores)} of this rank's share, bound to it by its launcher (which "
                                f"has {launcher})")
    return split_cores(cores, ranks)


def read_node() -> Node:
    count, name, gpu_bytes = _gpus()
    host_bytes, source = host_memory()
    return Node(gpu_count=count, gpu_name=name, gpu_memory_bytes=gpu_bytes, host_memory_bytes=host_bytes,
                host_memory_source=source, cores=usable_cores())
