"""The process table as a rank reads it (``/proc``): a process's state, parent and start time,
whether it is DeepSpeed's per-node ``launch.py``, and the ranks that launch.py started beside
this one."""
import os
import signal
from pathlib import Path
from typing import List, Optional, Tuple

LAUNCH_MODULE = "deepspeed.launcher.launch"
PROC = Path("/proc")


def process_stat(pid: int, proc: Path = PROC) -> Optional[Tuple[str, int, int]]:
    """(state, ppid, start time in clock ticks after boot) of a process, or None when there is
    no such process."""
    try:
        _, fields = stat_fields((proc / str(pid) / "stat").read_text())
    except OSError:
        return None
    return fields[0], int(fields[1]), int(fields[19])


def stat_fields(text: str) -> Tuple[str, List[str]]:
    """A /proc/<pid>[/task/<tid>]/stat line as (the command name, the fields after it, from the
    state on: fields[11] and [12] are user and system CPU ticks)."""
    # The command name (2nd field) is in parentheses and may itself hold spaces or ')'.
    return text[text.index("(") + 1:text.rfind(")")], text[text.rfind(")") + 2:].split()


def is_deepspeed_launch(pid: int, proc: Path = PROC) -> bool:
    try:
        args = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return any(a == LAUNCH_MODULE.encode() or a.endswith(b"deepspeed/launcher/launch.py") for a in args)


def sibling_ranks(proc: Path = PROC) -> List[int]:
    """The other processes that this rank's deepspeed launch.py started ([] when its parent is
    no deepspeed launch.py)."""
    parent, me = os.getppid(), os.getpid()
    if not is_deepspeed_launch(parent, proc):
        return []
    found = []
    for name in os.listdir(proc):
        if name.isdigit() and int(name) != me:
            stat = process_stat(int(name), proc)
            if stat is not None and stat[1] == parent:
                found.append(int(name))
    return found


def wake_stopped_siblings(proc: Path = PROC) -> List[int]:
    """SIGCONT to the ranks beside this one that are stopped (SIGSTOP, a suspended job); their
    pids. Called by a rank leaving on a failed collective: launch.py then ends every rank with
    SIGTERM, which a stopped process holds pending until launch.py's SIGKILL 30 s later, so
    without this a stopped rank outlives the job by those 30 s."""
    woken = []
    for pid in sibling_ranks(proc):
        stat = process_stat(pid, proc)
        if stat is not None and stat[0] in ("T", "t"):
            try:
                os.kill(pid, signal.SIGCONT)
                woken.append(pid)
            except OSError:  # gone meanwhile
                pass
    return woken
