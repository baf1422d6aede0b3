"""What every benchmark shares: the run's identity, its ranks, batch sizes and JSON rows (the loss
benchmarks' timing and row schema: harness.py)."""
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Dict, List, Optional

import torch

from infcl_ds.parallel.comm import without_cpu_shared_memory_op


def tree_commit(cwd: Path) -> str:
    """The checkout's commit, with `-dirty` where its tracked files differ from it: a working
    tree copied beside stale git metadata (a lent GPU machine's) then says so instead of passing
    for the stale commit. "" outside a git checkout."""
    def git(*args):
        return subprocess.run(["git", *args], capture_output=True, text=True, cwd=cwd, timeout=30)
    try:
        commit = git("rev-parse", "--short", "HEAD").stdout.strip()
        if commit and git("diff", "--quiet", "HEAD", "--").returncode == 1:
            commit += "-dirty"
        return commit
    except (OSError, subprocess.SubprocessError):
        return ""


def run_identity() -> Dict[str, str]:
    """Device, versions and commit, stamped on every row of a run."""
    # INFCL_DS_COMMIT first: the commit a copied working tree was sent from.
    commit = os.environ.get("INFCL_DS_COMMIT", "") or tree_commit(Path(__file__).resolve().parent)
    import triton
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else f"cpu ({platform.processor() or platform.machine()})"
    return {"device": device, "torch": torch.__version__, "triton": triton.__version__,
            "commit": commit or "unknown"}


def free_port() -> int:
    """A free TCP port on the loopback interface (benchmarks never leave this machine)."""
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def write_rows(path: Path, rows: List[dict], meta: dict) -> None:
    """Replace ``path`` by this run's rows: one run per file keeps every ratio same-run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    tmp.replace(path)


def parse_sizes(text: str) -> List[int]:
    """'16k,1m' -> [16384, 1048576] (k = 1024, m = 1024^2)."""
    out = []
    for tok in text.split(","):
        tok = tok.strip().lower()
        mult = {"k": 1 << 10, "m": 1 << 20}.get(tok[-1:], 1)
        out.append(int(tok.rstrip("km")) * mult)
    return out


def join_ranks(rank: int, world: int, port: int):
    """Join a benchmark's spawned ranks on 127.0.0.1 (NCCL on GPUs, gloo on CPUs).

    Returns this rank's device and ``group_max(x)``, the maximum of a number over the ranks
    (a row reports its slowest rank and its largest peak)."""
    import deepspeed
    import torch.distributed as torch_dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.set_device(rank)
    device = torch.device("cuda", rank) if cuda else torch.device("cpu")
    if not cuda:
        without_cpu_shared_memory_op()
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False, verbose=False)

    def group_max(x):
        t = torch.tensor(float(x or 0.0), device=device)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return t.item()

    return device, group_max


# -- jobs in process sessions of their own (launch/train.sh runs: benchmarks/faults.py, scale.py)

REPO = Path(__file__).resolve().parents[1]


def job_environment(accelerator: str) -> Dict[str, str]:
    """This Python's environment for a launch/train.sh job: its deepspeed first on PATH; on CPUs
    the Triton interpreter and DeepSpeed's CPU accelerator (gloo), on GPUs neither."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
               MASTER_ADDR="127.0.0.1", PYTHONUNBUFFERED="1")
    env.pop("VIRTUAL_ENV", None)  # train.sh would otherwise prefer an activated environment's Python
    if accelerator == "cpu":
        env.update(TRITON_INTERPRET="1", DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    else:
        env.pop("TRITON_INTERPRET", None)
        env.pop("DS_ACCELERATOR", None)
    return env


def _default_signals() -> None:
    for sig in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)


class Job:
    """A command (launch/train.sh) in its own process session (whose id is the command's pid),
    its output in a log: every process it starts can be found, measured and ended, and nothing else."""

    def __init__(self, command: List[str], env: Dict[str, str], log: Path, cwd: Path = REPO,
                 end_with_parent: bool = False):
        """``end_with_parent``: the job's processes are killed when this process dies, however it
        dies (its own session outlives it otherwise): a benchmark killed at a time limit leaves
        nothing training on the GPUs."""
        self.command, self.log = command, log
        with log.open("w") as out:
            # Default signal dispositions: a benchmark started from a shell with `&` inherits
            # SIGINT ignored, and the job would then ignore the SIGINT a fault row sends it.
            self.proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_default_signals)
        if end_with_parent:
            # In a session of its own too: a time limit that ends this process's group spares it.
            subprocess.Popen([sys.executable, "-c", _GUARD, str(os.getpid()), str(self.proc.pid)],
                             stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, start_new_session=True)

    def processes(self) -> List[int]:
        """The session's live processes (zombies are gone: they only wait to be reaped)."""
        self.proc.poll()  # reaps the launcher once it ended
        return session_pids(self.proc.pid)

    def rank(self, rank: int) -> Optional[int]:
        """The pid of global rank ``rank`` (one node: DeepSpeed's launch.py passes --local_rank=R)."""
        from infcl_ds.training.procs import is_deepspeed_launch, process_stat
        for pid in self.processes():
            stat = process_stat(pid)
            if stat is not None and is_deepspeed_launch(stat[1]) and f"--local_rank={rank}" in cmdline(pid):
                return pid
        return None

    def wait_gone(self, limit_s: float, since: float) -> Optional[float]:
        """Seconds from ``since`` until no process of the session is left; None past ``limit_s``."""
        while self.processes():
            if time.monotonic() - since > limit_s:
                return None
            time.sleep(0.1)
        return time.monotonic() - since

    def kill(self) -> None:
        for pid in self.processes():
            try:
                os.kill(pid, signal.SIGKILL)  # ends a stopped process too
            except ProcessLookupError:
                pass
        self.proc.wait()

    def text(self) -> str:
        return self.log.read_text(errors="replace")


# The guard of a Job that ends with its parent: once the parent is gone (this process is
# handed to another), SIGKILL to the job's process group (its session's: the launcher, launch.py,
# the ranks, their workers); it leaves when the group is empty.
_GUARD = """
import os, signal, sys, time
parent, group = int(sys.argv[1]), int(sys.argv[2])
while True:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        break
    if os.getppid() != parent:
        os.killpg(group, signal.SIGKILL)
        break
    time.sleep(1)
"""


def session_pids(sid: int) -> List[int]:
    """The live processes of session ``sid``."""
    return [pid for pid in all_pids() if session_of(pid) == sid and state_of(pid) not in (None, "Z", "X")]


def all_pids() -> List[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def session_of(pid: int) -> Optional[int]:
    try:
        return os.getsid(pid)
    except OSError:
        return None


def state_of(pid: int) -> Optional[str]:
    from infcl_ds.training.procs import process_stat
    stat = process_stat(pid)
    return stat[0] if stat else None


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
