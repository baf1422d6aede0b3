"""Checks that need no model, engine or data loader, run on every rank before they are built:
a problem here costs a second, not the minutes of a set-up (or a crash after it).

- ``output_dir`` is a directory this rank can write (a probe file is created and removed);
- its file system has room for one more checkpoint (``checkpoint_bytes``: weights plus
  AdamW's fp32 states; the newest tags are kept while the next is written).
"""
import errno
import os
import shutil
from pathlib import Path


class StartupError(RuntimeError):
    """The run cannot start where it was pointed at; the message names the path."""


def check_output_dir(output_dir, rank: int) -> Path:
    path = Path(output_dir)
    if path.exists() and not path.is_dir():
        raise StartupError(f"output_dir {path} exists and is not a directory")
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".write_probe_rank{rank}_{os.getpid()}"
        probe.write_bytes(b"probe")
        probe.unlink()
    except OSError as err:
        why = {errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
               errno.ENOSPC: "no space left", errno.ENOTDIR: "a parent is not a directory"}.get(err.errno, err.strerror)
        raise StartupError(f"output_dir {path} is not writable ({why})") from None
    return path


def checkpoint_bytes(num_params: int, dtype: str) -> int:
    """One checkpoint over all ranks: the weights in the training dtype, plus AdamW's two fp32
    moments and, in bf16, the fp32 master weights."""
    per_param = 4 + 8 if dtype == "fp32" else 2 + 4 + 8
    return num_params * per_param


def check_free_disk(output_dir, needed_bytes: int) -> None:
    free = shutil.disk_usage(output_dir).free
    if free < needed_bytes:
        raise StartupError(f"output_dir {output_dir} has {free / 2**30:.2f} GiB free; one checkpoint needs about "
                           f"{needed_bytes / 2**30:.2f} GiB (model weights and optimizer states)")
