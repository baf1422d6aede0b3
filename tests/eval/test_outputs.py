"""Outputs never clobber inputs: `export`/`eval --out` inside the checkpoints they read (as
given, through a symlink or `..`) or over a file they did not write is refused before any
work, one line, exit 2, the file untouched; the same command again to its own output works;
an `eval --out` that cannot be written is refused before the evaluation, and a write that
fails after it is one line. A malformed manifest (nested thousands deep, a name holding a NUL,
beyond the size bound) is a damaged checkpoint in resume, export and eval alike. One tiny
ZeRO-0 checkpoint (test_export's) for the module."""
import json
import sys
import types

import pytest

from dist_utils import run_ranks
from infcl_ds.eval.evaluate_checkpoint import main as eval_main
from infcl_ds.export import main as export_main
from test_export import NAME, TAG, _labelled_set, _train_and_save

STATES = "mp_rank_00_model_states.pt"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("run")
    (run_dir / "recipe.yaml").write_text(f"model:\n  name: {NAME}\n")
    run_ranks(_train_and_save, 1, 0, str(run_dir / "checkpoints"))
    return run_dir


@pytest.fixture
def fake_data(monkeypatch):
    """infcl_ds.data for eval, recording each build (test_export.test_eval_cli's stand-in); a
    hook given to ``on_build`` runs inside it: after --out's check, before the write."""
    built, hooks = [], []

    def build_eval_data(path, *, image_size, tokenizer, batch_size=256, mean, std):
        built.append(path)
        for hook in hooks:
            hook()
        return _labelled_set(tokenizer)
    monkeypatch.setitem(sys.modules, "infcl_ds.data", types.SimpleNamespace(build_eval_data=build_eval_data))
    return types.SimpleNamespace(built=built, on_build=hooks.append)


def _one_line(capsys, command):
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"infcl-ds {command}: "), err
    return err[len(f"infcl-ds {command}: "):]


def _inside_outs(run, tmp_path):
    """The run's own model states as --out: named directly, through a symlink, through `..`."""
    tag = run / "checkpoints" / TAG
    (tmp_path / "link").symlink_to(tag)
    return {"direct": tag / STATES, "symlink": tmp_path / "link" / STATES,
            "dotdot": run / "elsewhere" / ".." / "checkpoints" / TAG / STATES}


@pytest.mark.parametrize("how", ["direct", "symlink", "dotdot"])
def test_export_into_the_checkpoints_it_reads_is_refused(run, tmp_path, capsys, how):
    from infcl_ds.checkpoint.tags import resolve_tag
    out = _inside_outs(run, tmp_path)[how]
    before = (run / "checkpoints" / TAG / STATES).read_bytes()
    assert export_main(["--checkpoint", str(run), "--out", str(out)]) == 2
    message = _one_line(capsys, "export")
    assert message.startswith(f"--out {out} ") and f"is inside {run / 'checkpoints'}, the checkpoints that " \
        "--checkpoint reads: writing there would damage them; name a file outside it" in message, message
    assert (run / "checkpoints" / TAG / STATES).read_bytes() == before
    resolve_tag(run / "checkpoints", "latest")  # still verifies: resumable


def test_export_replaces_its_own_output_and_no_other_file(run, tmp_path, capsys):
    recipe = (run / "recipe.yaml").read_bytes()
    assert export_main(["--checkpoint", str(run), "--out", str(run / "recipe.yaml")]) == 2
    assert _one_line(capsys, "export") == (f"--out {run / 'recipe.yaml'} exists and was not written by infcl-ds "
                                           "export: not replaced; remove it or name another file")
    assert (run / "recipe.yaml").read_bytes() == recipe
    out = tmp_path / "model.pt"
    assert export_main(["--checkpoint", str(run), "--out", str(out)]) == 0
    assert export_main(["--checkpoint", str(run), "--out", str(out)]) == 0  # the same export again


@pytest.mark.parametrize("case", ["directory", "/dev/full", "under a file", "inside the checkpoints",
                                  "a file eval did not write"])
def test_eval_out_that_cannot_or_must_not_be_written_is_refused_before_any_work(run, tmp_path, fake_data,
                                                                                  capsys, case):
    (tmp_path / "notes.txt").write_text("mine")
    out, why = {
        "directory": (tmp_path, f"is a directory: name the file to write, e.g. {tmp_path / 'metrics.json'}"),
        "/dev/full": ("/dev/full", "is not a regular file: name a file to write"),
        "under a file": (tmp_path / "notes.txt" / "metrics.json", f": {tmp_path / 'notes.txt'} is not a directory"),
        "inside the checkpoints": (run / "checkpoints" / TAG / "metrics.json", f"is inside {run / 'checkpoints'}"),
        "a file eval did not write": (tmp_path / "notes.txt", "exists and was not written by infcl-ds eval"),
    }[case]
    assert eval_main(["--checkpoint", str(run), "--data", "SPLIT", "--out", str(out)]) == 2
    message = _one_line(capsys, "eval")
    assert message.startswith(f"--out {out}") and why in message, message
    assert fake_data.built == []  # refused before the checkpoint and data were read
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert not (run / "checkpoints" / TAG / "metrics.json").exists()


def test_eval_replaces_its_own_output_and_a_failed_write_is_one_line(run, tmp_path, fake_data, capsys):
    out = tmp_path / "metrics.json"
    for _ in range(2):  # the same evaluation again replaces its own file
        assert eval_main(["--checkpoint", str(run), "--data", "SPLIT", "--out", str(out)]) == 0
        written = json.loads(out.read_text())
        assert written["written_by"] == "infcl-ds eval" and len(written["metrics"]) == 8
    capsys.readouterr()
    # --out was writable when checked; by the write it is a directory (as a full disk or a
    # vanished mount would fail it): one line after the evaluation, no traceback.
    fake_data.on_build(lambda: (out.unlink(), out.mkdir()))
    assert eval_main(["--checkpoint", str(run), "--data", "SPLIT", "--out", str(out)]) == 2
    assert _one_line(capsys, "eval").startswith(f"--out {out}: writing failed (")
    assert out.is_dir() and not list(tmp_path.glob(".metrics.json.partial-*"))


def _damaged(kind: str) -> bytes:
    entry = {"bytes": 1, "sha256": "0" * 64}
    if kind == "nested thousands deep":
        return b'{"format": 1, "files": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    if kind == "a name holding a NUL":
        return json.dumps({"format": 1, "files": {"model\0.pt": entry}}).encode()
    # Well-formed, but beyond the 16 MiB a manifest may have: not read further.
    return json.dumps({"format": 1, "files": {}, "pad": "x" * (17 << 20)}).encode()


@pytest.mark.parametrize("kind", ["nested thousands deep", "a name holding a NUL", "beyond the size bound"])
def test_a_malformed_manifest_is_a_damaged_checkpoint_in_resume_export_and_eval(tmp_path, fake_data, capsys, kind):
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.checkpoint.tags import resolve_tag
    run = tmp_path / "run"
    tag = run / "checkpoints" / "step_00000001"
    tag.mkdir(parents=True)
    (run / "checkpoints" / "latest").write_text(tag.name)
    (tag / "manifest.json").write_bytes(_damaged(kind))
    damaged = f"checkpoint {tag}: manifest.json is damaged ("
    with pytest.raises(CheckpointError) as resume:  # what --resume reads first
        resolve_tag(run / "checkpoints", "latest")
    assert str(resume.value).startswith(damaged), resume.value
    assert export_main(["--checkpoint", str(run), "--out", str(tmp_path / "model.pt")]) == 2
    assert _one_line(capsys, "export").startswith(damaged)
    assert eval_main(["--checkpoint", str(run), "--data", "SPLIT"]) == 2
    assert _one_line(capsys, "eval").startswith(damaged)
