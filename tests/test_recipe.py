"""Every recipe finding of the outside probe (issue 15) is a one-line RecipeError naming the key,
or the file and line, and `infcl-ds train` exits with 2 before anything heavy starts (no
process group, no model). The typed recipe (config/recipe.py) makes most of them impossible."""
import re

import pytest

from infcl_ds.config import Recipe, dump_recipe, load_recipe
from infcl_ds.train import main as train_main
from launch_utils import TINY

SETS = [
    (["data.eval=5"], "data.eval must be a string, got 5"),
    (["optimizer.betas=abc"], "optimizer.betas must be a list, got 'abc'"),
    (["optimizer.betas=[2,3]"], r"optimizer.betas\[0\] must be < 1"),
    (["optimizer.betas=[0.9]"], "optimizer.betas must have at least 2 entries"),
    (["data.source=csv", "data.train=7"], "data.train must be a path or a list of paths, got int 7"),
    (["zero.overrides=[1,2]"], r"zero.overrides must be a mapping, got \[1, 2\]"),
    (["zero.overrides=abc"], "zero.overrides must be a mapping, got 'abc'"),
    (["zero.overrides={zero_optimization: 5}"], "zero.overrides.zero_optimization must be a mapping, got 5"),
    (["zero.base_config=/etc/passwd"], "zero.base_config /etc/passwd line 1 is not a JSON DeepSpeed config"),
    (["optimizer.weight_decay=-5"], "optimizer.weight_decay must be >= 0"),
    (["schedule.min_lr_ratio=5"], "schedule.min_lr_ratio must be <= 1"),
    (["checkpoint.every=-1"], "checkpoint.every must be >= 0"),
    (["checkpoint.keep=0"], "checkpoint.keep must be >= 1"),
    (["checkpoint.keep=-1"], "checkpoint.keep must be >= 1"),
    (["data.csv_separator=123"], "data.csv_separator must be a string, got 123"),
    (["optimizer.lr=.inf"], "optimizer.lr must be a finite number, got inf"),
    (["optimizer.lr=.nan"], "optimizer.lr must be a finite number, got nan"),
    (["optimizer.eps=-1"], "optimizer.eps must be > 0"),
    (["model.seed=-1"], "model.seed must be >= 0"),
    (["model.name=ViT-B-61"], "model.name 'ViT-B-61' is not an open_clip architecture; closest: ViT-B-16"),
    (["eval.batch_size=0"], "eval.batch_size must be >= 1"),
    (["batch.global=true"], "batch.global must be an integer, got True"),
    (["batch.chunk=1024"], "batch.chunk=1024 is larger than batch.global=512"),
    (["data.source=synthetic", "data.synthetic_size=100"],
     r"data.synthetic_size=100 is smaller than one global batch \(batch.global=512\)"),
    (["schedule.warmup_steps=500"], r"schedule.warmup_steps must be in \[0, schedule.steps=200\]"),
    (["optimizer.lr=[1"], r"--set 'optimizer.lr=\[1': not a YAML value"),
    (["model.compile=true", "zero.stage=3"], "model.compile=true is not supported with zero.stage=3"),
]
FILES = [
    ("", "is empty"),
    ("- 1\n- 2\n", "must be a mapping of sections, got a list"),
    ("model:\n  name: [a\nbatch: 3\n", "line 3: expected ',' or ']'"),
    ("model: !!python/object/apply:os.system ['touch PWNED']\n",
     "line 1: could not determine a constructor for the tag 'tag:yaml.org,2002:python/object/apply:os.system'"),
    (bytes(range(256)), r"is not a text \(YAML\) file"),
]


def _refused(capsys, argv, match):
    assert train_main(argv) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("infcl-ds train: recipe: ") or lines[0].startswith("infcl-ds train: --set "), err
    assert re.search(match, lines[0]), err


@pytest.mark.parametrize("sets,match", SETS, ids=[" ".join(s) for s, _ in SETS])
def test_set_findings_are_one_line_errors_with_exit_code_2(capsys, sets, match):
    argv = ["--config", str(TINY)]
    for assignment in sets:
        argv += ["--set", assignment]
    _refused(capsys, argv, match)


@pytest.mark.parametrize("content,match", FILES, ids=["empty", "list", "syntax", "python-tag", "binary"])
def test_file_findings_are_one_line_errors_with_exit_code_2(capsys, tmp_path, content, match):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_bytes(content if isinstance(content, bytes) else content.encode())
    _refused(capsys, ["--config", str(recipe), "--set", "batch.chunk=8"], str(recipe) + ".*" + match)
    assert not (tmp_path / "PWNED").exists() and list(tmp_path.iterdir()) == [recipe]


def test_config_naming_a_directory(capsys, tmp_path):
    _refused(capsys, ["--config", str(tmp_path)], "is a directory, not a recipe file")


def test_defaults_and_shipped_recipes_round_trip_through_yaml(tmp_path):
    default = Recipe()
    assert load_recipe(None) == default
    recipe = load_recipe(TINY)
    dumped = tmp_path / "dumped.yaml"
    dumped.write_text(dump_recipe(recipe))
    assert load_recipe(dumped) == recipe
    assert recipe.batch.global_size == 512 and "global: 512" in dumped.read_text()


def test_a_section_without_keys_takes_its_defaults(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model:\nbatch:\n  global: 64\n  chunk: 8\n")
    loaded = load_recipe(recipe)
    assert loaded.model == Recipe().model and loaded.batch.global_size == 64
    assert loaded.data.synthetic_size == 4096  # the default, at least one global batch
    assert load_recipe(None, ["batch.global=8192"]).data.synthetic_size == 8192


def test_compile_auto_is_on_for_cuda_ranks_under_zero_0_to_2_only():
    assert load_recipe(None, []).model.compile == "auto"
    for stage, cuda in ((0, True), (2, True), (3, False)):
        recipe = load_recipe(None, [f"zero.stage={stage}"])
        assert recipe.compiles("cuda") is cuda and recipe.compiles("cpu") is False
    assert load_recipe(None, ["model.compile=true"]).compiles("cpu") is True
    assert load_recipe(None, ["model.compile=false"]).compiles("cuda") is False
