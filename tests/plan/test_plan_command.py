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
    assert parse_size("1024B") == 1024


def test_a_memory_size_without_its_unit_is_refused_naming_the_option(capsys):
    # a bare 80 had been 80 bytes: the plan then said the model needs its memory "of 0.0 GiB"
    with pytest.raises(SystemExit) as refused:
        main(["--config", str(RECIPES / "tiny-cpu.yaml"), "--gpu-memory", "80"])
    assert refused.value.code == 2
    err = capsys.readouterr().err
    assert "--gpu-memory" in err and "'80' has no unit (e.g. 80GiB or 80GB)" in err, err


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
    (["--gpus", "-2"], "--gpus: must be 1 to 16384, got -2"),
    (["--gpus", "99999999999999999999"], "--gpus: must be 1 to 16384, got 99999999999999999999"),
    (["--gpus", "0"], "--gpus: must be 1 to 16384, got 0"),
    (["--gpus", "16384", "--set", "batch.global=512", "--set", "batch.chunk=1"],
     "batch.global=512 is smaller than the world size 16384: each rank needs a sample"),
    (["--gpus", "8", "--gpus-per-node", "99999999999999999999"], "--gpus-per-node: must be 1 to 16384, got 9999"),
    (["--num_gpus", "0"], "--num_gpus: must be -1 (all) or 1 to 16384, got 0"),
    (["--num_gpus", "99999999999999999999"], "--num_gpus: must be -1 (all) or 1 to 16384, got 9999"),
    (["--num_nodes", "-3"], "--num_nodes: must be -1 (all) or 1 to 16384, got -3"),
    (["--gpus", "8", "--cores", "99999999999999999999"], "--cores: must be 1 to 8192, got 9999"),
    (["--scaling", "--ranks", "0"], "--ranks: must be 1 to 16384, got 0"),
    (["--scaling", "--ranks", "8,99999999999999999999"], "--ranks: must be 1 to 16384, got 9999"),
    (["--scaling", "--ranks", "8,x"], "--ranks: 'x' is not a whole number"),
    (["--scaling", "--dim", "-5"], "--dim: must be 1 to 65536, got -5"),
    (["--scaling", "--dim", "99999999999999999999"], "--dim: must be 1 to 65536, got 9999"),
    (["--scaling", "--batch", "0"], "--batch: each batch must be 1 to 1073741824 (1024M), got '0'"),
    (["--scaling", "--batch", "4M,99999999999999M"], "--batch: each batch must be 1 to 1073741824 (1024M), got '9999"),
    (["--scaling", "--batch", "4k", "--ranks", "8,8192"], "--ranks 8192 is more than --batch 4096"),
    (["--rates", "__file__"], "--rates"),
])
def test_bad_plan_arguments_are_one_line_naming_them(args, named, capsys):
    """Each was a traceback (ZeroDivisionError, JSONDecodeError), a silent nonsense plan or
    table, or an absurd rank count answered with 'nearest valid: 0 or ...'."""
    args = [__file__ if a == "__file__" else a for a in args]
    with pytest.raises(SystemExit) as stop:
        code = main(["--config", str(RECIPES / "vit-l14-256k-8gpu.yaml"), *args])
        raise SystemExit(code)
    err = capsys.readouterr().err.strip()
    assert stop.value.code == 2 and len(err.splitlines()) == 1 and named in err, err
    assert "nearest valid: 0" not in err


def test_every_plan_flag_has_help():
    from infcl_ds.plan.command import _parser
    silent = [action.option_strings for action in _parser()._actions if not action.help]
    assert silent == []


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


# A time the report rounded to nothing: "0 s", "0.0 s", "0 ms", "0.0 ms" (as in "108 ms instead of 0 ms").
BARE_ZERO = re.compile(r"(?<![\d.])0(\.0+)? (s|ms)\b")


def test_times_under_a_second_are_never_a_bare_zero(capsys, monkeypatch):
    """tiny-cpu planned for 2 GPUs: a step of tens of microseconds, whose decoding binds."""
    from test_plan_machine import CPU_NODE
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: CPU_NODE)
    assert main(["--config", str(RECIPES / "tiny-cpu.yaml"), "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    assert not BARE_ZERO.search(out), BARE_ZERO.search(out)
    binds = next(line for line in out.splitlines() if "decoding binds" in line)
    assert re.search(r": \d+ ms instead of \d+(\.\d)? us$", binds), binds
    step = next(line for line in out.splitlines() if line.startswith("step time:"))
    assert re.match(r"step time: \d+(\.\d)? us = encode \d+(\.\d)? us", step), step


def test_a_plan_for_cpu_ranks_speaks_of_ranks_their_cores_and_host_memory(capsys, monkeypatch):
    """DS_ACCELERATOR=cpu (launch/train.sh tiny-cpu.yaml --num_gpus 2 on a CPU machine): the
    ranks' tensors are host memory, the decode processes come from this node's 2 cores, and
    nothing is said of GPUs, NVLink or a GPU-rated step time."""
    from test_plan_machine import CPU_NODE
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: CPU_NODE)
    assert main(["--config", str(RECIPES / "tiny-cpu.yaml"), "--gpus", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert lines[0].endswith("ZeRO-2, 2 CPU ranks (1 node x 2; DS_ACCELERATOR=cpu: over gloo)"), lines[0]
    assert "= 256 per rank," in lines[1] and lines[1].endswith("cached features in host memory")
    for gpu_words in ("NVLink", "GiB GPUs", "per GPU", "GPU memory", "TFLOP", "runtime reserve", "--gpu-memory",
                      "decoding binds", "16 cores"):
        assert gpu_words not in out, gpu_words
    assert not BARE_ZERO.search(out)
    # 2 cores on the node, 2 ranks: one core each, decoded in the training process
    assert ("data.decode_workers=0 (1 core of each rank's share, 2 on a node / 2 ranks: decoded in the training "
            "process, which a decode process would only take turns with; read from this node)") in out
    host = next(line for line in lines if line.startswith("host memory per node (GiB):"))
    assert "the ranks' tensors (no GPU)" in host and host.endswith("of 24.0 (read from this node's MemTotal)")
    assert any(line.startswith("step time: not modelled on CPU ranks") for line in lines)
    assert lines[-3] == "binding limit: host memory per node" + lines[-3].split("host memory per node")[1]
    assert lines[-2].startswith("fits: ") and lines[-2].endswith("of 24.0 GiB of host memory per node")
    assert re.fullmatch(r"peak per rank: \d+\.\d GiB, in host memory", lines[-1])
    # --cores: 8 on the node, 4 a rank, less the training process and the reader
    assert main(["--config", str(RECIPES / "tiny-cpu.yaml"), "--gpus", "2", "--cores", "8"]) == 0
    assert "data.decode_workers=2 (4 cores of each rank's share, 8 on a node / 2 ranks" in capsys.readouterr().out


@pytest.mark.parametrize("args, named", [
    (["--gpu-memory", "80GiB"], "--gpu-memory: DS_ACCELERATOR=cpu runs the ranks on their CPUs"),
    (["--max-step-time", "10"], "--max-step-time: the step time of CPU ranks (DS_ACCELERATOR=cpu) is not modelled"),
    (["--encoder-tflops", "100"], "--encoder-tflops: the step time of CPU ranks"),
    (["--set", "data.decoder=hybrid"], "data.decoder=hybrid decodes on the GPU and DS_ACCELERATOR=cpu runs the ranks"),
])
def test_cpu_ranks_refuse_what_only_a_gpu_has(args, named, capsys, monkeypatch):
    from test_plan_machine import CPU_NODE
    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: CPU_NODE)
    assert main(["--config", str(RECIPES / "tiny-cpu.yaml"), "--gpus", "2", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and named in err, err


def test_a_missing_nvimgcodec_is_named_with_its_extra(capsys, monkeypatch):
    """data.gpu_jpeg_library=nvimgcodec without nvImageCodec importable: on a GPU node (it trains)
    a refusal naming the extra; on a node without a GPU (it plans for others) a note; nothing
    where the GPU decodes no JPEGs."""
    import sys
    from test_plan_machine import CPU_NODE, H200_NODE
    monkeypatch.setitem(sys.modules, "nvidia.nvimgcodec", None)  # an import of it raises ImportError
    extra = "pip install 'infcl_ds[gpu-decode]'"
    plan = ["--config", str(RECIPES / "vit-b32-512k-1gpu.yaml"), "--set", "data.gpu_jpeg_library=nvimgcodec"]
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: H200_NODE)
    assert main(plan + ["--set", "data.decoder=hybrid"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nvImageCodec, which is not installed" in err and extra in err, err
    monkeypatch.setattr("infcl_ds.plan.command.read_node", lambda: CPU_NODE)
    assert main(plan + ["--set", "data.decoder=nvjpeg"]) in (0, 1)
    lines = capsys.readouterr().out.strip().splitlines()
    note = lines[-3]
    assert note.startswith("note: data.gpu_jpeg_library=nvimgcodec needs NVIDIA's nvImageCodec") and extra in note
    assert main(plan + ["--set", "data.decoder=pil"]) in (0, 1)
    assert "nvImageCodec" not in capsys.readouterr().out
