"""`data.decoder: auto`: PIL's processes where they keep up with the planned step,
else hybrid (the GPU decodes a share of each chunk beside them), pil on a CPU rank
(plan.auto_decoder, resolved per rank at start-up by training/resolve.py), and said by the
planner with its reason."""
import re

import pytest
import torch

from infcl_ds.config import load_recipe
from infcl_ds.data import DataError, build_train_data
from infcl_ds.data.footprint import DECODE_RATES_PER_WORKER
from infcl_ds.plan.command import main as plan_main
from infcl_ds.plan.machine import split_cores
from infcl_ds.plan.plan import auto_chunk, auto_decoder, make_plan, recipe_with
from infcl_ds.training import resolve

GIB = 1 << 30
H200 = 141 * GIB
RECIPES = "ds_configs/recipes"


def test_pil_where_its_processes_keep_up_else_hybrid():
    share = split_cores(16, 1)
    # ViT-L-14 at 16k: a 25 s step needs ~660 decodes/s; 13 processes (16 cores less the training
    # process and 2 readers) give 2,210.
    slow = load_recipe(None, ["model.name=ViT-L-14", "batch.global=16384", "data.source=webdataset", "data.train=x",
                              "data.decoder=auto"])
    chosen = auto_decoder(slow, 1, H200, 1, share)
    assert chosen.name == "pil" and chosen.why.startswith("13 PIL processes decode 2,210 samples/s of the ")
    assert chosen.why.endswith("they keep up, with open_clip's pixels exactly")
    # ViT-B-32 at 512k on one GPU: each step needs more than the 14 processes give.
    fast = load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml")
    chosen = auto_decoder(fast, 1, H200, 1, share)
    assert chosen.name == "hybrid" and chosen.why.endswith("the GPU decodes a share of each chunk beside them")
    given, needed = (float(x.replace(",", "")) for x in
                     re.match(r"14 PIL processes decode ([\d,]+) samples/s of the ([\d,]+) a ", chosen.why).groups())
    assert given == 14 * DECODE_RATES_PER_WORKER["pil"] < needed
    # Fewer cores, fewer processes: ViT-L-14 binds on a 2-core share (1 process).
    assert auto_decoder(slow, 1, H200, 1, split_cores(2, 1)).name == "hybrid"
    assert auto_decoder(recipe_with(slow, "data", host_batch="decoded"), 1, H200, 1, share).name == "pil"


def test_the_plan_says_what_auto_becomes_and_plans_with_it(capsys):
    argv = ["--config", f"{RECIPES}/vit-b32-512k-1gpu.yaml", "--gpus", "1", "--gpu-memory", "141GiB",
            "--host-memory", "256GiB", "--cores", "16", "--set", "data.decoder=auto"]
    assert plan_main(argv) == 0
    out = capsys.readouterr().out
    assert "\n  data.decoder=auto: hybrid (14 PIL processes decode 2,380 samples/s of the " in out
    assert "available from 14 decode processes at the measured 170 per process and the GPU's decoder" in out
    # With data.decode_workers: auto the processes leave the GPU decoder's lane thread its core.
    assert plan_main([*argv, "--set", "data.decode_workers=auto"]) == 0
    out = capsys.readouterr().out
    assert "data.decoder=auto: hybrid (13 PIL processes decode 2,210 samples/s of the " in out
    assert "data.decode_workers=auto: 12 per rank (16 cores of each rank's share, less the training process, " \
           "2 readers and the GPU decoder's lane thread)" in out
    plan = make_plan(load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=auto"]), 1, H200, 1, 256 * GIB,
                     cores=16)
    assert plan.recipe.data.decoder == plan.decoder.name == "hybrid"
    named = make_plan(load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=pil"]), 1, H200, 1,
                      256 * GIB, cores=16)
    assert named.decoder is None and named.recipe.data.decoder == "pil"
    assert plan_main([*argv, "--set", "data.decoder=pil"]) == 0
    assert "data.decoder=auto" not in capsys.readouterr().out
    # The chunk `auto` plans is the one for the decoder `auto` becomes (hybrid's window on the GPU).
    recipe = load_recipe(f"{RECIPES}/vit-l14-4m-8gpu.yaml", ["batch.chunk=auto", "data.decoder=auto"])
    assert auto_chunk(recipe, 8, 24 * GIB) == auto_chunk(recipe_with(recipe, "data", decoder="hybrid"), 8, 24 * GIB)


def test_each_rank_resolves_it_at_start_up_and_says_it_once(capsys, monkeypatch):
    recipe = load_recipe(f"{RECIPES}/vit-b32-512k-1gpu.yaml", ["data.decoder=auto"])
    cpu = resolve.resolve_auto_decoder(recipe, 1, torch.device("cpu"), rank=0)
    assert cpu.data.decoder == "pil" and recipe.data.decoder == "auto"
    assert capsys.readouterr().err == "data.decoder=auto: pil (no GPU on this rank)\n"
    # A GPU rank: the planner's choice for its GPU and its share of the node's cores.
    monkeypatch.setattr(resolve, "_gpu_memory_and_count", lambda device: (H200, 1))
    monkeypatch.setattr(resolve, "_rank_share", lambda device: split_cores(16, 1))
    gpu = resolve.resolve_auto_decoder(recipe, 1, torch.device("cuda", 0), rank=1)
    assert gpu.data.decoder == "hybrid" and capsys.readouterr().err == ""  # said by rank 0 only
    named = recipe_with(recipe, "data", decoder="pil")
    assert resolve.resolve_auto_decoder(named, 1, torch.device("cuda", 0), rank=0) is named
    synthetic = load_recipe(None, ["data.source=synthetic", "batch.global=8", "batch.chunk=8", "data.decoder=auto"])
    with pytest.raises(DataError, match=r"^data.decoder=auto is resolved by the trainer \(plan.auto_decoder\)"):
        build_train_data(synthetic.data, rank=0, world_size=1, local_batch=8, seed=0, image_size=8, tokenizer=None)
