"""What the planner reads off the node it runs on: its GPUs' memory, its host memory and the
cores this process may use.

`launch/train.sh` runs the planner on the node that then trains (one node, or the first of a
hostfile's), so what this node has is what a rank there will have; a node without a CUDA GPU (a
login node, a CPU machine) says nothing about the training nodes, and the planner assumes sizes
there instead, saying so. Flags (`--gpu-memory`, `--host-memory`) always win.
"""
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# cgroup v2, then v1: a job scheduler's memory limit, which is what the ranks may use.
_CGROUP_LIMITS = ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes")


@dataclass(frozen=True)
class Node:
    gpu_count: int                  # CUDA GPUs visible to this process
    gpu_name: str                   # the first one's name ("" without GPUs)
    gpu_memory_bytes: int           # the smallest visible GPU's total memory (0 without GPUs)
    host_memory_bytes: int          # MemTotal, or the cgroup's limit where lower
    host_memory_source: str         # "MemTotal" or "cgroup limit"
    cores: int                      # cores this process may run on (its affinity, not os.cpu_count)

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


def host_memory() -> tuple:
    """(bytes, source) of the memory this node gives its processes."""
    total = _mem_total()
    limit = _cgroup_limit()
    if limit is not None and limit < total:
        return limit, "cgroup limit"
    return total, "MemTotal"


def usable_cores() -> int:
    """Cores this process may run on: `taskset`, a scheduler's cpuset or `--bind-to` shrink it."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def read_node() -> Node:
    count, name, gpu_bytes = _gpus()
    host_bytes, source = host_memory()
    return Node(gpu_count=count, gpu_name=name, gpu_memory_bytes=gpu_bytes, host_memory_bytes=host_bytes,
                host_memory_source=source, cores=usable_cores())
