"""Checkpoints that a kill at any moment, a full disk or a hostile file cannot turn against the run.

DeepSpeed's ``save_checkpoint`` writes the tag directory, then rewrites its ``latest`` file
in place: a kill during that write leaves a pointer that names nothing. Here DeepSpeed writes
the tag only (``save_latest=False``); once every rank has finished, rank 0 writes the tag's
manifest (``manifest.py``: every file's size and SHA-256) and points ``latest`` at
it by writing a temporary file and renaming it over the old pointer, which is atomic on POSIX
file systems. A tag interrupted mid-write is never pointed at, so a resume takes the previous
complete one. A save that fails on any rank (a full disk) fails on every rank, as a
``CheckpointError``, and its partial tag is removed; ``latest`` stays on the last complete tag.

Each rank's own state (RNG streams, its data-loader position and skip count) goes to
``<tag>/client_rank{r}.pt`` as tensors and numbers only (DeepSpeed stores ``client_state``
only from data-parallel rank 0); the run's recipe goes to ``<tag>/recipe.yaml``.

Reading (``load``): a tag ``tags.resolve_tag`` verified, every file unpickled with
``weights_only=True`` (``safe_load.py``). Which tags exist, are intact or unfinished, and
who removes the unfinished ones: ``tags.py``.
"""
import hashlib
import io
import re
from pathlib import Path
from typing import Any, Dict, List, Optional

import torch

from ..parallel.ring import is_collective_failure
from ..run_dir import RECIPE
from .atomic import atomic_write_bytes
from .manifest import write_manifest
from .rng import rng_state, set_rng_state
from .safe_load import CheckpointError, deepspeed_reads_weights_only, load_weights_only
from .state_mismatch import summarize
from .tags import LATEST, prune, read_latest, remove_tag


def client_file(rank: int) -> str:
    """The file of a tag holding rank ``rank``'s client state."""
    return f"client_rank{rank}.pt"


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
        if rank == 0 and is_collective_failure(err) and read_latest(checkpoint_dir) != tag:
            remove_tag(checkpoint_dir / tag, ignore_errors=True)
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
            remove_tag(tag_dir)
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
            atomic_write_bytes(tag_dir / client_file(rank), buffer.getvalue())
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
            remove_tag(tag_dir, ignore_errors=True)
        dist.barrier()
        previous = read_latest(checkpoint_dir)
        reason = f": {failure}" if failure is not None else ""
        raise CheckpointError(f"saving checkpoint {tag} failed on rank {', '.join(map(str, failed))}{reason}; "
                              f"the partial tag was removed and {LATEST} still names "
                              f"{previous or 'nothing (no earlier checkpoint)'}")
    if rank == 0:
        prune(checkpoint_dir, keep, current=tag)
    dist.barrier()
    return tag


# -- loading --------------------------------------------------------------------------------

def read_client(tag_dir: Path, rank: int, trust: bool = False) -> Dict[str, Any]:
    """This rank's client state (step, data position, RNG streams) from a verified tag."""
    path = Path(tag_dir) / client_file(rank)
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
    """Restore the engine from a tag ``tags.resolve_tag`` returned, written by as many ranks as
    there are now, and return this rank's client state, with the RNG streams already restored."""
    client = read_client(tag_dir, rank, trust)
    load_engine(engine, tag_dir, trust)
    set_rng_state(client["rng"])
    return client
