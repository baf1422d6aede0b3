"""The loss benchmarks' harness (benchmarks/harness.py) on CPU: `bench loss` writes one row schema
for both losses, the float64 self-check fails a wrong gradient, the timing policy runs the step
as documented, and the files written before the one schema still read."""
import json
from pathlib import Path

import pytest
import torch

from benchmarks import harness, loss
from reference import clip_loss_reference, siglip_loss_reference

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = {"impl", "B", "D", "dtype", "world", "ms", "peak_mib", "tflops_eff", "flops_per_B2D", "status", "device",
          "commit"}


@pytest.mark.parametrize("which, baseline, flops", [("clip", "full_logits", 8), ("siglip", "open_clip", 6)])
def test_bench_loss_writes_one_schema_for_both_losses(tmp_path, which, baseline, flops):
    out = tmp_path / f"{which}.json"
    argv = ["--loss", which, "--no-check", "--batch", "128,256", "--dim", "32", "--dtype", "fp32",
            "--impl", f"infcl_ds,{baseline}", "--reps", "2", "--out", str(out)]
    loss.main(argv + (["--extra", ""] if which == "clip" else []))
    rows = json.loads(out.read_text())["rows"]
    assert [(r["impl"], r["B"]) for r in rows] == [("infcl_ds", 128), (baseline, 128), ("infcl_ds", 256),
                                                   (baseline, 256)]
    for row in rows:
        assert SCHEMA <= set(row), SCHEMA - set(row)
        assert row["status"] == "measured" and row["world"] == 1 and row["flops_per_B2D"] == flops
        assert row["tflops_eff"] == pytest.approx(flops * row["B"] ** 2 * 32 / (row["ms"] * 1e-3) / 1e12)
    assert ("peak_mib_budget" in rows[0]) == (which == "siglip")
    assert out.with_suffix(".png").stat().st_size > 10_000


def test_float64_check_passes_the_exact_gradients_and_fails_a_wrong_one():
    g = torch.Generator().manual_seed(0)
    image, text = (torch.nn.functional.normalize(torch.randn(64, 16, generator=g), dim=1) for _ in range(2))
    scale, bias = torch.tensor(10.0), torch.tensor(-10.0)
    ref_loss, *grads = clip_loss_reference(image, text, scale)
    inputs = (image, text, scale)
    assert harness.compare_with_float64("fp32", clip_loss_reference, inputs, grads, ref_loss)["ok"]
    wrong = [grads[0] * 1.01, *grads[1:]]  # 1% off: outside fp32's tolerance, inside bf16's
    assert not harness.compare_with_float64("fp32", clip_loss_reference, inputs, wrong)["ok"]
    assert harness.compare_with_float64("bf16", clip_loss_reference, inputs, wrong)["ok"]
    # The CLIP loss of a batch of one is constant: its zero gradients are not judged.
    one = (image[:1], text[:1], scale)
    noise = [torch.full_like(x, 1e-6) for x in one]
    assert harness.compare_with_float64("fp32", clip_loss_reference, one, noise, torch.tensor(0.0))["ok"]
    # The sigmoid loss: its value is judged too when a tolerance is given.
    inputs = (image, text, scale, bias)
    ref_loss, *grads = siglip_loss_reference(*inputs)
    assert harness.compare_with_float64("fp32", siglip_loss_reference, inputs, grads, ref_loss, 1e-4)["ok"]
    off = harness.compare_with_float64("fp32", siglip_loss_reference, inputs, grads, ref_loss * 1.001, 1e-4)
    assert not off["ok"] and off["loss_rel_err"] == pytest.approx(1e-3)


def test_a_rows_estimate_comes_from_its_impl_at_its_d_and_dtype():
    """A row is long (timed once, unwarmed) only by the rate of an earlier row of its shape class:
    the first row of a new D or dtype is where its kernels compile and tune."""
    done = [harness.record(harness.loss_row("infcl_ds", 1024, 64, "bf16", 1, 6), 10.0, None)]
    rate = done[0]["tflops_eff"]
    assert harness.estimated_s(done, harness.loss_row("infcl_ds", 2048, 64, "bf16", 1, 6)) == pytest.approx(0.04)
    assert rate == pytest.approx(6 * 1024**2 * 64 / 1e-2 / 1e12)
    for impl, D, dtype in (("infcl_ds", 96, "bf16"), ("infcl_ds", 64, "fp32"), ("open_clip", 64, "bf16")):
        assert harness.estimated_s(done, harness.loss_row(impl, 2048, D, dtype, 1, 6)) == 0.0


@pytest.mark.parametrize("how, calls", [(dict(reps=3), 1 + 1 + 3),
                                        (dict(reps=3, long_row_ms=0.0), 1 + 1),
                                        (dict(reps=1, warm_up=False), 1),
                                        (harness.timing(4.0, reps=3, long_row_seconds=5.0), 1 + 1 + 3),
                                        (harness.timing(6.0, reps=3, long_row_seconds=5.0), 1 + 1),
                                        (harness.timing(31.0, reps=3, long_row_seconds=5.0), 1)])
def test_measure_runs_the_warm_up_the_peak_run_and_the_repetitions(how, calls):
    """A warm-up, one run for the peak (and a time), then --reps more unless the row is long;
    a row the benchmarks expect to be long (harness.timing) runs once, after a warm-up, and one
    expected past UNWARMED_ROW_SECONDS without it."""
    runs = []
    inputs = tuple(torch.ones(2, requires_grad=True) for _ in range(3))

    def loss_fn(*xs):
        assert all(x.grad is None for x in xs)  # every run starts from dropped gradients
        runs.append(1)
        return sum(x.sum() for x in xs)
    ms, peak = harness.measure(loss_fn, inputs, **how)
    assert len(runs) == calls and ms >= 0 and peak is None  # no peak off the GPU


@pytest.mark.parametrize("name", ["siglip", "siglip_ring", "ring"])
def test_files_of_the_old_row_names_read_as_the_one_schema(tmp_path, name):
    """siglip*.json (eff_tflops, extra_mib) and ring.json (tflops_eff_per_gpu) are measured
    records kept as written: the plots read them through harness.OLD_NAMES."""
    from benchmarks import plot
    path = ROOT / "docs" / "benchmarks" / f"{name}.json"
    rows = [harness.as_current(r) for r in json.loads(path.read_text())["rows"] if r.get("ms")]
    assert rows and all(r["tflops_eff"] > 0 and not set(r) & set(harness.OLD_NAMES) for r in rows)
    draw = plot.plot_ring if name == "ring" else plot.plot_siglip
    draw(path, tmp_path / f"{name}.png")
    assert (tmp_path / f"{name}.png").stat().st_size > 10_000


def test_the_sigmoid_ring_rows_carry_open_clips_exchanges_and_the_efficiency(tmp_path):
    """`bench ring --loss siglip` on two gloo ranks: after the float64 check, a row per impl
    (open_clip's SigLipLoss with a dist_impl of its own), then this code on one rank at the
    ring's work per GPU (global B / sqrt(2) samples) and the ring row's efficiency against it."""
    from benchmarks import ring
    out = tmp_path / "siglip_ring.json"
    ring.main(["--loss", "siglip", "--batch", "128", "--dim", "32", "--dtype", "fp32", "--reps", "1",
               "--impl", "infcl_ds,open_clip_shift", "--check-rows", "37", "--out", str(out)])
    data = json.loads(out.read_text())
    assert all(check["ok"] for check in data["meta"]["checks"])
    rows = {r["impl"]: r for r in data["rows"]}
    assert set(rows) == {"infcl_ds", "open_clip_shift", "infcl_ds_1gpu"}
    ring_row, one = rows["infcl_ds"], rows["infcl_ds_1gpu"]
    assert (one["B"], one["world"], one["same_work_as_B"]) == (91, 1, 128)  # round(128 / sqrt(2))
    assert ring_row["efficiency"] == pytest.approx(ring_row["tflops_eff"] / one["tflops_eff"])
