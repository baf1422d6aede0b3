"""`python -m benchmarks.gpu_tests`: one run of a part of the tests marked `gpu` as a row of
docs/benchmarks/gpu_tests.json, from the JUnit XML pytest wrote (`--junitxml`):

    python -m benchmarks.gpu_tests --junit part.xml --part 2 --parts 4 --round 1 --out gpu_tests.json

A row: `gpus` (the CUDA devices the run saw), `part`, `parts`, `round`, `passed`, `failed`
(failures and errors), `skipped`, `seconds` (pytest's own time), `failures` (the failing tests'
ids), `device`, `commit`. A later run of the same part, split and round on as many GPUs replaces
its row; the other rows stay. launch/bench_gpu_tests.sh runs the parts.

    python -m benchmarks.gpu_tests durations --log times.jsonl --durations tests/gpu_durations.json \
        [--rows gpu_tests.json]

turns logs of benchmarks/pytest_log.py into the durations file pytest-split reads (`tests/run.sh
--gpu --part K/N`): a whole pass's, or the parts' of rounds (each test's mean). With `--rows`, a
whole pass's outcomes become the row of round 0: split by nothing (part 1 of 1), its `seconds`
the tests' own times summed over the commands it took.
"""
import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import Dict, List, Optional

from .common import run_identity, write_rows
from .pytest_log import read_log

DEFAULT_OUT = Path("docs/benchmarks/gpu_tests.json")


def junit_counts(path: Path) -> dict:
    """passed, failed (failures and errors), skipped, seconds and the failing tests' ids of a
    pytest JUnit XML file (one testsuite, or a testsuites wrapper of them)."""
    root = ElementTree.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else list(root.iter("testsuite"))
    counts = {"passed": 0, "failed": 0, "skipped": 0, "seconds": 0.0, "failures": []}
    for suite in suites:
        counts["seconds"] += float(suite.get("time", 0.0))
        for case in suite.iter("testcase"):
            outcome = {child.tag for child in case}
            name = f"{case.get('classname', '')}::{case.get('name', '')}"
            if outcome & {"failure", "error"}:
                counts["failed"] += 1
                counts["failures"].append(name)
            elif "skipped" in outcome:
                counts["skipped"] += 1
            else:
                counts["passed"] += 1
    return counts


def row_key(row: dict) -> tuple:
    return row.get("gpus"), row.get("part"), row.get("parts"), row.get("round")


def merged(out: Path, row: dict) -> List[dict]:
    old = json.loads(out.read_text())["rows"] if out.is_file() else []
    return [r for r in old if row_key(r) != row_key(row)] + [row]


def cuda_devices() -> int:
    import torch
    return torch.cuda.device_count()


def logs_merged(paths: List[Path]) -> Dict[str, dict]:
    """{test id: {"seconds", "outcome"}} over several logs (benchmarks/pytest_log.py): a test's
    seconds are its mean over the logs that hold it, its outcome the last log's."""
    runs: Dict[str, List[dict]] = {}
    for path in paths:
        for test, entry in read_log(path).items():
            runs.setdefault(test, []).append(entry)
    return {test: {"seconds": round(sum(e["seconds"] for e in entries) / len(entries), 3),
                   "outcome": entries[-1]["outcome"]} for test, entries in sorted(runs.items())}


def log_counts(logged: Dict[str, dict]) -> dict:
    """junit_counts' fields from logged tests (logs_merged)."""
    outcomes = [entry["outcome"] for entry in logged.values()]
    return {"passed": outcomes.count("passed"), "failed": outcomes.count("failed"),
            "skipped": outcomes.count("skipped"),
            "seconds": round(sum(entry["seconds"] for entry in logged.values()), 3),
            "failures": sorted(test for test, entry in logged.items() if entry["outcome"] == "failed")}


def durations_main(argv) -> Optional[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_tests durations",
                                description="logged tests as pytest-split's durations (and a whole pass as round 0)")
    p.add_argument("--log", type=Path, action="append", required=True,
                   help="a log of benchmarks/pytest_log.py; again for more (a round's parts, several rounds)")
    p.add_argument("--durations", type=Path, required=True, help="pytest-split's file to write")
    p.add_argument("--rows", type=Path, default=None,
                   help="also record the logged tests as the row of round 0 here (a whole pass's log)")
    p.add_argument("--gpus", type=int, default=None, help="with --rows; default: the CUDA devices torch sees")
    args = p.parse_args(argv)
    logged = logs_merged(args.log)
    if not logged:
        raise SystemExit(f"{', '.join(map(str, args.log))}: no test logged")
    args.durations.write_text(json.dumps({test: entry["seconds"] for test, entry in logged.items()}, indent=4) + "\n")
    counts = log_counts(logged)
    print(f"durations of {len(logged)} tests into {args.durations}: {counts['passed']} passed, {counts['failed']} "
          f"failed, {counts['skipped']} skipped, {counts['seconds']:.0f} s of tests"
          + (f"; failed: {', '.join(counts['failures'])}" if counts["failures"] else ""), flush=True)
    if not args.rows:
        return None
    identity = run_identity()
    row = {"gpus": cuda_devices() if args.gpus is None else args.gpus, "part": 1, "parts": 1, "round": 0, **counts,
           **identity}
    write_rows(args.rows, merged(args.rows, row), identity)
    return row


def main(argv=None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["durations"]:
        return durations_main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_tests", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--junit", type=Path, required=True, help="pytest's --junitxml file of the part's run")
    p.add_argument("--part", type=int, required=True)
    p.add_argument("--parts", type=int, required=True)
    p.add_argument("--round", type=int, required=True, help="1, 2, ...: the part's runs in a row")
    p.add_argument("--gpus", type=int, default=None, help="default: the CUDA devices torch sees")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    if args.gpus is None:
        args.gpus = cuda_devices()
    identity = run_identity()
    row = {"gpus": args.gpus, "part": args.part, "parts": args.parts, "round": args.round,
           **junit_counts(args.junit), **identity}
    write_rows(args.out, merged(args.out, row), identity)
    print(f"part {args.part}/{args.parts}, round {args.round}, {args.gpus} GPU(s): {row['passed']} passed, "
          f"{row['failed']} failed, {row['skipped']} skipped in {row['seconds']:.0f} s"
          + (f"; failed: {', '.join(row['failures'])}" if row["failures"] else ""), flush=True)
    return row


if __name__ == "__main__":
    main()
