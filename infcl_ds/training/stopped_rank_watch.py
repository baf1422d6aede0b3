"""A rank names a stopped rank of its node while the job waits on it.

A stopped rank (SIGSTOP, a suspended process) holds every collective of the job until the
collective timeout (`distributed.timeout`). On NCCL torch's watchdog then ends the ranks with a
line of its own, which names the rank that waited, not the one stopped. So one rank of each node
(its lowest running local rank) reads the node's process table every POLL_S seconds
(training/procs.py) and, once a rank has been stopped at two reads in a row, prints one line
naming it while the job still waits; no rank is named twice. A rank on another node is named by
its own node's ranks. A rank with no DeepSpeed launch.py above it reads nothing.

Exited ranks are not this watch's: launch.py ends the job within a second of a rank's failed
exit, and a rank that ended well may leave before its peers.
"""
import sys
import threading
from typing import Callable, Optional, Set

from ..os_thread_names import NamedThread
from .procs import NodeView, node_view

POLL_S = 5.0


class StoppedRankWatch:
    """The thread that names stopped ranks of this node (see the module's docstring)."""

    def __init__(self, rank, where: Callable[[], str], timeout_s: float, poll_s: float = POLL_S,
                 view: Callable[[], Optional[NodeView]] = node_view, out=None):
        self.rank, self.where, self.timeout_s, self.poll_s = rank, where, timeout_s, poll_s
        self.view, self.out = view, out
        self._closed = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def start(self) -> "StoppedRankWatch":
        """Start the thread when a DeepSpeed launch.py started this rank; otherwise nothing."""
        if self.view() is not None:
            self._thread = NamedThread(target=self._run, daemon=True, name="stopped-rank-watch",
                                       os_name="stopped-watch")
            self._thread.start()
        return self

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        before: Set[int] = set()
        named: Set[int] = set()
        while not self._closed.wait(self.poll_s):
            view = self.view()
            if view is None:
                continue
            stopped = set(view.stopped)
            if view.running and min(view.running) == view.mine:  # one line per node
                for local in sorted((stopped & before) - named):
                    print(self.line(view, local), file=self.out or sys.stderr, flush=True)
                    named.add(local)
            before = stopped

    def line(self, view: NodeView, local: int) -> str:
        return (f"infcl-ds train: rank {self.rank}, {self.where()}: rank {view.first + local} "
                f"(pid {view.stopped[local]}) is stopped (SIGSTOP, or a suspended process): every collective "
                f"waits on it, and the job ends once one has waited {self.timeout_s / 60:g} min")
