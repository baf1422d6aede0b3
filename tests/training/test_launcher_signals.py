"""SIGINT/SIGTERM to the `deepspeed` launcher (here through launch/train.sh, which execs it)
ends every rank: DeepSpeed's runner forwards no signal on one node, so each rank watches its
launcher (training/launcher_watch.py). Plus the watch's own decisions, in process."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from launch_utils import ROOT, SYNTHETIC, TINY
from test_launch import environment

from benchmarks.common import free_port
from infcl_ds.checkpoint import tags
from infcl_ds.training.launcher_watch import LAUNCHER_GONE_EXIT, LauncherWatch, Process, is_alive, launcher_processes
from infcl_ds.training.procs import is_deepspeed_launch, process_stat


def _session(pid: int):
    try:
        return os.getsid(pid)
    except OSError:
        return None


def _ranks(session: int) -> list:
    """The rank processes of a session: children of a deepspeed launch.py."""
    found = []
    for pid in map(int, filter(str.isdigit, os.listdir("/proc"))):
        stat = process_stat(pid)
        if stat is not None and _session(pid) == session and is_deepspeed_launch(stat[1]):
            found.append(Process(pid, stat[2], "rank"))
    return found


def _live_in(session: int) -> list:
    return [pid for pid in map(int, filter(str.isdigit, os.listdir("/proc")))
            if _session(pid) == session and (process_stat(pid) or ("Z",))[0] != "Z"]


def _files(directory: Path) -> dict:
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns) for p in directory.rglob("*") if p.is_file()}


@pytest.mark.slow
def test_a_signal_to_the_launcher_ends_every_rank(tmp_path):
    run = tmp_path / "run"
    sets = SYNTHETIC + [f"output_dir={run}", "schedule.steps=100000", "checkpoint.every=2", "checkpoint.keep=2"]
    log = tmp_path / "launch.log"
    proc = subprocess.Popen([str(ROOT / "launch" / "train.sh"), str(TINY), "--num_gpus", "2", "--no-plan",
                             "--master_port", str(free_port()), *[a for s in sets for a in ("--set", s)]],
                            cwd=tmp_path, env=environment(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (run / "checkpoints" / tags.LATEST).is_file():  # training, saving every 2 steps
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        ranks = _ranks(proc.pid)
        assert len(ranks) == 2, ranks
        os.kill(proc.pid, signal.SIGTERM)  # train.sh's pid is the deepspeed runner's (exec)
        sent = time.monotonic()
        while any(is_alive(r) for r in ranks):
            assert time.monotonic() - sent < 30, "ranks still alive 30 s after the launcher was signalled"
            time.sleep(0.2)
        proc.wait(timeout=10)
        # Nothing of the job is left (the ranks' decode workers leave within 5 s of their rank)
        # and the run's files stay as they are.
        while _live_in(proc.pid):
            assert time.monotonic() - sent < 30, {pid: process_stat(pid) for pid in _live_in(proc.pid)}
            time.sleep(0.2)
        before = _files(run)
        time.sleep(2)
        assert _files(run) == before
        tag = tags.resolve_tag(run / "checkpoints")  # latest names a tag whose manifest verifies
        assert tag.name.startswith("step_")
        text = log.read_text()
        assert "the deepspeed launcher (pid" in text and "went away" in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
    finally:
        if _live_in(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def test_a_reused_pid_or_a_zombie_is_not_the_launcher(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        me = Process(child.pid, process_stat(child.pid)[2], "deepspeed launcher")
        assert is_alive(me)
        assert not is_alive(me._replace(start=me.start + 1))  # the same pid, started later: another process
        child.kill()
        time.sleep(0.3)
        assert process_stat(child.pid)[0] == "Z"  # not reaped yet
        assert not is_alive(me)
    finally:
        child.kill()
        child.wait()
    assert not is_alive(me)


def test_no_deepspeed_launcher_means_nothing_watched():
    # pytest's parent is a shell or CI's runner: mpirun, srun and torchrun ranks are alike.
    assert launcher_processes() == []
    assert not LauncherWatch([]).start()._thread.is_alive()


def test_the_watch_waits_for_a_save_then_exits_with_one_line(tmp_path):
    """In a child process: the launcher (a sleeping process) is killed while a save is under
    way; the watch exits only when the save is over, status 4, one line."""
    program = f"""
import subprocess, sys, time
from infcl_ds.training.launcher_watch import LauncherWatch, Process
from infcl_ds.training.procs import process_stat
fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
watch = LauncherWatch([Process(fake.pid, process_stat(fake.pid)[2], "deepspeed launcher")], poll_s=0.1, grace_s=0.5)
watch.where = lambda: "step 7"
watch.start()
with watch.saving():
    fake.kill(); fake.wait()
    time.sleep(1.5)
    print("save complete", flush=True)
time.sleep(30)
"""
    done = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == LAUNCHER_GONE_EXIT
    assert done.stdout == "save complete\n"
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("infcl-ds train: rank ?, step 7: the deepspeed launcher (pid "), lines
    assert "went away" in lines[0]
