"""The process table as a rank reads it (``/proc``): a process's state, parent and start time,
whether it is DeepSpeed's per-node ``launch.py``, the ranks that launch.py started beside this
one, and which of them is stopped or has exited."""
import os
import signal
from pathlib import Path
from typing import Dict, List, Mapping, NamedTuple, Optional, Tuple

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


def end_stopped_siblings(proc: Path = PROC) -> List[int]:
    """SIGKILL to the ranks beside this one that are stopped (SIGSTOP, a suspended job); their
    pids. Called by a rank leaving on a failed collective, whose job is over: launch.py ends
    every rank with SIGTERM, which a stopped process holds pending until launch.py's SIGKILL
    30 s later. Not SIGCONT: a woken rank goes on with what it was doing until launch.py's
    SIGTERM a second later, e.g. writing its part of a checkpoint into the tag that rank 0 has
    just removed (seen with four gloo ranks: the tag was back, unfinished)."""
    ended = []
    for pid in sibling_ranks(proc):
        stat = process_stat(pid, proc)
        if stat is not None and stat[0] in ("T", "t"):
            try:
                os.kill(pid, signal.SIGKILL)
                ended.append(pid)
            except OSError:  # gone meanwhile
                pass
    return ended


def environ_value(pid: int, name: str, proc: Path = PROC) -> Optional[str]:
    """A variable of a process's environment at its start (None: unset, unreadable, or the
    process has exited: a zombie's environment reads empty)."""
    try:
        items = (proc / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return None
    prefix = name.encode() + b"="
    return next((item[len(prefix):].decode(errors="replace") for item in items if item.startswith(prefix)), None)


class NodeView(NamedTuple):
    """This node's ranks as the process table shows them (local ranks; global = first + local)."""
    first: int  # the node's first global rank: RANK - LOCAL_RANK (launch.py numbers them in a row)
    mine: int  # this rank's local rank
    size: int  # LOCAL_SIZE: the ranks launch.py started on this node
    running: Dict[int, int]  # local rank -> pid, alive and not stopped (this rank included)
    stopped: Dict[int, int]  # local rank -> pid, stopped (SIGSTOP, a suspended job)
    unknown: int = 0  # live ranks whose local rank could not be read (environment and command line)

    def exited(self) -> List[int]:
        """Local ranks with no live process: killed, crashed or ended (a zombie that launch.py
        has not reaped counts); none named while a live rank's local rank is unknown."""
        if self.unknown:
            return []
        return [r for r in range(self.size) if r not in self.running and r not in self.stopped]


def node_view(proc: Path = PROC, environ: Mapping[str, str] = os.environ) -> Optional[NodeView]:
    """The ranks of this node; None when this rank was not started by DeepSpeed's launch.py
    (nothing to read)."""
    if not is_deepspeed_launch(os.getppid(), proc):
        return None
    try:
        local_size, local_rank, rank = (int(environ[k]) for k in ("LOCAL_SIZE", "LOCAL_RANK", "RANK"))
    except (KeyError, ValueError):
        return None
    running, stopped, unknown = {local_rank: os.getpid()}, {}, 0
    for pid in sibling_ranks(proc):
        stat = process_stat(pid, proc)
        if stat is None or stat[0] in ("Z", "X"):
            continue  # exited (or gone meanwhile): among view.exited()
        theirs = local_rank_of(pid, proc)
        if theirs is None:
            unknown += 1
            continue
        (stopped if stat[0] in ("T", "t") else running)[theirs] = pid
    return NodeView(rank - local_rank, local_rank, local_size, running, stopped, unknown)


def local_rank_of(pid: int, proc: Path = PROC) -> Optional[int]:
    """A rank's local rank: LOCAL_RANK of its environment (launch.py sets it), else the
    ``--local_rank=K`` of its command line (an environment that cannot be read: another user's
    process, a non-dumpable one); None when neither says."""
    value = environ_value(pid, "LOCAL_RANK", proc)
    if value is not None and value.isdigit():
        return int(value)
    try:
        args = (proc / str(pid) / "cmdline").read_bytes().split(b"\0")
    except OSError:
        return None
    flag = next((a[len(b"--local_rank="):] for a in args if a.startswith(b"--local_rank=")), b"")
    return int(flag) if flag.isdigit() else None


def peers_at_fault(proc: Path = PROC, environ: Mapping[str, str] = os.environ) -> Optional[List[str]]:
    """What this node's process table says of the ranks beside this one, read when a collective
    failed: "rank 5 (pid 812) is stopped" for each stopped one, "rank 6 has exited" for each
    with no live process, in rank order. [] when every other rank of the node runs (the fault
    is on another node, or a rank is wedged); None without a DeepSpeed launch.py above."""
    view = node_view(proc, environ)
    if view is None:
        return None
    found = [(r, f"rank {view.first + r} (pid {pid}) is stopped") for r, pid in view.stopped.items()]
    found += [(r, f"rank {view.first + r} has exited") for r in view.exited()]
    return [line for _, line in sorted(found)]
