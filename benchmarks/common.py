"""What every benchmark shares: the run's identity, timing, peak memory and JSON rows."""
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

import torch


def run_identity() -> Dict[str, str]:
    """Device, versions and commit, stamped on every row of a run."""
    # INFCL_DS_COMMIT first: a copied working tree (GPU machines) may carry stale git metadata.
    commit = os.environ.get("INFCL_DS_COMMIT", "")
    if not commit:
        try:
            commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                    cwd=Path(__file__).resolve().parent, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            commit = ""
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


def synchronize():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], None], reps: int) -> float:
    """Median wall time of ``reps`` calls in ms (CUDA events on GPU), after the caller's warm-up."""
    times = []
    for _ in range(reps):
        if torch.cuda.is_available():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def peak_mib_above_current(fn: Callable[[], None]) -> Optional[float]:
    """Peak allocated memory during ``fn`` above what was allocated before it (GPU only)."""
    if not torch.cuda.is_available():
        return None
    synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def measure(step: Callable[[], None], reps: int):
    """(median ms, peak MiB above current) of ``step``. reps=0: one run gives both (rows of
    many seconds whose kernels were compiled and tuned at a smaller size); otherwise a
    warm-up, so compilation and tile tuning stay out of the peak, then a peak run, then reps."""
    if reps == 0:
        box = {}
        peak = peak_mib_above_current(lambda: box.setdefault("ms", time_ms(step, 1)))
        return box["ms"], peak
    step()
    peak = peak_mib_above_current(step)
    return time_ms(step, reps), peak


def extrapolated(rows: List[dict], B: int, rate_key: str, **match) -> Optional[dict]:
    """Fields of a row at batch B extrapolated from the largest measured row matching
    ``match``: time ~ B^2 at a flat rate, memory ~ B. None if nothing was measured."""
    base = max((r for r in rows if r.get("status") == "measured" and all(r[k] == v for k, v in match.items())),
               key=lambda r: r["B"], default=None)
    if base is None:
        return None
    f = B / base["B"]
    return {"ms": base["ms"] * f * f, "peak_mib": base["peak_mib"] * f if base["peak_mib"] else None,
            rate_key: base[rate_key], "status": "extrapolated", "extrapolated_from_B": base["B"]}


def is_oom(err: BaseException) -> bool:
    return isinstance(err, torch.OutOfMemoryError) or "out of memory" in str(err).lower()


def write_rows(path: Path, rows: List[dict], meta: dict) -> None:
    """Replace ``path`` by this run's rows: one run per file keeps every ratio same-run."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    tmp.replace(path)


def fmt_row(row: dict) -> str:
    ms = "-" if row.get("ms") is None else f"{row['ms']:10.1f}"
    peak = "-" if row.get("peak_mib") is None else f"{row['peak_mib']:9.0f}"
    rate = "-" if row.get("tflops_eff") is None else f"{row['tflops_eff']:7.1f}"
    return (f"{row['impl']:12s} B={row['B']:>8d} D={row['D']:>5d} {row['dtype']:5s} ms={ms} "
            f"peak_mib={peak} TFLOP/s={rate} {row.get('status', '')}")


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
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo", auto_mpi_discovery=False, verbose=False)

    def group_max(x):
        t = torch.tensor(float(x or 0.0), device=device)
        torch_dist.all_reduce(t, op=torch_dist.ReduceOp.MAX)
        return t.item()

    return device, group_max
