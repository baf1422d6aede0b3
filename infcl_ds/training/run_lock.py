"""One live run per output directory.

The process that owns a run's files, global rank 0 (it writes recipe.yaml, run.json, the
metrics, each tag's manifest and ``latest``; the other ranks write only their own shards of
a tag), holds an exclusive ``flock`` on ``OUTPUT_DIR/.infcl-ds.lock`` from before it joins the
job until the run ends. The OS drops the lock with the process, however it ends, so a
SIGKILLed run's directory stays resumable; the file's content (the holder's pid, host and
start time) only tells a refused start whom it met, and stays behind, stale, after it.

A start into a directory whose lock is held is refused, with ``--resume`` or ``--restart``
too: alone, at once and before DeepSpeed is imported (``take_if_owner``); on several ranks
rank 0 still joins the job and broadcasts the refusal (``share_refusal``), so every rank
stops with the same line rather than waiting for a peer that left.

A file system without working locks (NFS without lockd, Lustre mounted ``noflock``: ENOLCK,
EOPNOTSUPP, ENOSYS) gets a warning and no lock: refusing to train there would be worse than
not guarding the directory. Lustre mounted ``localflock`` locks per node only.
"""
import errno
import fcntl
import json
import os
import socket
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Dict, Optional, Tuple

from ..run_dir import LOCK_FILE
from ..shown import shown
from .distributed import LAUNCHER_VARIABLES
from .preflight import StartupError

_INFO_BYTES = 4096  # the most of a lock file read back: its content is informational
_MESSAGE_BYTES = 16384  # a refusal as rank 0 broadcasts it (paths are at most 4096 bytes)


class RunDirBusy(StartupError):
    """Another live process holds the output directory's lock; the message names it."""


class RunLock:
    """This process's hold on a run directory: ``fd`` while held; ``refusal`` when another
    process holds it (the line every rank prints); neither when no lock could be taken."""

    def __init__(self, path: Path, fd: Optional[int] = None, refusal: Optional[str] = None):
        self.path, self.fd, self.refusal = path, fd, refusal

    def release(self) -> None:
        """Closing the descriptor drops the lock; the file stays (removing it would let a
        waiting start lock an unlinked file while a third creates a new one)."""
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
            _held.pop(os.path.realpath(self.path), None)


# The locks this process holds, by the lock file's real path: taking one again (a second
# Trainer in one process, as tests do) returns it, where a second flock would refuse itself.
_held: Dict[str, RunLock] = {}


def _forget_in_child() -> None:
    """A forked child (a decode or data worker) closes its copies of the descriptors, so that
    a rank killed before its workers notice still frees its directory at once. Closing, not
    unlocking: an unlock would drop the parent's lock."""
    for lock in _held.values():
        try:
            os.close(lock.fd)
        except OSError:
            pass
        lock.fd = None
    _held.clear()


os.register_at_fork(after_in_child=_forget_in_child)


def launch_rank_world() -> Tuple[Optional[int], int]:
    """This process's rank and the job's size as its launcher set them (the variables
    ``distributed.fill_env_from_launcher`` reads), without changing the environment: before
    the job is joined. (0, 1) with no launcher; rank None when it is not a number (joining
    then fails with its own message)."""
    def value(key: str) -> Optional[str]:
        return next((os.environ[name] for name in (key,) + LAUNCHER_VARIABLES[key] if name in os.environ), None)
    rank, world = value("RANK"), value("WORLD_SIZE")
    try:
        return int(rank or 0), int(world or 1)
    except ValueError:
        return None, 1


def _warn(text: str) -> None:
    print(f"infcl-ds train: warning: {text}", file=sys.stderr, flush=True)


def _holder(path: Path) -> str:
    """Who holds the lock, from the file's content; a holder that has just locked may not have
    written it yet, so an empty or partial content is read again for up to half a second."""
    for _ in range(10):
        try:
            with open(path, "rb") as f:
                info = json.loads(f.read(_INFO_BYTES))
            if isinstance(info, dict) and "pid" in info:
                pid, host, started = (shown(str(info.get(key)), 80, quote=False) for key in ("pid", "host", "started"))
                return f"pid {pid} on host {host}, started {started}"
        except (OSError, ValueError, RecursionError):
            pass
        time.sleep(0.05)
    return "a process that did not write its pid and host"


def _write_info(fd: int) -> None:
    info = {"pid": os.getpid(), "host": socket.gethostname(),
            "started": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(info) + "\n").encode(), 0)
    except OSError:  # a full disk: the lock holds without its note
        pass


def take(output_dir) -> RunLock:
    """Lock ``output_dir`` (created if missing) for this process: a held ``RunLock``, or one
    with ``refusal`` set when a live process holds it. A directory that cannot be created or
    written gets no lock: the output-directory check names the problem on every rank."""
    path = Path(output_dir) / LOCK_FILE
    try:
        Path(output_dir).mkdir(parents=True, exist_ok=True)
    except OSError:
        return RunLock(path)
    held = _held.get(os.path.realpath(path))
    if held is not None:
        return held
    try:
        # O_NOFOLLOW: a planted symlink does not make us create or lock a file elsewhere.
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
    except OSError as err:
        if err.errno in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOSPC):
            return RunLock(path)  # the output-directory check refuses such a directory
        _warn(f"cannot open {path} ({err.strerror}): a second run started into {output_dir} will not be refused")
        return RunLock(path)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return RunLock(path, refusal=(
                f"output_dir {output_dir} is in use by a run that is still going ({_holder(path)}; it holds {path}): "
                f"wait for it to end or stop it; a directory holds one run at a time"))
        # ENOLCK, EOPNOTSUPP, ENOSYS and the like: this file system does not lock.
        _warn(f"cannot lock {path} ({errno.errorcode.get(err.errno, err.errno)}: {err.strerror}; a file system "
              f"without locks?): a second run started into {output_dir} will not be refused")
        return RunLock(path)
    _write_info(fd)
    lock = _held[os.path.realpath(path)] = RunLock(path, fd)
    return lock


def holds(output_dir) -> bool:
    """Whether this process holds ``output_dir``'s lock (it owns the run's files)."""
    lock = _held.get(os.path.realpath(Path(output_dir) / LOCK_FILE))
    return lock is not None and lock.fd is not None


def take_if_owner(output_dir) -> Optional[RunLock]:
    """On the run's owner (rank 0 by the launcher's variables), ``take`` the directory's lock;
    None on the other ranks. Alone, a refusal is raised at once (``RunDirBusy``): no peer
    needs to hear of it. On several ranks it is returned, for ``share_refusal`` after the
    join."""
    rank, world = launch_rank_world()
    if rank != 0:
        return None
    lock = take(output_dir)
    if lock.refusal is not None and world == 1:
        raise RunDirBusy(lock.refusal)
    return lock


def share_refusal(lock: Optional[RunLock], rank: int, world: int, device) -> None:
    """Every rank calls this once the job is joined, before any other collective: rank 0's
    refusal (one broadcast) is raised as ``RunDirBusy`` on every rank, with the same line."""
    if world == 1:
        text = lock.refusal if lock is not None else None
    else:
        import deepspeed.comm as dist
        import torch
        message = torch.zeros(_MESSAGE_BYTES, dtype=torch.uint8, device=device)
        if rank == 0 and lock is not None and lock.refusal:
            data = lock.refusal.encode()[:_MESSAGE_BYTES]
            message[:len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device)
        dist.broadcast(message, src=0)
        text = bytes(message.cpu().tolist()).rstrip(b"\0").decode(errors="replace") or None
    if text:
        raise RunDirBusy(text)
