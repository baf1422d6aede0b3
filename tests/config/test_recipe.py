"""Every recipe problem a hostile user tried is a one-line RecipeError naming the key,
or the file and line, and `infcl-ds train` exits with 2 before anything heavy starts (no
process group, no model). The typed recipe (config/recipe.py) makes most of them impossible."""
import re

import pytest

from infcl_ds.config import Recipe, RecipeError, dump_recipe, load_recipe
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
    (["deepspeed.overrides=abc"], "deepspeed.overrides must be a mapping, got 'abc'"),
    (["deepspeed.overrides={data_types: 5}"], "deepspeed.overrides.data_types must be a mapping, got 5"),
    (["zero.overrides={bf16: {enabled: false}}"], r"zero.overrides.bf16 is not a ZeRO key .*deepspeed.overrides"),
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
    (["model.compile=true", "zero.stage=3"], "model.compile is not supported with zero.stage=3"),
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


# ---- YAML that parses but cannot be a recipe: one line at the place it is written ----------

def _laughs() -> str:
    """The "billion laughs": 9 levels of 9 aliases each, 9^9 leaves from under 1 KB."""
    text = "zero:\n  overrides:\n    l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n"
    for level in range(1, 10):
        text += f"    l{level}: &l{level} [" + ", ".join([f"*l{level - 1}"] * 9) + "]\n"
    return text


YAML_FILES = [
    ("duplicate-key", "schedule:\n  steps: 2\n  steps: 5000\n",
     r"line 3: duplicate key 'steps' \(first on line 2; YAML would keep only the last\)$"),
    ("duplicate-section", "model:\n  seed: 1\nbatch:\n  chunk: 8\nmodel:\n  seed: 2\n",
     r"line 5: duplicate key 'model' \(first on line 1"),
    ("merge-key", "model:\n  <<: {seed: 1}\n",
     r"line 2: YAML merge key << is not allowed in a recipe; write the keys out$"),
    ("deep", "zero:\n  overrides:\n    a: " + "[" * 20000 + "]" * 20000 + "\n",
     r"line 3: nested more than 32 levels deep$"),
    ("deep-block", "".join("  " * i + "a:\n" for i in range(20000)), r"line 32: nested more than 32 levels deep$"),
    ("int-key", "1: x\n", r"line 1: key '1' is not a name \(YAML reads it as int 1\); quote it if it is one$"),
    ("bool-key", "model:\n  on: 1\n", r"line 2: key 'on' is not a name \(YAML reads it as bool True\)"),
    ("sequence-key", "? [a]\n", r"line 1: a key must be a name, got a sequence$"),
    ("mapping-key", "? {a: 1}\n: x\n", r"line 1: a key must be a name, got a mapping$"),
]


def _load_refused(path, sets, match):
    # load_recipe itself, not train's main: a reader that accepts these goes on to train
    # (or, for the aliases, to hang in start-up); train's main prints the one line.
    with pytest.raises(RecipeError) as err:
        load_recipe(path, sets)
    message = str(err.value)
    assert "\n" not in message and re.search(match, message), message


@pytest.mark.parametrize("content,match", [c[1:] for c in YAML_FILES], ids=[c[0] for c in YAML_FILES])
def test_yaml_beyond_a_recipe_is_one_line_naming_the_file_and_line(tmp_path, content, match):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(content)
    _load_refused(recipe, [], "^" + re.escape(f"recipe: {recipe} ") + match)


def test_billion_laughs_is_refused_at_load_not_expanded_at_start_up(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(_laughs())
    assert len(recipe.read_bytes()) < 1024
    _load_refused(recipe, [], "^" + re.escape(f"recipe: {recipe} line 4: YAML alias *l0 is not allowed in a recipe; "
                                              "write the value out") + "$")


YAML_SETS = [
    ("duplicate-key", "zero.overrides={a: 1, a: 2}",
     r"--set 'zero.overrides=\{a: 1, a: 2\}': duplicate key 'a' \(YAML would keep only the last\)$"),
    ("alias", "zero.overrides={a: &x [1, 2], b: *x}",
     r"--set 'zero.overrides=\{a: &x \[1, 2\], b: \*x\}': YAML alias \*x is not allowed in a recipe"),
    # The 40 KB value is cut short in the message: one readable line.
    ("deep", "zero.overrides=" + "[" * 20000 + "]" * 20000,
     r"--set 'zero.overrides=\[{65}'\.\.\. \(40,015 characters\): nested more than 32 levels deep$"),
    ("int-key", "zero.overrides={1: x}",
     r"--set 'zero.overrides=\{1: x\}': key '1' is not a name \(YAML reads it as int 1\); quote it if it is one$"),
    ("null-key", "zero.overrides={~: x}",
     r"--set 'zero.overrides=\{~: x\}': key '~' is not a name \(YAML reads it as null\)"),
]


@pytest.mark.parametrize("assignment,match", [c[1:] for c in YAML_SETS], ids=[c[0] for c in YAML_SETS])
def test_set_values_follow_the_recipe_files_yaml_rules(assignment, match):
    _load_refused(TINY, [assignment], "^" + match)


def test_quoted_keys_anchors_and_safe_tags_still_load(tmp_path):
    recipe = tmp_path / "recipe.yaml"
    # An anchor nobody refers to is harmless; a quoted "on" is the string.
    recipe.write_text("model: &m\n  seed: 3\ndeepspeed:\n  overrides: {'on': 1, wall_clock_breakdown: !!bool true}\n")
    loaded = load_recipe(recipe)
    assert loaded.model.seed == 3 and loaded.deepspeed.overrides == {"on": 1, "wall_clock_breakdown": True}
    with pytest.raises(Exception, match="could not determine a constructor"):
        load_recipe(None, ["zero.overrides=!!python/object/apply:os.system ['true']"])


def test_a_base_config_nested_thousands_deep_is_one_line(tmp_path):
    deep = tmp_path / "deep.json"
    deep.write_text("[" * 20000 + "]" * 20000)
    message = f"recipe: zero.base_config {deep} is nested too deeply to be a DeepSpeed config"
    _load_refused(None, [f"zero.base_config={deep}"], "^" + re.escape(message) + "$")


def test_a_seed_beyond_32_bits_is_refused_at_load():
    """numpy and Python take 32-bit seeds: 2**32 failed only when the trainer seeded them."""
    from infcl_ds.config import RecipeError, load_recipe
    assert load_recipe(None, [f"model.seed={2 ** 32 - 1}"]).model.seed == 2 ** 32 - 1
    with pytest.raises(RecipeError, match="model.seed"):
        load_recipe(None, [f"model.seed={2 ** 32}"])
