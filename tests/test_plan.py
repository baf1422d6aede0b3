"""The planner (infcl_ds/plan): exact component arithmetic on a tiny case, ZeRO sharding,
feature offload, the shipped recipes, refusals, and the CLI's output contract."""
import re
from pathlib import Path

import pytest

from infcl_ds.config import RecipeError, load_recipe
from infcl_ds.plan import KernelRates, make_plan, ring_scaling_table
from infcl_ds.plan import memory as mem
from infcl_ds.plan.cli import hostfile_world, main, parse_size
from infcl_ds.plan.encoders import estimate_model

GIB = 1 << 30
RECIPES = Path(__file__).resolve().parents[1] / "ds_configs" / "recipes"
TINY = ["model.name=infcl-tiny", "batch.global=16", "batch.chunk=4"]


@pytest.fixture(scope="module")
def rates():
    return KernelRates.load()


def tiny(*overrides):
    return load_recipe(None, TINY + list(overrides))


@pytest.mark.parametrize("name", ["infcl-tiny", "infcl-tiny-digits"])
def test_parameter_count_matches_open_clip(name):
    from infcl_ds.models import create_model
    assert estimate_model(name).params == sum(p.numel() for p in create_model(name).parameters())


def test_tiny_components_exact(rates):
    """infcl-tiny (P = 1,615,553, D = 32), bf16, ZeRO-2 on 2 GPUs, local batch 8, chunk 4."""
    plan = make_plan(tiny(), 2, 80 * GIB, rates=rates)
    P = 1_615_553
    # Image tower: s = (16/8)^2 + 1 = 5 tokens, h = 32, a = 32/16 = 2 heads, 1 layer:
    #   5*32*(34 + 5*2*5/32) = 5690 B; plus the chunk's images, uint8 + bf16: 3*16*16*(1+2) = 2304 B.
    # Text tower: s = 16, h = 32, a = 2, 1 layer: 16*32*(34 + 5*2*16/32) = 19968 B.
    activations = 4 * (5690 + 19968 + 2304)
    # Ring per sample: 2 visiting blocks 2*32*2, their stats 2*4, two fp32 partials 2*32*4,
    # received partial + text and image accumulators 3*32*4, saved row/col stats 2*4 = 784 B;
    # G panel: 8 x 8 columns (the panel is capped by the block) x 2 B = 128 B.
    assert plan.components == {
        mem.PARAMS: 2 * P, mem.GRADS: 2 * P, mem.OPTIM: 12 * P // 2, mem.GRAD_SUM: 4 * P,
        mem.ZERO_BUFFERS: 2 * 500_000_000 * 2,  # zero2.json: overlap_comm, two bf16 buckets of 5e8
        mem.RUNTIME: mem.GPU_RUNTIME_RESERVE,
        mem.ACTIVATIONS: activations,
        mem.FEATURES: 2 * 8 * 32 * 2, mem.FEATURE_GRADS: 2 * 8 * 32 * 2,
        mem.LOSS_BUFFERS: 8 * 784 + 128,
    }
    always = 2 * P + 12 * P // 2 + 2_000_000_000 + mem.GPU_RUNTIME_RESERVE
    assert plan.gpu.phase_bytes(mem.ENCODER_PASS) == always + 2 * P + 4 * P + activations + 1024
    assert plan.gpu.phase_bytes(mem.LOSS) == always + 1024 + 1024 + 8 * 784 + 128
    assert plan.peak_gpu_bytes == always + 6 * P + activations + 1024
    # Host, per node (both ranks on it): 8 samples x (3*16*16 uint8 + 16 int64 tokens) x
    # (1 training + 2 workers x 2 prefetched) batches, plus the per-rank reserve.
    assert plan.host == {mem.INPUTS: 2 * 8 * 896 * 5, mem.OFFLOADED: 0, mem.PROCESSES: 2 * mem.HOST_RESERVE_PER_RANK}
    assert plan.fits and plan.verdict.startswith("fits: ")


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_zero_stage_sharding(rates, stage):
    P, world = 1_615_553, 4
    plan = make_plan(tiny(f"zero.stage={stage}"), world, 80 * GIB, rates=rates)
    c = plan.components
    assert c[mem.PARAMS] == (-(-2 * P // world) if stage == 3 else 2 * P)
    assert c[mem.OPTIM] == (12 * P if stage == 0 else -(-12 * P // world))
    assert c[mem.GRADS] == 2 * P  # coalesced reduction: whole until the step's one reduction
    assert c[mem.GRAD_SUM] == (0 if stage == 3 else 4 * P)
    expected_buffers = {0: 0, 1: 5e8 * 2, 2: 2 * 5e8 * 2, 3: 2 * 5e8 * 2 + 5e7 * 2}[stage]
    assert c[mem.ZERO_BUFFERS] == expected_buffers


def test_fp32_states(rates):
    P = 1_615_553
    c = make_plan(tiny("precision.dtype=fp32"), 2, 80 * GIB, rates=rates).components
    assert (c[mem.PARAMS], c[mem.GRADS], c[mem.OPTIM], c[mem.GRAD_SUM]) == (4 * P, 4 * P, 4 * P, 0)


def test_offload_moves_features_to_host(rates):
    on_gpu = make_plan(tiny(), 2, 80 * GIB, rates=rates)
    offloaded = make_plan(tiny("batch.offload_features=true"), 2, 80 * GIB, rates=rates)
    features = 2 * 8 * 32 * 2
    # The encoder pass no longer holds the feature gradients; the loss still needs both on the GPU.
    assert on_gpu.gpu.phase_bytes(mem.ENCODER_PASS) - offloaded.gpu.phase_bytes(mem.ENCODER_PASS) == features
    assert on_gpu.gpu.phase_bytes(mem.LOSS) == offloaded.gpu.phase_bytes(mem.LOSS)
    assert offloaded.host[mem.OFFLOADED] == 2 * 2 * features  # 2 ranks x (features + gradients)
    assert offloaded.host_bytes - on_gpu.host_bytes == 2 * 2 * features


def test_offload_is_offered_when_the_encoder_pass_is_over(rates):
    """Offload takes the feature gradients out of the encoder pass only (the loss needs the
    features on the GPU): it is a remedy exactly when the encoder pass is the phase over."""
    recipe = load_recipe(None, ["model.name=ViT-B-16", "batch.global=16384", "batch.chunk=4"])
    fitting = make_plan(recipe, 2, 80 * GIB, rates=rates)
    assert fitting.gpu.peak_phase == mem.ENCODER_PASS
    plan = make_plan(recipe, 2, fitting.peak_gpu_bytes - 1, rates=rates)
    assert not plan.fits and plan.binding == "GPU memory"
    assert "set batch.offload_features=true" in plan.remedies


def test_too_large_a_batch_gets_more_gpus(rates):
    """The loss phase over: the verdict blames its biggest component and proposes the smallest
    GPU count (a multiple of a node's) that fits."""
    recipe = load_recipe(None, ["model.name=ViT-B-16", "batch.global=8388608", "batch.chunk=64"])
    setting = {"gpu_memory_bytes": 20 * GIB, "host_memory_bytes": 1 << 50, "rates": rates}
    plan = make_plan(recipe, 8, **setting)
    assert not plan.fits and plan.gpu.peak_phase == mem.LOSS
    assert plan.verdict.startswith("does not fit: the loss and ring buffers need")
    suggested = int(re.search(r"use (\d+) GPUs", plan.verdict).group(1))
    assert make_plan(recipe, suggested, **setting).fits
    assert not make_plan(recipe, suggested - 8, **setting).fits


def test_12m_recipe_fits_and_names_binding_limit(rates, capsys):
    recipe = load_recipe(RECIPES / "vit-l14-12m-32gpu.yaml")
    plan = make_plan(recipe, 32, 80 * GIB, rates=rates)
    assert plan.fits and plan.peak_gpu_bytes < 80 * GIB
    assert plan.binding == "host memory per node"
    assert 100 * GIB < plan.host_bytes < 2048 * GIB
    assert plan.step_seconds > 0 and plan.time.hop is not None and plan.time.hop.hidden
    assert main(["--config", str(RECIPES / "vit-l14-12m-32gpu.yaml"), "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert re.fullmatch(r"peak per GPU: \d+\.\d GiB", out[-1])
    assert out[-2].startswith("fits: ") and out[-2].endswith("of 80 GiB")
    assert any(line.startswith("binding limit: host memory per node") for line in out)
    assert any(line.startswith("host memory per node (GiB):") for line in out)


@pytest.mark.parametrize("path", sorted(RECIPES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_recipe_loads(path):
    recipe = load_recipe(path)
    assert recipe.batch.global_size >= 1


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


def test_refuses_host_memory_over_the_node(rates):
    recipe = load_recipe(RECIPES / "vit-l14-12m-32gpu.yaml", ["data.workers=4"])
    plan = make_plan(recipe, 32, 80 * GIB, host_memory_bytes=2 << 40, rates=rates)
    assert not plan.fits and plan.binding == "host memory per node"
    assert plan.verdict.startswith("does not fit: host memory per node needs")
    assert "set data.workers=1" in plan.remedies


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


def test_scaling_table(rates, capsys):
    rows = ring_scaling_table((12 << 20,), 768, (8, 32, 1024), rates=rates)
    by_ranks = {row.ranks: row for row in rows}
    assert list(by_ranks[8].hops) == ["NVLink"] and by_ranks[8].hops["NVLink"].hidden
    assert by_ranks[32].hops["200 Gb/s"].hidden and by_ranks[32].hops["400 Gb/s"].hidden
    assert not by_ranks[1024].hops["200 Gb/s"].hidden
    # Fixed global batch: the loss time falls as ranks grow.
    assert by_ranks[8].loss_time("NVLink") > by_ranks[32].loss_time("400 Gb/s") > by_ranks[1024].loss_time("400 Gb/s")
    assert main(["--scaling", "--batch", "4M,12M"]) == 0
    table = capsys.readouterr().out
    assert table.count("\n| 12M |") == 8 and "transfers hide from b =" in table
