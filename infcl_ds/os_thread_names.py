"""Our threads and decode processes named for the operating system too, so that `top -H`,
py-spy and /proc (the benchmarks' thread readings) tell them apart from torch's and NCCL's
instead of showing every one as `python3`. Python 3.11 names threads for itself only.

Linux keeps 15 bytes of a name: each name here fits. Elsewhere, or where prctl is refused, the
names stay Python's alone. Imports nothing of the package: every layer may use it.
"""
import ctypes
import sys
import threading

_PR_SET_NAME = 15  # prctl option: the calling thread's name (/proc/<pid>/task/<tid>/comm)
_MAX_BYTES = 15


def name_this_thread(name: str) -> None:
    """Give the calling thread (the process's main thread: the process) `name`, cut to 15 bytes."""
    if not sys.platform.startswith("linux"):
        return
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_NAME, name.encode()[:_MAX_BYTES], 0, 0, 0)
    except (OSError, AttributeError):
        pass


class NamedThread(threading.Thread):
    """A threading.Thread that takes `os_name` (at most 15 bytes) as its name for the system too."""

    def __init__(self, *args, os_name: str, **kwargs):
        if len(os_name.encode()) > _MAX_BYTES:
            raise ValueError(f"a thread's system name has at most {_MAX_BYTES} bytes, got {os_name!r}")
        super().__init__(*args, **kwargs)
        self.os_name = os_name

    def run(self):
        name_this_thread(self.os_name)
        super().run()
