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


def test_two_nodes_train_the_one_node_losses_and_write_each_file_once(tmp_path):
    out, work = tmp_path / "scale.json", tmp_path / "work"
    command = [sys.executable, "-m", "benchmarks.scale", "one-node-64k", "two-nodes-64k", "--accelerator", "cpu",
               "--out", str(out), "--work", str(work), "--shards", str(tmp_path / "shards")]
    proc = subprocess.run(command, cwd=ROOT, env=environment(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-5000:] + proc.stderr[-3000:]
    rows = {r["part"]: r for r in json.loads(out.read_text())["rows"]}
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
    assert out.with_suffix(".png").is_file()
