"""A pytest plugin that logs each test as it ends and resumes where a cut run stopped:

    python -m pytest -p benchmarks.pytest_log --test-log=times.jsonl -m gpu

Each test's outcome and seconds (setup, call and teardown together, as pytest-split counts them)
are appended to the log as one JSON line when its teardown ends (a module skipped whole, as one
skipped entry), and the tests the log already holds are left out. A whole pass over the marked tests therefore survives its command's time limit:
the next command goes on from the last logged test (launch/bench_gpu_tests.sh `durations`), and
`python -m benchmarks.gpu_tests durations` turns the log into tests/gpu_durations.json.
"""
import json
import os
import signal
from pathlib import Path
from typing import Dict

import pytest


def read_log(path: Path) -> Dict[str, dict]:
    """{test id: {"seconds", "outcome"}} of a log; a line cut short by a kill is left out (its
    test runs again)."""
    logged = {}
    if not path.is_file():
        return logged
    for line in path.read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(entry, dict) and {"test", "seconds", "outcome"} <= entry.keys():
            logged[entry["test"]] = {"seconds": float(entry["seconds"]), "outcome": entry["outcome"]}
    return logged


def pytest_addoption(parser):
    parser.addoption("--test-log", default=None, metavar="PATH",
                     help="append each test's outcome and seconds to PATH as it ends; leave out the tests PATH holds")


def pytest_configure(config):
    path = config.getoption("test_log")
    if path:
        # SIGINT is how a pass is cut (bench_gpu_tests.sh: `timeout -s INT`). A process started
        # in the background of a shell without job control inherits it ignored, and Python then
        # leaves it so: the pass would run on to the limit's SIGKILL, cut inside a test.
        if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
            signal.signal(signal.SIGINT, signal.default_int_handler)
        config.pluginmanager.register(PassLog(Path(path)), "infcl_ds_test_log")


class PassLog:

    def __init__(self, path: Path):
        self.path = path
        # a line a kill cut short gets its end, so that the next entry starts a line of its own
        if path.is_file() and path.stat().st_size and not path.read_bytes().endswith(b"\n"):
            with path.open("a") as log:
                log.write("\n")
        self.seconds: Dict[str, float] = {}
        self.outcome: Dict[str, str] = {}

    @pytest.hookimpl(trylast=True)  # after the -m and -k selection
    def pytest_collection_modifyitems(self, config, items):
        logged = read_log(self.path)
        done = [item for item in items if item.nodeid in logged]
        if done:
            items[:] = [item for item in items if item.nodeid not in logged]
            config.hook.pytest_deselected(items=done)

    def pytest_collectreport(self, report):
        # a module skipped as a whole (a missing extra) has no tests' reports: it is logged as one
        if report.skipped:
            self._write({"test": report.nodeid, "seconds": 0.0, "outcome": "skipped"})

    def pytest_runtest_logreport(self, report):
        test = report.nodeid
        self.seconds[test] = self.seconds.get(test, 0.0) + report.duration
        if report.failed:
            self.outcome[test] = "failed"
        elif report.skipped and self.outcome.get(test) != "failed":
            self.outcome[test] = "skipped"
        elif report.when == "call" and test not in self.outcome:
            self.outcome[test] = "passed"
        if report.when == "teardown":
            self._write({"test": test, "seconds": round(self.seconds.pop(test), 3),
                         "outcome": self.outcome.pop(test, "passed")})

    def _write(self, entry: dict) -> None:
        # one line, flushed to disk before the next test starts: a kill loses at most that test
        with self.path.open("a") as log:
            log.write(json.dumps(entry) + "\n")
            log.flush()
            os.fsync(log.fileno())
