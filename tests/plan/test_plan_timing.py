"""The planner's step time (infcl_ds/plan/timing.py, calibrate.py): the calibration against
docs/benchmarks/train.json, the engine's phases and passes, float8 towers, the decoding rate,
the ring's scaling table, and the kernel rates read from a benchmark file."""
import json
from pathlib import Path

import pytest

from infcl_ds.config import load_recipe
from infcl_ds.plan import KernelRates, make_plan, ring_scaling_table
from infcl_ds.plan import memory as mem
from infcl_ds.plan.command import main
from infcl_ds.plan import calibrate
from infcl_ds.engine.tower_footprint import ACTIVATION_CALIBRATION, estimate_model
from infcl_ds.plan.timing import (CHUNK_HALVING_SLOWDOWN, COMPILED_ENCODER_RATES, DEFAULT_ENCODER_TFLOPS,
                                 MEASURED_ENCODER_RATES, chunk_factor)

GIB = 1 << 30
RECIPES = Path(__file__).resolve().parents[2] / "ds_configs" / "recipes"


@pytest.fixture(scope="module")
def rates():
    return KernelRates.load()


def test_constants_are_the_fit_of_the_64k_row_and_predict_the_others(rates):
    """ACTIVATION_CALIBRATION and MEASURED_ENCODER_RATES are what docs/benchmarks/train.json's
    B = 65,536 row gives; the 256k and 1M rows, not fitted, are predicted within 0.1% (peak)
    and 1% (step)."""
    rows, meta = calibrate.measured_rows()
    by_batch = {row["B"]: row for row in rows}
    fitted = calibrate.fit(by_batch[65536], meta, rates)
    assert ACTIVATION_CALIBRATION[("ViT-B-16", False)] == pytest.approx(fitted["factor"], abs=5e-5)
    measured = MEASURED_ENCODER_RATES["ViT-B-16"]
    assert (measured.forward, measured.forward_backward) == (fitted["encode_s_per_sample"],
                                                             fitted["reencode_s_per_sample"])
    # ViT-B-16's effective rate is the default for other models.
    flops = estimate_model("ViT-B-16").forward_flops()
    assert DEFAULT_ENCODER_TFLOPS * 1e12 == pytest.approx(4 * flops / (measured.forward + measured.forward_backward),
                                                          rel=5e-3)
    for batch in (262144, 1048576):
        check = calibrate.check(by_batch[batch], meta, rates)
        assert check["pred_peak_mib"] == pytest.approx(check["peak_mib"], rel=1e-3)
        assert check["pred_step_s"] == pytest.approx(check["step_s"], rel=0.01)
    assert calibrate.main([]) == 0


def test_float8_towers_are_planned_at_their_measured_phase_factors(rates):
    """model.float8: the compiled bf16 towers' phases times the float8/bf16 factors measured on
    ViT-L-14 (calibration/overheads.json), the source saying so."""
    from infcl_ds.plan.timing import FLOAT8_PHASE_FACTORS
    bf16, float8 = (make_plan(load_recipe(None, ["model.name=ViT-L-14", "batch.global=16384", "model.compile=true",
                                                 f"model.float8={v}"]), 1, 141 * GIB, rates=rates).time
                    for v in ("false", "true"))
    assert float8.encode == pytest.approx(bf16.encode * FLOAT8_PHASE_FACTORS[0])
    assert float8.reencode == pytest.approx(bf16.reencode * FLOAT8_PHASE_FACTORS[1])
    assert float8.encoders > bf16.encoders and "model.float8" in float8.encoder_source
    assert float8.encoder_rate == pytest.approx(bf16.encoder_rate * bf16.encoders / float8.encoders)


def test_step_time_follows_the_engine_phases(rates, monkeypatch):
    """encode = one no-grad forward, re-encode = forward + backward (+ a forward recomputed with
    checkpointing): measured per-sample times for ViT-B-16, FLOPs at a rate otherwise."""
    measured = MEASURED_ENCODER_RATES["ViT-B-16"]
    recipe = load_recipe(None, ["model.name=ViT-B-16", "batch.global=65536", "batch.chunk=256", "model.compile=false"])
    t = make_plan(recipe, 2, 141 * GIB, rates=rates).time
    assert t.encoder_measured
    assert (t.encode, t.reencode) == (32768 * measured.forward, 32768 * measured.forward_backward)
    assert t.total == t.encode + t.reencode + t.loss
    # Compiled towers (model.compile: auto plans for GPUs, true): their own measured rate, which
    # is faster; a model whose compiled towers were not measured keeps its eager rate.
    compiled = COMPILED_ENCODER_RATES["ViT-B-16"]
    assert compiled.forward + compiled.forward_backward < measured.forward + measured.forward_backward
    for value in ("auto", "true"):
        t = make_plan(load_recipe(None, ["model.name=ViT-B-16", "batch.global=65536", f"model.compile={value}",
                                         f"batch.chunk={compiled.chunk}"]), 2, 141 * GIB, rates=rates).time
        assert (t.encode, t.reencode) == (32768 * compiled.forward, 32768 * compiled.forward_backward)

    def l14_times():
        return (make_plan(load_recipe(None, ["model.name=ViT-L-14", "batch.global=16384", f"model.compile={v}",
                                             "batch.chunk=128"]), 1, 141 * GIB, rates=rates).time
                for v in ("false", "true"))
    eager_l14, compiled_l14 = l14_times()
    at_128 = chunk_factor(128, COMPILED_ENCODER_RATES["ViT-L-14"].chunk)  # measured at 512: two halvings slower
    assert at_128 == pytest.approx(CHUNK_HALVING_SLOWDOWN ** 2)
    assert compiled_l14.encode == pytest.approx(16384 * COMPILED_ENCODER_RATES["ViT-L-14"].forward * at_128)
    assert compiled_l14.encode < eager_l14.encode
    monkeypatch.delitem(COMPILED_ENCODER_RATES, "ViT-L-14")  # as for a model measured eager only
    eager_l14, compiled_l14 = l14_times()
    assert compiled_l14.encoders == eager_l14.encoders and "not measured" in compiled_l14.encoder_source
    ckpt = make_plan(load_recipe(None, ["model.name=ViT-B-16", "batch.global=65536", "batch.chunk=256",
                                        "model.grad_checkpointing=true", "model.compile=false"]), 2, 141 * GIB,
                     rates=rates).time
    assert ckpt.reencode == pytest.approx(32768 * (measured.forward_backward + measured.forward))
    # Not measured (ViT-H-14), or a rate given: 1 and 3 forwards' FLOPs at that rate.
    flops = estimate_model("ViT-H-14").forward_flops()
    large = load_recipe(None, ["model.name=ViT-H-14", "batch.global=65536", "batch.chunk=128"])
    t = make_plan(large, 2, 141 * GIB, rates=rates).time
    assert not t.encoder_measured
    assert t.encode == pytest.approx(flops * 32768 / (DEFAULT_ENCODER_TFLOPS * 1e12))
    assert t.reencode == pytest.approx(3 * t.encode)
    t = make_plan(recipe, 2, 141 * GIB, rates=rates, encoder_tflops=100.0).time
    assert not t.encoder_measured
    assert t.encoders == pytest.approx(4 * estimate_model("ViT-B-16").forward_flops() * 32768 / 100e12)
    # ZeRO-3: the encoder phases take ZERO3_ENCODER_SLOWDOWN times as long with large chunks, and
    # at least ZERO3_CHUNK_FLOOR_S per chunk pass with small ones (its host-side hooks; measured).
    from infcl_ds.plan.timing import ZERO3_CHUNK_FLOOR_S, ZERO3_ENCODER_SLOWDOWN
    zero3 = ["model.name=ViT-B-16", "batch.global=65536", "zero.stage=3", "model.compile=false"]
    z3 = make_plan(load_recipe(None, zero3 + ["batch.chunk=2048"]), 2, 141 * GIB, rates=rates).time
    assert z3.encode == pytest.approx(32768 * measured.forward * ZERO3_ENCODER_SLOWDOWN * chunk_factor(2048, measured.chunk))
    z3 = make_plan(load_recipe(None, zero3 + ["batch.chunk=128"]), 2, 141 * GIB, rates=rates).time
    assert z3.encode == pytest.approx(256 * ZERO3_CHUNK_FLOOR_S[0])
    assert z3.reencode == pytest.approx(256 * ZERO3_CHUNK_FLOOR_S[1])


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


def test_the_encoders_are_planned_at_the_chunk_they_run_at(rates):
    """A chunk half as large as the measured one makes the encoder phases CHUNK_HALVING_SLOWDOWN
    slower; a larger one faster, up to chunk 1,024 (the largest a gain was measured to)."""
    compiled = COMPILED_ENCODER_RATES["ViT-B-16"]  # measured at chunk 1,024

    def encoders(chunk):
        recipe = load_recipe(None, ["model.name=ViT-B-16", "batch.global=65536", f"batch.chunk={chunk}"])
        return make_plan(recipe, 2, 141 * GIB, rates=rates).time.encoders
    at_measured = 32768 * (compiled.forward + compiled.forward_backward)
    assert encoders(1024) == pytest.approx(at_measured)
    assert encoders(256) == pytest.approx(at_measured * CHUNK_HALVING_SLOWDOWN ** 2)
    assert encoders(2048) == pytest.approx(at_measured)
    assert chunk_factor(512, 256) == pytest.approx(1 / CHUNK_HALVING_SLOWDOWN) and chunk_factor(4096, 256) == \
        pytest.approx(CHUNK_HALVING_SLOWDOWN ** -2)


def test_decoding_rate_binds_the_step(rates, capsys):
    """2 x local batch decodes per step per rank; too few decode processes make the engine wait
    for them (plan/overlap.py) at least the decoding time beyond the compute, whatever the
    window, and the report says how many processes would keep up."""
    recipe = load_recipe(RECIPES / "vit-b32-512k-1gpu.yaml", ["data.decoder=pil", "data.decode_workers=2",
                                                              "data.keep_decoded_gib=0", "data.keep_decoded_host_gib=0"])
    plan = make_plan(recipe, 1, 139 * GIB, 1, 128 * GIB, rates=rates)
    decoding = plan.decoding
    assert decoding.decodes == 2 * 524_288 and decoding.binds and decoding.overlap.rate_binds
    assert decoding.needed == pytest.approx(2 * 524_288 / plan.time.total)
    assert decoding.overlap.bound_s == pytest.approx(2 * 524_288 / decoding.available - plan.time.total)
    assert plan.step_seconds == pytest.approx(plan.time.total + decoding.wait_s)
    assert decoding.wait_s >= decoding.overlap.bound_s - 1e-6
    assert main(["--config", str(RECIPES / "vit-b32-512k-1gpu.yaml"), "--gpus", "1", "--gpu-memory", "139GiB",
                 "--host-memory", "128GiB", "--set", "data.decoder=pil", "--set", "data.decode_workers=2",
                 "--set", "data.keep_decoded_gib=0",
                 "--set", "data.keep_decoded_host_gib=0"]) == 0
    out = capsys.readouterr().out
    assert "decoding binds: a steady step waits " in out
    assert f"    - {decoding.workers_needed()} decode processes a rank " in out
    # Chunks kept decoded on the GPU between the passes are decoded once: the recipe keeps all.
    kept = make_plan(load_recipe(RECIPES / "vit-b32-512k-1gpu.yaml"), 1, 139 * GIB, 1, 128 * GIB, rates=rates)
    assert kept.decoding.needed == pytest.approx(524_288 / kept.time.total)
    assert kept.gpu.components[mem.PIXELS_KEPT] == 524_288 * 3 * 224 ** 2 and kept.fits
    # Decoded host batches of 524,288 need more than the 128 GiB host: refused.
    decoded = make_plan(load_recipe(RECIPES / "vit-b32-512k-1gpu.yaml", ["data.host_batch=decoded"]), 1, 139 * GIB, 1,
                        128 * GIB, rates=rates)
    assert not decoded.fits and decoded.verdict.startswith("does not fit: host memory per node needs")


def test_decodes_follow_the_engines_passes():
    """Two passes decode every row twice (less the kept ones); a local batch of one chunk is
    encoded once (engine.step.engine_passes), and decoded once, unless ZeRO-3 forces two."""
    from types import SimpleNamespace

    from infcl_ds.config import load_recipe
    from infcl_ds.engine.step import engine_passes
    from infcl_ds.plan.timing import decoding
    base = ["model.name=ViT-B-16", "data.source=webdataset", "data.train=x", "batch.global=1024",
            "data.decode_workers=14", "data.decoder=pil", "data.decode_window_gib=1",
            "data.keep_decoded_host_gib=0"]  # resolved, as make_plan does
    time = SimpleNamespace(encode=0.25, loss=0.0, reencode=0.75)

    def decodes(recipe, kept=0):
        return decoding(recipe, 1024, time, kept, 224).decodes
    chunked = load_recipe(None, [*base, "batch.chunk=256"])
    assert decodes(chunked, kept=512) == 2 * 1024 - 512
    one = load_recipe(None, [*base, "batch.chunk=1024"])
    assert engine_passes(1, 2) == 1 and decodes(one) == 1024
    zero3 = load_recipe(None, [*base, "batch.chunk=1024", "zero.stage=3", "model.compile=false"])
    assert engine_passes(1, 3) == 2 and decodes(zero3) == 2 * 1024


def test_rates_come_from_the_clip_loss_rows_of_a_benchmark_file(tmp_path):
    """--rates FILE: the CLIP loss's rows (8 B^2 D; files from before rows said so count as
    such); a sigmoid loss file (6 B^2 D) is refused rather than read at the wrong work."""
    from infcl_ds.plan.refusal import PlanError
    row = {"impl": "infcl_ds", "status": "measured", "dtype": "bf16", "D": 768, "B": 65536, "tflops_eff": 400.0}
    for flops in (8, None):
        path = tmp_path / f"clip-{flops}.json"
        path.write_text(json.dumps({"meta": {}, "rows": [dict(row, flops_per_B2D=flops) if flops else row]}))
        assert KernelRates.load(path).rows == (("bf16", 768, 65536, 400e12),)
    path = tmp_path / "siglip.json"
    path.write_text(json.dumps({"meta": {}, "rows": [dict(row, flops_per_B2D=6)]}))
    with pytest.raises(PlanError, match="no measured infcl_ds rows of the CLIP loss"):
        KernelRates.load(path)


def test_a_model_first_measured_by_the_one_gpu_bench_gets_its_eager_and_compiled_rates(tmp_path):
    """calibrate's vs_open_clip rows: a model the planner had no entry for gets both rates (each
    from its smallest batch); a model already there keeps its fitted eager rate."""
    import json

    from infcl_ds.plan.calibrate import write_compiled_calibration
    encoders = json.loads((calibrate.CALIBRATION / "encoder_rates.json").read_text())
    encoders["models"].pop("ViT-B-32", None)  # a model the planner has no entry for yet
    (tmp_path / "encoder_rates.json").write_text(json.dumps(encoders))
    before = encoders["models"]["ViT-B-16"]

    def row(model, B, compiled, encode_s, **extra):
        return {"impl": "infcl_ds", "status": "measured", "world": 1, "model": model, "B": B, "local": B,
                "chunk": 1024, "compile": compiled, "encode_s": encode_s, "reencode_s": 3 * encode_s,
                "device": "NVIDIA H200", **extra}
    rows = [row("ViT-B-32", 131072, False, 9.0), row("ViT-B-32", 65536, False, 5.0),
            row("ViT-B-32", 65536, True, 4.0), row("ViT-B-32", 65536, True, 1.0, set=["model.float8=true"]),
            row("ViT-B-16", 32768, False, 99.0), row("ViT-B-16", 32768, True, 3.0)]
    (tmp_path / "vs.json").write_text(json.dumps({"rows": rows}))
    assert write_compiled_calibration(tmp_path / "vs.json", tmp_path) == ["ViT-B-32", "ViT-B-16"]
    models = json.loads((tmp_path / "encoder_rates.json").read_text())["models"]
    b32 = models["ViT-B-32"]
    assert (b32["samples"], b32["encode_s"], b32["reencode_s"]) == (65536, 5.0, 15.0)
    assert (b32["compiled"]["encode_s"], b32["compiled"]["samples"]) == (4.0, 65536)  # not the float8 row
    assert "B=65536 row (ViT-B-32" in b32["source"] and "compiled B=65536" in b32["compiled"]["source"]
    assert models["ViT-B-16"]["encode_s"] == before["encode_s"] and models["ViT-B-16"]["compiled"]["encode_s"] == 3.0
