"""Hostile and damaged checkpoints (docs/reliability.md): no code runs from a checkpoint on resume,
export or eval, tags stay inside the run, damaged tags and tampered files are named, a changed
recipe is refused at resume, and a full disk during a save leaves the last complete tag."""
import errno
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch

from dist_utils import run_ranks
from launch_utils import run_recipe


class _Marker:
    """Unpickled by a full unpickler, creates the file ``path`` (any code could run instead)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return open, (self.path, "w")


def _plant(path: Path, marker: Path) -> None:
    """Add the marker's pickle to a checkpoint file and re-sign the tag's manifest, as an
    attacker who can write the files can: only the unpickler stands in the way."""
    from infcl_ds.checkpoint.manifest import read_manifest, write_manifest
    state = torch.load(path, map_location="cpu", weights_only=False)
    state["payload"] = _Marker(marker)
    torch.save(state, path)
    write_manifest(path.parent, read_manifest(path.parent)["recipe_sha256"])

FILES = {"client": "client_rank0.pt", "model_states": "mp_rank_00_model_states.pt",
         "optim_states": "zero_pp_rank_0_mp_rank_00_optim_states.pt"}


def _train_then_resume_attempts(rank, world, run_dir, marker):
    """Train; then resume with a changed recipe (refused, then allowed), and with a hostile
    pickle in each kind of checkpoint file (refused). Returns what each attempt raised."""
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.training.trainer import Trainer
    run_dir, marker = Path(run_dir), Path(marker)
    Trainer(run_recipe(run_dir)).run()
    out = {}
    try:
        Trainer(run_recipe(run_dir, ["schedule.steps=4"]), resume="latest")
    except CheckpointError as err:
        out["recipe_change"] = str(err)
    allowed = Trainer(run_recipe(run_dir, ["schedule.steps=4"]), resume="latest", allow_recipe_change=True)
    out["allowed_step"] = allowed.step
    tag_dir = run_dir / "checkpoints" / "step_00000002"
    for kind, name in FILES.items():
        original = (tag_dir / name).read_bytes(), (tag_dir / "manifest.json").read_bytes()
        _plant(tag_dir / name, marker)
        try:
            Trainer(run_recipe(run_dir), resume="latest")
            out[kind] = "loaded"
        except CheckpointError as err:
            out[kind] = str(err)
        (tag_dir / name).write_bytes(original[0])
        (tag_dir / "manifest.json").write_bytes(original[1])
    return out


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(run directory, what the resume attempts raised, marker path)."""
    run_dir = tmp_path_factory.mktemp("run")
    marker = tmp_path_factory.mktemp("marker") / "pwned"
    results = run_ranks(_train_then_resume_attempts, 1, str(run_dir), str(marker), wait_s=400)[0]
    return run_dir, results, marker


def test_hostile_pickle_refused_on_resume_export_and_eval(trained, tmp_path, capsys):
    from infcl_ds.eval.evaluate_checkpoint import main as eval_main
    from infcl_ds.export import main as export_main
    run_dir, results, marker = trained
    for kind, name in FILES.items():
        assert name in results[kind] and "refused" in results[kind], (kind, results[kind])
        assert "--trust-checkpoint" in results[kind]
    assert not marker.exists()

    tag_dir = run_dir / "checkpoints" / "step_00000002"
    for kind in ("model_states", "optim_states"):  # what export and eval read
        saved = {p: p.read_bytes() for p in tag_dir.iterdir()}
        _plant(tag_dir / FILES[kind], marker)
        try:
            assert export_main(["--checkpoint", str(run_dir), "--out", str(tmp_path / "m.pt")]) == 2
            assert eval_main(["--checkpoint", str(run_dir), "--data", str(tmp_path)]) == 2
            err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("infcl-ds")]
            assert len(err) == 2 and all("refused" in line and FILES[kind] in line for line in err), err
            assert not marker.exists() and not (tmp_path / "m.pt").exists()
            # The plant is live: --trust-checkpoint (the full unpickler, which DeepSpeed uses by
            # itself) runs it.
            assert export_main(["--checkpoint", str(run_dir), "--out", str(tmp_path / "m.pt"),
                                "--trust-checkpoint"]) == 0
            assert marker.exists()
        finally:
            marker.unlink(missing_ok=True)
            (tmp_path / "m.pt").unlink(missing_ok=True)
            for path, data in saved.items():
                path.write_bytes(data)
    # The intact checkpoint exports.
    assert export_main(["--checkpoint", str(run_dir), "--out", str(tmp_path / "m.pt")]) == 0


def test_recipe_change_refused_unless_allowed(trained):
    _, results, _ = trained
    assert "schedule.steps: 2 -> 4" in results["recipe_change"], results["recipe_change"]
    assert "--allow-recipe-change" in results["recipe_change"]
    assert results["allowed_step"] == 2


def test_tags_outside_the_run_are_refused(trained, tmp_path):
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.checkpoint.tags import resolve_tag
    run_dir, _, _ = trained
    checkpoints = run_dir / "checkpoints"
    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(checkpoints / "step_00000002", elsewhere / "step_00000002")  # a valid tag, elsewhere
    latest = (checkpoints / "latest").read_text()
    try:
        outside = os.path.relpath(elsewhere / "step_00000002", checkpoints)
        for pointer in (outside, str(elsewhere / "step_00000002")):
            (checkpoints / "latest").write_text(pointer)
            with pytest.raises(CheckpointError, match="not a directory inside"):
                resolve_tag(checkpoints, "latest")
            with pytest.raises(CheckpointError, match="not a directory inside"):
                resolve_tag(checkpoints, pointer)
        (checkpoints / "latest").write_text("")
        with pytest.raises(CheckpointError, match=r"latest is empty; intact checkpoints: step_00000001, step_00000002"):
            resolve_tag(checkpoints, "latest")
    finally:
        (checkpoints / "latest").write_text(latest)
    assert resolve_tag(checkpoints, "latest") == checkpoints / "step_00000002"


def test_cli_refuses_a_tag_outside_the_run(trained, tmp_path, capsys):
    from infcl_ds.export import main as export_main
    run_dir, _, _ = trained
    assert export_main(["--checkpoint", str(run_dir), "--tag", "../../x", "--out", str(tmp_path / "m.pt")]) == 2
    assert "not a directory inside" in capsys.readouterr().err


@pytest.mark.parametrize("damage", ["truncate", "garble", "empty_manifest"])
def test_damaged_tag_is_named_with_the_intact_ones(trained, damage):
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.checkpoint.tags import resolve_tag
    run_dir, _, _ = trained
    checkpoints = run_dir / "checkpoints"
    victim = checkpoints / "step_00000002" / ("manifest.json" if damage == "empty_manifest" else FILES["optim_states"])
    original = victim.read_bytes()
    try:
        if damage == "truncate":
            victim.write_bytes(original[: len(original) // 2])
        elif damage == "garble":
            victim.write_bytes(original[:100] + bytes(255 - b for b in original[100:200]) + original[200:])
        else:
            victim.write_bytes(b"")
        with pytest.raises(CheckpointError) as info:
            resolve_tag(checkpoints, "latest")
        message = str(info.value)
        assert "step_00000002" in message and (victim.name in message), message
        assert "intact checkpoints: step_00000001 (--resume step_00000001 to use one)" in message, message
    finally:
        victim.write_bytes(original)


def _save_fails_on_rank1(rank, world, run_dir):
    """Two ranks; rank 1's write of the step-2 checkpoint fails with ENOSPC."""
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.training.trainer import Trainer
    trainer = Trainer(run_recipe(run_dir, ["schedule.steps=3"]))
    if rank == 1:
        real_save = torch.save

        def full_disk(obj, f, *args, **kwargs):
            if "step_00000002" in str(f):
                raise OSError(errno.ENOSPC, "No space left on device", str(f))
            return real_save(obj, f, *args, **kwargs)

        torch.save = full_disk
    try:
        trainer.run()
    except CheckpointError as err:
        return str(err)
    return "saved"


def test_full_disk_during_a_save_keeps_the_last_complete_tag(tmp_path):
    from infcl_ds.checkpoint.tags import read_latest
    results = run_ranks(_save_fails_on_rank1, 2, str(tmp_path), wait_s=300)
    for rank in range(2):
        assert "saving checkpoint step_00000002 failed on rank 1" in results[rank], results[rank]
        assert "latest still names step_00000001" in results[rank]
    assert "No space left on device" in results[1]
    checkpoints = tmp_path / "checkpoints"
    assert read_latest(checkpoints) == "step_00000001"
    assert sorted(p.name for p in checkpoints.iterdir() if p.is_dir()) == ["step_00000001"]


def test_export_and_eval_name_a_missing_path_in_one_line(trained, tmp_path, capsys):
    from infcl_ds.eval.evaluate_checkpoint import main as eval_main
    from infcl_ds.export import main as export_main
    run_dir, _, _ = trained
    assert export_main(["--checkpoint", str(tmp_path / "nope"), "--out", str(tmp_path / "m.pt")]) == 2
    assert capsys.readouterr().err.strip() == f"infcl-ds export: no checkpoint directory {tmp_path / 'nope'}"
    assert eval_main(["--checkpoint", str(tmp_path / "nope"), "--data", str(tmp_path)]) == 2
    assert capsys.readouterr().err.strip() == f"infcl-ds eval: no checkpoint directory {tmp_path / 'nope'}"
    assert eval_main(["--checkpoint", str(run_dir), "--data", str(tmp_path / "no_split")]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("infcl-ds")]
    assert len(err) == 1 and "no_split" in err[0], err


# --- files of a run that were tampered with ----------------------------------------------------

def test_a_manifest_entry_that_is_not_an_entry_is_a_damaged_manifest(tmp_path):
    """A number in place of {"bytes", "sha256"} was an AttributeError traceback."""
    from infcl_ds.checkpoint.manifest import read_manifest
    from infcl_ds.checkpoint.safe_load import CheckpointError
    (tmp_path / "manifest.json").write_text('{"format": 1, "files": {"model.pt": 5}}')
    with pytest.raises(CheckpointError, match="manifest.json is damaged"):
        read_manifest(tmp_path)


def _tag_of_one_file(tmp_path) -> Path:
    from infcl_ds.checkpoint.manifest import write_manifest
    tag = tmp_path / "checkpoints" / "step_00000001"
    (tag / "sub").mkdir(parents=True)
    (tag / "a.pt").write_bytes(b"x" * 1000)
    write_manifest(tag, "0" * 64)
    return tag


@pytest.mark.parametrize("spelling", ["./a.pt", "sub/../a.pt", ".//a.pt"])
def test_a_file_listed_under_two_spellings_is_a_damaged_manifest(tmp_path, spelling):
    """Each spelling was verified, the file hashed once per spelling: a 16 MiB manifest listing
    one large file ~100,000 times kept every rank hashing for an hour."""
    from infcl_ds.checkpoint.manifest import verify
    from infcl_ds.checkpoint.safe_load import CheckpointError
    tag = _tag_of_one_file(tmp_path)
    manifest = json.loads((tag / "manifest.json").read_text())
    manifest["files"][spelling] = manifest["files"]["a.pt"]
    (tag / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(CheckpointError, match="^" + re.escape(
            f"checkpoint {tag}: manifest.json is damaged (it lists one file twice: 'a.pt' and {spelling!r})") + "$"):
        verify(tag)
    # A name leading out of the tag stays refused as one.
    (tmp_path / "elsewhere.pt").write_bytes(b"x" * 1000)
    for outside in ("../../elsewhere.pt", "sub/../../../elsewhere.pt"):
        manifest["files"] = {"a.pt": manifest["files"]["a.pt"], outside: manifest["files"]["a.pt"]}
        (tag / "manifest.json").write_text(json.dumps(manifest))
        with pytest.raises(CheckpointError, match=re.escape(f"manifest.json names {outside}, outside the tag")):
            verify(tag)


def test_a_file_under_several_names_is_hashed_once(tmp_path, monkeypatch):
    """Hard and symbolic links are names the manifest may list; the bytes behind them are read once."""
    from infcl_ds.checkpoint import manifest
    tag = _tag_of_one_file(tmp_path)
    os.link(tag / "a.pt", tag / "b.pt")
    (tag / "c.pt").symlink_to("a.pt")
    manifest.write_manifest(tag, "0" * 64)
    hashed = []
    digest = manifest.file_digest
    monkeypatch.setattr(manifest, "file_digest", lambda path: hashed.append(path) or digest(path))
    assert sorted(manifest.verify(tag)["files"]) == ["a.pt", "b.pt", "c.pt"]
    assert len(hashed) == 1, hashed
    (tag / "a.pt").write_bytes(b"y" * 1000)  # changed under all three names: named by the first
    with pytest.raises(manifest.CheckpointError, match=r"a.pt does not match its SHA-256"):
        manifest.verify(tag)


def test_a_saved_recipe_with_a_python_tag_is_one_line_not_a_constructor_traceback(tmp_path):
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.export import run_model_name
    from infcl_ds.training.recipe_change import trajectory_changes
    hostile = "model: {name: !!python/object/apply:os.system [touch pwned]}\n"
    with pytest.raises(CheckpointError, match=r"run/recipe.yaml is not a recipe: .*python/object/apply"):
        trajectory_changes(hostile, "model: {name: infcl-tiny}\n", "run/recipe.yaml")
    (tmp_path / "recipe.yaml").write_text(hostile)
    with pytest.raises(ValueError, match=r"recipe.yaml is not a recipe with model.name"):
        run_model_name(tmp_path)
    assert not (tmp_path / "pwned").exists() and not os.path.exists("pwned")


def test_an_allowed_class_called_with_bad_arguments_is_a_damaged_file(tmp_path):
    """The weights-only reader lets DeepSpeed's LossScaler through; a file that calls it with
    arguments it does not take raised its constructor's TypeError as a traceback."""
    from deepspeed.runtime.fp16.loss_scaler import LossScaler

    from infcl_ds.checkpoint.safe_load import CheckpointError, load_weights_only

    class BadCall:
        def __reduce__(self):
            return LossScaler, ("too", "many", "arguments", "for", "it", "to", "take")

    path = tmp_path / "client.pt"
    torch.save({"scaler": BadCall()}, path)
    with pytest.raises(CheckpointError, match="client.pt cannot be read"):
        load_weights_only(path)


def test_a_checkpoints_names_are_escaped_in_its_refusals(tmp_path):
    """A tag or file name holding a line break or an ESC is written escaped: the refusal stays one
    line and the terminal obeys nothing in it."""
    from infcl_ds.checkpoint.manifest import verify, write_manifest
    from infcl_ds.checkpoint.safe_load import CheckpointError
    tag = tmp_path / "step_1\n\x1b[2J"
    tag.mkdir()
    (tag / "model\nstates.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError) as err:
        verify(tag)
    assert "\n" not in str(err.value) and "\x1b" not in str(err.value) and "step_1\\n\\x1b[2J" in str(err.value)
    write_manifest(tag, "0" * 64)
    (tag / "extra\x1b.pt").write_bytes(b"y")
    with pytest.raises(CheckpointError, match=r"extra\\x1b\.pt not in its manifest") as err:
        verify(tag)
    assert "\x1b" not in str(err.value) and "\n" not in str(err.value)
