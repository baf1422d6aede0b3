"""A run's DeepSpeed checkpoint (ZeRO 0 and 2, fp32, one gloo rank) exports to a state dict
that open_clip loads strictly, equal to the engine's weights after a step, with a 0-dim
logit_scale; the exported model scores the same under open_clip's zero-shot code as ours."""
import json
import subprocess
import sys
import types
from pathlib import Path

import open_clip
import pytest
import torch

from dist_utils import run_ranks
from infcl_ds.eval import build_zero_shot_classifier, zero_shot_accuracy
from infcl_ds.eval.cli import main as eval_main
from infcl_ds.export import export, load_exported, load_state_dict_from_checkpoint, main as export_main
from infcl_ds.models import create_model, get_tokenizer
from infcl_ds.training.safe_load import CheckpointError
from test_eval import CLASSNAMES, TEMPLATES, FakeEvalData, open_clip_train_accuracy

NAME, TAG, BATCH, CHUNK = "infcl-tiny", "step_000001", 8, 4


def _train_and_save(rank, world, stage, checkpoints):
    from infcl_ds.engine import ContrastiveEngine
    model = create_model(NAME, seed=0)
    config = {"train_micro_batch_size_per_gpu": CHUNK, "gradient_accumulation_steps": 1, "gradient_clipping": 0.0,
              "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}
    step = ContrastiveEngine.create(model, config, CHUNK, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-3))
    g = torch.Generator().manual_seed(1)
    step.train_step(torch.randn(BATCH, 3, 16, 16, generator=g), torch.randint(1, 1000, (BATCH, 16), generator=g))
    step.engine.save_checkpoint(checkpoints, tag=TAG)
    from infcl_ds.training.manifest import write_manifest
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
    from infcl_ds.data import digits
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
def test_export_out_that_is_not_a_file_is_one_line_before_the_checkpoint_is_read(out, tmp_path, capsys):
    """--out a directory or a device: one line naming it, exit 2, nothing read or written
    (the checkpoint here does not even exist: --out is checked first)."""
    from infcl_ds.export import main as export_main
    if out == "a directory":
        out = str(tmp_path)
    assert export_main(["--checkpoint", str(tmp_path / "no-run"), "--out", out]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and f"--out {out} is " in err, err


def test_eval_batch_size_zero_is_one_line(tmp_path, capsys):
    with pytest.raises(SystemExit) as stop:
        eval_main(["--checkpoint", str(tmp_path), "--data", str(tmp_path), "--batch-size", "0"])
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and "--batch-size: must be at least 1, got 0" in err


def test_readme_export_line_loads_a_tiny_model_in_a_plain_open_clip(run, tmp_path, capsys):
    """`infcl-ds export` of a tiny model writes its config beside the file and says how to load
    it: a process that never imports infcl_ds loads it strictly."""
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
