"""A rank ends when the `deepspeed` launcher that started it is gone.

DeepSpeed's runner (the ``deepspeed`` command) starts one ``deepspeed.launcher.launch`` per
node, which starts the ranks. On one node the runner forwards no signal: SIGINT or SIGTERM to
it ends it in a second, while its launch.py and the ranks train on to the end, writing
checkpoints into a run nobody is watching. So each rank records, at start, the launcher
processes above it (launch.py, its parent, and the runner, launch.py's parent) and a thread
checks every second that they are still alive. A pid can be reused after its process is gone:
a process counts as the same only with the start time read at first (``/proc/PID/stat``),
and a zombie (ended, not yet reaped) counts as gone.

When one is gone the rank stops: in the training loop every rank agrees at the next step
boundary (``agreed_stop``: one all-reduce, so that no rank stops while another waits in a
collective) and exits with one line; a checkpoint being written is finished first (saves are
atomic either way: ``latest`` only ever names a complete tag). If the loop does not reach a
boundary within ``GRACE_S`` (start-up, a long step, a peer that is stuck), or a save does not
end within ``SAVE_GRACE_S``, the watching thread ends the process itself, with the same line.

Ranks started another way (mpirun, srun, torchrun, by hand) have no deepspeed launch.py
above them: then nothing is watched; those launchers end their ranks themselves.
"""
import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import List, NamedTuple, Optional

from ..os_thread_names import NamedThread
from .exits import LAUNCHER_GONE_EXIT
from .procs import is_deepspeed_launch, process_stat

POLL_S = 1.0
GRACE_S = 20.0  # with POLL_S: every rank is gone well within 30 s of its launcher
SAVE_GRACE_S = 600.0


class Process(NamedTuple):
    pid: int
    start: int  # clock ticks after boot: tells a reused pid from the process recorded
    name: str


def launcher_processes(proc: Path = Path("/proc")) -> List[Process]:
    """The deepspeed launch.py that is this process's parent, and the process that started it
    (the `deepspeed` runner, or on another node of a pdsh launch the remote shell); [] when
    the parent is no deepspeed launch.py or there is no /proc."""
    parent = os.getppid()
    if not is_deepspeed_launch(parent, proc):
        return []
    launch = process_stat(parent, proc)
    if launch is None:
        return []
    found = [Process(parent, launch[2], "deepspeed launch.py")]
    runner = process_stat(launch[1], proc) if launch[1] > 1 else None
    if runner is not None:
        found.append(Process(launch[1], runner[2], "deepspeed launcher"))
    return found


def is_alive(process: Process, proc: Path = Path("/proc")) -> bool:
    stat = process_stat(process.pid, proc)
    return stat is not None and stat[2] == process.start and stat[0] not in ("Z", "X")


class LauncherWatch:
    """The thread that watches the launcher processes (see the module's docstring)."""

    def __init__(self, processes: List[Process], poll_s: float = POLL_S, grace_s: float = GRACE_S,
                 save_grace_s: float = SAVE_GRACE_S, proc: Path = Path("/proc")):
        self.processes, self.poll_s, self.grace_s, self.save_grace_s = processes, poll_s, grace_s, save_grace_s
        self.proc = proc
        self.gone = threading.Event()
        self.gone_process: Optional[Process] = None
        self.where = lambda: "start-up"  # what the rank is doing, for the line; the trainer sets it
        self._saves = 0
        self._lock = threading.Lock()
        self._thread = NamedThread(target=self._watch, name="launcher-watch", daemon=True, os_name="launcher-watch")

    def start(self) -> "LauncherWatch":
        if self.processes:
            self._thread.start()
        return self

    @contextmanager
    def saving(self):
        """A checkpoint is being written: the thread waits for it (up to SAVE_GRACE_S)."""
        with self._lock:
            self._saves += 1
        try:
            yield
        finally:
            with self._lock:
                self._saves -= 1

    def message(self, rank) -> str:
        p = self.gone_process
        what = (f"the {p.name} (pid {p.pid}) that started this rank went away (killed, interrupted or ended)"
                if p is not None else "another rank's deepspeed launcher went away")
        return f"infcl-ds train: rank {rank}, {self.where()}: {what}: stopping"

    def exit(self, rank, extra: str = "") -> None:
        """Print the line and leave at once (the first caller, the loop or the thread, wins)."""
        self._lock.acquire()  # never released: the process ends here
        print(self.message(rank) + extra, file=sys.stderr, flush=True)
        sys.stdout.flush()
        os._exit(LAUNCHER_GONE_EXIT)

    def _watch(self) -> None:
        while True:
            time.sleep(self.poll_s)
            gone = next((p for p in self.processes if not is_alive(p, self.proc)), None)
            if gone is not None:
                break
        self.gone_process = gone
        self.gone.set()
        noticed = time.monotonic()
        while True:
            waited = time.monotonic() - noticed
            with self._lock:
                saving = self._saves > 0
            if waited >= (self.save_grace_s if saving else self.grace_s):
                break
            time.sleep(0.2)
        self.exit(os.environ.get("RANK", "?"))


def watch_launcher(**kwargs) -> LauncherWatch:
    """Start watching this rank's deepspeed launcher (a no-op without one)."""
    return LauncherWatch(launcher_processes(), **kwargs).start()


def agreed_stop(watch: Optional[LauncherWatch], device, world: int) -> bool:
    """Whether any rank has seen its launcher go; every rank calls it at the same point (one
    all-reduce whether or not this rank watches anything, so that calls always pair up)."""
    stop = watch is not None and watch.gone.is_set()
    if world <= 1:
        return stop
    import deepspeed.comm as dist
    import torch
    flag = torch.tensor([float(stop)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
