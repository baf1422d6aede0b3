"""Outputs never clobber inputs: `export`/`eval --out` inside the checkpoints they read (as
given, through a symlink or `..`) or over a file they did not write is refused before any
work, one line, exit 2, the file untouched; the same command again to its own output works;
an `eval --out` that cannot be written is refused before the evaluation, and a write that
fails after it is one line. A malformed manifest (nested thousands deep, a name holding a NUL,
beyond the size bound) is a damaged checkpoint in resume, export and eval alike, and so is a
FIFO, socket or device in a tag, named without being opened. One tiny ZeRO-0 checkpoint
(test_export's) for the module, and a ZeRO-2 one for the files that are not regular."""
import contextlib
import json
import os
import shutil
import socket
import sys
import threading
import time
import types
from pathlib import Path

import pytest

from dist_utils import run_ranks
from infcl_ds.eval.evaluate_checkpoint import main as eval_main
from infcl_ds.export import main as export_main
from test_export import NAME, TAG, _labelled_set, _train_and_save

STATES = "mp_rank_00_model_states.pt"


def trained_run(tmp_path_factory, name: str, stage: int) -> Path:
    """A run directory holding the tiny model's recipe and a checkpoint saved under ZeRO `stage`."""
    run_dir = tmp_path_factory.mktemp(name)
    (run_dir / "recipe.yaml").write_text(f"model:\n  name: {NAME}\n")
    run_ranks(_train_and_save, 1, stage, str(run_dir / "checkpoints"))
    return run_dir


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    return trained_run(tmp_path_factory, "run", 0)


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


# -- files in a tag that are not regular files ----------------------------------------------------

# A ZeRO rank's optimizer states, which export opens (every file of the pattern): the tag's own
# rank's, and a second rank's that the tag does not have.
OPTIM, SECOND_OPTIM = "zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"


@pytest.fixture(scope="module")
def zero2_run(tmp_path_factory):
    return trained_run(tmp_path_factory, "run_zero2", 2)


@contextlib.contextmanager
def _fifo_watch(fifo: Path):
    """Whether anything opened ``fifo`` to read (``opened``): each such reader is let go at once
    (it sees end of file), so a test of old code fails on its message instead of hanging."""
    state = types.SimpleNamespace(opened=False)
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            try:  # opening to write without blocking succeeds only while a reader waits
                os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
                state.opened = True
            except OSError:
                pass
            time.sleep(0.02)
    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join()


def _special(tag: Path, kind: str, outside: Path):
    """Make ``kind`` in the verified tag ``tag``; returns (its name in the tag, what the refusal
    calls it, the FIFO a reader could wait on or None)."""
    if kind == "a FIFO as a rank's optimizer states":
        os.mkfifo(tag / SECOND_OPTIM)
        return SECOND_OPTIM, "a FIFO", tag / SECOND_OPTIM
    if kind == "a listed file replaced by a FIFO":
        (tag / OPTIM).unlink()
        os.mkfifo(tag / OPTIM)
        return OPTIM, "a FIFO", tag / OPTIM
    if kind == "a FIFO as the manifest":
        (tag / "manifest.json").unlink()
        os.mkfifo(tag / "manifest.json")
        return "manifest.json", "a FIFO", tag / "manifest.json"
    if kind == "a symbolic link to a FIFO":
        os.mkfifo(outside / "pipe")
        (tag / SECOND_OPTIM).symlink_to(outside / "pipe")
        return SECOND_OPTIM, "a symbolic link to a FIFO", outside / "pipe"
    if kind == "a symbolic link to a device":
        (tag / SECOND_OPTIM).symlink_to("/dev/zero")
        return SECOND_OPTIM, "a symbolic link to a character device", None
    cwd = os.getcwd()  # a socket's path is bound relative: the absolute one is over its 108 bytes
    os.chdir(tag)
    try:
        with socket.socket(socket.AF_UNIX) as listening:
            listening.bind(SECOND_OPTIM)
    finally:
        os.chdir(cwd)
    return SECOND_OPTIM, "a socket", None


@pytest.mark.parametrize("kind", ["a FIFO as a rank's optimizer states", "a listed file replaced by a FIFO",
                                  "a FIFO as the manifest", "a symbolic link to a FIFO",
                                  "a symbolic link to a device", "a socket"])
def test_a_fifo_socket_or_device_in_a_tag_is_refused_by_resume_export_and_eval_unopened(zero2_run, tmp_path,
                                                                                      fake_data, capsys, kind):
    """Export and eval of a FIFO named as a rank's optimizer states waited on it forever: the
    manifest's checks looked at regular files only."""
    from infcl_ds.checkpoint.safe_load import CheckpointError
    from infcl_ds.checkpoint.tags import resolve_tag
    copy = tmp_path / "run"
    shutil.copytree(zero2_run, copy)
    tag = copy / "checkpoints" / TAG
    name, what, fifo = _special(tag, kind, tmp_path)
    refused = f"checkpoint {tag}: {name} is {what}, not a regular file: refused"
    with _fifo_watch(fifo) if fifo else contextlib.nullcontext(types.SimpleNamespace(opened=False)) as watch:
        assert export_main(["--checkpoint", str(copy), "--out", str(tmp_path / "model.pt")]) == 2
        assert _one_line(capsys, "export").startswith(refused)
        assert eval_main(["--checkpoint", str(copy), "--data", "SPLIT"]) == 2
        assert _one_line(capsys, "eval").startswith(refused)
        with pytest.raises(CheckpointError) as resume:  # what --resume (and resharding) reads first
            resolve_tag(copy / "checkpoints", "latest")
        assert str(resume.value).startswith(refused), resume.value
    assert not watch.opened, "a reader opened the FIFO"
