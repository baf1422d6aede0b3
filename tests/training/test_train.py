"""The trainer end to end on 2 gloo ranks: a run killed with SIGKILL and resumed from its
latest checkpoint ends with the same parameters (1e-6) and losses as an uninterrupted one;
recipe errors are refused before any work."""
import csv
import re
import signal
import time

import pytest
import torch

from infcl_ds.checkpoint.tags import read_latest
from infcl_ds.config import RecipeError, check_world, load_recipe
from launch_utils import TINY, start_ranks, wait_all

STEPS = 12


def _final_params(run_dir):
    from infcl_ds.export import load_state_dict_from_checkpoint
    return load_state_dict_from_checkpoint(run_dir)


def _losses(run_dir):
    with open(run_dir / "metrics.csv", newline="") as f:
        return {int(r["step"]): float(r["loss"]) for r in csv.DictReader(f)}


def test_sigkill_and_resume_continue_exactly(tmp_path):
    common = [f"schedule.steps={STEPS}", "checkpoint.every=2", "checkpoint.keep=3"]
    whole, broken = tmp_path / "whole", tmp_path / "broken"
    assert wait_all(start_ranks(2, common + [f"output_dir={whole}"], log_dir=tmp_path)) == [0, 0]

    procs = start_ranks(2, common + [f"output_dir={broken}"], log_dir=tmp_path)
    deadline = time.monotonic() + 240
    while read_latest(broken / "checkpoints") is None and time.monotonic() < deadline:
        time.sleep(0.05)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    assert wait_all(procs) == [-signal.SIGKILL] * 2
    killed_at = read_latest(broken / "checkpoints")
    assert killed_at is not None and killed_at != f"step_{STEPS:08d}", killed_at

    assert wait_all(start_ranks(2, common + [f"output_dir={broken}"], ["--resume", "latest"], log_dir=tmp_path)) == [0, 0]
    want, got = _final_params(whole), _final_params(broken)
    assert want.keys() == got.keys()
    for name in want:
        err = ((got[name].double() - want[name].double()).abs().max() / (want[name].double().abs().max() + 1e-12)).item()
        assert err < 1e-6, (name, err, killed_at)
    # The metrics read as one run: every step once, the same losses.
    assert _losses(broken).keys() == set(range(1, STEPS + 1))
    for step, loss in _losses(whole).items():
        assert abs(_losses(broken)[step] - loss) < 1e-6 * abs(loss), step


# --- recipe errors: one test each --------------------------------------------------------

def test_unknown_key_names_the_nearest_valid_one():
    with pytest.raises(RecipeError, match=r"unknown key batch\.chunks; did you mean batch\.chunk\?"):
        load_recipe(TINY, ["batch.chunks=8"])


def test_unknown_section_names_the_nearest_valid_one():
    with pytest.raises(RecipeError, match=r"unknown key optimiser; did you mean optimizer\?"):
        load_recipe(TINY, ["optimiser.lr=1e-3"])


def test_global_batch_not_divisible_by_world_size():
    recipe = load_recipe(TINY, ["batch.global=513"])
    with pytest.raises(RecipeError, match=r"batch.global=513 is not divisible by the world size 2"):
        check_world(recipe, 2)


def test_chunk_larger_than_local_batch():
    recipe = load_recipe(TINY, ["batch.global=64", "batch.chunk=64"])
    with pytest.raises(RecipeError, match=r"batch.chunk=64 is larger than the local batch 32"):
        check_world(recipe, 2)


def test_wrong_type_and_choice():
    with pytest.raises(RecipeError, match=r"batch.chunk must be an integer"):
        load_recipe(TINY, ["batch.chunk=big"])
    with pytest.raises(RecipeError, match=r"zero.stage must be one of"):
        load_recipe(TINY, ["zero.stage=4"])


@pytest.mark.parametrize("section,overrides,match", [
    ("deepspeed", "gradient_accumulation_steps: 4",
     r"deepspeed.overrides.gradient_accumulation_steps is set by the recipe; use batch.global"),
    ("deepspeed", "bf16: {enabled: false}", r"deepspeed.overrides.bf16 is set by the recipe; use precision.dtype"),
    ("zero", "stage: 3", r"zero.overrides.stage is set by the recipe; use zero.stage"),
    ("deepspeed", "data_types: {grad_accum_dtype: fp32}", r"grad_accum_dtype is not supported with bf16"),
])
def test_overrides_cannot_change_what_the_recipe_owns(tmp_path, section, overrides, match):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("precision: {dtype: bf16}\nzero:\n  stage: 1\n")
    with pytest.raises(RecipeError, match=match):
        load_recipe(recipe, [f"{section}.overrides={{{overrides}}}"])
    # Keys DeepSpeed owns alone pass through.
    recipe.write_text("zero:\n  stage: 2\n  overrides: {reduce_bucket_size: 1000000}\n")
    assert load_recipe(recipe).zero.overrides == {"reduce_bucket_size": 1000000}


def test_cli_refuses_a_bad_recipe_before_any_work(capsys):
    from infcl_ds.train import main
    assert main(["--config", str(TINY), "--set", "schedul.steps=3"]) == 2
    assert "did you mean schedule?" in capsys.readouterr().err


def test_a_copy_of_a_packaged_base_config_trains_and_is_named_once(tmp_path):
    import shutil

    from infcl_ds.resources import package_file
    base = tmp_path / "zero2.json"
    shutil.copy(str(package_file("ds_configs", "zero2.json")), base)
    procs = start_ranks(2, [f"output_dir={tmp_path / 'run'}", "zero.stage=2", f"zero.base_config={base}",
                            "schedule.steps=1", "checkpoint.every=1"], log_dir=tmp_path)
    assert wait_all(procs) == [0, 0]
    logs = [(tmp_path / f"rank{rank}.log").read_text() for rank in range(2)]
    line = (f"infcl-ds train: zero.base_config {base}: gradient_clipping, bf16 are set by the recipe; its "
            f"optimizer.grad_clip=0.0, precision.dtype=fp32 are used, not the base config's values\n")
    assert logs[0].count(line) == 1 and "zero.base_config" not in logs[1], logs


def test_every_rank_refuses_an_indivisible_batch(tmp_path):
    # Raised by check_world on each rank after joining, before any collective: no hang.
    procs = start_ranks(2, ["batch.global=15", f"output_dir={tmp_path}"], log_dir=tmp_path)
    assert wait_all(procs, timeout=120) == [2, 2]
    for rank in range(2):
        assert "not divisible by the world size 2" in (tmp_path / f"rank{rank}.log").read_text()


def test_chunk_auto_resolves_alike_on_every_rank(tmp_path):
    # batch.chunk=auto on CPU ranks (no GPU to plan for): min(64, the local batch of 8); the run
    # trains with it and its saved recipe holds the number, so a resume needs no planning.
    import yaml
    procs = start_ranks(2, ["batch.chunk=auto", "schedule.steps=2", f"output_dir={tmp_path}"], log_dir=tmp_path)
    assert wait_all(procs, timeout=300) == [0, 0]
    # rank 0's one line of what every `auto` became
    assert re.search(r"^auto: .*batch\.chunk=8 \(a CPU rank\)", (tmp_path / "rank0.log").read_text(), re.M)
    saved = yaml.safe_load(next((tmp_path / "checkpoints").glob("step_*/recipe.yaml")).read_text())
    assert saved["batch"]["chunk"] == 8


def test_digits_run_evaluates_like_the_eval_command(tmp_path):
    # Real shards, the quickstart's model, 3 steps on 2 ranks: the trainer's final zero-shot
    # evaluation equals `infcl-ds eval` on the checkpoint it wrote.
    import json

    from infcl_ds.data.commands.digits import build_digits
    from infcl_ds.eval.evaluate_checkpoint import main as eval_main
    build_digits(tmp_path / "digits")
    run = tmp_path / "run"
    overrides = ["model.name=infcl-tiny-digits", "data.source=webdataset", f"data.train={tmp_path}/digits/train",
                 f"data.eval={tmp_path}/digits/test", "batch.global=64", "batch.chunk=16", "schedule.steps=3",
                 f"output_dir={run}"]
    assert wait_all(start_ranks(2, overrides, log_dir=tmp_path)) == [0, 0]
    log = (tmp_path / "rank0.log").read_text()
    line = next(l for l in log.splitlines() if l.startswith("zero-shot top-1:"))
    trained = json.loads((run / "eval.json").read_text())
    assert float(line.split(":")[1]) == pytest.approx(trained["zeroshot_top1"], abs=1e-4)
    out = tmp_path / "eval.json"
    assert eval_main(["--checkpoint", str(run), "--data", f"{tmp_path}/digits/test", "--out", str(out)]) == 0
    again = json.loads(out.read_text())["metrics"]
    for key, value in trained.items():
        assert again[key] == pytest.approx(value, abs=1e-6), key
