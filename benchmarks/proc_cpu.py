"""CPU seconds of one process's threads and of its children, read from /proc: which part of a
trainer keeps the host busy while its GPU waits (its main thread, torch's worker threads, NCCL's
or CUDA's threads, its decode processes)."""
import os
from pathlib import Path
from typing import Dict, List, Tuple

from infcl_ds.training.procs import stat_fields

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def thread_cpu_s(pid: int) -> Dict[int, Tuple[str, float]]:
    """Each thread of `pid`: tid -> (its name, user + system CPU seconds). Empty once it is gone."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except OSError:
            continue
        name, fields = stat_fields(stat)
        out[int(tid)] = (name, (int(fields[11]) + int(fields[12])) / _TICKS)  # utime, stime
    return out


def children_cpu_s(psutil, pid: int) -> float:
    """User + system CPU seconds of `pid`'s living descendants (decode processes, data readers)."""
    total = 0.0
    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return total
    for child in children:
        try:
            times = child.cpu_times()
        except psutil.Error:
            continue
        total += times.user + times.system
    return total


def busiest_threads(before: Dict[int, Tuple[str, float]], after: Dict[int, Tuple[str, float]],
                    seconds: float, top: int = 6, least: float = 0.2) -> List[str]:
    """The threads that used the most cores between two thread_cpu_s readings `seconds` apart, as
    "name:cores" (at most `top`, each above `least` cores); threads of one name that each use
    some are summed as "name x N:cores", so a pool of workers shows as one entry."""
    if seconds <= 0:
        return []
    by_name: Dict[str, List[float]] = {}
    for tid, (name, cpu) in after.items():
        used = (cpu - before.get(tid, (name, 0.0))[1]) / seconds
        if used > 0.02:
            by_name.setdefault(name, []).append(used)
    ranked = sorted(((sum(cores), name, len(cores)) for name, cores in by_name.items()), reverse=True)
    return [f"{name}{f' x {n}' if n > 1 else ''}:{cores:.2f}" for cores, name, n in ranked[:top] if cores >= least]
