"""training/procs.py: the ranks beside this one, read off /proc; a rank leaving on a failed
collective wakes a stopped sibling, so launch.py's SIGTERM ends it at once instead of its
SIGKILL 30 s later."""
import json
import subprocess
import sys

from launch_utils import ROOT

# A stand-in for DeepSpeed's launch.py (its path is what identifies it): one rank stopped,
# another that wakes its stopped siblings, then the first rank's state.
FAKE_LAUNCH = """
import json, os, signal, subprocess, sys, time
from infcl_ds.training.procs import process_stat
stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
os.kill(stopped.pid, signal.SIGSTOP)
while process_stat(stopped.pid)[0] not in ("T", "t"):
    time.sleep(0.01)
waker = subprocess.run([sys.executable, "-c",
                        "import json; from infcl_ds.training.procs import wake_stopped_siblings; "
                        "print(json.dumps(wake_stopped_siblings()))"],
                       capture_output=True, text=True, check=True)
time.sleep(0.2)
print(json.dumps({"stopped": stopped.pid, "woken": json.loads(waker.stdout),
                  "state after": process_stat(stopped.pid)[0]}))
stopped.kill()
"""


def test_a_leaving_rank_wakes_a_stopped_sibling(tmp_path):
    launch = tmp_path / "deepspeed" / "launcher" / "launch.py"
    launch.parent.mkdir(parents=True)
    launch.write_text(FAKE_LAUNCH)
    out = subprocess.run([sys.executable, str(launch)], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["woken"] == [seen["stopped"]] and seen["state after"] not in ("T", "t"), seen


def test_no_deepspeed_launcher_means_no_siblings():
    from infcl_ds.training.procs import sibling_ranks, wake_stopped_siblings
    assert sibling_ranks() == [] and wake_stopped_siblings() == []  # pytest's parent is no launch.py


def test_stat_fields_reads_a_name_with_spaces_and_parentheses():
    from infcl_ds.training.procs import stat_fields
    name, fields = stat_fields("4242 (decode) (x y) S 1 2 3 4 5 6 7 8 9 10 120 30 0\n")
    assert name == "decode) (x y"
    assert fields[0] == "S" and fields[1] == "1" and (fields[11], fields[12]) == ("120", "30")
