"""`infcl-ds plan` (infcl_ds/plan/command.py, refusal.py): the shipped recipes, refusals, the
hostfile's world, sizes, and the command's output contract."""
import re
from pathlib import Path

import pytest

from infcl_ds.config import RecipeError, load_recipe
from infcl_ds.plan import KernelRates, make_plan
from infcl_ds.data import footprint
from infcl_ds.plan import memory as mem
from infcl_ds.plan.command import hostfile_world, main, parse_size

GIB = 1 << 30
RECIPES = Path(__file__).resolve().parents[2] / "ds_configs" / "recipes"


@pytest.fixture(scope="module")
def rates():
    return KernelRates.load()


def test_12m_recipe_fits_and_names_binding_limit(rates, capsys):
    decoded = make_plan(load_recipe(RECIPES / "vit-l14-12m-32gpu.yaml", ["data.host_batch=decoded", "data.workers=6"]),
                        32, 80 * GIB, rates=rates)
    assert decoded.fits and decoded.peak_gpu_bytes < 80 * GIB
    assert decoded.binding == "host memory per node"
    # Decoded: per node 8 ranks, each holding two local batches of 393,216 samples and 6 workers'
    # 2 prefetched pieces of 256, at 3 x 224^2 uint8 pixels + 77 int64 tokens = 151,144 bytes a
    # sample; no offloaded features; 5 GiB per rank for the processes.
    assert decoded.host[mem.INPUTS] == 8 * (2 * 393_216 + 6 * 2 * 256) * 151_144
    assert decoded.host_bytes == decoded.host[mem.INPUTS] + 8 * 5 * GIB
    # Encoded (the recipe): the same samples at the stored image's bytes (assumed: no shards
    # here) + 77 int32 tokens + the 28-byte row table, and the decode pool's pieces.
    recipe = load_recipe(RECIPES / "vit-l14-12m-32gpu.yaml")
    plan = make_plan(recipe, 32, 80 * GIB, rates=rates)
    assert plan.fits and plan.image_bytes == footprint.DEFAULT_IMAGE_BYTES
    assert plan.host[mem.INPUTS] == 8 * (2 * 393_216 + 2 * 2 * 256) * (32 * 1024 + 4 * 77 + 28)
    # The decode pool's window (auto: the rows with which the processes run through the whole step),
    # in slots of 32 rows of 224 px, and 7 processes' heaps.
    # The rows the pool keeps between the passes (auto: those the GPU does not) are in it too.
    rows = footprint.kept_rows(plan.choice("data.decode_window_gib").value, 224)
    assert rows == footprint.pool_window_rows(plan.recipe.data, 393_216, 224) > 32 * 2 * 7
    on_host = plan.decoding.overlap.shape.host_kept
    assert on_host == footprint.kept_rows(plan.choice("data.keep_decoded_host_gib").value, 224) > 0
    assert plan.host[mem.DECODING] == 8 * (-(-(rows + on_host) // 32) * 32 * 3 * 224 ** 2 + 7 * (GIB // 10))
    assert plan.host[mem.INPUTS] < decoded.host[mem.INPUTS] / 3
    assert plan.step_seconds > 0 and plan.time.hop is not None and plan.time.hop.hidden
    assert main(["--config", str(RECIPES / "vit-l14-12m-32gpu.yaml"), "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"peak per GPU: \d+\.\d GiB", out[-1])
    assert out[-2].startswith("fits: ") and out[-2].endswith("of 80 GiB")
    assert any(line.startswith(f"binding limit: {plan.binding}") for line in out)
    assert any(line.startswith("host memory per node (GiB):") for line in out)


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads_splits_over_its_gpus_and_round_trips(path, tmp_path):
    """Each shipped recipe splits over the GPU count its name gives (tiny-cpu: 2 ranks) and
    reads back unchanged from the recipe.yaml a run writes."""
    from infcl_ds.config import check_world, dump_recipe
    recipe = load_recipe(path)
    gpus = int(re.search(r"(\d+)gpu", path.name).group(1)) if "gpu" in path.name else 2
    check_world(recipe, gpus)
    assert recipe.local_batch(gpus) * gpus == recipe.batch.global_size
    (tmp_path / "recipe.yaml").write_text(dump_recipe(recipe))
    assert load_recipe(tmp_path / "recipe.yaml") == recipe


@pytest.mark.parametrize("name", ["vit-b16-1m-8gpu", "vit-l14-256k-8gpu", "vit-l14-4m-8gpu", "vit-l14-12m-32gpu"])
def test_large_recipes_fit_80gb(rates, name):
    gpus = int(re.search(r"(\d+)gpu", name).group(1))
    recipe = load_recipe(RECIPES / f"{name}.yaml")
    assert recipe.precision.dtype == "bf16" and recipe.data.source == "webdataset"
    plan = make_plan(recipe, gpus, 80 * GIB, rates=rates)
    assert plan.fits, plan.verdict


def test_refuses_batch_that_does_not_split(capsys):
    assert main(["--config", str(RECIPES / "vit-b16-1m-8gpu.yaml"), "--gpus", "3"]) == 2
    assert "not divisible by the world size 3" in capsys.readouterr().err
    with pytest.raises(RecipeError):
        make_plan(load_recipe(RECIPES / "vit-b16-1m-8gpu.yaml"), 3, 80 * GIB)


def test_refuses_chunk_whose_activations_alone_exceed_the_gpu(capsys):
    code = main(["--config", str(RECIPES / "vit-l14-256k-8gpu.yaml"), "--set", "batch.chunk=1024"])
    out = capsys.readouterr().out.strip().splitlines()
    assert code == 1
    assert out[-2].startswith("does not fit: one chunk's activations alone need")
    assert "batch.chunk=" in out[-2] and "model.grad_checkpointing=true" in out[-2]
    assert out[-1].startswith("peak per GPU: ")


def test_refuses_unsupported_model(capsys):
    assert main(["--config", str(RECIPES / "vit-b16-1m-8gpu.yaml"), "--set", "model.name=RN50"]) == 2
    assert "ResNet" in capsys.readouterr().err


def test_world_from_hostfile(tmp_path):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=8\nnode2 slots=8\nnode3 slots=8\n")
    assert hostfile_world(str(hostfile), "", "", -1, -1) == (24, 8)
    assert hostfile_world(str(hostfile), "", "node3", -1, -1) == (16, 8)
    assert hostfile_world(str(hostfile), "node1:0,1@node2:0,1", "", -1, -1) == (4, 2)


def test_parse_size():
    assert parse_size("80GiB") == 80 << 30 and parse_size("141GB") == 141 * 10 ** 9 and parse_size("2TiB") == 2 << 40


def test_a_fitting_zero3_recipe_is_told_when_zero2_fits_too(capsys):
    recipe = RECIPES / "vit-l14-256k-8gpu.yaml"
    plan = make_plan(load_recipe(recipe, ["zero.stage=3"]), 8, 80 * GIB)
    assert plan.fits and len(plan.advice) == 1 and plan.advice[0].startswith("zero.stage=2 also fits (")
    assert make_plan(load_recipe(recipe), 8, 80 * GIB).advice == ()  # ZeRO-2 already
    # Where only ZeRO-3 fits, no advice: ViT-L-14 on 16 GB GPUs with checkpointing.
    # Nothing kept decoded: kept chunks (auto) would fill whatever memory the plan is given.
    tight = load_recipe(recipe, ["zero.stage=3", "model.grad_checkpointing=true", "batch.chunk=16",
                                 "data.keep_decoded_gib=0"])
    two_of = load_recipe(recipe, ["zero.stage=2", "model.grad_checkpointing=true", "batch.chunk=16",
                                  "data.keep_decoded_gib=0"])
    three_peak = make_plan(tight, 8, 80 * GIB).peak_gpu_bytes
    two_peak = make_plan(two_of, 8, 80 * GIB).peak_gpu_bytes
    assert three_peak < two_peak  # ZeRO-2's unsharded bf16 weights
    between = (three_peak + two_peak) // 2
    three = make_plan(tight, 8, between)
    assert three.fits and not make_plan(two_of, 8, between).fits and three.advice == ()
    assert main(["--config", str(recipe), "--gpus", "8", "--set", "zero.stage=3"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-3].startswith("advice: zero.stage=2 also fits") and out[-2].startswith("fits: ")


@pytest.mark.parametrize("args, named", [
    (["--encoder-tflops", "0"], "--encoder-tflops: must be a finite number above 0, got '0'"),
    (["--encoder-tflops", "nan"], "--encoder-tflops: must be a finite number above 0, got 'nan'"),
    (["--gpus", "-2"], "--gpus: must be at least 1, got -2"),
    (["--scaling", "--ranks", "0"], "--ranks: must be at least 1, got 0"),
    (["--scaling", "--dim", "-5"], "--dim: must be at least 1, got -5"),
    (["--rates", "__file__"], "--rates"),
])
def test_bad_plan_arguments_are_one_line_naming_them(args, named, capsys):
    """Each was a traceback (ZeroDivisionError, JSONDecodeError) or a silent nonsense plan."""
    args = [__file__ if a == "__file__" else a for a in args]
    with pytest.raises(SystemExit) as stop:
        code = main(["--config", str(RECIPES / "vit-l14-256k-8gpu.yaml"), *args])
        raise SystemExit(code)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and named in err, err


def test_a_plan_says_when_it_assumed_the_gpu_size_and_advises_no_absurd_pool(capsys, monkeypatch):
    """tiny-cpu on 2 GPUs planned on a node without GPUs: '80 GiB' is marked as assumed, and its
    decoding line advises no data.decode_workers=58886."""
    from test_plan_machine import CPU_NODE
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: CPU_NODE)
    assert main(["--config", str(RECIPES / "tiny-cpu.yaml"), "--gpus", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert out[-2].startswith("fits: ") and out[-2].endswith("(assumed 80 GiB GPUs: this node has none; pass --gpu-memory)")
    at = next(i for i, line in enumerate(out) if line.strip().startswith("decoding:"))
    decoding = "\n".join(out[at:at + 5])
    assert "data.decode_workers=" not in decoding
    assert "decode processes a rank would keep up, more than a node has cores" in decoding
    assert main(["--config", str(RECIPES / "tiny-cpu.yaml"), "--gpus", "2", "--gpu-memory", "24GiB"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-2].endswith("of 24 GiB")
