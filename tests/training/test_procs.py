"""training/procs.py: the ranks beside this one, read off /proc; a rank leaving on a failed
collective names the ranks of its node that are stopped or have exited, and ends a stopped
sibling at once (launch.py's SIGTERM would wait 30 s for it; SIGCONT would let it write on)."""
import json
import subprocess
import sys

from launch_utils import ROOT

# A stand-in for DeepSpeed's launch.py (its path is what identifies it): one rank stopped,
# another that ends its stopped siblings, then the first rank's state.
FAKE_LAUNCH = """
import json, os, signal, subprocess, sys, time
from infcl_ds.training.procs import process_stat
stopped = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
os.kill(stopped.pid, signal.SIGSTOP)
while process_stat(stopped.pid)[0] not in ("T", "t"):
    time.sleep(0.01)
ender = subprocess.run([sys.executable, "-c",
                        "import json; from infcl_ds.training.procs import end_stopped_siblings; "
                        "print(json.dumps(end_stopped_siblings()))"],
                       capture_output=True, text=True, check=True)
deadline = time.monotonic() + 10
while process_stat(stopped.pid)[0] != "Z" and time.monotonic() < deadline:  # running to its end, then a zombie
    time.sleep(0.01)
print(json.dumps({"stopped": stopped.pid, "ended": json.loads(ender.stdout),
                  "state after": process_stat(stopped.pid)[0]}))
stopped.kill()
"""


def run_as_deepspeed_launch(tmp_path, script: str) -> dict:
    """Run ``script`` as DeepSpeed's launch.py (its path is what identifies it); its JSON output."""
    launch = tmp_path / "deepspeed" / "launcher" / "launch.py"
    launch.parent.mkdir(parents=True)
    launch.write_text(script)
    out = subprocess.run([sys.executable, str(launch)], capture_output=True, text=True, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_a_leaving_rank_ends_a_stopped_sibling(tmp_path):
    seen = run_as_deepspeed_launch(tmp_path, FAKE_LAUNCH)
    assert seen["ended"] == [seen["stopped"]] and seen["state after"] == "Z", seen  # killed, not yet reaped


# launch.py of a node's four ranks, 4-7 (RANK = 4 + LOCAL_RANK): local rank 1 stopped, 2 killed
# and reaped, 3 killed and left a zombie; local rank 0 reads the table, before and after.
NODE_LAUNCH = """
import json, os, signal, subprocess, sys, time
from infcl_ds.training.procs import process_stat

def rank(local, code="import time; time.sleep(60)"):
    env = dict(os.environ, LOCAL_SIZE="4", LOCAL_RANK=str(local), RANK=str(4 + local))
    return subprocess.Popen([sys.executable, "-c", code], env=env)

def rank_zero_reads():
    code = "import json; from infcl_ds.training.procs import peers_at_fault; print(json.dumps(peers_at_fault()))"
    env = dict(os.environ, LOCAL_SIZE="4", LOCAL_RANK="0", RANK="4")
    return json.loads(subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                                     check=True).stdout)

def wait_state(pid, states):
    while process_stat(pid)[0] not in states:
        time.sleep(0.01)

ranks = [rank(k) for k in (1, 2, 3)]  # Popen returns once each has exec'd: its environment is its own
before = rank_zero_reads()
os.kill(ranks[0].pid, signal.SIGSTOP)
ranks[1].kill(); ranks[1].wait()
ranks[2].kill()
wait_state(ranks[0].pid, ("T", "t"))
wait_state(ranks[2].pid, ("Z",))
print(json.dumps({"before": before, "after": rank_zero_reads(), "stopped": ranks[0].pid}))
ranks[0].kill()
"""


def test_a_failed_collective_names_the_stopped_and_exited_ranks_of_its_node(tmp_path):
    seen = run_as_deepspeed_launch(tmp_path, NODE_LAUNCH)
    assert seen["before"] == []
    assert seen["after"] == [f"rank 5 (pid {seen['stopped']}) is stopped", "rank 6 has exited", "rank 7 has exited"]


def test_the_line_names_the_peers_found_or_says_where_else_to_look():
    from infcl_ds.training.exits import peers_line
    assert peers_line(["rank 6 has exited"]) == "rank 6 has exited, see its log"
    assert peers_line(["rank 5 (pid 9) is stopped", "rank 6 has exited"]).endswith("has exited, see their logs")
    assert "another node" in peers_line([]) and peers_line(None) == "a peer rank is stopped, wedged or dead, see its log"


def test_no_deepspeed_launcher_means_no_siblings():
    from infcl_ds.training.procs import end_stopped_siblings, peers_at_fault, sibling_ranks
    assert sibling_ranks() == [] and end_stopped_siblings() == []  # pytest's parent is no launch.py
    assert peers_at_fault() is None


def test_stat_fields_reads_a_name_with_spaces_and_parentheses():
    from infcl_ds.training.procs import stat_fields
    name, fields = stat_fields("4242 (decode) (x y) S 1 2 3 4 5 6 7 8 9 10 120 30 0\n")
    assert name == "decode) (x y"
    assert fields[0] == "S" and fields[1] == "1" and (fields[11], fields[12]) == ("120", "30")


def test_a_local_rank_is_read_from_the_environment_else_the_command_line(tmp_path):
    from infcl_ds.training.procs import NodeView, local_rank_of
    (tmp_path / "7").mkdir()
    (tmp_path / "7" / "cmdline").write_bytes(b"python\0-u\0-m\0infcl_ds.train\0--local_rank=2\0--config\0x.yaml\0")
    assert local_rank_of(7, tmp_path) == 2  # no environ file: unreadable
    (tmp_path / "7" / "environ").write_bytes(b"PATH=/bin\0LOCAL_RANK=3\0")
    assert local_rank_of(7, tmp_path) == 3
    assert local_rank_of(8, tmp_path) is None  # no such process
    # A live rank whose local rank is unknown could be any of the missing ones: none named exited.
    assert NodeView(0, 0, 4, {0: 1, 1: 2}, {}, unknown=0).exited() == [2, 3]
    assert NodeView(0, 0, 4, {0: 1, 1: 2}, {}, unknown=1).exited() == []
