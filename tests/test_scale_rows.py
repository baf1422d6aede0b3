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
