"""Unfinished checkpoint tags (no manifest.json: a save or a removal cut short) are removed by
the run's owner only: by a save whose collective failed, and when a resume resolves its tag;
never the tag `latest` names or the one asked for, never a damaged one, never by a process
that does not hold the run's lock (infcl_ds/checkpoint/tags.py's docstring)."""
from pathlib import Path

import pytest
import torch

from infcl_ds.checkpoint import store, tags
from infcl_ds.checkpoint.manifest import MANIFEST, write_manifest
from infcl_ds.checkpoint.safe_load import CheckpointError
from infcl_ds.training import run_lock


def _tag(checkpoints: Path, step: int, finished: bool = True) -> Path:
    tag_dir = checkpoints / f"step_{step:08d}"
    tag_dir.mkdir(parents=True)
    (tag_dir / "client_rank0.pt").write_bytes(b"state of step %d" % step)
    if finished:
        write_manifest(tag_dir, "0" * 64)
    return tag_dir


def _run(tmp_path: Path, latest: int) -> Path:
    """A run whose checkpoints hold, around `latest`: an unfinished tag older and one newer, a
    finished one older, and a damaged one (its manifest garbled) newer."""
    checkpoints = tmp_path / "run" / "checkpoints"
    _tag(checkpoints, 1, finished=False)
    _tag(checkpoints, 2)
    _tag(checkpoints, latest)
    _tag(checkpoints, 4, finished=False)
    (_tag(checkpoints, 5) / MANIFEST).write_text("{not json")
    (checkpoints / tags.LATEST).write_text(f"step_{latest:08d}")
    return checkpoints


def _tags(checkpoints: Path) -> list:
    return sorted(p.name for p in checkpoints.glob("step_*"))


def _owner(checkpoints: Path) -> bool:
    """Whether this process owns the run, as the trainer asks it: it holds the run's lock."""
    return run_lock.holds(checkpoints.parent)


def _resolve(checkpoints: Path, *tag: str) -> Path:
    """Resolve a tag as the trainer's resume does."""
    return tags.resolve_tag(checkpoints, *tag, owner=_owner(checkpoints))


@pytest.fixture
def owner(tmp_path):
    """This process holds the run's lock, as rank 0 of a training job does."""
    lock = run_lock.take(tmp_path / "run")
    yield lock
    lock.release()


def test_the_owner_removes_unfinished_tags_older_and_newer_than_latest(tmp_path, owner, capsys):
    checkpoints = _run(tmp_path, latest=3)
    assert _resolve(checkpoints) == checkpoints / "step_00000003"
    assert _tags(checkpoints) == ["step_00000002", "step_00000003", "step_00000005"]  # the damaged one stays
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1, lines
    assert lines[0].startswith("infcl-ds train: removed 2 unfinished checkpoint tag(s) of ")
    assert "step_00000001, step_00000004: no manifest.json" in lines[0]
    assert lines[0].endswith("latest names step_00000003")
    _resolve(checkpoints)  # nothing left to remove: no second line
    assert capsys.readouterr().err == ""


def test_a_process_without_the_runs_lock_removes_nothing(tmp_path, capsys):
    # export and eval, or anything reading a run that may be saving that very tag
    checkpoints = _run(tmp_path, latest=3)
    before = _tags(checkpoints)
    assert _resolve(checkpoints) == checkpoints / "step_00000003"
    assert _tags(checkpoints) == before and capsys.readouterr().err == ""


def test_the_tag_latest_names_and_the_tag_asked_for_are_never_removed(tmp_path, owner):
    checkpoints = _run(tmp_path, latest=3)
    (checkpoints / tags.LATEST).write_text("step_00000004")  # names an unfinished tag
    with pytest.raises(CheckpointError, match="step_00000004 has no manifest.json"):
        _resolve(checkpoints)
    assert "step_00000004" in _tags(checkpoints) and "step_00000001" not in _tags(checkpoints)
    _tag(checkpoints, 6, finished=False)
    with pytest.raises(CheckpointError, match="step_00000006 has no manifest.json"):
        _resolve(checkpoints, "step_00000006")
    assert {"step_00000004", "step_00000006"} <= set(_tags(checkpoints))


def test_a_removal_cut_short_leaves_an_unfinished_tag(tmp_path, owner, monkeypatch):
    checkpoints = _run(tmp_path, latest=3)
    monkeypatch.setattr(tags.shutil, "rmtree", lambda *a, **k: None)  # killed right after the manifest went
    tags.prune(checkpoints, keep=1, current="step_00000005")
    assert tags.unfinished_tags(checkpoints) == ["step_00000001", "step_00000002", "step_00000003",
                                                 "step_00000004"]
    monkeypatch.undo()
    assert tags.remove_unfinished_tags(checkpoints, owner=_owner(checkpoints)) == ["step_00000001", "step_00000002",
                                                                                   "step_00000004"]


class _Engine:
    """A DeepSpeed engine whose save writes part of the tag, then meets a peer that is gone;
    with `named`, after ``latest`` moved to the tag (the final barrier's failure)."""

    def __init__(self, named: bool):
        self.module, self.named = torch.nn.Linear(1, 1), named

    def save_checkpoint(self, save_dir, tag, **_):
        (Path(save_dir) / tag).mkdir(parents=True, exist_ok=True)
        (Path(save_dir) / tag / "mp_rank_00_model_states.pt").write_bytes(b"part")
        if self.named:
            (Path(save_dir) / tags.LATEST).write_text(tag)
        raise RuntimeError("[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer")


@pytest.mark.parametrize("rank, named, left", [(0, False, ["step_00000001"]),
                                               (1, False, ["step_00000001", "step_00000002"]),
                                               (0, True, ["step_00000001", "step_00000002"])],
                         ids=["rank 0 removes", "rank 1 does not", "not the tag latest names"])
def test_a_save_whose_collective_fails_removes_its_tag_on_rank_0(tmp_path, monkeypatch, rank, named, left):
    # Only rank 0 removes (it owns the run's files); the next resume removes what rank 1 leaves.
    checkpoints = tmp_path / "run" / "checkpoints"
    _tag(checkpoints, 1)
    (checkpoints / tags.LATEST).write_text("step_00000001")
    monkeypatch.setattr(store, "_failed_ranks", lambda failed, device: [])  # no job to ask
    with pytest.raises(RuntimeError, match="Connection closed by peer"):
        store.save(_Engine(named), checkpoints, 2, {}, rank)
    assert _tags(checkpoints) == left
