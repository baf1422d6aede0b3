"""Run a function on N ranks in fresh processes on 127.0.0.1: gloo on the CPU
(DS_ACCELERATOR=cpu), or NCCL with one GPU per rank under `tests/run.sh --gpu` (devices.py;
a test needing more ranks than GPUs is skipped).

The ranks are forked from a server that has imported torch, deepspeed and open_clip once (the
multiprocessing forkserver, started by the first test that runs ranks): each test still gets
processes of its own, that no earlier test ran in, without paying those imports again (seconds
a rank, most of a two-rank engine test's time on a GPU host). The server imports no project
module and runs no test code, and never initializes CUDA (torch's device checks read NVML there;
had it, torch would refuse CUDA in the forked ranks by name), so a forked rank starts as a spawned
one would; it gets the test's environment, not the server's."""
import io
import os
import queue as queue_module
import time
import traceback
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp
from torch.utils._pytree import tree_map

from devices import DIST_BACKEND, GPU, setup_rank
from benchmarks.common import free_port
from infcl_ds.parallel.comm import without_cpu_shared_memory_op
from infcl_ds.training.distributed import leave_distributed


# Imported once, in the server the ranks are forked from. Third-party only: a project module
# imported there would keep the environment of the first test that ran ranks.
SERVER_PRELOAD = ["torch", "triton", "deepspeed", "open_clip"]


def _rank_context():
    # the server starts with this environment: torch's device checks then read NVML, never
    # initializing the CUDA driver in a process that forks ranks
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(SERVER_PRELOAD)
    return ctx


def _entry(fn, rank, world, port, args, queue, timeout_s, environ):
    os.environ.clear()
    os.environ.update(environ)
    # What importing deepspeed and open_clip sets in the parent, set alike whichever test ran
    # there before: a rank's environment does not depend on the order of the tests.
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    if not GPU:
        os.environ["DS_ACCELERATOR"] = "cpu"
    try:
        setup_rank(rank)
        import deepspeed
        if not GPU:
            without_cpu_shared_memory_op()
        deepspeed.init_distributed(dist_backend=DIST_BACKEND, auto_mpi_discovery=False, verbose=False,
                                   init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                   timeout=timedelta(seconds=timeout_s))
        # Through bytes: tensors sent as shared memory die with the child process.
        # On the CPU, so that the parent compares CUDA ranks' results with CPU references.
        result = tree_map(lambda x: x.cpu() if isinstance(x, torch.Tensor) else x,
                                              fn(rank, world, *args))
        buf = io.BytesIO()
        torch.save(result, buf)
        queue.put((rank, "ok", buf.getvalue()))
    except BaseException:  # noqa: BLE001 - everything goes back to the test
        queue.put((rank, "error", traceback.format_exc()))
        return
    try:  # as the trainer's ranks leave: one left to the interpreter's exit can abort in the teardown
        leave_distributed()
    except Exception:  # noqa: BLE001 - a peer that failed has gone; this rank's result is delivered
        pass


def run_ranks(fn, world, *args, timeout_s=60, wait_s=240, allow_errors=False):
    """Return {rank: result} (or {rank: ("error", traceback)} if allow_errors)."""
    if GPU and world > torch.cuda.device_count():
        pytest.skip(f"{world} ranks need {world} GPUs, this machine has {torch.cuda.device_count()}")
    ctx = _rank_context()
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(fn, r, world, port, args, queue, timeout_s, dict(os.environ)))
             for r in range(world)]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + wait_s
    try:
        while len(results) < world and time.monotonic() < deadline:
            try:
                rank, status, value = queue.get(timeout=1)
            except queue_module.Empty:
                # A rank that died without a word (os._exit, a signal) reports its exit code.
                for r, p in enumerate(procs):
                    if r not in results and p.exitcode is not None and queue.empty():
                        time.sleep(0.5)
                        if queue.empty() and r not in results:
                            results[r] = ("error", f"rank {r} exited with code {p.exitcode} without a result")
                continue
            results[rank] = torch.load(io.BytesIO(value), weights_only=False) if status == "ok" else ("error", value)
        if len(results) < world:
            raise AssertionError(f"ranks {sorted(set(range(world)) - set(results))} gave no result in {wait_s} s")
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    errors = {r: v[1] for r, v in results.items() if isinstance(v, tuple) and v and v[0] == "error"}
    if errors and not allow_errors:
        raise AssertionError("\n".join(f"--- rank {r} ---\n{tb}" for r, tb in errors.items()))
    return results



def on_ring(rank, group_ranks, run_case, cases):
    """``run_case(case, group, position)`` for each case on a ring over ``group_ranks`` (all
    ranks if None); [] on a rank outside the group. Every rank calls it: new_group is collective."""
    import torch.distributed as torch_dist
    group = torch_dist.new_group(group_ranks) if group_ranks else None
    if group_ranks and rank not in group_ranks:
        return []
    position = group_ranks.index(rank) if group_ranks else rank
    return [run_case(case, group, position) for case in cases]
