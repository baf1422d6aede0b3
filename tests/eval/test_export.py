"""A run's DeepSpeed checkpoint (ZeRO 0 and 2, fp32, one gloo rank) exports to a state dict
that open_clip loads strictly, equal to the engine's weights after a step, with a 0-dim
logit_scale; the exported model scores the same under open_clip's zero-shot code as ours.
The default format, an open_clip model folder, loads through open_clip's `local-dir:` alone and
scores what `infcl-ds eval` scores; an existing folder is replaced only if an export wrote all
of it, and a failed write leaves the earlier one as it was."""
import errno
import json
import os
import subprocess
import sys
import types
from pathlib import Path

import open_clip
import pytest
import torch

from dist_utils import run_ranks
from infcl_ds.checkpoint.safe_load import CheckpointError
from infcl_ds.eval import build_zero_shot_classifier, zero_shot_accuracy
from infcl_ds.eval.evaluate_checkpoint import main as eval_main
from infcl_ds.export import export, load_exported, load_state_dict_from_checkpoint, main as export_main
from infcl_ds.models import CONFIG_DIR, create_model, get_tokenizer, model_info
from test_eval import CLASSNAMES, TEMPLATES, FakeEvalData, open_clip_train_accuracy

NAME, TAG, BATCH, CHUNK = "infcl-tiny", "step_000001", 8, 4


def _train_and_save(rank, world, stage, checkpoints):
    from infcl_ds.engine import ContrastiveEngine, EngineSettings
    model = create_model(NAME, seed=0)
    config = {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    step = ContrastiveEngine.create(model, config, EngineSettings(CHUNK),
                                    optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(1)
    step.train_step(torch.randn(BATCH, 3, 16, 16, generator=g), torch.randint(1, 1000, (BATCH, 16), generator=g))
    step.deepspeed.save_checkpoint(checkpoints, tag=TAG)
    from infcl_ds.checkpoint.manifest import write_manifest
    write_manifest(Path(checkpoints) / TAG, recipe_sha256="")  # as the trainer's save does
    return {name: param.detach().clone() for name, param in step.model.named_parameters()}


@pytest.fixture(scope="module", params=[0, 2], ids=["zero0", "zero2"])
def run(request, tmp_path_factory):
    """(run directory, the engine's parameters after one step) for one ZeRO stage."""
    run_dir = tmp_path_factory.mktemp(f"run_zero{request.param}")
    (run_dir / "recipe.yaml").write_text(f"model:\n  name: {NAME}\n")
    weights = run_ranks(_train_and_save, 1, request.param, str(run_dir / "checkpoints"))[0]
    return run_dir, weights


@pytest.mark.parametrize("where", ["run", "checkpoints", "tag"])
def test_export_loads_strictly_with_the_engine_weights(run, where, tmp_path):
    run_dir, weights = run
    checkpoint_dir = {"run": run_dir, "checkpoints": run_dir / "checkpoints",
                      "tag": run_dir / "checkpoints" / TAG}[where]
    export(checkpoint_dir, tmp_path / "model.pt")
    state_dict = torch.load(tmp_path / "model.pt", weights_only=True)
    open_clip.create_model(NAME).load_state_dict(state_dict, strict=True)

    assert state_dict["logit_scale"].dim() == 0
    fresh = create_model(NAME, seed=0).state_dict()
    assert not torch.equal(state_dict["visual.conv1.weight"], fresh["visual.conv1.weight"])  # the step moved it
    assert set(state_dict) == set(weights)
    for name, value in weights.items():
        assert state_dict[name].dtype == torch.float32
        assert torch.equal(state_dict[name], value.reshape(fresh[name].shape)), name


def test_tag_argument_and_mismatch(run):
    run_dir, _ = run
    by_tag = load_state_dict_from_checkpoint(run_dir, tag=TAG)
    by_latest = load_state_dict_from_checkpoint(run_dir)
    assert all(torch.equal(by_tag[k], by_latest[k]) for k in by_tag)
    with pytest.raises(CheckpointError, match="no checkpoint 'step_999999'"):
        load_state_dict_from_checkpoint(run_dir, tag="step_999999")
    with pytest.raises(ValueError):
        load_state_dict_from_checkpoint(run_dir / "checkpoints" / TAG, tag="step_999999")


def _labelled_set(tokenizer, n=30):
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, len(CLASSNAMES), (n,), generator=g)
    texts = tokenizer([f"a handwritten {CLASSNAMES[y]}" for y in labels.tolist()])
    return FakeEvalData(torch.randn(n, 3, 16, 16, generator=g), labels, texts)


def test_exported_model_zero_shot_matches_open_clip(run, tmp_path, capsys):
    run_dir, _ = run
    assert export_main(["--checkpoint", str(run_dir), "--out", str(tmp_path / "model.pt")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "model.pt" in lines[0]

    model = load_exported(tmp_path / "model.pt", NAME)
    tokenizer = get_tokenizer(NAME)
    data = _labelled_set(tokenizer)
    ours = zero_shot_accuracy(model, build_zero_shot_classifier(model, tokenizer, CLASSNAMES, TEMPLATES, "cpu"),
                              data, "cpu")
    legacy = open_clip.build_zero_shot_classifier_legacy(model, tokenizer, CLASSNAMES, TEMPLATES, device="cpu")
    assert ours == pytest.approx(open_clip_train_accuracy(model, legacy, data), abs=1e-9)


def test_eval_cli(run, tmp_path, monkeypatch, capsys):
    """The eval command on a fake infcl_ds.data (the real one is another module's job)."""
    run_dir, _ = run
    seen = {}

    def build_eval_data(path, *, image_size, tokenizer, batch_size=256, mean, std):
        seen.update(path=path, image_size=image_size, batch_size=batch_size, mean=mean, std=std)
        return _labelled_set(tokenizer)

    monkeypatch.setitem(sys.modules, "infcl_ds.data", types.SimpleNamespace(build_eval_data=build_eval_data))
    out = tmp_path / "metrics.json"
    assert eval_main(["--checkpoint", str(run_dir), "--data", "SPLIT", "--batch-size", "16", "--out", str(out)]) == 0
    assert seen == {"path": "SPLIT", "image_size": 16, "batch_size": 16,
                    "mean": open_clip.OPENAI_DATASET_MEAN, "std": open_clip.OPENAI_DATASET_STD}
    printed = capsys.readouterr().out
    metrics = json.loads(out.read_text())["metrics"]
    assert f"zero-shot top-1: {metrics['zeroshot_top1']:.4f}" in printed
    assert f"image->text R@1: {metrics['image_to_text_R@1']:.4f}" in printed


@pytest.fixture(scope="module")
def digits_split(tmp_path_factory):
    """The held-out split of the real digits data set, at infcl-tiny's image size."""
    from infcl_ds.data.commands import digits
    out = tmp_path_factory.mktemp("digits")
    digits.build_digits(out, image_size=16)
    return out / "test"


def test_eval_cli_on_real_digits(run, digits_split, tmp_path):
    """The eval command end to end: the real data pipeline's batches, an exported checkpoint."""
    run_dir, _ = run
    out = tmp_path / "metrics.json"
    assert eval_main(["--checkpoint", str(run_dir), "--data", str(digits_split), "--out", str(out)]) == 0
    metrics = json.loads(out.read_text())["metrics"]
    assert len(metrics) == 8
    # The zero-shot scores are what open_clip_train's loop gives the same weights on the same
    # batches with open_clip's own classifier.
    from infcl_ds.data import build_eval_data
    model = open_clip.create_model(NAME)
    model.load_state_dict(load_state_dict_from_checkpoint(run_dir))
    model.eval()
    tokenizer = get_tokenizer(NAME)
    data = build_eval_data(str(digits_split), image_size=16, tokenizer=tokenizer, mean=open_clip.OPENAI_DATASET_MEAN,
                           std=open_clip.OPENAI_DATASET_STD)
    legacy = open_clip.build_zero_shot_classifier_legacy(model, tokenizer, data.classnames, data.templates,
                                                         device="cpu")
    theirs = open_clip_train_accuracy(model, legacy, data)
    assert metrics["zeroshot_top1"] == pytest.approx(theirs["top1"], abs=1e-9)
    assert metrics["zeroshot_top5"] == pytest.approx(theirs["top5"], abs=1e-9)
    for direction in ("image_to_text", "text_to_image"):
        recall = [metrics[f"{direction}_R@{k}"] for k in (1, 5, 10)]
        assert 0 <= recall[0] <= recall[1] <= recall[2] <= 1, recall


@pytest.mark.parametrize("out", ["a directory", "/dev/full"])
@pytest.mark.parametrize("fmt", ["pt", "open_clip"])
def test_export_out_that_is_not_a_file_is_one_line_before_the_checkpoint_is_read(out, fmt, tmp_path, capsys):
    """--out a directory (for a file; for a folder: one it did not write) or a device: one line
    naming it, exit 2, nothing read or written (the checkpoint here does not even exist: --out
    is checked first)."""
    if out == "a directory":
        out = str(tmp_path)
    assert export_main(["--checkpoint", str(tmp_path / "no-run"), "--out", out, "--format", fmt]) == 2
    err = capsys.readouterr().err.strip()
    said = f"--out {out} exists and was not written by" if (out, fmt) == (str(tmp_path), "open_clip") else \
        f"--out {out} is "
    assert len(err.splitlines()) == 1 and said in err, err


def test_eval_batch_size_zero_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        eval_main(["--checkpoint", str(tmp_path), "--data", str(tmp_path), "--batch-size", "0"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "--batch-size: must be at least 1, got 0" in err


ZERO0 = pytest.mark.parametrize("run", [0], indirect=True, ids=["zero0"])  # where one stage tells all


@ZERO0
def test_format_pt_of_a_tiny_model_loads_in_a_plain_open_clip(run, tmp_path, capsys):
    """`infcl-ds export --out model.pt` of a tiny model writes its config beside the file and
    says how to load it: a process that never imports infcl_ds loads it strictly."""
    run_dir, _ = run
    out = tmp_path / "model.pt"
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    config = tmp_path / f"{NAME}.json"
    assert f"open_clip.add_model_config({str(config)!r}) before open_clip.create_model({NAME!r})" in \
        capsys.readouterr().out.splitlines()[0]
    program = (f"import open_clip, torch; open_clip.add_model_config({str(config)!r}); "
               f"open_clip.create_model({NAME!r}).load_state_dict(torch.load({str(out)!r}), strict=True); "
               "print('loaded')")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.stdout.strip().endswith("loaded"), done.stderr[-2000:]


# --- the open_clip model folder (--format open_clip, the default) ------------------------------

def _snapshot(folder: Path):
    """Every file under ``folder``, by relative path, with its bytes (and every directory)."""
    return {str(path.relative_to(folder)): path.read_bytes() if path.is_file() else None for path in folder.rglob("*")}


def _leftovers(parent: Path):
    return [name for name in os.listdir(parent) if ".partial-" in name or ".replaced-" in name]


def test_folder_loads_through_local_dir_alone_with_the_checkpoint_weights(run, tmp_path, capsys):
    run_dir, _ = run
    out = tmp_path / "model"
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    assert f"open_clip.create_model_and_transforms('local-dir:{out}') loads it" in capsys.readouterr().out
    assert sorted(os.listdir(out)) == ["open_clip_config.json", "open_clip_model.safetensors"]
    config = json.loads((out / "open_clip_config.json").read_text())
    shipped = json.loads((CONFIG_DIR / f"{NAME}.json").read_text())
    assert config == {"model_cfg": shipped, "preprocess_cfg": {
        "mean": list(open_clip.OPENAI_DATASET_MEAN), "std": list(open_clip.OPENAI_DATASET_STD),
        "interpolation": "bicubic", "resize_mode": "shortest", "size": [16, 16]}}

    model, _, preprocess = open_clip.create_model_and_transforms(f"local-dir:{out}")  # strict=True inside
    expected = load_state_dict_from_checkpoint(run_dir)
    loaded = model.state_dict()
    assert set(loaded) == set(expected) and loaded["logit_scale"].dim() == 0
    assert all(torch.equal(loaded[key], value) for key, value in expected.items())
    normalize = preprocess.transforms[-1]
    assert (tuple(normalize.mean), tuple(normalize.std)) == (open_clip.OPENAI_DATASET_MEAN,
                                                              open_clip.OPENAI_DATASET_STD)
    texts = ["a handwritten seven", "the digit " * 20]  # the second beyond the context length
    assert torch.equal(open_clip.get_tokenizer(f"local-dir:{out}")(texts), get_tokenizer(NAME)(texts))


def test_folder_zero_shot_equals_eval(run, digits_split, tmp_path):
    """The folder, its model, tokenizer and preprocessing all from `local-dir:`, scores on the
    held-out digits what `infcl-ds eval` scores on the same checkpoint, with the same logits."""
    from infcl_ds.data import build_eval_data
    run_dir, _ = run
    out, metrics_file = tmp_path / "model", tmp_path / "metrics.json"
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    assert eval_main(["--checkpoint", str(run_dir), "--data", str(digits_split), "--out", str(metrics_file)]) == 0
    metrics = json.loads(metrics_file.read_text())["metrics"]

    model = open_clip.create_model(f"local-dir:{out}").eval()
    tokenizer = open_clip.get_tokenizer(f"local-dir:{out}")
    info = model_info(model)  # read off the folder's preprocess_cfg, as eval reads its model's
    data = build_eval_data(str(digits_split), image_size=info["image_size"], tokenizer=tokenizer,
                           mean=info["mean"], std=info["std"])
    classifier = build_zero_shot_classifier(model, tokenizer, data.classnames, data.templates, "cpu")
    accuracy = zero_shot_accuracy(model, classifier, data, "cpu")
    assert accuracy["top1"] == metrics["zeroshot_top1"] and accuracy["top5"] == metrics["zeroshot_top5"]

    ours = create_model(NAME)  # the model `infcl-ds eval` builds
    ours.load_state_dict(load_state_dict_from_checkpoint(run_dir), strict=True)
    ours.eval()
    ours_classifier = build_zero_shot_classifier(ours, get_tokenizer(NAME), data.classnames, data.templates, "cpu")
    images = next(iter(data))[0]
    with torch.no_grad():
        assert torch.equal(model.encode_image(images) @ classifier, ours.encode_image(images) @ ours_classifier)


def test_a_siglip_folder_builds_its_logit_bias_in_open_clip(tmp_path):
    """The loss's arguments travel in the folder's model_cfg: open_clip alone builds the
    SigLIP model's logit_bias, and its weights load strictly (no checkpoint needed)."""
    from infcl_ds.export import write_model_folder
    state_dict = create_model(NAME, seed=0, loss="siglip").state_dict()
    write_model_folder(tmp_path, state_dict, NAME, source=tmp_path)
    model = open_clip.create_model(f"local-dir:{tmp_path}")
    assert model.logit_bias is not None
    assert all(torch.equal(model.state_dict()[key], value) for key, value in state_dict.items())


@ZERO0
def test_folder_loads_in_a_python_that_never_imports_infcl_ds(run, tmp_path):
    """The README's line: the folder is self-contained, the tiny architecture's config in it."""
    run_dir, _ = run
    out = tmp_path / "model"
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    program = (f"import open_clip; m, _, p = open_clip.create_model_and_transforms('local-dir:{out}'); "
               f"t = open_clip.get_tokenizer('local-dir:{out}'); "
               "print('loaded', m.visual.image_size, t.context_length, sorted(open_clip.list_models())[-1])")
    done = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    line = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    assert line.startswith("loaded (16, 16) 16 ") and NAME not in line, done.stderr[-2000:]


@ZERO0
@pytest.mark.parametrize("name, fmt, written", [("model.pt", None, "file"), ("model", None, "folder"),
                                                ("weights.bin", "pt", "file"), ("model.pt", "open_clip", "folder")])
def test_format_follows_out_unless_given(run, tmp_path, name, fmt, written):
    run_dir, _ = run
    out = tmp_path / name
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out)] + (["--format", fmt] if fmt else [])) == 0
    assert (out.is_file(), out.is_dir()) == (written == "file", written == "folder")
    assert (tmp_path / f"{NAME}.json").exists() == (written == "file")  # the config beside a file only


def _export_line(capsys, argv):
    assert export_main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("infcl-ds export: "), err
    return err[len("infcl-ds export: "):]


@ZERO0
@pytest.mark.parametrize("case", ["inside the checkpoints", "a foreign folder", "an empty folder",
                                  "open_clip's own folder", "a foreign file inside", "our state dict file"])
def test_folder_refusals_leave_everything_as_it_was(run, tmp_path, capsys, case):
    run_dir, _ = run
    out = tmp_path / "model"
    said = f"--out {out} exists and was not written by infcl-ds export: not replaced; remove it or name another folder"
    if case == "inside the checkpoints":
        out = run_dir / "checkpoints" / "exported"
        said = f"--out {out} is inside {run_dir / 'checkpoints'}, the checkpoints that --checkpoint reads"
    elif case == "a foreign folder":
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    elif case == "an empty folder":
        out.mkdir()
    elif case == "open_clip's own folder":  # the layout without our metadata: someone's download
        from safetensors.torch import save_file
        out.mkdir()
        (out / "open_clip_config.json").write_text('{"model_cfg": {}}')
        save_file({"w": torch.zeros(1)}, out / "open_clip_model.safetensors")
    elif case == "a foreign file inside":
        assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
        (out / "notes.txt").write_text("mine")
        said = f"--out {out} holds notes.txt, which infcl-ds export did not write: not replaced"
    else:
        out = tmp_path / "model.pt"
        assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
        said = f"--out {out} is a state dict file from infcl-ds export --format pt"
    before, checkpoints = _snapshot(tmp_path), _snapshot(run_dir / "checkpoints")
    assert said in _export_line(capsys, ["--checkpoint", str(run_dir), "--out", str(out), "--format", "open_clip"])
    assert _snapshot(tmp_path) == before and _snapshot(run_dir / "checkpoints") == checkpoints


@ZERO0
def test_format_pt_keeps_a_foreign_file_where_its_config_goes(run, tmp_path, capsys):
    run_dir, _ = run
    (tmp_path / f"{NAME}.json").write_text('{"mine": 1}')
    message = _export_line(capsys, ["--checkpoint", str(run_dir), "--out", str(tmp_path / "model.pt")])
    assert message.startswith(f"{tmp_path / (NAME + '.json')} exists and was not written by infcl-ds export")
    assert sorted(os.listdir(tmp_path)) == [f"{NAME}.json"] and (tmp_path / f"{NAME}.json").read_text() == '{"mine": 1}'


@ZERO0
def test_folder_replaces_an_earlier_export(run, tmp_path):
    run_dir, _ = run
    out = tmp_path / "model"
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    (out / "open_clip_config.json").write_text("{}")  # an earlier export's file, changed since
    inode = (out / "open_clip_model.safetensors").stat().st_ino
    assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    assert (out / "open_clip_model.safetensors").stat().st_ino != inode
    assert json.loads((out / "open_clip_config.json").read_text())["model_cfg"] == \
        json.loads((CONFIG_DIR / f"{NAME}.json").read_text())
    assert sorted(os.listdir(tmp_path)) == ["model"] and sorted(os.listdir(out)) == [
        "open_clip_config.json", "open_clip_model.safetensors"]


@ZERO0
@pytest.mark.parametrize("where", ["writing the weights", "renaming the new folder in", "writing a first export"])
def test_a_failed_folder_write_leaves_the_earlier_export_as_it_was(run, tmp_path, capsys, monkeypatch, where):
    import safetensors.torch
    run_dir, _ = run
    out = tmp_path / "model"
    if where != "writing a first export":
        assert export_main(["--checkpoint", str(run_dir), "--out", str(out)]) == 0
    before = _snapshot(out) if out.exists() else None
    full = OSError(errno.ENOSPC, "No space left on device")
    if where == "renaming the new folder in":
        rename = os.rename

        def failing_rename(src, dst):
            if ".partial-" in str(src):
                raise full
            rename(src, dst)
        monkeypatch.setattr(os, "rename", failing_rename)
    else:
        def half_written(tensors, path, metadata=None):
            Path(path).write_bytes(b"half")
            raise full
        monkeypatch.setattr(safetensors.torch, "save_file", half_written)
    message = _export_line(capsys, ["--checkpoint", str(run_dir), "--out", str(out)])
    assert message == f"--out {out}: writing failed ([Errno 28] No space left on device)"
    assert (_snapshot(out) if out.exists() else None) == before and not _leftovers(tmp_path)
