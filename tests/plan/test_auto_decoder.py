"""`data.decoder: auto`: PIL's processes where the engine does not wait for them in the planned
step, else the GPU decoder where that makes the step shorter: alone (nvjpeg), or beside them
(hybrid: a share of each chunk) where that is shorter still; pil on a CPU rank
(plan/auto_values.py's one plan, asked per rank at start-up by training/resolve.py), and said by
the planner with its reason."""
import re

import pytest
import torch

from infcl_ds.config import load_recipe
from infcl_ds.data import DataError, build_train_data
from infcl_ds.data.footprint import DECODE_RATES_PER_WORKER, gpu_decode_rate
from infcl_ds.plan.command import main as plan_main
from infcl_ds.plan.machine import split_cores
from infcl_ds.plan.plan import make_plan
from infcl_ds.plan.auto_values import RankSizes, estimate, recipe_with, resolve_autos
from infcl_ds.training import resolve

GIB = 1 << 30
H200 = 141 * GIB
RECIPES = "ds_configs/recipes"


def auto_decoder(recipe, gpus, gpu_memory, per_node, share, host=256 * GIB):
    """What `data.decoder: auto` becomes in the one plan of a rank with these sizes."""
    return resolve_autos(recipe, gpus, RankSizes(gpu_memory, per_node, share, host)).choice("data.decoder")


def test_pil_where_its_processes_keep_up_else_hybrid():
    share = split_cores(16, 1)
    # ViT-L-14 at 16k: a 25 s step needs ~660 decodes/s; 14 processes (16 cores less the training
    # process and the readers' core) give 2,380.
    slow = load_recipe(None, ["model.name=ViT-L-14", "batch.global=16384", "data.source=webdataset", "data.train=x",
                              "data.decoder=auto"])
    chosen = auto_decoder(slow, 1, H200, 1, share)
    assert chosen.value == "pil" and chosen.why.startswith("14 PIL processes decode 2,380 samples/s of the ")
    assert chosen.why.endswith("they keep up, with open_clip's pixels exactly")
    # ViT-B-32 at 512k on one GPU: each step needs more than the 14 processes give.
    fast = load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=auto"])
    chosen = auto_decoder(fast, 1, H200, 1, share)
    assert chosen.value == "hybrid" and chosen.why.endswith("the GPU decodes a share of each chunk beside them")
    given, needed = (float(x.replace(",", "")) for x in
                     re.match(r"14 PIL processes decode ([\d,]+) samples/s of the ([\d,]+) a ", chosen.why).groups())
    assert given == 14 * DECODE_RATES_PER_WORKER["pil"] < needed
    # Fewer cores, fewer processes: ViT-L-14 binds on a 2-core share (1 process); the GPU decoder
    # alone keeps up with its step, and the one process beside it would not shorten it.
    assert auto_decoder(slow, 1, H200, 1, split_cores(2, 1)).value == "nvjpeg"
    assert auto_decoder(recipe_with(slow, "data", host_batch="decoded"), 1, H200, 1, share).value == "pil"


def test_the_plan_says_what_auto_becomes_and_plans_with_it(capsys):
    argv = ["--config", f"{RECIPES}/vit-b32-512k-1gpu.yaml", "--gpus", "1", "--gpu-memory", "141GiB",
            "--host-memory", "256GiB", "--cores", "16", "--set", "data.decoder=auto"]
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    assert "\n  auto: data.decoder=hybrid (14 PIL processes decode 2,380 samples/s of the " in out
    assert re.search(r"/s from 14 decode processes at the measured 170 per process, their window [\d.]+ GiB "
                     r"\([\d,]+ rows\) and the GPU's decoder at the measured " + f"{gpu_decode_rate():,.0f}", out)
    # With data.decode_workers: auto the processes leave the GPU decoder's lane thread its core.
    assert plan_main([*argv, "--set", "data.decode_workers=auto"]) == 0
    out = capsys.readouterr().out
    assert "auto: data.decoder=hybrid (14 PIL processes decode 2,380 samples/s of the " in out
    assert "data.decode_workers=13 (16 cores of each rank's share, less the training process, " \
           "2 readers (one core) and the GPU decoder's lane thread)" in out
    plan = make_plan(load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=auto"]), 1, H200, 1, 256 * GIB,
                     cores=16)
    assert plan.recipe.data.decoder == plan.choice("data.decoder").value == "hybrid"
    named = make_plan(load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=pil"]), 1, H200, 1,
                      256 * GIB, cores=16)
    assert named.choice("data.decoder") is None and named.recipe.data.decoder == "pil"
    assert plan_main([*argv, "--set", "data.decoder=pil"]) == 0
    assert "auto: data.decoder=" not in capsys.readouterr().out
    # The chunk `auto` plans is the one for the decoder `auto` becomes (hybrid's window on the GPU).
    recipe = load_recipe(f"{RECIPES}/vit-l14-4m-8gpu.yaml", ["batch.chunk=auto", "data.decoder=auto"])
    sizes = RankSizes(24 * GIB, 8, split_cores(128, 8), 2048 * GIB)
    resolved = resolve_autos(recipe, 8, sizes)
    named = resolve_autos(recipe_with(recipe, "data", decoder=resolved.recipe.data.decoder), 8, sizes)
    assert resolved.recipe.batch.chunk == named.recipe.batch.chunk


def test_each_rank_resolves_it_at_start_up_and_says_it_once(capsys):
    recipe = load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=auto"])
    cpu = resolve.resolve_recipe(recipe, 1, torch.device("cpu"), rank=0)
    assert cpu.recipe.data.decoder == "pil" and recipe.data.decoder == "auto"
    assert cpu.choice("data.decoder").text() == "data.decoder=pil (no GPU on this rank)"
    resolve.agree_on_chunk(recipe, cpu, 1, torch.device("cpu"), rank=0)
    assert capsys.readouterr().err == "auto: data.decoder=pil (no GPU on this rank); data.keep_decoded_host_gib=0 " \
                                      "(a CPU rank); data.decode_window_gib=1 (a CPU rank)\n"
    # A GPU rank: the planner's choice for its GPU and its share of the node's cores.
    sizes = RankSizes(H200, 1, split_cores(16, 1), 256 * GIB)
    gpu = resolve.resolve_recipe(recipe, 1, torch.device("cuda", 0), rank=1, sizes=sizes)
    resolve.agree_on_chunk(recipe, gpu, 1, torch.device("cuda", 0), rank=1)
    assert gpu.recipe.data.decoder == "hybrid" and capsys.readouterr().err == ""  # said by rank 0 only
    named = recipe_with(recipe, "data", decoder="pil")
    assert resolve.resolve_recipe(named, 1, torch.device("cuda", 0), rank=0, sizes=sizes).choice("data.decoder") is None
    synthetic = load_recipe(None, ["data.source=synthetic", "batch.global=8", "batch.chunk=8", "data.decoder=auto"])
    with pytest.raises(DataError, match=r"^data.decoder=auto is resolved by the trainer \(plan/auto_values.py\)"):
        build_train_data(synthetic.data, rank=0, world_size=1, local_batch=8, seed=0, image_size=8, tokenizer=None)


def test_png_shards_stay_with_pil_where_the_gpu_decoder_would_be_chosen_for_jpeg(tmp_path):
    """The quickstart's digits are PNG: the GPU decoder would hand each to PIL in its lane's one
    thread, so `auto` keeps PIL's processes and says why; the same digits as JPEG get the GPU
    decoder."""
    from infcl_ds.data.commands.digits import build_digits
    from infcl_ds.data.footprint import jpeg_share
    share = split_cores(2, 1)  # one decode process: ViT-L-14 at 16k binds on it (the test above)
    chosen = {}
    for image_format in ("png", "jpg"):
        build_digits(tmp_path / image_format, image_format=image_format)
        recipe = load_recipe(None, ["model.name=ViT-L-14", "batch.global=16384", "data.source=webdataset",
                                    f"data.train={tmp_path / image_format / 'train'}", "data.decoder=auto"])
        assert jpeg_share(recipe.data) == (0.0 if image_format == "png" else 1.0)
        chosen[image_format] = auto_decoder(recipe, 1, H200, 1, share)
    assert chosen["jpg"].value == "nvjpeg"
    assert chosen["png"].value == "pil"
    assert chosen["png"].why == "0% of the first shard's images are JPEG: the GPU decoder takes JPEGs only"


def test_the_gpu_decoder_alone_where_it_keeps_up_by_itself(monkeypatch):
    """With a GPU decoder fast enough alone (a rate as benchmarks/decode.py would measure it),
    `auto` takes it without the PIL processes: beside them the step would be no shorter. At
    torchvision's measured rate the processes beside it still shorten the step: hybrid."""
    from infcl_ds.data import footprint
    share = split_cores(16, 1)
    fast = load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=auto", "data.gpu_jpeg_library=nvimgcodec"])
    for library in ("nvjpeg", "nvimgcodec"):  # the rule, not this checkout's calibration
        monkeypatch.setitem(footprint._DECODE_RATES, f"{library}_per_gpu", 2150.0)
        monkeypatch.delitem(footprint._DECODE_RATES, f"{library}_towers_slowdown", raising=False)
    assert auto_decoder(fast, 1, H200, 1, share).value == "hybrid"  # nvimgcodec at 2,150/s
    monkeypatch.setitem(footprint._DECODE_RATES, "nvimgcodec_per_gpu", 20_000.0)
    chosen = auto_decoder(fast, 1, H200, 1, share)
    assert chosen.value == "nvjpeg", chosen
    assert re.search(r"the GPU decodes every row \([\d.]+ s a step; [\d.]+ s with them beside it\)$", chosen.why)
    # the other library keeps its own (measured) rate: hybrid there
    assert auto_decoder(recipe_with(fast, "data", gpu_jpeg_library="torchvision"), 1, H200, 1, share).value == "hybrid"


def test_hybrid_where_it_alone_beats_pil_even_within_its_margin_over_the_gpu_decoder_alone(monkeypatch):
    """The rule's corner: hybrid less than 1% shorter than the GPU decoder alone, which is longer
    than PIL's step, while hybrid is shorter than PIL's: hybrid, the shortest."""
    from types import SimpleNamespace
    from infcl_ds.plan import auto_values
    steps = {"pil": 10.0, "nvjpeg": 10.05, "hybrid": 9.98}

    def fake_plan(recipe, *args):
        decoding = SimpleNamespace(binds=True, workers=14, available=2380.0, needed=3000.0)
        return SimpleNamespace(recipe=recipe, choices=(), decoding=decoding, time=SimpleNamespace(total=9.0),
                               step_s=steps[recipe.data.decoder])
    monkeypatch.setattr(auto_values, "_plan_decoder", fake_plan)
    monkeypatch.setattr(auto_values, "jpeg_share", lambda data: 1.0)
    recipe = load_recipe(None, ["model.name=ViT-L-14", "batch.global=16384", "data.source=webdataset", "data.train=x",
                                "data.decoder=auto"])
    assert auto_decoder(recipe, 1, H200, 1, split_cores(16, 1)).value == "hybrid"
    steps.update(hybrid=10.02)  # now longer than PIL's: PIL
    assert auto_decoder(recipe, 1, H200, 1, split_cores(16, 1)).value == "pil"
    steps.update(nvjpeg=9.0, hybrid=8.95)  # hybrid within 1% of the GPU decoder alone: alone
    assert auto_decoder(recipe, 1, H200, 1, split_cores(16, 1)).value == "nvjpeg"


def test_the_gpu_decoders_window_grows_where_the_step_waits_for_it_taken_from_the_kept_rows(monkeypatch):
    """`data.gpu_decode_window_gib: auto`: 4 GiB where the lane's window does not bind; where it
    does (ViT-B-32 at 512k a GPU, hybrid), the larger window whose step is shortest, the rows kept
    on the GPU giving it room, within the GPU's budget; and said why."""
    from infcl_ds.data import footprint
    from infcl_ds.plan import memory as mem
    from infcl_ds.plan.auto_values import AUTO_CHUNK_MEMORY_SHARE
    monkeypatch.setitem(footprint._DECODE_RATES, "nvimgcodec_per_gpu", 3116.4)
    sizes = RankSizes(int(139.8 * GIB), 4, split_cores(64, 4), 500 * GIB)
    sets = ["model.name=ViT-B-32", "batch.global=2097152", "batch.chunk=2048", "data.decoder=hybrid",
            "data.gpu_jpeg_library=nvimgcodec"]
    grown = resolve_autos(load_recipe(f"{RECIPES}/vit-b16-1m-8gpu.yaml", sets), 4, sizes)
    fixed = resolve_autos(load_recipe(f"{RECIPES}/vit-b16-1m-8gpu.yaml", sets + ["data.gpu_decode_window_gib=4"]), 4,
                          sizes)
    lane = grown.choice("data.gpu_decode_window_gib")
    assert lane.value > 4 and grown.recipe.data.gpu_decode_window_gib == lane.value
    assert fixed.choice("data.gpu_decode_window_gib") is None and fixed.decoding.overlap.window_binds
    assert grown.decoding.wait_s < fixed.decoding.wait_s / 2
    assert grown.recipe.data.keep_decoded_gib < fixed.recipe.data.keep_decoded_gib  # its room
    assert mem.gpu_memory(estimate("ViT-B-32"), grown.recipe, 4).peak <= AUTO_CHUNK_MEMORY_SHARE * 139.8 * GIB
    assert lane.why.startswith("the step waits ") and lane.why.endswith("taken from the rows kept on the GPU")
    # ViT-L-14 at 16k on 2 cores: the GPU decoder alone keeps up; its window stays the smallest
    slow = load_recipe(None, ["model.name=ViT-L-14", "batch.global=16384", "data.source=webdataset", "data.train=x",
                              "data.decoder=nvjpeg"])
    small = resolve_autos(slow, 1, RankSizes(H200, 1, split_cores(2, 1), 256 * GIB)).choice("data.gpu_decode_window_gib")
    assert small.value == 4 and small.why.startswith("the smallest")


def test_hybrid_keeps_what_the_gpu_cannot_in_the_pools_window_and_balances_its_share():
    """ViT-B-32 at 512k a GPU on 2 x H200 (250 GiB, 32 cores), its towers at 352 TFLOP/s: the GPU
    keeps rows, the decode pool's window more; the pool's chunks are the processes' alone, and the
    GPU's share of the others grows to balance them. Fewer decodes and a shorter step than with
    the rows the GPU does not keep decoded in both passes."""
    recipe = load_recipe(f"{RECIPES}/vit-b16-1m-8gpu.yaml", [
        "model.name=ViT-B-32", "batch.global=1048576", "batch.chunk=auto", "data.decode_workers=auto",
        "data.keep_decoded_gib=auto", "data.decoder=hybrid", "data.gpu_jpeg_library=nvimgcodec"])
    plan = make_plan(recipe, 2, int(139.8 * GIB), 2, 250 * GIB, cores=32, encoder_tflops=352)
    shape = plan.decoding.overlap.shape
    assert 0 < shape.kept < shape.local and shape.host_kept > 0
    assert shape.decodes == 2 * shape.local - shape.kept - shape.host_kept  # the kept rows once
    data = plan.recipe.data
    assert data.gpu_decode_share > gpu_decode_rate("nvimgcodec") / (gpu_decode_rate("nvimgcodec")
                                                                     + data.decode_workers * DECODE_RATES_PER_WORKER["pil"])
    assert "the processes' alone" in plan.choice("data.gpu_decode_share").why
    twice = make_plan(recipe_with(recipe, "data", keep_decoded_host_gib=0.0), 2, int(139.8 * GIB), 2, 250 * GIB,
                      cores=32, encoder_tflops=352)
    assert twice.decoding.overlap.shape.decodes > shape.decodes and twice.step_seconds > plan.step_seconds


def test_hybrid_at_a_share_of_one_still_plans_its_processes_for_the_rows_the_pool_keeps():
    """data.gpu_decode_share=1 with rows kept in the pool's window: those chunks are the
    processes', so the plan counts them as a decoder with a window holding the kept rows and a
    run-ahead beyond them (not the 32 rows of a rank without processes)."""
    recipe = load_recipe(f"{RECIPES}/vit-b16-1m-8gpu.yaml", [
        "model.name=ViT-B-32", "batch.global=1048576", "batch.chunk=2048", "data.decode_workers=13",
        "data.keep_decoded_gib=10", "data.decoder=hybrid", "data.gpu_decode_share=1.0",
        "data.gpu_jpeg_library=nvimgcodec", "data.gpu_decode_window_gib=8"])
    plan = make_plan(recipe, 2, int(139.8 * GIB), 2, 250 * GIB, cores=32, encoder_tflops=352)
    shape, (pool, gpu) = plan.decoding.overlap.shape, plan.decoding.overlap.decoders
    assert shape.host_kept > 0 and plan.decoding.workers == 13
    assert pool.share == 0.0 and gpu.share == 1.0 and pool.window > shape.host_kept
