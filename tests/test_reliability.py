"""Faults and hostile files (docs/reliability.md): no code runs from a checkpoint, tags stay
inside the run, damaged tags are named, a changed recipe is refused at resume, a full disk
during a save leaves the last complete tag, the first step moves the parameters, a stopped
peer ends the job within its timeout, and start-up problems are one line before any set-up."""
import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dist_utils import run_ranks
from launch_utils import ROOT, SYNTHETIC, TINY, start_ranks, wait_all

# A two-step ZeRO-2 run on one rank, a checkpoint after each step: model states, optimizer
# states and client state files, two tags.
RUN_SETTINGS = ["zero.stage=2", "precision.dtype=fp32", "schedule.steps=2", "checkpoint.every=1",
                "checkpoint.keep=3"]


def _recipe(run_dir, extra=()):
    from infcl_ds.config import load_recipe
    return load_recipe(TINY, SYNTHETIC + RUN_SETTINGS + [f"output_dir={run_dir}"] + list(extra))


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
    Trainer(_recipe(run_dir)).run()
    out = {}
    try:
        Trainer(_recipe(run_dir, ["schedule.steps=4"]), resume="latest")
    except CheckpointError as err:
        out["recipe_change"] = str(err)
    allowed = Trainer(_recipe(run_dir, ["schedule.steps=4"]), resume="latest", allow_recipe_change=True)
    out["allowed_step"] = allowed.step
    tag_dir = run_dir / "checkpoints" / "step_00000002"
    for kind, name in FILES.items():
        original = (tag_dir / name).read_bytes(), (tag_dir / "manifest.json").read_bytes()
        _plant(tag_dir / name, marker)
        try:
            Trainer(_recipe(run_dir), resume="latest")
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
    trainer = Trainer(_recipe(run_dir, ["schedule.steps=3"]))
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


def _first_step_moves(rank, world, run_dir):
    """For warm-up 0, 1 and 20: the rate of step 1 and whether the weights moved."""
    from infcl_ds.training.trainer import Trainer
    out = {}
    for warmup in (0, 1, 20):
        trainer = Trainer(_recipe(Path(run_dir) / f"w{warmup}", ["schedule.steps=40",
                                                                 f"schedule.warmup_steps={warmup}"]))
        engine = trainer.engine
        before = {n: p.detach().clone() for n, p in engine.model.named_parameters()}
        lr = engine.deepspeed.get_lr()[0]
        engine.train_step(next(trainer._batches()))
        moved = [n for n, p in engine.model.named_parameters() if not torch.equal(p.detach(), before[n])]
        out[warmup] = (lr, len(moved), len(before), engine.deepspeed.get_lr()[0])
    return out


def test_first_step_has_a_nonzero_rate_and_moves_the_weights(tmp_path):
    results = run_ranks(_first_step_moves, 1, str(tmp_path), wait_s=300)[0]
    lr = 2e-3  # the tiny recipe's
    for warmup, (first, moved, total, second) in results.items():
        assert first == pytest.approx(lr * (1 / warmup if warmup else 1.0)), (warmup, first)
        assert moved == total, (warmup, moved, total)
    from infcl_ds.training.schedule import lr_ratio
    for warmup, (_, _, _, second) in results.items():
        assert second == pytest.approx(lr * lr_ratio(2, 40, warmup, 0.0)), (warmup, second)
    assert lr_ratio(1, 40, 20, 0.0) == 1 / 20 and lr_ratio(20, 40, 20, 0.0) == 1.0
    assert lr_ratio(21, 40, 20, 0.0) == 1.0 and lr_ratio(40, 40, 20, 0.0) > 0


@pytest.mark.parametrize("backend", ["gloo", pytest.param("nccl", marks=[pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="NCCL needs two GPUs")])])
def test_stopped_peer_ends_the_job_within_the_timeout(tmp_path, backend):
    # Two ranks, a one-minute timeout; rank 1 is stopped mid-run. Rank 0 must leave within the
    # timeout plus 30 s (gloo) or 60 s (NCCL, whose watchdog first waits for its debug dump:
    # distributed.NCCL_DUMP_WAIT_MS; seen leaving 100 s after the stop on two H200s). gloo: one
    # line naming itself, its step and the operation, status 3. NCCL: its watchdog names the rank
    # and operation and tears the process down.
    run = tmp_path / "run"
    procs = start_ranks(2, [f"output_dir={run}", "schedule.steps=100000", "distributed.timeout=1",
                            "checkpoint.every=0"], log_dir=tmp_path,
                        accelerator="cpu" if backend == "gloo" else "cuda")
    try:
        deadline = time.monotonic() + 400  # start-up can include DeepSpeed's JIT build of its shm op
        while time.monotonic() < deadline and not (run / "metrics.csv").is_file():
            time.sleep(0.2)
        time.sleep(1.0)
        assert all(p.poll() is None for p in procs), (tmp_path / "rank0.log").read_text()[-3000:]
        procs[1].send_signal(signal.SIGSTOP)
        stopped = time.monotonic()
        code = procs[0].wait(timeout=60 + 60 + 30)
        waited = time.monotonic() - stopped
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    log = (tmp_path / "rank0.log").read_text()
    assert waited < 60 + (60 if backend == "nccl" else 30), waited
    if backend == "nccl":
        assert code != 0 and "Rank 0" in log and "timeout" in log.lower(), log[-3000:]
        return
    assert code == 3, log[-3000:]
    line = next(l for l in log.splitlines() if l.startswith("infcl-ds train: rank 0, step"))
    assert "a collective failed or timed out (timeout 1 min)" in line, line
    assert "Traceback" not in log


def test_fractional_deepspeed_timeout_imports(tmp_path):
    code = ("from infcl_ds.training.distributed import make_timeout_env_importable, collective_timeout_s\n"
            "make_timeout_env_importable()\nimport deepspeed\nprint(collective_timeout_s())")
    env = dict(os.environ, DEEPSPEED_TIMEOUT="0.5", PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "30.0"
    env["DEEPSPEED_TIMEOUT"] = "soon"
    out = subprocess.run([sys.executable, "-m", "infcl_ds.train", "--config", str(TINY)], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "DEEPSPEED_TIMEOUT='soon'" in out.stderr, out.stderr[-2000:]


@pytest.mark.parametrize("value", ["0", "-1", "soon", "true", "1e308", "1e-9", ".nan"])
def test_timeout_recipe_key_must_be_positive_minutes(value):
    from infcl_ds.config import RecipeError, load_recipe
    with pytest.raises(RecipeError, match=r"distributed.timeout must be a number of minutes from 1/60 \(one second\)"):
        load_recipe(TINY, [f"distributed.timeout={value}"])
    assert load_recipe(TINY, ["distributed.timeout=0.5"]).distributed.timeout == 0.5


# --- start-up checks ------------------------------------------------------------------------

def test_output_dir_that_is_a_file_is_refused_before_the_model_is_built(tmp_path):
    target = tmp_path / "a_file"
    target.write_text("not a directory")
    assert wait_all(start_ranks(2, [f"output_dir={target}"], log_dir=tmp_path), timeout=300) == [2, 2]
    for rank in range(2):
        log = (tmp_path / f"rank{rank}.log").read_text()
        assert f"infcl-ds train: output_dir {target} exists and is not a directory" in log, log[-2000:]
        assert "Traceback" not in log and "No pretrained weights" not in log  # the model was never built


def test_read_only_output_dir_is_refused(tmp_path, monkeypatch):
    from infcl_ds.training.preflight import StartupError, check_output_dir

    def read_only(self, data):
        raise OSError(errno.EROFS, "Read-only file system", str(self))

    monkeypatch.setattr(Path, "write_bytes", read_only)
    with pytest.raises(StartupError, match=r"output_dir .* is not writable \(read-only file system\)"):
        check_output_dir(tmp_path / "run", rank=0)


def test_free_disk_estimate_refuses_a_too_small_disk(tmp_path):
    from infcl_ds.training.preflight import StartupError, check_free_disk, checkpoint_bytes
    assert checkpoint_bytes(10, "fp32") == 120 and checkpoint_bytes(10, "bf16") == 140
    check_free_disk(tmp_path, 1)
    with pytest.raises(StartupError, match="one checkpoint needs about"):
        check_free_disk(tmp_path, shutil.disk_usage(tmp_path).free * 2 + 2**40)


def _csv_recipe(path, extra=()):
    from infcl_ds.config import load_recipe
    return load_recipe(TINY, ["data.source=csv", f"data.train={path}", "data.eval=null"] + list(extra))


def test_data_check_refuses_non_utf8_and_missing_columns(tmp_path, capsys):
    from infcl_ds.data.check import main
    good = tmp_path / "good.csv"
    good.write_text("filepath,title\na.png,a cat é\n", encoding="utf-8")
    assert main(["--config", str(TINY), "--set", "data.source=csv", "--set", f"data.train={good}",
                 "--set", "data.eval=null"]) == 0
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"filepath,title\na.png,ok\nb.png,caf\xe9\n")
    assert main(["--config", str(TINY), "--set", "data.source=csv", "--set", f"data.train={bad}",
                 "--set", "data.eval=null"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"infcl-ds data check: CSV {bad} is not UTF-8: byte 0xe9 on line 3"], err
    cols = tmp_path / "cols.csv"
    cols.write_text("path,caption\na.png,x\n")
    assert main(["--config", str(TINY), "--set", "data.source=csv", "--set", f"data.train={cols}",
                 "--set", "data.eval=null"]) == 2
    assert "lacks column(s) ['filepath', 'title']" in capsys.readouterr().err


def test_trainer_refuses_a_non_utf8_csv_in_one_line(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_bytes(b"filepath,title\na.png,caf\xe9\n")
    overrides = ["data.source=csv", f"data.train={bad}", f"output_dir={tmp_path / 'run'}"]
    assert wait_all(start_ranks(1, overrides, log_dir=tmp_path), timeout=300) == [2]
    log = (tmp_path / "rank0.log").read_text()
    assert f"infcl-ds train: CSV {bad} is not UTF-8: byte 0xe9 on line 2" in log and "Traceback" not in log, log[-2000:]


# --- the loss API's edges -------------------------------------------------------------------

def _features(device="cpu", n=5, d=7):
    g = torch.Generator().manual_seed(0)
    return (torch.randn(n, d, generator=g).to(device), torch.randn(n, d, generator=g).to(device))


def test_meta_features_are_a_value_error():
    from infcl_ds import contrastive_loss
    image, text = _features("meta")
    with pytest.raises(ValueError, match="features on device meta; supported: cuda, cpu"):
        contrastive_loss(image, text, 10.0)


@pytest.mark.parametrize("scale", ["100", True, None, [10.0]])
def test_a_scale_that_is_not_a_number_is_a_value_error(scale):
    from infcl_ds import contrastive_loss
    with pytest.raises(ValueError, match="logit_scale must be a number or a tensor"):
        contrastive_loss(*_features(), scale)


def test_numeric_scales_still_pass():
    import numpy as np

    from infcl_ds import contrastive_loss
    image, text = _features()
    want = contrastive_loss(image, text, torch.tensor(10.0))
    for scale in (10, 10.0, np.float32(10.0), np.float64(10.0)):
        assert torch.allclose(contrastive_loss(image, text, scale), want), scale


def test_unknown_loss_arguments_are_refused_at_construction():
    from infcl_ds import ClipLoss, ContrastiveLoss
    with pytest.raises(ValueError, match=r"infcl_ds.ClipLoss: unknown argument\(s\) foo; loss options are"):
        ClipLoss(foo=1)
    with pytest.raises(ValueError, match=r"infcl_ds.ContrastiveLoss: unknown argument\(s\) chek_finite"):
        ContrastiveLoss(chek_finite=False)
    ClipLoss(check_finite=False, backend="torch")  # the real options pass


def test_double_backward_is_refused_clearly():
    from infcl_ds import contrastive_loss
    image, text = (t.requires_grad_() for t in _features())
    loss = contrastive_loss(image, text, 10.0)
    with pytest.raises(RuntimeError, match="double backward .* is not supported"):
        torch.autograd.grad(loss, image, create_graph=True)
    # First-order gradients are untouched.
    loss = contrastive_loss(image, text, 10.0)
    (grad,) = torch.autograd.grad(loss, image)
    assert grad.shape == image.shape and torch.isfinite(grad).all()


@pytest.mark.parametrize("workers", [0, 1])
def test_a_shard_of_unusable_samples_is_one_line_not_a_traceback(tmp_path, workers):
    import io
    import tarfile
    shard = tmp_path / "bad-000000.tar"
    with tarfile.open(shard, "w") as tar:
        for i in range(32):
            for suffix, data in ((".jpg", b"not an image"), (".txt", f"caption {i}".encode())):
                info = tarfile.TarInfo(f"{i:06d}{suffix}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    overrides = ["data.source=webdataset", f"data.train={shard}", f"data.workers={workers}",
                 f"output_dir={tmp_path / 'run'}"]
    assert wait_all(start_ranks(1, overrides, log_dir=tmp_path), timeout=300) == [2]
    log = (tmp_path / "rank0.log").read_text()
    lines = [line for line in log.splitlines() if line.startswith("infcl-ds train:")]
    # Encoded host batches (the default) find the undecodable images when a chunk is decoded,
    # decoded ones in the data workers: each says so in its own words.
    unusable = "no image of these" in lines[0] or "are all unusable" in lines[0] if lines else False
    assert len(lines) == 1 and "rank 0, step 1:" in lines[0] and unusable, log[-3000:]
    assert "Traceback" not in log, log[-3000:]


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


def test_a_taken_master_port_is_named_not_blamed_on_a_peer(tmp_path):
    """Rank 0 cannot open the job's store on a port another process holds: one line naming the
    port, exit 2 (it was reported as a stopped, wedged or dead peer, exit 3)."""
    import socket
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen(1)
        port = holder.getsockname()[1]
        env = dict(os.environ, PYTHONPATH=str(ROOT), DS_ACCELERATOR="cpu", RANK="0", LOCAL_RANK="0",
                   WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        out = subprocess.run([sys.executable, "-m", "infcl_ds.train", "--config", str(TINY),
                              "--set", f"output_dir={tmp_path / 'run'}"], env=env, capture_output=True, text=True,
                             timeout=300)
    lines = [line for line in out.stderr.splitlines() if line.startswith("infcl-ds train:")]
    assert out.returncode == 2 and len(lines) == 1, out.stderr[-3000:]
    assert f"MASTER_PORT {port} on 127.0.0.1 is taken by another process" in lines[0], lines
    assert "Traceback" not in out.stderr


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
