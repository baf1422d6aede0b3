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


def test_open_clip_trains_row_sits_beside_the_engines_part_with_the_ratio_of_one_run(tmp_path):
    import json

    from benchmarks.scale_vs_open_clip_train import main
    engine = {**row("four-gpu-128k", 8000.0, "a"), "model": "ViT-B-16", "B": 131072, "impl": "infcl_ds"}
    older = {**row("four-gpu-1m", 8400.0, "z"), "model": "ViT-B-16", "B": 1048576}
    out = tmp_path / "scale.json"
    out.write_text(json.dumps({"meta": {"note": "kept"}, "rows": [engine, older]}))
    trainer = {"impl": "open_clip_train", "status": "measured", "data": "jpeg", "model": "ViT-B-16", "B": 131072,
               "world": 4, "samples_per_s": 5000.0, "step_s": 26.2, "device": "H100", "commit": "a",
               "command": "torchrun ...", "decode_workers": 14}
    synthetic = {**trainer, "data": "synthetic", "samples_per_s": 9999.0}
    rows_file = tmp_path / "oct.json"
    rows_file.write_text(json.dumps({"meta": {}, "rows": [synthetic, trainer]}))
    rows = main(["--rows", str(rows_file), "--out", str(out)])
    assert [r["part"] for r in rows] == ["four-gpu-128k", "four-gpu-1m", "four-gpu-128k-open-clip-train"]
    assert rows[0]["vs_open_clip_train"] == rows[2]["vs_open_clip_train"] == pytest.approx(1.6)
    assert rows[2]["impl"] == "open_clip_train" and rows[2]["samples_per_s"] == 5000.0
    assert json.loads(out.read_text())["meta"] == {"note": "kept"}
    # the engine's row of another run: no ratio; the trainer's row replaced, not doubled
    rows_file.write_text(json.dumps({"meta": {}, "rows": [{**trainer, "commit": "b"}]}))
    rows = main(["--rows", str(rows_file), "--out", str(out)])
    assert len(rows) == 3 and rows[2]["vs_open_clip_train"] is None and rows[2]["commit"] == "b"
    assert "vs_open_clip_train" not in rows[0]


def test_the_scale_plot_draws_this_engines_rows_beside_open_clip_trains(tmp_path):
    import json

    from benchmarks.plot import plot_scale
    engine = {**row("four-gpu-128k", 8000.0, "a"), "model": "ViT-B-16", "B": 131072, "impl": "infcl_ds", "nodes": 1,
              "plan_step_s": 14.1, "step_s": 16.3, "decode_wait_share": 0.03, "host_gib": 44.9, "plan_host_gib": 47.0,
              "peak_mib": 42516.0, "plan_peak_mib": 43066.0, "loss": [11.8, 12.0, 12.5]}
    trainer = {"part": "four-gpu-128k-open-clip-train", "impl": "open_clip_train", "model": "ViT-B-16", "B": 131072,
               "world": 4, "nodes": 1, "samples_per_s": 5000.0, "step_s": 26.2, "commit": "a", "device": "H100"}
    path = tmp_path / "scale.json"
    path.write_text(json.dumps({"meta": {}, "rows": [engine, trainer]}))
    plot_scale(path, tmp_path / "scale.png")
    assert (tmp_path / "scale.png").stat().st_size > 0


def test_a_part_run_with_other_overrides_is_a_row_of_its_own_and_a_rerun_replaces_its_own(tmp_path, monkeypatch):
    import json

    import benchmarks.plot
    from benchmarks.scale import Setup, save
    monkeypatch.setattr(benchmarks.plot, "plot_scale", lambda *a: None)
    b32 = {**row("two-gpu-b32-1m", 6400.0, "a"), "set": []}
    four_lanes = {**b32, "samples_per_s": 7000.0, "set": ["data.gpu_decode_lanes=4"]}
    out = tmp_path / "scale.json"
    out.write_text(json.dumps({"meta": {}, "rows": [b32, four_lanes]}))
    setup = Setup("cuda", tmp_path, tmp_path, out, [])
    rows = save(setup, [{**row("four-gpu-b32-2m", 12600.0, "b"), "set": []}])
    assert [(r["part"], r["samples_per_s"]) for r in rows] == [  # in the parts' order
        ("four-gpu-b32-2m", 12600.0), ("two-gpu-b32-1m", 6400.0), ("two-gpu-b32-1m", 7000.0)]
    rows = save(setup, [{**b32, "samples_per_s": 6500.0, "commit": "c"}])
    assert sorted(r["samples_per_s"] for r in rows if r["part"] == "two-gpu-b32-1m") == [6500.0, 7000.0]


def test_a_wait_counts_its_seconds_from_its_own_start(tmp_path, monkeypatch, capsys):
    """--wait SECONDS ends SECONDS after the process started, its imports' time included: a run
    still going past then is "still running" (3), at once when that time has passed."""
    import os
    import time

    from benchmarks.scale import Setup, wait
    monkeypatch.delenv("OUT", raising=False)
    (tmp_path / "scale.pid").write_text(str(os.getpid()))  # a live process: the run goes on
    (tmp_path / "scale.log").write_text("step 1/3: 60 s so far\n")
    setup = Setup("cpu", tmp_path, tmp_path, tmp_path / "scale.json", [])
    began = time.monotonic()
    assert wait(30.0, setup, started=began - 60.0) == 3
    assert time.monotonic() - began < 5.0
    assert "still running" in capsys.readouterr().out


def test_a_merge_keeps_the_files_note_and_plots_the_steps_of_a_run_whose_split_moved(tmp_path):
    """scale.json's note says where its rows ran: a merge keeps it. A run whose `hybrid` split
    moved gets its steps drawn (scale_split-PART.png), from its row alone: each step's time, wait,
    the decoders' rates and the split."""
    import json

    from benchmarks.scale import Setup, save, split_png, step_figures
    out = tmp_path / "scale.json"
    out.write_text(json.dumps({"meta": {"note": "rows of several runs"}, "rows": []}))
    steps = [{"step": k, "loss": 11.8, "step_s": t, "decode_wait_s": w, "decode_wait_gpu_s": g,
              "decode_rows_per_process_s": p, "decode_busy_share": 0.5, "decode_gpu_rows_per_s": r,
              "decode_gpu_share": s}
             for k, t, w, g, p, r, s in ((1, 54.2, 12.6, 9.6, 288.0, 2784.0, 0.533),
                                         (2, 25.4, 1.8, 0.0, 280.6, 1439.0, 0.533),
                                         (3, 30.6, 8.1, 7.7, 288.6, 2738.0, 0.533),
                                         (4, 29.2, 7.5, 1.5, 254.4, 3752.0, 0.411))]
    figures = step_figures(steps, 131072)
    assert figures["decode_rows_per_process_steps"] == [288.0, 280.6, 288.6, 254.4]
    moved = {**row("one-gpu-b32-128k", 4070.0, "a"), "set": [], "model": "ViT-B-32", "B": 131072, "world": 1,
             "nodes": 1, "plan_step_s": 27.7, "host_gib": 17.7, "plan_host_gib": 19.3, "plan_peak_mib": 90347.0,
             "planner_said": ["auto: data.decoder=hybrid; data.decode_workers=13 (read from this node)"], **figures}
    still = {**moved, "part": "two-gpu-b32-1m", "decode_gpu_shares": [0.575, 0.575, 0.575]}
    save(Setup("cuda", tmp_path, tmp_path, out, []), [moved, still])
    assert json.loads(out.read_text())["meta"]["note"] == "rows of several runs"
    assert split_png(out, "one-gpu-b32-128k").stat().st_size > 0
    assert not split_png(out, "two-gpu-b32-1m").exists()
