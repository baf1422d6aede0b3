"""benchmarks/gpu_tests.py: a part's pytest run (its JUnit XML) as a row of gpu_tests.json, the
outcomes counted as pytest counts them, a rerun of the same part and round replacing its row."""
import json
import subprocess
import sys
from pathlib import Path

from benchmarks.gpu_tests import junit_counts, main

ROOT = Path(__file__).resolve().parents[1]


def test_a_real_pytest_runs_outcomes_become_a_row_and_a_rerun_replaces_it(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_ok(): pass\n"
        "def test_also_ok(): pass\n"
        "def test_bad(): assert 1 == 2\n"
        "@pytest.mark.skip(reason='gloo only')\n"
        "def test_skipped(): pass\n"
        "@pytest.fixture\n"
        "def broken(): raise RuntimeError('setup')\n"
        "def test_error(broken): pass\n")
    junit = tmp_path / "part.xml"
    subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path / "test_sample.py"),
                    f"--junitxml={junit}"], cwd=tmp_path, capture_output=True, timeout=120)
    counts = junit_counts(junit)
    assert (counts["passed"], counts["failed"], counts["skipped"]) == (2, 2, 1)
    assert sorted(f.rsplit("::", 1)[1] for f in counts["failures"]) == ["test_bad", "test_error"]
    out = tmp_path / "gpu_tests.json"
    for round_ in (1, 2, 1):
        row = main(["--junit", str(junit), "--part", "1", "--parts", "3", "--round", str(round_), "--gpus", "4",
                    "--out", str(out)])
    assert row["gpus"] == 4 and row["seconds"] > 0 and "commit" in row
    rows = json.loads(out.read_text())["rows"]
    assert [(r["part"], r["parts"], r["round"]) for r in rows] == [(1, 3, 2), (1, 3, 1)]


def test_the_gpu_plan_script_says_its_parts_without_running_any():
    for argv in ([], ["round", "1"], ["durations", "two"], ["rounds", "1", "1/2"]):
        done = subprocess.run(["bash", str(ROOT / "launch" / "bench_gpu_tests.sh"), *argv], capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": "/nonexistent-out"})
        assert done.returncode == 2, (argv, done.stderr)
        assert "bench_gpu_tests.sh round R K/N" in done.stderr


def test_the_nccl_plan_script_says_its_parts_and_refuses_an_unknown_one_before_running():
    for argv in ([], ["faults-5"], ["siglip-ring", "nonsense"]):
        done = subprocess.run(["bash", str(ROOT / "launch" / "bench_nccl.sh"), *argv], capture_output=True,
                              text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "OUT": "/nonexistent-out"})
        assert done.returncode == 2, (argv, done.stderr)
        for part in ("faults-1", "engine-128k", "open-clip-train-128k", "siglip-ring"):
            assert part in done.stderr
