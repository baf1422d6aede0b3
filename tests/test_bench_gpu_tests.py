"""benchmarks/gpu_tests.py: a part's pytest run (its JUnit XML) as a row of gpu_tests.json, the
outcomes counted as pytest counts them, a rerun of the same part and round replacing its row;
benchmarks/pytest_log.py: a pass cut by its time limit goes on where it stopped, and its log
becomes pytest-split's durations."""
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.gpu_tests import junit_counts, main
from benchmarks.pytest_log import read_log

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


SAMPLE_PASS = (
    "import os, time, pytest\n"
    "def test_a(): pass\n"
    "def test_b(): assert 1 == 2\n"
    "@pytest.mark.skip(reason='gloo only')\n"
    "def test_c(): pass\n"
    "def test_d():\n"
    "    if os.environ.get('HANG'):\n"
    "        open(os.environ['HANG'], 'w').close()\n"
    "        time.sleep(60)\n"
    "@pytest.fixture\n"
    "def broken(): raise RuntimeError('setup')\n"
    "def test_e(broken): pass\n"
    "def test_f(): time.sleep(0.2)\n")


def _ignore_sigint():
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _pass(tmp_path, log, **env):
    # Started with SIGINT ignored, as from a shell's background without job control (nohup ... &):
    # the plugin restores it, or SIGINT would not cut the pass.
    return subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "benchmarks.pytest_log",
                             "--test-log", str(log), str(tmp_path / "test_sample.py"), str(tmp_path / "test_extra.py")], cwd=tmp_path,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **env},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_ignore_sigint)


def test_a_pass_cut_by_sigint_goes_on_where_it_stopped_and_becomes_the_durations(tmp_path):
    """The plugin logs each test as it ends; SIGINT (bench_gpu_tests.sh's time limit) in the
    middle of a test leaves that test unlogged, and the next run runs it and only what is left.
    The whole log is pytest-split's durations and the row of round 0."""
    (tmp_path / "test_sample.py").write_text(SAMPLE_PASS)
    (tmp_path / "test_extra.py").write_text("import pytest\npytest.skip('needs an extra', allow_module_level=True)\n")
    log, hanging = tmp_path / "log.jsonl", tmp_path / "hanging"
    cut = _pass(tmp_path, log, HANG=str(hanging))
    deadline = time.monotonic() + 60
    while not hanging.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert hanging.exists(), cut.communicate(timeout=60)[0]
    cut.send_signal(signal.SIGINT)
    cut.communicate(timeout=60)
    first = read_log(log)
    assert sorted(t.rsplit("::", 1)[-1] for t in first) == ["test_a", "test_b", "test_c", "test_extra.py"]
    with log.open("a") as f:
        f.write('{"test": "cut short')  # a line a kill cut: left out, its test runs again
    rest = _pass(tmp_path, log)
    out = rest.communicate(timeout=120)[0]
    assert "3 deselected" in out, out
    logged = read_log(log)
    assert {t.rsplit("::", 1)[-1]: e["outcome"] for t, e in logged.items()} == {
        "test_a": "passed", "test_b": "failed", "test_c": "skipped", "test_d": "passed", "test_e": "failed",
        "test_f": "passed", "test_extra.py": "skipped"}
    assert logged[next(t for t in logged if t.endswith("test_f"))]["seconds"] >= 0.2
    durations, rows = tmp_path / "gpu_durations.json", tmp_path / "gpu_tests.json"
    row = main(["durations", "--log", str(log), "--durations", str(durations), "--gpus", "4", "--rows", str(rows)])
    assert json.loads(durations.read_text()) == {t: e["seconds"] for t, e in logged.items()}
    assert (row["round"], row["part"], row["parts"], row["passed"], row["failed"], row["skipped"]) == (0, 1, 1, 3, 2, 2)
    assert [r["round"] for r in json.loads(rows.read_text())["rows"]] == [0]
    # the parts of two rounds: each test's mean, no row
    other = tmp_path / "round-2.jsonl"
    other.write_text("".join(json.dumps({"test": t, "seconds": e["seconds"] + 1.0, "outcome": "passed"}) + "\n"
                             for t, e in logged.items()))
    assert main(["durations", "--log", str(log), "--log", str(other), "--durations", str(durations)]) is None
    assert json.loads(durations.read_text()) == pytest.approx({t: e["seconds"] + 0.5 for t, e in logged.items()})
    assert len(json.loads(rows.read_text())["rows"]) == 1


def test_the_gpu_plan_script_says_its_parts_without_running_any():
    for argv in ([], ["round", "1"], ["durations", "two"], ["durations", "1/2"], ["durations", "500", "/no/log"],
                 ["rounds", "1", "1/2"]):
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
