"""`python -m benchmarks.host_memory` on CPU: the tiny model on the digits shards, both host
forms, two steps each, then a resume: rows with the measured and planned figures, the user's
--set keys applied without overriding the run's own steps, form and directory."""
import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks.common import free_port
from infcl_ds.data.commands.digits import build_digits

ROOT = Path(__file__).resolve().parents[1]


def _bench(tmp_path, *extra):
    env = dict(os.environ, DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), RANK="0",
               WORLD_SIZE="1", LOCAL_RANK="0", OMP_NUM_THREADS="1")
    sets = ["data.source=webdataset", f"data.train={tmp_path / 'digits' / 'train'}",
            f"data.eval={tmp_path / 'digits' / 'test'}", "batch.global=64",
            "batch.chunk=32", f"output_dir={tmp_path / 'run'}", "data.workers=0", "eval.every=0",
            "schedule.warmup_steps=1"]
    argv = [sys.executable, "-m", "benchmarks.host_memory", "--recipe", "ds_configs/recipes/tiny-cpu.yaml",
            "--host-memory", "16GiB", "--out", str(tmp_path / "hm.json"), *extra]
    for item in sets:
        argv += ["--set", item]
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return json.loads((tmp_path / "hm.json").read_text())


def test_host_memory_rows_for_both_forms_and_a_resume(tmp_path):
    build_digits(tmp_path / "digits", image_size=32)
    # A row of another batch already in the file stays; this run's rows are added beside it.
    other = {"host_batch": "encoded", "model": "ViT-B-32", "B": 65536, "world": 1, "status": "measured", "host_gib": 16.0}
    (tmp_path / "hm.json").write_text(json.dumps({"meta": {}, "rows": [other]}))
    data = _bench(tmp_path, "--steps", "2")
    assert data["rows"][0] == other
    data["rows"] = data["rows"][1:]
    rows = {r["host_batch"]: r for r in data["rows"]}
    assert set(rows) == {"encoded", "decoded"}
    for form, row in rows.items():
        assert row["status"] == "measured" and row["steps"] == [1, 2], row
        assert row["host_gib"] == 16 and row["plan_host_gib"] > 0 and row["step_s"] > 0
        assert f"output_dir={tmp_path / 'run'}-{form}" in row["command"]
        # the timeline: [s since start, GiB above it, tree RSS GiB, shared GiB, total GiB, tree
        # PSS GiB] from the start to the end of the run, every 5 s; its largest tree figures are
        # the run's peaks, and PSS (shared pages counted once) is at most the summed RSS
        timeline = row["host_timeline"]
        assert all(len(point) == 6 and point[4] > 0 for point in timeline) and timeline[0][0] <= 1.0
        assert all(0 < point[5] <= point[2] + 0.006 for point in timeline[1:]), timeline
        assert timeline[-1][0] >= row["wall_s"] - 5.0 - 3.0, (timeline, row["wall_s"])
        assert all(b[0] - a[0] <= 5.0 + 1.0 for a, b in zip(timeline, timeline[1:]))
        assert abs(max(p[2] for p in timeline) - row["peak_tree_rss_gib"]) <= 0.006
        assert abs(max(p[5] for p in timeline) - row["peak_tree_pss_gib"]) <= 0.006
    # Held encoded, a 32 px PNG sample is a fraction of its decoded pixels + tokens.
    assert rows["encoded"]["bytes_per_sample"] < rows["decoded"]["bytes_per_sample"]
    resumed = _bench(tmp_path, "--steps", "3", "--resume")
    encoded = next(r for r in resumed["rows"] if r["host_batch"] == "encoded" and r["B"] == 64)
    assert "resume" not in resumed["rows"][0]  # the other batch's row is not the one resumed
    assert encoded["resume"]["steps"] == [3] and encoded["resume"]["first_step_after_resume"] == 3


def test_the_sampler_keeps_no_point_from_after_the_tree_exited():
    """Samples taken after the process exited, before its waiter sets `done`, are not the run's:
    no timeline point of zero resident memory at the end."""
    import time

    from benchmarks.host_memory import MemorySampler
    proc = subprocess.Popen([sys.executable, "-c", "import time; x = bytearray(50_000_000); time.sleep(1.0)"])
    sampler = MemorySampler(proc.pid, period_s=0.05, timeline_s=0.2)
    sampler.start()
    proc.wait()
    time.sleep(0.6)  # samples of the exited tree: three timeline periods
    sampler.done.set()
    sampler.join()
    assert sampler.timeline and all(point[2] > 0 for point in sampler.timeline), sampler.timeline
    assert sampler.peak_tree_rss > 50_000_000


def test_peak_host_takes_the_reading_that_saw_the_peak():
    """PSS sweeps of a large run stop before its peak: on a host whose total stays put the memory
    in use (read every period) gives the peak; on a VM whose total grows, only the PSS holds."""
    from benchmarks.host_memory import peak_host
    steady = [[5.0 * i, used, 0.0, 0.0, 503.76, 288.46] for i, used in enumerate((161.0, 405.9, 415.8))]
    assert peak_host(415.8, 288.46, steady) == (415.8, "in use")
    assert peak_host(40.0, 42.2, steady) == (42.2, "pss")  # the sweeps saw more than the whole machine
    growing = [[0.0, 10.0, 0.0, 0.0, 251.0, 9.0], [5.0, 30.0, 0.0, 0.0, 280.0, 11.0]]
    assert peak_host(30.0, 11.0, growing) == (11.0, "pss")
    assert peak_host(30.0, 11.0, []) == (11.0, "pss")  # no timeline: nothing says the total held
