"""One live run per output directory: a start into a directory whose run is still going is
refused at once (plain, --resume, on every rank of a job alike), before DeepSpeed is
imported, naming the holder's pid and host, exit 2; a SIGKILLed holder leaves the directory
usable; a file system without locks is a warning. The holder is a process that takes the
lock and sleeps, the starts are real `python -m infcl_ds.train` processes (tiny recipe)."""
import errno
import re
import signal
import socket
import subprocess
import sys
from contextlib import contextmanager

from launch_utils import ROOT, start_ranks, wait_all

HOLDER = ("import sys, time\n"
          "from infcl_ds.training.run_lock import take\n"
          "lock = take(sys.argv[1])\n"
          "print('held' if lock.fd is not None else 'not held', flush=True)\n"
          "time.sleep(600)\n")


@contextmanager
def holder(run_dir):
    proc = subprocess.Popen([sys.executable, "-c", HOLDER, str(run_dir)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        yield proc
    finally:
        proc.kill()
        proc.wait()


def _start(tmp_path, name, world, overrides, extra=()):
    logs = tmp_path / name
    logs.mkdir()
    return logs, start_ranks(world, list(overrides), list(extra), log_dir=logs)


def _our_lines(logs, rank=0):
    return [line for line in (logs / f"rank{rank}.log").read_text().splitlines() if line.startswith("infcl-ds train:")]


def _refusal(run_dir, pid):
    return (f"infcl-ds train: output_dir {run_dir} is in use by a run that is still going (pid {pid} on host "
            f"{socket.gethostname()}, started ")


def test_a_live_run_refuses_a_second_start_and_a_killed_one_does_not(tmp_path, monkeypatch):
    run = tmp_path / "run"
    # The starts list their imports on stderr: a refusal comes before DeepSpeed's.
    monkeypatch.setenv("PYTHONPROFILEIMPORTTIME", "1")
    with holder(run) as held:
        plain_logs, plain = _start(tmp_path, "plain", 1, [f"output_dir={run}"])
        resume_logs, resume = _start(tmp_path, "resume", 1, [f"output_dir={run}"], ["--resume", "latest"])
        assert wait_all(plain + resume, timeout=120) == [2, 2]
        for logs in (plain_logs, resume_logs):
            lines = _our_lines(logs)
            assert len(lines) == 1 and lines[0].startswith(_refusal(run, held.pid)), lines
            assert lines[0].endswith(f"; it holds {run / '.infcl-ds.lock'}): wait for it to end or stop it; "
                                     "a directory holds one run at a time")
            text = (logs / "rank0.log").read_text()
            assert not re.search(r"\|\s+deepspeed(\.|$)", text, re.M), "refused only after importing DeepSpeed"
            assert "Traceback" not in text
        assert sorted(p.name for p in run.iterdir()) == [".infcl-ds.lock"]  # nothing of a run written
        held.send_signal(signal.SIGKILL)
        held.wait()
    monkeypatch.delenv("PYTHONPROFILEIMPORTTIME")
    logs, again = _start(tmp_path, "again", 1, [f"output_dir={run}", "schedule.steps=1"])
    assert wait_all(again, timeout=300) == [0], (logs / "rank0.log").read_text()[-3000:]
    assert (run / "checkpoints" / "latest").read_text() == "step_00000001"


def test_every_rank_of_a_job_refuses_with_the_same_line(tmp_path):
    run = tmp_path / "run"
    with holder(run) as held:
        logs, procs = _start(tmp_path, "job", 2, [f"output_dir={run}"])
        codes = wait_all(procs, timeout=300)
        assert codes == [2, 2], "\n".join(f"--- rank {r}\n" + (logs / f"rank{r}.log").read_text()[-2000:]
                                          for r in range(2))
    lines = [_our_lines(logs, rank) for rank in range(2)]
    assert len(lines[0]) == 1 and lines[0][0].startswith(_refusal(run, held.pid)), lines
    assert lines[1] == lines[0]


def test_a_file_system_without_locks_is_a_warning_not_a_failure(tmp_path, monkeypatch, capsys):
    import fcntl

    from infcl_ds.training import run_lock

    def flock(fd, operation):
        raise OSError(errno.ENOLCK, "No locks available")
    monkeypatch.setattr(fcntl, "flock", flock)
    lock = run_lock.take(tmp_path / "run")
    assert lock.fd is None and lock.refusal is None
    err = capsys.readouterr().err.strip()
    assert err == (f"infcl-ds train: warning: cannot lock {tmp_path / 'run' / '.infcl-ds.lock'} (ENOLCK: No locks "
                   f"available; a file system without locks?): a second run started into {tmp_path / 'run'} will "
                   "not be refused")
