"""Checkpoints that a kill at any moment, a full disk or a hostile file cannot turn against the run.

DeepSpeed's ``save_checkpoint`` writes the tag directory, then rewrites its ``latest`` file
in place: a kill during that write leaves a pointer that names nothing. Here DeepSpeed writes
the tag only (``save_latest=False``); once every rank has finished, rank 0 writes the tag's
manifest (``training/manifest.py``: every file's size and SHA-256) and points ``latest`` at
it by writing a temporary file and renaming it over the old pointer, which is atomic on POSIX
file systems. A tag interrupted mid-write is never pointed at, so a resume takes the previous
complete one. A save that fails on any rank (a full disk) fails on every rank, as a
``CheckpointError``, and its partial tag is removed; ``latest`` stays on the last complete tag.

Each rank's own state (RNG streams, its data-loader position and skip count) goes to
``<tag>/client_rank{r}.pt`` as tensors and numbers only (DeepSpeed stores ``client_state``
only from data-parallel rank 0); the run's recipe goes to ``<tag>/recipe.yaml``.

Reading: a tag must be a directory directly inside the run's ``checkpoints/`` (``latest`` or a
tag naming ``../elsewhere`` or an absolute path is refused), its manifest must verify, and
every file is unpickled with ``weights_only=True`` (``training/safe_load.py``). A damaged tag
is named with the intact ones listed.

Unfinished tags. A tag directory without ``manifest.json`` was never finished: its save was cut
short (a rank or the whole job killed mid-save), or its removal was (a tag is removed manifest
first, ``_remove_tag``). No command reads one: resume, export and eval verify the manifest.
Two places remove them, and only the run's owner, which holds the run directory's lock
(``training/run_lock.py``: global rank 0 of a training job) and writes every other file of the
run:

- a save whose collective fails (a peer killed or stopped mid-save) removes its own tag on
  rank 0 before the error goes on, unless ``latest`` already names it;
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
import hashlib
import io
import os
import random
import re
import shutil
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch

from ..shown import shown
from .atomic import atomic_write_bytes
from .manifest import MANIFEST, verify, write_manifest
from .safe_load import CheckpointError, deepspeed_reads_weights_only, load_weights_only
from .state_mismatch import summarize

LATEST = "latest"
RECIPE = "recipe.yaml"


def rng_state() -> Dict[str, Any]:
    """Every RNG stream as tensors, numbers and strings: readable with weights_only=True."""
    version, mt_state, gauss = random.getstate()
    numpy_state = np.random.get_state(legacy=False)
    state = {"python": [version, list(mt_state), gauss],
             "numpy": {"bit_generator": numpy_state["bit_generator"],
                       "key": torch.from_numpy(numpy_state["state"]["key"].astype(np.int64)),
                       "pos": int(numpy_state["state"]["pos"]), "has_gauss": int(numpy_state["has_gauss"]),
                       "gauss": float(numpy_state["gauss"])},
             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    version, mt_state, gauss = state["python"]
    random.setstate((version, tuple(mt_state), gauss))
    numpy_state = state["numpy"]
    np.random.set_state({"bit_generator": numpy_state["bit_generator"],
                         "state": {"key": numpy_state["key"].numpy().astype(np.uint32), "pos": numpy_state["pos"]},
                         "has_gauss": numpy_state["has_gauss"], "gauss": numpy_state["gauss"]})
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def read_latest(checkpoint_dir: Path) -> Optional[str]:
    pointer = Path(checkpoint_dir) / LATEST
    return pointer.read_text(errors="replace").strip() if pointer.is_file() else None


# -- saving ---------------------------------------------------------------------------------

def _is_write_failure(err: BaseException) -> bool:
    """A file write that failed (disk full, quota, read-only): torch.save reports some as
    RuntimeErrors from its zip writer ("inline_container.cc ... unexpected pos")."""
    return isinstance(err, OSError) or (isinstance(err, RuntimeError) and "inline_container" in str(err))


def _failed_ranks(failed: bool, device) -> List[int]:
    """The ranks whose flag is set (every rank calls this: one all-gather)."""
    import deepspeed.comm as dist
    flags = [torch.zeros(1, device=device) for _ in range(dist.get_world_size())]
    dist.all_gather(flags, torch.tensor([float(failed)], device=device))
    return [rank for rank, flag in enumerate(flags) if flag.item()]


def save(engine, checkpoint_dir: Path, step: int, client: Dict[str, Any], rank: int, keep: int = 2,
         recipe_text: str = "") -> str:
    """Save the engine, this rank's client state and the recipe as tag step_XXXXXXXX; every rank
    calls it. A write that fails on any rank raises CheckpointError on every rank, with the
    partial tag removed and ``latest`` unchanged. A collective that fails (a peer gone or
    stopped) propagates, after rank 0 removed the unfinished tag."""
    checkpoint_dir = Path(checkpoint_dir)
    tag = f"step_{step:08d}"
    try:
        return _save(engine, checkpoint_dir, tag, step, client, rank, keep, recipe_text)
    except Exception as err:
        from .exits import is_collective_failure  # exits imports this module (through divergence)
        if rank == 0 and is_collective_failure(err) and read_latest(checkpoint_dir) != tag:
            _remove_tag(checkpoint_dir / tag, ignore_errors=True)
        raise


def _save(engine, checkpoint_dir: Path, tag: str, step: int, client: Dict[str, Any], rank: int, keep: int,
          recipe_text: str) -> str:
    import deepspeed.comm as dist
    tag_dir = checkpoint_dir / tag
    device = next(engine.module.parameters()).device
    failure: Optional[BaseException] = None
    # A tag of this name from a trajectory abandoned by resuming an earlier tag may hold the
    # files of another number of ranks: it goes before any rank writes, so none is mixed in.
    if rank == 0 and tag_dir.exists():
        try:
            _remove_tag(tag_dir)
        except OSError as err:
            failure = err
    if _failed_ranks(failure is not None, device):
        raise CheckpointError(f"saving checkpoint {tag} failed: the earlier {tag_dir} could not be removed"
                              + (f": {failure}" if failure is not None else " (see rank 0)"))
    try:
        engine.save_checkpoint(str(checkpoint_dir), tag=tag, client_state={"step": step}, save_latest=False)
    except Exception as err:  # noqa: BLE001 - a write failure is re-raised below on every rank
        if not _is_write_failure(err):
            raise
        failure = err
        # save_checkpoint ends with a barrier that the other ranks are in (from ZeRO 0 to 2
        # no collective lies between its writes and that barrier).
        dist.barrier()
    if failure is None:
        try:
            buffer = io.BytesIO()
            torch.save({**client, "step": step, "rng": rng_state()}, buffer)
            atomic_write_bytes(tag_dir / f"client_rank{rank}.pt", buffer.getvalue())
            if rank == 0:
                atomic_write_bytes(tag_dir / RECIPE, recipe_text.encode())
        except OSError as err:
            failure = err
    failed = _failed_ranks(failure is not None, device)  # every rank's files are complete, or one failed
    if not failed and rank == 0:
        try:
            write_manifest(tag_dir, hashlib.sha256(recipe_text.encode()).hexdigest())
            atomic_write_bytes(checkpoint_dir / LATEST, tag.encode())
        except OSError as err:
            failure = err
    failed = failed or _failed_ranks(failure is not None, device)
    if failed:
        if rank == 0:
            _remove_tag(tag_dir, ignore_errors=True)
        dist.barrier()
        previous = read_latest(checkpoint_dir)
        reason = f": {failure}" if failure is not None else ""
        raise CheckpointError(f"saving checkpoint {tag} failed on rank {', '.join(map(str, failed))}{reason}; "
                              f"the partial tag was removed and {LATEST} still names "
                              f"{previous or 'nothing (no earlier checkpoint)'}")
    if rank == 0:
        _prune(checkpoint_dir, keep, current=tag)
    dist.barrier()
    return tag


def _prune(checkpoint_dir: Path, keep: int, current: str) -> None:
    """Delete all but the newest ``keep`` tags (never the one just pointed at)."""
    if keep < 1:
        return
    tags = sorted(p for p in checkpoint_dir.glob("step_*") if p.is_dir())
    for old in tags[:-keep]:
        if old.name != current:
            _remove_tag(old, ignore_errors=True)


def _remove_tag(tag_dir: Path, ignore_errors: bool = False) -> None:
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


def _owns_run(checkpoint_dir: Path) -> bool:
    """Whether this process holds the lock of the run that ``checkpoint_dir`` belongs to."""
    from .run_lock import holds  # its table of held locks: the one record of who owns a run
    return holds(checkpoint_dir.parent)


def unfinished_tags(checkpoint_dir: Path) -> List[str]:
    """The tag directories in ``checkpoint_dir`` without a manifest, oldest first."""
    return sorted(p.name for p in Path(checkpoint_dir).glob("step_*")
                  if p.is_dir() and not p.is_symlink() and not os.path.lexists(p / MANIFEST))


def remove_unfinished_tags(checkpoint_dir: Path, keep: Tuple[str, ...] = ()) -> List[str]:
    """Remove the unfinished tags (module docstring) other than ``keep`` and the one ``latest``
    names, on the run's owner only; one line naming what went. Returns the names removed."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir() or not _owns_run(checkpoint_dir):
        return []
    spared = set(keep) | {read_latest(checkpoint_dir)}
    removed = [name for name in unfinished_tags(checkpoint_dir) if name not in spared]
    for name in removed:
        _remove_tag(checkpoint_dir / name, ignore_errors=True)
    if removed:
        print(f"infcl-ds train: removed {len(removed)} unfinished checkpoint tag(s) of {checkpoint_dir} "
              f"({', '.join(removed)}: no {MANIFEST}, a save or removal cut short); {LATEST} names "
              f"{read_latest(checkpoint_dir) or 'nothing'}", file=sys.stderr, flush=True)
    return removed


# -- reading --------------------------------------------------------------------------------

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


def resolve_tag(checkpoint_dir: Path, tag: str = LATEST, flag: str = "--resume") -> Path:
    """The verified directory of ``tag`` ("latest" follows the pointer) in ``checkpoint_dir``;
    CheckpointError naming the problem, with the intact tags, otherwise."""
    checkpoint_dir = Path(checkpoint_dir)
    if not checkpoint_dir.is_dir():
        raise CheckpointError(f"no checkpoint directory {checkpoint_dir}")
    remove_unfinished_tags(checkpoint_dir, keep=(tag,))
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


def read_client(tag_dir: Path, rank: int, trust: bool = False) -> Dict[str, Any]:
    """This rank's client state (step, data position, RNG streams) from a verified tag."""
    path = Path(tag_dir) / f"client_rank{rank}.pt"
    if not path.is_file():
        raise CheckpointError(f"checkpoint {tag_dir} has no {path.name}: saved with a different number of ranks")
    if trust:
        return torch.load(path, map_location="cpu", weights_only=False)
    return load_weights_only(path)


def load_engine(engine, tag_dir: Path, trust: bool = False, source: Optional[Path] = None) -> None:
    """Restore the engine (model, optimizer, scheduler) from ``source`` (a tag directory;
    ``tag_dir``, the verified tag it stands for, by default), every file read weights-only."""
    tag_dir = Path(tag_dir)
    source = Path(source or tag_dir)
    with deepspeed_reads_weights_only(trust):
        try:
            path, _ = engine.load_checkpoint(str(source.parent), tag=source.name)
        except CheckpointError:
            raise
        except RuntimeError as err:
            if not re.search(r"size of tensor|size mismatch|must match the size", str(err)):
                raise
            # DeepSpeed copies flat buffers back without checking their layout first.
            raise CheckpointError(
                f"checkpoint {tag_dir} does not match this engine's parameters ({summarize(err)}): written for another "
                "model, optimizer grouping or ZeRO stage, or a ZeRO-3 checkpoint of an older infcl_ds that "
                "ordered the optimizer groups otherwise (docs/training.md)") from None
    if path is None:
        raise CheckpointError(f"DeepSpeed could not load checkpoint {tag_dir}")


def load(engine, tag_dir: Path, rank: int, trust: bool = False) -> Dict[str, Any]:
    """Restore the engine from a tag ``resolve_tag`` returned, written by as many ranks as
    there are now, and return this rank's client state, with the RNG streams already restored."""
    client = read_client(tag_dir, rank, trust)
    load_engine(engine, tag_dir, trust)
    set_rng_state(client["rng"])
    return client
