"""How a rank of `infcl-ds train` ends: the exit statuses (EXIT_STATUSES, also `--help`'s) and
the errors that map to them."""
import os
import sys
from typing import List, Optional

from ..checkpoint.safe_load import CheckpointError
from ..config import RecipeError
from ..data.errors import DataError
from .divergence import DivergedError
from .preflight import StartupError
from .procs import end_stopped_siblings, peers_at_fault

DONE_EXIT = 0
USER_ERROR_EXIT = 2
COLLECTIVE_FAILURE_EXIT = 3
LAUNCHER_GONE_EXIT = 4
EXIT_STATUSES = (
    "Exit status (docs/reliability.md): 0 done; 2 the run cannot go on as configured (recipe, data, output "
    "directory, disk, checkpoint: one line on stderr naming it); 3 a collective failed or timed out (a peer rank is "
    "stopped, wedged or dead: one line naming this rank, its step and the ranks of its node that are stopped or have "
    "exited); 4 the deepspeed launcher that started the "
    "ranks went away (SIGINT/SIGTERM to it: every rank stops within 30 s, after a checkpoint being written; "
    "training/launcher_watch.py).")

# Errors that are the run's configuration or files, not a bug: one line, exit 2.
USER_ERRORS = (RecipeError, DataError, CheckpointError, StartupError, DivergedError, FileNotFoundError)


def one_line(err: BaseException) -> str:
    """The error's own message on one line; for an error re-raised from a data-loader worker
    (whose message carries the worker's traceback) the original error's last line."""
    lines = [line.strip() for line in str(err).strip().splitlines() if line.strip()]
    if not lines:
        return type(err).__name__
    if "Original Traceback" in str(err):
        last = lines[-1]
        return last.split(": ", 1)[1] if last.startswith(f"{type(err).__name__}: ") else last
    return " ".join(lines)


def peers_line(at_fault: Optional[List[str]]) -> str:
    """The peers named for a failed collective (procs.peers_at_fault's findings)."""
    if at_fault:
        return "; ".join(at_fault) + (", see its log" if len(at_fault) == 1 else ", see their logs")
    if at_fault == []:
        return ("every other rank of this node runs: a rank on another node is stopped, wedged or dead, "
                "or one here is wedged, see their logs")
    return "a peer rank is stopped, wedged or dead, see its log"


def exit_now(code: int) -> None:
    """Leave at once: tearing the process group down would wait on the peer that failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def exit_collective_failure(err: BaseException, rank, phase: str, timeout_s: float) -> None:
    """One line naming this rank, what it was doing, the peers of its node at fault (stopped or
    exited, read off /proc before a stopped one is ended) and the failed operation; exit 3 at once."""
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    print(f"infcl-ds train: rank {rank}, {phase}: a collective failed or timed out (timeout "
          f"{timeout_s / 60:g} min): {peers_line(peers_at_fault())}. {first}", file=sys.stderr)
    end_stopped_siblings()  # else a stopped rank beside this one outlives the job by launch.py's 30 s
    exit_now(COLLECTIVE_FAILURE_EXIT)
