"""The scaling benchmark's machinery (benchmarks/scale.py) on gloo ranks with the tiny model from
small JPEG shards: one launcher of two ranks, then two DeepSpeed nodes of one rank each from a
hostfile (--no_ssh --node_rank I), each through launch/train.sh. The two-node run trains the
one-node run's losses, writes the same files, each by its one owner, and both rows carry every
key of docs/benchmarks/scale.json."""
import json
import subprocess
import sys

import pytest

from launch_utils import ROOT
from test_launch import environment, losses

pytestmark = pytest.mark.slow

ROW_KEYS = {"model", "B", "world", "nodes", "impl", "data", "samples_per_s", "decode_wait_share", "step_s",
            "plan_step_s", "host_gib", "plan_host_gib", "peak_mib", "plan_peak_mib", "loss", "efficiency", "command",
            "device", "torch", "triton", "commit"}


def scale_parts(tmp_path, *parts):
    """`python -m benchmarks.scale PARTS` on gloo ranks into tmp_path: (rows by part, work folder)."""
    out, work = tmp_path / "scale.json", tmp_path / "work"
    command = [sys.executable, "-m", "benchmarks.scale", *parts, "--accelerator", "cpu",
               "--out", str(out), "--work", str(work), "--shards", str(tmp_path / "shards")]
    proc = subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    return {r["part"]: r for r in json.loads(out.read_text())["rows"]}, work


def test_two_nodes_train_the_one_node_losses_and_write_each_file_once(tmp_path):
    rows, work = scale_parts(tmp_path, "one-node-64k", "two-nodes-64k")
    one, two = rows["one-node-64k"], rows["two-nodes-64k"]
    for row in (one, two):
        assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
        assert row["world"] == 2 and row["B"] == 64 and row["steps"] == [1, 2, 3]
        assert row["host_gib"] > 0 and row["plan_host_gib"] > 0 and row["plan_peak_mib"] > 0
    assert (one["nodes"], two["nodes"]) == (1, 2)
    # each node's launcher: its own node rank, GPU and half of the cores
    assert len(two["commands"]) == 2 and all("--no_ssh" in c and "--include node0:0@node1:1" in c
                                             for c in two["commands"])
    assert two["checks"]["losses_match_one_node"], (two["loss"], one["loss"])
    assert losses(work / "two-nodes-64k" / "run") == pytest.approx(losses(work / "one-node-64k" / "run"), rel=1e-6)
    written = two["written_once"]
    assert written["passed"] and written["lock_written_by_rank0"] and written["same_files_as_one_node"], written
    assert written["rank_files"]["0"] and written["rank_files"]["1"]
    assert (tmp_path / "scale.png").is_file()


def test_four_ranks_and_their_last_checkpoint_resumed_on_two(tmp_path):
    """The four-GPU parts' machinery on four gloo ranks: the 1M part (here 256 samples) and its
    last checkpoint resumed by two ranks for one step, each row with the planner's figures beside
    the measured ones, the checks the targets name, the decode processes' own rate, and
    `resumed_from_world` on the resume's row."""
    rows, _ = scale_parts(tmp_path, "four-gpu-1m", "resume-two-gpu-1m")
    run, resume = rows["four-gpu-1m"], rows["resume-two-gpu-1m"]
    for row in (run, resume):
        assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
        assert row["B"] == 256 and row["plan_step_s"] > 0 and row["plan_host_gib"] > 0
        assert {"decode_wait_5pct", "step_within_10pct", "host_within_10pct"} <= set(row["checks"])
    assert run["world"] == 4 and run["steps"] == [1, 2, 3] and run["checks"]["steady_steps_2"]
    assert run["decode_rows_per_process_s"] > 0  # the pool's own rate, from metrics.csv
    # a piece counts in the step it ends in, so a short step's share may pass 1 by part of a piece
    assert len(run["decode_busy_shares"]) == 2 and all(0 < b < 1.5 for b in run["decode_busy_shares"])
    # where a step's time went: the engine's phases (on CPU ranks the host's clock) within the step,
    # and the waits for the next batch and for decoded rows
    assert set(run["phases_s"]) == {"encode", "loss", "reencode", "optimizer"}
    assert 0 < sum(run["phases_s"].values()) <= run["step_s"] * 1.01
    assert len(run["batch_waits_s"]) == 3 and all(w >= 0 for w in run["batch_waits_s"])
    assert resume["world"] == 2 and resume["resumed_from_world"] == 4 and resume["steps"] == [4]
    assert resume["checks"]["resumed"] and resume["resumes"].startswith("four-gpu-1m's run (4 GPUs")
    assert len(resume["loss"]) == 1 and resume["loss"][0] > 0
