"""Checks that need no model, engine or data loader, run on every rank before they are built:
a problem here costs a second, not the minutes of a set-up (or a crash after it).

- ``output_dir`` is a directory this rank can write (a probe file is created and removed);
- its file system has room for one more checkpoint (``checkpoint_bytes``: weights plus
  AdamW's fp32 states; the newest tags are kept while the next is written);
- a fresh start does not write into a directory that already holds a run (``held_run``):
  without ``--resume`` it is refused, and ``--restart`` moves the old run aside first
  (``move_old_run``), so one directory's checkpoints, metrics and events are one run's.
"""
import errno
import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Optional

from ..run_dir import CHECKPOINTS, EVAL_CSV, EVAL_JSON, METRICS, RUN_FILES, TENSORBOARD


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


def held_run(output_dir) -> Optional[str]:
    """The first file showing that ``output_dir`` holds a run (its path inside the directory),
    or None.

    A run is what a fresh start would overwrite, cut or mix with its own: a checkpoint tag
    (``checkpoints/step_*``) or the ``checkpoints/latest`` pointer, ``metrics.csv``,
    ``eval.csv``, ``eval.json``, or a TensorBoard events file under ``tensorboard/``. Not
    ``recipe.yaml`` or ``run.json`` alone (a start that failed before its first step: nothing
    to lose, they are rewritten), and no file the trainer never writes (a launcher's log, the
    write probes), so a directory prepared by hand or by a job script is not refused.
    """
    path = Path(output_dir)
    checkpoints = path / CHECKPOINTS
    found = [checkpoints / "latest"] + sorted(checkpoints.glob("step_*"))
    found += [path / name for name in (METRICS, EVAL_CSV, EVAL_JSON)]
    found += sorted((path / TENSORBOARD).rglob("events.out.tfevents*"))
    for item in found:
        if os.path.lexists(item):
            return str(item.relative_to(path))
    return None


def old_run_dir(output_dir, now: Optional[datetime] = None) -> Path:
    """``<output_dir>.old-<UTC time>``: a sibling, so moving into it is a rename on the same
    file system (nothing copied, nothing half-moved by a full disk)."""
    path = Path(os.path.abspath(output_dir))
    stamp = (now or datetime.now(timezone.utc)).strftime("%Y%m%dT%H%M%SZ")
    return path.with_name(f"{path.name}.old-{stamp}")


def move_old_run(output_dir) -> Optional[Path]:
    """Move the run held in ``output_dir`` (its RUN_FILES) into a new ``old_run_dir`` and
    return that directory; None when the directory holds no run. Nothing is deleted, and a
    second restart within the same second gets its own directory (``-2``, ``-3``, ...)."""
    path = Path(output_dir)
    if held_run(path) is None:
        return None
    target = base = old_run_dir(path)
    for attempt in range(2, 1000):
        try:
            target.mkdir()
            break
        except FileExistsError:
            target = base.with_name(f"{base.name}-{attempt}")
    else:
        raise FileExistsError(errno.EEXIST, "no free name for the old run", str(base))
    for name in RUN_FILES:
        if os.path.lexists(path / name):
            os.rename(path / name, target / name)
    return target
