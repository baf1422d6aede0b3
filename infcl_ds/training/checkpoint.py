"""Checkpoints that a kill at any moment cannot break.

DeepSpeed's ``save_checkpoint`` writes the tag directory, then rewrites its ``latest`` file
in place: a kill during that write leaves a pointer that names nothing. Here DeepSpeed writes
the tag only (``save_latest=False``); once every rank has finished (a barrier), rank 0 points
``latest`` at it by writing a temporary file and renaming it over the old pointer, which is
atomic on POSIX file systems. A tag interrupted mid-write is never pointed at, so a resume
takes the previous complete one.

Each rank's own state (RNG streams, its data-loader position and skip count) goes to
``<tag>/client_rank{r}.pt``, also through a rename: DeepSpeed stores ``client_state`` only
from data-parallel rank 0.
"""
import os
import random
import shutil
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np
import torch

LATEST = "latest"


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


def atomic_write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def rng_state() -> Dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: Dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def read_latest(checkpoint_dir: Path) -> Optional[str]:
    pointer = Path(checkpoint_dir) / LATEST
    return pointer.read_text().strip() if pointer.is_file() else None


def save(engine, checkpoint_dir: Path, step: int, client: Dict[str, Any], rank: int, keep: int = 2) -> str:
    """Save the engine and this rank's client state as tag step_XXXXXXXX; every rank calls it."""
    import deepspeed.comm as dist
    checkpoint_dir = Path(checkpoint_dir)
    tag = tag_for(step)
    engine.save_checkpoint(str(checkpoint_dir), tag=tag, client_state={"step": step}, save_latest=False)
    buffer = _to_bytes({**client, "step": step, "rng": rng_state()})
    atomic_write_bytes(checkpoint_dir / tag / f"client_rank{rank}.pt", buffer)
    dist.barrier()  # every rank's files are complete before the pointer moves
    if rank == 0:
        atomic_write_bytes(checkpoint_dir / LATEST, tag.encode())
        _prune(checkpoint_dir, keep, current=tag)
    dist.barrier()
    return tag


def load(engine, checkpoint_dir: Path, tag: str, rank: int) -> Dict[str, Any]:
    """Restore the engine (model, optimizer, scheduler) and return this rank's client state,
    with the RNG streams already restored. ``tag`` may be "latest"."""
    checkpoint_dir = Path(checkpoint_dir)
    if tag == LATEST:
        tag = read_latest(checkpoint_dir)
        if tag is None:
            raise FileNotFoundError(f"--resume latest: no checkpoint in {checkpoint_dir} (no '{LATEST}' file)")
    client_path = checkpoint_dir / tag / f"client_rank{rank}.pt"
    if not client_path.is_file():
        raise FileNotFoundError(f"checkpoint {checkpoint_dir / tag} has no {client_path.name}: saved with a "
                                "different number of ranks, or incomplete")
    path, _ = engine.load_checkpoint(str(checkpoint_dir), tag=tag)
    if path is None:
        raise FileNotFoundError(f"DeepSpeed could not load checkpoint {checkpoint_dir / tag}")
    client = torch.load(client_path, weights_only=False)
    set_rng_state(client["rng"])
    return client


def _to_bytes(obj) -> bytes:
    import io
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _prune(checkpoint_dir: Path, keep: int, current: str) -> None:
    """Delete all but the newest ``keep`` tags (never the one just pointed at)."""
    if keep < 1:
        return
    tags = sorted(p for p in checkpoint_dir.glob("step_*") if p.is_dir())
    for old in tags[:-keep]:
        if old.name != current:
            shutil.rmtree(old, ignore_errors=True)
