"""`python -m benchmarks.gpu_tests`: one run of a part of the tests marked `gpu` as a row of
docs/benchmarks/gpu_tests.json, from the JUnit XML pytest wrote (`--junitxml`):

    python -m benchmarks.gpu_tests --junit part.xml --part 2 --parts 4 --round 1 --out gpu_tests.json

A row: `gpus` (the CUDA devices the run saw), `part`, `parts`, `round`, `passed`, `failed`
(failures and errors), `skipped`, `seconds` (pytest's own time), `failures` (the failing tests'
ids), `device`, `commit`. A later run of the same part, split and round on as many GPUs replaces
its row; the other rows stay. launch/bench_gpu_tests.sh runs the parts.

    python -m benchmarks.gpu_tests durations --log times.jsonl --durations tests/gpu_durations.json

turns the log of a whole pass (benchmarks/pytest_log.py) into the durations file pytest-split
reads (`tests/run.sh --gpu --part K/N`) and its outcomes into the row of round 0: that pass,
split by nothing (part 1 of 1), its `seconds` the tests' own times summed over the commands it
took.
"""
import argparse
import json
import sys
import xml.etree.ElementTree as ElementTree
from pathlib import Path
from typing import List

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


def log_counts(path: Path) -> dict:
    """junit_counts' fields from a pass's log (benchmarks/pytest_log.py)."""
    logged = read_log(path)
    outcomes = [entry["outcome"] for entry in logged.values()]
    return {"passed": outcomes.count("passed"), "failed": outcomes.count("failed"),
            "skipped": outcomes.count("skipped"),
            "seconds": round(sum(entry["seconds"] for entry in logged.values()), 3),
            "failures": sorted(test for test, entry in logged.items() if entry["outcome"] == "failed")}


def durations_main(argv) -> dict:
    p = argparse.ArgumentParser(prog="python -m benchmarks.gpu_tests durations",
                                description="a whole pass's log as pytest-split's durations and the row of round 0")
    p.add_argument("--log", type=Path, required=True, help="the pass's log (benchmarks/pytest_log.py)")
    p.add_argument("--durations", type=Path, required=True, help="pytest-split's file to write")
    p.add_argument("--gpus", type=int, required=True, help="the CUDA devices the pass ran on")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = p.parse_args(argv)
    logged = read_log(args.log)
    if not logged:
        raise SystemExit(f"{args.log}: no test logged")
    args.durations.write_text(json.dumps({test: entry["seconds"] for test, entry in sorted(logged.items())},
                                         indent=4) + "\n")
    identity = run_identity()
    row = {"gpus": args.gpus, "part": 1, "parts": 1, "round": 0, **log_counts(args.log), **identity}
    write_rows(args.out, merged(args.out, row), identity)
    print(f"durations of {len(logged)} tests on {args.gpus} GPU(s) into {args.durations}: {row['passed']} passed, "
          f"{row['failed']} failed, {row['skipped']} skipped, {row['seconds']:.0f} s of tests"
          + (f"; failed: {', '.join(row['failures'])}" if row["failures"] else ""), flush=True)
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
        import torch
        args.gpus = torch.cuda.device_count()
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
