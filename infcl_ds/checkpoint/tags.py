"""The tags of a run's ``checkpoints/`` directory: the ``latest`` pointer, which tags are intact
or unfinished, resolving the one a command asked for, removing and pruning them.

Reading: a tag must be a directory directly inside the run's ``checkpoints/`` (``latest`` or a
tag naming ``../elsewhere`` or an absolute path is refused) and its manifest must verify
(``manifest.py``); ``store.py`` then unpickles every file with ``weights_only=True``
(``safe_load.py``). A damaged tag is named with the intact ones listed.

Unfinished tags. A tag directory without ``manifest.json`` was never finished: its save was cut
short (a rank or the whole job killed mid-save), or its removal was (a tag is removed manifest
first, ``remove_tag``). No command reads one: resume, export and eval verify the manifest.
Two places remove them, and only the run's owner, which holds the run directory's lock
(``training/run_lock.py``: global rank 0 of a training job) and writes every other file of the
run; the caller says whether it is that owner (``owner=``), this package knows no lock:

- a save whose collective fails (a peer killed or stopped mid-save) removes its own tag on
  rank 0 before the error goes on, unless ``latest`` already names it (``store.save``);
- resolving a tag to resume (``resolve_tag``, before it reads anything) removes every unfinished
  tag except the one ``latest`` names and the one asked for, with one line naming them. That
  covers what the first cannot: rank 0 itself killed, the whole job killed, NCCL's watchdog
  ending rank 0 without an exception. An unfinished tag is removed whether it is newer or older
  than ``latest``: no save finished it, and none of the run's processes is writing it (the
  lock excludes another live run; this run's ranks have not started saving).

A tag whose manifest exists but does not verify is damage, not an unfinished save: it is
named with the intact tags and never removed. Export and eval hold no lock and remove nothing
(the run may be saving that very tag); neither does a run on a file system without locks.
"""
import os
import shutil
import sys
from pathlib import Path
from typing import List, Optional, Tuple

from ..shown import shown
from .manifest import MANIFEST, verify
from .safe_load import CheckpointError

LATEST = "latest"


def read_latest(checkpoint_dir: Path) -> Optional[str]:
    pointer = Path(checkpoint_dir) / LATEST
    return pointer.read_text(errors="replace").strip() if pointer.is_file() else None


# -- removing --------------------------------------------------------------------------------

def prune(checkpoint_dir: Path, keep: int, current: str) -> None:
    """Delete all but the newest ``keep`` tags (never the one just pointed at)."""
    if keep < 1:
        return
    tags = sorted(p for p in checkpoint_dir.glob("step_*") if p.is_dir())
    for old in tags[:-keep]:
        if old.name != current:
            remove_tag(old, ignore_errors=True)


def remove_tag(tag_dir: Path, ignore_errors: bool = False) -> None:
    """Remove a tag, its manifest first: a removal cut short leaves an unfinished tag (no
    manifest), which the next resume removes, rather than a damaged one, which it keeps."""
    try:
        (tag_dir / MANIFEST).unlink()
    except FileNotFoundError:
        pass
    except OSError:
        if not ignore_errors:
            raise
    shutil.rmtree(tag_dir, ignore_errors=ignore_errors)


def unfinished_tags(checkpoint_dir: Path) -> List[str]:
    """The tag directories in ``checkpoint_dir`` without a manifest, oldest first."""
    return sorted(p.name for p in Path(checkpoint_dir).glob("step_*")
                  if p.is_dir() and not p.is_symlink() and not os.path.lexists(p / MANIFEST))


def remove_unfinished_tags(checkpoint_dir: Path, keep: Tuple[str, ...] = (), owner: bool = False) -> List[str]:
    """Remove the unfinished tags (module docstring) other than ``keep`` and the one ``latest``
    names, where the caller is the run's owner (``owner``: it holds the run's lock); one line
    naming what went. Returns the names removed."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir() or not owner:
        return []
    spared = set(keep) | {read_latest(checkpoint_dir)}
    removed = [name for name in unfinished_tags(checkpoint_dir) if name not in spared]
    for name in removed:
        remove_tag(checkpoint_dir / name, ignore_errors=True)
    if removed:
        print(f"infcl-ds train: removed {len(removed)} unfinished checkpoint tag(s) of {checkpoint_dir} "
              f"({', '.join(removed)}: no {MANIFEST}, a save or removal cut short); {LATEST} names "
              f"{read_latest(checkpoint_dir) or 'nothing'}", file=sys.stderr, flush=True)
    return removed


# -- reading ---------------------------------------------------------------------------------

def intact_tags(checkpoint_dir: Path) -> List[str]:
    """The tags in ``checkpoint_dir`` whose manifest verifies, oldest first."""
    intact = []
    for tag_dir in sorted(p for p in Path(checkpoint_dir).glob("step_*") if p.is_dir()):
        try:
            verify(tag_dir)
        except CheckpointError:
            continue
        intact.append(tag_dir.name)
    return intact


def _intact_hint(checkpoint_dir: Path, flag: str) -> str:
    intact = intact_tags(checkpoint_dir)
    if not intact:
        return f"no intact checkpoint in {checkpoint_dir}"
    return f"intact checkpoints: {', '.join(intact)} ({flag} {intact[-1]} to use one)"


def resolve_tag(checkpoint_dir: Path, tag: str = LATEST, flag: str = "--resume", owner: bool = False) -> Path:
    """The verified directory of ``tag`` ("latest" follows the pointer) in ``checkpoint_dir``;
    CheckpointError naming the problem, with the intact tags, otherwise. The run's owner
    (``owner``) first removes the unfinished tags but ``tag`` (``remove_unfinished_tags``)."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise CheckpointError(f"no checkpoint directory {checkpoint_dir}")
    remove_unfinished_tags(checkpoint_dir, keep=(tag,), owner=owner)
    name, source = tag, f"{flag} {tag}"
    if tag == LATEST:
        pointer = checkpoint_dir / LATEST
        if not pointer.is_file():
            raise CheckpointError(f"no '{LATEST}' file in {checkpoint_dir}; {_intact_hint(checkpoint_dir, flag)}")
        name, source = read_latest(checkpoint_dir), f"{pointer}"
        if not name:
            raise CheckpointError(f"{pointer} is empty; {_intact_hint(checkpoint_dir, flag)}")
        if not name.isprintable() or len(name.encode()) > 255:  # a NUL would reach the file system as a ValueError
            raise CheckpointError(f"{pointer} does not hold a tag name (it holds {shown(name, 60)}): damaged; "
                                  f"{_intact_hint(checkpoint_dir, flag)}")
    tag_dir = checkpoint_dir / name
    if os.path.isabs(name) or tag_dir.resolve().parent != checkpoint_dir.resolve():
        raise CheckpointError(f"checkpoint tag {name!r} (from {source}) is not a directory inside {checkpoint_dir}: "
                              f"refused; {_intact_hint(checkpoint_dir, flag)}")
    if not tag_dir.is_dir():
        raise CheckpointError(f"no checkpoint {name!r} in {checkpoint_dir}; {_intact_hint(checkpoint_dir, flag)}")
    try:
        verify(tag_dir)
    except CheckpointError as err:
        raise CheckpointError(f"{err}; {_intact_hint(checkpoint_dir, flag)}") from None
    return tag_dir
