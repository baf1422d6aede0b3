"""Launches as on a cluster, on CPU ranks (gloo) with all traffic on 127.0.0.1: each trains
3 steps of the tiny recipe on synthetic data (global batch 16, chunk 4).

- 2 "nodes" x 2 ranks from a hostfile through launch/train.sh and DeepSpeed's launcher, one
  launcher process per node (--no_ssh --node_rank i), against 1 node x 4 ranks: same losses.
- mpirun -np 2 through launch/mpi.sh: one job of world size 2 (not two 1-rank jobs).
"""
import csv
import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from launch_utils import ROOT, SYNTHETIC  # noqa: E402
from launch_utils import TINY as RECIPE  # noqa: E402

from benchmarks.common import free_port  # noqa: E402

TIMEOUT_S = 170
pytestmark = pytest.mark.slow


def tiny_run(output_dir: Path) -> list:
    """--set overrides: 3 steps of the tiny model on synthetic data (global batch 16, chunk 4)."""
    sets = SYNTHETIC + [f"output_dir={output_dir}", "schedule.steps=3", "checkpoint.every=0"]
    return [arg for s in sets for arg in ("--set", s)]


def environment(**extra) -> dict:
    venv_bin = str(Path(sys.executable).parent)  # deepspeed and python of this environment
    env = dict(os.environ, PATH=f"{venv_bin}:{os.environ['PATH']}", TRITON_INTERPRET="1", DS_ACCELERATOR="cpu",
               OMP_NUM_THREADS="1", MASTER_ADDR="127.0.0.1", GLOO_SOCKET_IFNAME="lo", PYTHONUNBUFFERED="1")
    env.pop("VIRTUAL_ENV", None)
    env.update(extra)
    return env


def start(cmd, cwd: Path, env: dict, log: Path) -> subprocess.Popen:
    cwd.mkdir(parents=True, exist_ok=True)
    # Own session: on a timeout the whole launcher tree is killed, and nothing else.
    return subprocess.Popen([str(c) for c in cmd], cwd=cwd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def finish(procs, logs) -> None:
    try:
        for proc in procs:
            proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        for proc in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("launch timed out:\n" + "\n".join(log.read_text()[-3000:] for log in logs))
    for proc, log in zip(procs, logs):
        assert proc.returncode == 0, f"{proc.args[:3]} exited {proc.returncode}:\n{log.read_text()[-5000:]}"


def losses(run_dir: Path) -> list:
    with (run_dir / "metrics.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [int(r["step"]) for r in rows] == [1, 2, 3]
    return [float(r["loss"]) for r in rows]


def world_size(run_dir: Path) -> int:
    return json.loads((run_dir / "run.json").read_text())["world_size"]


@pytest.fixture(scope="module")
def one_node_four_ranks(tmp_path_factory):
    """launch/train.sh RECIPE --num_gpus 4: the reference run (planner first)."""
    tmp = tmp_path_factory.mktemp("one-node")
    log = tmp / "launch.log"
    proc = start([ROOT / "launch" / "train.sh", RECIPE, "--num_gpus", 4, "--master_port", free_port(),
                  *tiny_run(tmp / "run")], tmp / "node0", environment(), log)
    finish([proc], [log])
    assert "fits:" in log.read_text()
    return tmp / "run"


def test_two_nodes_from_a_hostfile_match_one_node(tmp_path, one_node_four_ranks):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node0 slots=2\nnode1 slots=2\n")
    port, run = free_port(), tmp_path / "run"
    # What train.sh writes into .deepspeed_env for the other nodes (DeepSpeed's pdsh/ssh
    # runners export it there; with --no_ssh each node has its own launcher, so here the file
    # is checked, not read): the forwarded names, and a user's own lines kept.
    env = environment(NCCL_DEBUG="INFO")
    (tmp_path / "node0").mkdir()
    (tmp_path / "node0" / ".deepspeed_env").write_text("MY_CLUSTER_SETTING=1\nNCCL_DEBUG=WARN\n")
    procs, logs = [], []
    for node in (0, 1):
        logs.append(tmp_path / f"node{node}.log")
        procs.append(start([ROOT / "launch" / "train.sh", RECIPE, "--hostfile", hostfile, "--no_ssh",
                            "--node_rank", node, "--master_addr", "127.0.0.1", "--master_port", port,
                            *tiny_run(run)], tmp_path / f"node{node}", env, logs[-1]))
    finish(procs, logs)
    assert world_size(run) == world_size(one_node_four_ranks) == 4
    assert losses(run) == pytest.approx(losses(one_node_four_ranks), rel=1e-6)
    forwarded = (tmp_path / "node0" / ".deepspeed_env").read_text().splitlines()
    assert {"NCCL_DEBUG=INFO", "DS_ACCELERATOR=cpu", "OMP_NUM_THREADS=1", "MY_CLUSTER_SETTING=1"} <= set(forwarded)
    assert "NCCL_DEBUG=WARN" not in forwarded


def test_mpirun_two_ranks_are_one_job(tmp_path, one_node_four_ranks):
    if shutil.which("mpirun") is None:
        message = "mpirun not installed: run launch/install_openmpi.sh (tests/run.sh does)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI's set-up installs it: a skip there would hide a broken install
        pytest.skip(message)
    run, log = tmp_path / "run", tmp_path / "mpirun.log"
    env = environment(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    proc = start([ROOT / "launch" / "mpi.sh", RECIPE, "-np", 2, "--master_port", free_port(), *tiny_run(run),
                  "--", "--oversubscribe", "--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo"],
                 tmp_path, env, log)
    finish([proc], [log])
    assert world_size(run) == 2
    # Both ranks stepped in one ZeRO job: each saved its own optimizer shard and data position.
    checkpoint = next((run / "checkpoints").glob("*/zero_pp_rank_0_*optim_states.pt")).parent
    for rank in (0, 1):
        assert list(checkpoint.glob(f"zero_pp_rank_{rank}_*optim_states.pt"))
        assert (checkpoint / f"client_rank{rank}.pt").is_file()
    # The same global batches and loss as the 4-rank run, up to the ranks' summation order.
    assert losses(run) == pytest.approx(losses(one_node_four_ranks), rel=1e-4)


def test_train_sh_refuses_what_the_planner_refuses(tmp_path):
    """A recipe that cannot fit is never launched: the planner's verdict and exit status."""
    recipe = ROOT / "ds_configs" / "recipes" / "vit-l14-256k-8gpu.yaml"
    # Synthetic data: the recipe's shards are not on this machine, and the data check (run
    # first) would refuse them before the planner is asked.
    command = [ROOT / "launch" / "train.sh", recipe, "--num_gpus", "8", "--set", "batch.chunk=1024",
               "--set", "data.source=synthetic", "--set", "data.eval=null"]
    proc = subprocess.run([str(c) for c in command], cwd=tmp_path, env=environment(), capture_output=True, text=True,
                          timeout=120, check=False)
    assert proc.returncode == 1
    # DS_ACCELERATOR=cpu: a plan for CPU ranks, whose tensors are host memory
    assert "does not fit: host memory per node needs" in proc.stdout and "the ranks' tensors" in proc.stdout
    assert "the planner refused" in proc.stderr
    assert not (tmp_path / "runs").exists()  # the recipe's output_dir: nothing was launched


def test_train_sh_on_a_node_without_gpus_plans_cpu_ranks(tmp_path):
    """Without DS_ACCELERATOR (a fresh shell) on a node with no CUDA GPU, train.sh says the ranks
    run on the CPUs and its planner plans CPU ranks, not GPUs this node does not have."""
    recipe = ROOT / "ds_configs" / "recipes" / "vit-l14-256k-8gpu.yaml"
    command = [ROOT / "launch" / "train.sh", recipe, "--num_gpus", "8", "--set", "batch.chunk=1024",
               "--set", "data.source=synthetic", "--set", "data.eval=null"]
    env = {k: v for k, v in environment().items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([str(c) for c in command], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=120, check=False)
    assert "the ranks run on its CPUs (DS_ACCELERATOR=cpu)" in proc.stderr
    assert proc.returncode == 1 and "the ranks' tensors" in proc.stdout and "NVLink" not in proc.stdout
    assert not (tmp_path / "runs").exists()


def test_missing_data_fails_before_launch(tmp_path):
    """launch/train.sh checks the recipe's data paths on the launching node (infcl-ds data
    check): a missing shard is refused in seconds with its name, before DeepSpeed starts."""
    sets = [arg for s in SYNTHETIC + ["data.source=webdataset", f"data.train={tmp_path}/nope-{{000..003}}.tar"]
            for arg in ("--set", s)]
    log = tmp_path / "launch.log"
    proc = start([ROOT / "launch" / "train.sh", RECIPE, "--num_gpus", 2, *sets], tmp_path / "cwd", environment(), log)
    assert proc.wait(timeout=TIMEOUT_S) == 2
    text = log.read_text()
    assert f"shard {tmp_path}/nope-000.tar does not exist" in text and "deepspeed" not in text.lower()
