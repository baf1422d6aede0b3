"""Numbers in a recipe are numbers (a YAML boolean never is one), every size and count has an upper
bound, and each choice names the valid values: one-line RecipeErrors naming the key, at load,
before anything is launched (config/recipe.py, config/deepspeed_config.py)."""
import json
import re
from pathlib import Path

import pytest
import torch

from launch_utils import TINY, data_check
from test_recipe import _load_refused, _refused

from infcl_ds.config import load_recipe
from infcl_ds.config.recipe import MAX_GIB, MAX_IMAGE_BYTES, MAX_PROCESSES, MAX_SAMPLES, MAX_STEPS
from infcl_ds.data.sources.samples import MAX_IMAGE_BYTES as DATA_MAX_IMAGE_BYTES
from infcl_ds.plan.command import main as plan_main

RECIPES = sorted((Path(__file__).resolve().parents[2] / "ds_configs" / "recipes").glob("*.yaml"))

# A YAML boolean where a number belongs (yes/on/true are booleans in YAML 1.1).
BOOLEANS = [
    ("optimizer.lr=yes", "optimizer.lr must be a number, got True"),
    ("optimizer.weight_decay=on", "optimizer.weight_decay must be a number, got True"),
    ("optimizer.eps=true", "optimizer.eps must be a number, got True"),
    ("optimizer.grad_clip=yes", "optimizer.grad_clip must be a number, got True"),
    ("optimizer.betas=[0.9, true]", "optimizer.betas[1] must be a number, got True"),
    ("schedule.min_lr_ratio=off", "schedule.min_lr_ratio must be a number, got False"),
    ("data.decode_window_gib=on", "data.decode_window_gib must be auto or a number > 0 and <= 16,384, got True"),
    ("data.gpu_decode_window_gib=on", "data.gpu_decode_window_gib must be auto or a number > 0 and <= 16,384, "
                                      "got True"),
    ("data.keep_decoded_gib=true", "data.keep_decoded_gib must be auto or a number from 0 to 16,384, got True"),
    ("data.gpu_decode_share=yes", "data.gpu_decode_share must be auto or a number from 0 to 1, got True"),
    ("distributed.timeout=yes", "distributed.timeout must be a number of minutes from 1/60 (one second) to 525,600 (a year), "
                                "got True"),
    ("batch.global=true", "batch.global must be an integer, got True"),
]
# Sizes and counts beyond what a machine (or the run's bookkeeping) holds.
BOUNDS = [
    ("data.decode_window_gib=1.0e+308", "data.decode_window_gib must be auto or a number > 0 and <= 16,384, "
                                        "got 1e+308"),
    ("data.decode_window_gib=0", "data.decode_window_gib must be auto or a number > 0 and <= 16,384, got 0"),
    ("data.gpu_decode_window_gib=0", "data.gpu_decode_window_gib must be auto or a number > 0 and <= 16,384, got 0"),
    ("data.keep_decoded_gib=1.0e+308", "data.keep_decoded_gib must be auto or a number from 0 to 16,384, got 1e+308"),
    (f"batch.global={2 * 10 ** 62}", f"batch.global must be <= 1,073,741,824, got {2 * 10 ** 62}"),
    (f"batch.chunk={2 ** 40}", f"batch.chunk must be an integer from 1 to 1,073,741,824 or auto, got {2 ** 40}"),
    ("data.workers=100000", "data.workers must be <= 1,024, got 100000"),
    ("data.decode_workers=100000", "data.decode_workers must be auto or an integer from 0 to 1,024, got 100000"),
    (f"data.worker_batch={10 ** 12}", f"data.worker_batch must be <= 1,073,741,824, got {10 ** 12}"),
    (f"eval.batch_size={10 ** 12}", f"eval.batch_size must be <= 65,536, got {10 ** 12}"),
    (f"data.synthetic_size={2 ** 31}", f"data.synthetic_size must be <= 1,073,741,824, got {2 ** 31}"),
    (f"data.image_bytes={2 ** 40}", f"data.image_bytes must be <= 67,108,864, got {2 ** 40}"),
    (f"schedule.steps={10 ** 8}", f"schedule.steps must be <= 99,999,999, got {10 ** 8}"),
    (f"schedule.warmup_steps={10 ** 8}", f"schedule.warmup_steps must be <= 99,999,999, got {10 ** 8}"),
    (f"checkpoint.every={10 ** 8}", "checkpoint.every must be <= 99,999,999"),
    (f"checkpoint.keep={10 ** 8}", "checkpoint.keep must be <= 99,999,999"),
    (f"logging.every={10 ** 8}", "logging.every must be <= 99,999,999"),
    (f"eval.every={10 ** 8}", "eval.every must be <= 99,999,999"),
    (f"model.seed={2 ** 32}", "model.seed must be <= 4,294,967,295"),
    ("distributed.timeout=1.0e+9", "distributed.timeout must be a number of minutes from 1/60"),
    (f"optimizer.lr={10 ** 400}", "optimizer.lr must be a finite number"),
]
SEPARATORS = [
    ("data.csv_separator=',,'", "data.csv_separator must be one character other than '\"', a line break or NUL, "
                                "got ',,'"),
    ("data.csv_separator='\"'", "data.csv_separator must be one character"),
    ('data.csv_separator="\\n"', "data.csv_separator must be one character"),
    ("data.csv_separator=''", "data.csv_separator must be one character"),
    ("data.csv_separator=1", "data.csv_separator must be a string, got 1"),
]
# Union fields: the message lists every valid choice. (Each message: its start, as written.)
CHOICES = [
    ("model.compile=yes please", "model.compile must be auto, true or false, got 'yes please'"),
    ("model.float8=fp8", "model.float8 must be true, false or emulate, got 'fp8'"),
    ("data.gpu_decode_share=2", "data.gpu_decode_share must be auto or a number from 0 to 1, got 2"),
    ("data.keep_decoded_gib=-1", "data.keep_decoded_gib must be auto or a number from 0 to 16,384, got -1"),
    ("batch.chunk=most", "batch.chunk must be an integer from 1 to 1,073,741,824 or auto, got 'most'"),
    ("batch.chunk=0", "batch.chunk must be an integer from 1 to 1,073,741,824 or auto, got 0"),
    ("data.train=[1, 2]", "data.train must be a string or a list of strings, got [1, 2]"),
]
CASES = BOOLEANS + BOUNDS + SEPARATORS + CHOICES


@pytest.mark.parametrize("assignment,match", CASES, ids=[a for a, _ in CASES])
def test_each_bad_number_bound_or_choice_is_one_line_naming_the_key(assignment, match):
    _load_refused(None, [assignment], "^" + re.escape("recipe: " + match))


def test_the_cli_prints_one_line_and_exits_2(capsys):
    _refused(capsys, ["--config", str(TINY), "--set", "optimizer.lr=yes"],
             "^infcl-ds train: recipe: optimizer.lr must be a number, got True$")
    # What data check and the planner took before: refused at their load too.
    code, out = data_check(capsys, "data.workers=100000")
    assert code == 2 and out.err.strip() == "infcl-ds data check: recipe: data.workers must be <= 1,024, got 100000"
    assert plan_main(["--config", str(TINY), "--gpus", "1", "--set", "data.decode_workers=100000"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "refused: recipe: data.decode_workers must be auto or an integer from 0 to 1,024, got 100000", err


GOOD = [
    ("optimizer.lr=1", lambda r: r.optimizer.lr == 1.0 and isinstance(r.optimizer.lr, float)),
    ("optimizer.lr=1e-3", lambda r: r.optimizer.lr == 1e-3),  # text to PyYAML, a number to YAML 1.2
    ("optimizer.betas=[0, 0.5]", lambda r: r.optimizer.betas == [0.0, 0.5]),
    ("optimizer.grad_clip=1", lambda r: r.optimizer.grad_clip == 1.0),
    ("schedule.min_lr_ratio=1", lambda r: r.schedule.min_lr_ratio == 1.0),
    ("data.keep_decoded_gib=0", lambda r: r.data.keep_decoded_gib == 0.0),
    (f"data.keep_decoded_gib={MAX_GIB}", lambda r: r.data.keep_decoded_gib == MAX_GIB),
    ("data.gpu_decode_share=1", lambda r: r.data.gpu_decode_share == 1.0),
    (f"data.decode_window_gib={MAX_GIB}", lambda r: r.data.decode_window_gib == MAX_GIB),
    ("data.decode_window_gib=auto", lambda r: r.data.decode_window_gib == "auto"),
    ("data.gpu_decode_window_gib=0.5", lambda r: r.data.gpu_decode_window_gib == 0.5),
    ("data.gpu_decode_window_gib=auto", lambda r: r.data.gpu_decode_window_gib == "auto"),
    (f"data.workers={MAX_PROCESSES}", lambda r: r.data.workers == MAX_PROCESSES),
    (f"batch.global={MAX_SAMPLES}", lambda r: r.data.synthetic_size == MAX_SAMPLES),  # one global batch
    (f"data.image_bytes={MAX_IMAGE_BYTES}", lambda r: r.data.image_bytes == MAX_IMAGE_BYTES),
    (f"schedule.steps={MAX_STEPS}", lambda r: r.schedule.steps == MAX_STEPS),
    ("batch.chunk=auto", lambda r: r.batch.chunk == "auto"),
    ("model.compile=false", lambda r: r.model.compile is False),
    ("model.float8=emulate", lambda r: r.model.float8 == "emulate"),
    ("data.csv_separator=';'", lambda r: r.data.csv_separator == ";"),
    ('data.csv_separator="\\t"', lambda r: r.data.csv_separator == "\t"),
    ("distributed.timeout=1e2", lambda r: r.distributed.timeout == 100.0),
    ("distributed.timeout=5", lambda r: r.distributed.timeout == 5.0),
]


@pytest.mark.parametrize("assignment,check", GOOD, ids=[a for a, _ in GOOD])
def test_good_values_still_load(assignment, check):
    assert check(load_recipe(None, [assignment]))


@pytest.mark.parametrize("path", RECIPES, ids=[p.name for p in RECIPES])
def test_every_shipped_recipe_loads(path):
    load_recipe(path)


def test_the_image_bytes_bound_is_the_largest_image_a_source_reads():
    assert MAX_IMAGE_BYTES == DATA_MAX_IMAGE_BYTES


# -- the DeepSpeed settings: NVMe directories, a base config of one's own --------------------

def _nvme(offload: str, path) -> str:
    return f"zero.overrides={{{offload}: {{device: nvme, nvme_path: {path}}}}}"


def test_an_nvme_offload_directory_is_checked_at_load(tmp_path):
    missing, file = tmp_path / "missing", tmp_path / "file"
    file.write_text("")
    for offload in ("offload_optimizer", "offload_param"):
        key = f"zero.overrides.{offload}.nvme_path"
        _load_refused(None, [_nvme(offload, missing)], f"^recipe: {re.escape(key)} {missing} does not exist$")
        _load_refused(None, [_nvme(offload, file)], f"^recipe: {re.escape(key)} {file} is not a directory$")
        assert load_recipe(None, [_nvme(offload, tmp_path)]).zero.overrides[offload]
    _load_refused(None, ["zero.overrides={offload_param: {device: nvme}}"],
                  r"^recipe: zero.overrides.offload_param.nvme_path must be a directory for "
                  r"device nvme, got None$")
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"zero_optimization": {"stage": 2, "offload_optimizer": {
        "device": "nvme", "nvme_path": str(missing)}}}))
    _load_refused(None, [f"zero.base_config={base}"],
                  f"^recipe: zero.base_config {base}: zero_optimization.offload_optimizer.nvme_path {missing} "
                  "does not exist$")


@pytest.mark.parametrize("key,instead", [("optimizer", "optimizer.*"), ("scheduler", "schedule.*"),
                                         ("fp16", "precision.dtype"),
                                         ("gradient_accumulation_steps", "batch.global")])
def test_a_base_config_of_ones_own_holds_none_of_the_recipes_keys(tmp_path, key, instead):
    base = tmp_path / "base.json"
    base.write_text(json.dumps({key: {"type": "X"}, "zero_optimization": {"stage": 2}}))
    _load_refused(None, [f"zero.base_config={base}"],
                  f"^recipe: zero.base_config {base}: {key} is set by the recipe; use {re.escape(instead)}$")
    _load_refused(None, [f"deepspeed.overrides={{{key}: 1}}"],  # the same rule, the same words
                  f"^recipe: deepspeed.overrides.{key} is set by the recipe; use {re.escape(instead)}$")
    base.write_text(json.dumps({"zero_optimization": {"stage": 2, "overlap_comm": False}}))
    assert load_recipe(None, [f"zero.base_config={base}"]).zero.base_config == str(base)


PACKAGED_BASES = sorted((Path(__file__).resolve().parents[2] / "infcl_ds" / "ds_configs").glob("*.json"))


@pytest.mark.parametrize("base", PACKAGED_BASES, ids=lambda path: path.name)
def test_a_packaged_base_config_is_taken_as_ones_own_and_the_recipe_s_values_win(base):
    """The packaged bases hold gradient_clipping and bf16, the start of a base of one's own: named
    as a base, each builds the config its stage builds by default, the recipe's values in it."""
    from infcl_ds.config import build_deepspeed_config
    from infcl_ds.config.deepspeed_config import base_keys_written_over
    stage = json.loads(base.read_text())["zero_optimization"]["stage"]
    for settings in ([], ["optimizer.grad_clip=1.0", "precision.dtype=fp32"]):
        packaged = load_recipe(None, [f"zero.stage={stage}"] + settings)
        own = load_recipe(None, [f"zero.stage={stage}", f"zero.base_config={base}"] + settings)
        assert build_deepspeed_config(own, 2) == build_deepspeed_config(packaged, 2)
        assert base_keys_written_over(packaged) is None  # the default base: nothing to say
    config = build_deepspeed_config(own, 2)
    assert config["gradient_clipping"] == 1.0 and config["bf16"] == {"enabled": False}
    assert base_keys_written_over(own) == (f"zero.base_config {base}: gradient_clipping, bf16 are set by the recipe; "
                                           "its optimizer.grad_clip=1.0, precision.dtype=fp32 are used, not the base "
                                           "config's values")


def test_a_base_config_s_key_the_recipe_writes_over_goes_whole(tmp_path):
    from infcl_ds.config import build_deepspeed_config
    from infcl_ds.config.deepspeed_config import base_keys_written_over
    base = tmp_path / "base.json"
    base.write_text(json.dumps({"bf16": {"enabled": True, "immediate_grad_update": True},
                                "zero_optimization": {"stage": 2}}))
    recipe = load_recipe(None, [f"zero.base_config={base}", "precision.dtype=bf16"])
    assert build_deepspeed_config(recipe, 2)["bf16"] == {"enabled": True}  # none of the base's bf16 settings
    assert base_keys_written_over(recipe) == (f"zero.base_config {base}: bf16 is set by the recipe; its "
                                              "precision.dtype=bf16 is used, not the base config's value")


def test_zero_overrides_reach_zero_optimization_and_deepspeed_overrides_the_whole_config():
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig

    from infcl_ds.config import build_deepspeed_config
    plain = build_deepspeed_config(load_recipe(None, []), 2)
    recipe = load_recipe(None, ["zero.overrides={reduce_bucket_size: 1000, offload_optimizer: {device: cpu}}",
                                "deepspeed.overrides={wall_clock_breakdown: true, flops_profiler: {enabled: true}}"])
    config = build_deepspeed_config(recipe, 2)
    assert config["zero_optimization"] == dict(plain["zero_optimization"], reduce_bucket_size=1000,
                                               offload_optimizer={"device": "cpu"})
    assert config == dict(plain, zero_optimization=config["zero_optimization"], wall_clock_breakdown=True,
                          flops_profiler={"enabled": True})
    DeepSpeedZeroConfig(**config["zero_optimization"])  # DeepSpeed takes the block as written


@pytest.mark.parametrize("assignment,match", [
    # An old recipe's whole-config key under zero.overrides: the section that takes it.
    ("zero.overrides={wall_clock_breakdown: true}",
     r"zero.overrides.wall_clock_breakdown is not a ZeRO key \(zero.overrides is merged into zero_optimization only\); "
     r"a key of the whole DeepSpeed config goes in deepspeed.overrides.wall_clock_breakdown"),
    ("zero.overrides={bf16: {enabled: false}}",
     r"zero.overrides.bf16 is not a ZeRO key \(.*the whole config's keys go in deepspeed.overrides\), and bf16 is set "
     r"by the recipe; use precision.dtype"),
    ("zero.overrides={zero_optimization: {reduce_bucket_size: 1}}",
     r"zero.overrides.zero_optimization: zero.overrides is merged into zero_optimization already; write its keys "
     r"directly under zero.overrides"),
    ("zero.overrides={reduce_bucket_sz: 1}", r"zero.overrides.reduce_bucket_sz is not a ZeRO key .*; did you mean "
                                             r"zero.overrides.reduce_bucket_size\?$"),
    ("zero.overrides={stage: 3}", r"zero.overrides.stage is set by the recipe; use zero.stage"),
    ("deepspeed.overrides={zero_optimization: {reduce_bucket_size: 1}}",
     r"deepspeed.overrides.zero_optimization: ZeRO's keys go in zero.overrides"),
])
def test_each_override_section_refuses_the_other_s_keys_in_one_line(assignment, match):
    _load_refused(None, [assignment], "^recipe: " + match)


# -- model.float8 on a CPU rank ------------------------------------------------------------

def test_float8_on_a_cpu_rank_is_a_recipe_error_before_any_collective():
    from infcl_ds.training.build import build_engine
    from infcl_ds.training.resolve import resolve_recipe
    from infcl_ds.config import RecipeError
    recipe = load_recipe(None, ["model.float8=true", "model.compile=false"])
    message = (r"^recipe: model.float8=true needs a CUDA GPU with float8 tensor cores .*; this rank runs on cpu\. "
               r"Use model.float8: false, or emulate to check its numerics \(slow\)$")
    with pytest.raises(RecipeError, match=message):
        build_engine(recipe, 1, torch.device("cpu"))
    # batch.chunk: auto agrees on the chunk in a collective: refused before the plan that precedes it
    # (no process group here).
    auto = load_recipe(None, ["model.float8=true", "batch.chunk=auto"])
    with pytest.raises(RecipeError, match=message):
        resolve_recipe(auto, 2, torch.device("cpu"), rank=0)


def test_rows_kept_in_the_decode_pools_window_need_its_processes():
    """data.keep_decoded_host_gib keeps what the decode processes decoded: refused with nvjpeg
    (no processes), taken with hybrid (whose processes decode those chunks alone)."""
    base = ["data.source=webdataset", "data.train=x.tar", "data.keep_decoded_host_gib=2"]
    _load_refused(None, base + ["data.decoder=nvjpeg"], r"data.keep_decoded_host_gib .* data.decoder=nvjpeg")
    assert load_recipe(None, base + ["data.decoder=hybrid"]).data.keep_decoded_host_gib == 2
