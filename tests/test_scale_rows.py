"""How benchmarks/scale.py pairs rows of docs/benchmarks/scale.json: a weak-scaling efficiency is
a ratio of two rows measured in one run, and stays the one its own run gave when the file's
baseline is replaced by a later run's."""
import pytest

from benchmarks.scale import with_efficiency


def row(part, samples_per_s, commit, device="H100"):
    return {"part": part, "samples_per_s": samples_per_s, "world": 4, "accelerator": "cuda", "device": device,
            "commit": commit, "checks": {}}


def test_efficiency_pairs_the_baseline_of_the_same_run():
    base, big = row("four-gpu-128k", 8000.0, "a"), row("four-gpu-1m", 8400.0, "a")
    with_efficiency([base, big])
    assert big["efficiency"] == pytest.approx(1.05)
    assert big["efficiency_reference"]["commit"] == "a" and big["checks"]["efficiency_95pct"]


def test_a_later_baseline_leaves_an_earlier_runs_efficiency_alone():
    base, big = row("four-gpu-128k", 8000.0, "a"), row("four-gpu-1m", 8400.0, "a")
    with_efficiency([base, big])
    later = row("four-gpu-128k", 7000.0, "b")  # the baseline measured again, beside another part
    with_efficiency([later, big])
    assert big["efficiency"] == pytest.approx(1.05) and big["efficiency_reference"]["samples_per_s"] == 8000.0


def test_no_efficiency_without_a_baseline_of_its_run():
    lone = row("four-gpu-2m", 8300.0, "c")
    with_efficiency([row("four-gpu-128k", 8000.0, "a"), lone])
    assert lone["efficiency"] is None
    other_card = row("four-gpu-2m", 8300.0, "a", device="H200")
    with_efficiency([row("four-gpu-128k", 8000.0, "a"), other_card])
    assert other_card["efficiency"] is None


def test_a_parts_model_and_settings_reach_its_gpu_run_but_not_the_tiny_cpu_one(tmp_path):
    from benchmarks.scale import PARTS, Setup, recipe_sets
    part = PARTS["four-gpu-b32-2m"]
    gpu = Setup("cuda", tmp_path, tmp_path, tmp_path / "scale.json", ["logging.every=1"])
    sets = recipe_sets(part, gpu, "shards", tmp_path / "run", 3)
    assert "model.name=ViT-B-32" in sets and "data.decoder=auto" in sets and "data.gpu_jpeg_library=nvimgcodec" in sets
    assert sets[-1] == "logging.every=1"  # the invocation's --set comes last and wins
    assert f"batch.global={2048 * 1024}" in sets
    cpu = recipe_sets(part, Setup("cpu", tmp_path, tmp_path, tmp_path / "scale.json", []), "shards", tmp_path, 3)
    assert "model.name=infcl-tiny" in cpu and not any(s.startswith("data.decoder=") for s in cpu)
