"""OpenCLIP's own trainer (`open_clip_train`) run on the same machine, for `infcl-ds bench train
--impl open_clip_train` and for the drop-in test of `infcl_ds.ClipLoss` inside it.

OpenCLIP's `--accum-freq` is the same cached-feature scheme as this engine (a no-grad pass, then a
pass with grad per chunk), so its trainer at `--local-loss --gather-with-grad --accum-freq K` is
the baseline a user of a batch that fits OpenCLIP compares with. It runs as a subprocess
(`torchrun` for several ranks), on synthetic data, its logs and checkpoints in a temporary
directory removed afterwards; its samples/s per step are read from its own log lines ("Batch (t): 0.123, 4567.8/s, ...").

    python -m benchmarks.open_clip_train [--model-config-dir D] [--infcl-loss] [--record-losses F] -- ARGS...

runs `open_clip_train.main.main(ARGS)` in this process, after registering the model configs in D
with open_clip, swapping open_clip_train's loss for `infcl_ds.ClipLoss` with the same flags
(`--infcl-loss`), and recording every loss value it returns (`--record-losses`, per rank).
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import List, Optional

CHECKOUT = Path(__file__).resolve().parents[1]

# One line per logged step: "... Batch (t): 0.123, 4567.8/s, 2283.9/s/gpu LR: ..."
STEP_LINE = re.compile(r"Batch \(t\): ([0-9.]+), ([0-9.eE+]+)/s")


def open_clip_train_args(model: str, global_batch: int, world: int, per_rank_batch: int, steps: int,
                         compile: bool, precision: str, workers: int, device_is_cuda: bool,
                         data: Optional[List[str]] = None) -> List[str]:
    """open_clip_train's command line for `steps` steps of `global_batch` samples over `world`
    ranks, `per_rank_batch` samples per forward (its --batch-size) and --accum-freq for the rest;
    synthetic data (one image and caption repeated: timing only), or `data`, open_clip_train's own
    data arguments (e.g. --dataset-type csv --train-data F.csv ...)."""
    per_step = world * per_rank_batch
    if global_batch % per_step:
        raise ValueError(f"a global batch of {global_batch} is not a multiple of {world} ranks x "
                         f"{per_rank_batch} per forward")
    argv = [*(data or ["--dataset-type", "synthetic"]), "--train-num-samples", str(global_batch * steps), "--epochs", "1",
            "--model", model, "--batch-size", str(per_rank_batch), "--accum-freq", str(global_batch // per_step),
            "--precision", precision, "--local-loss", "--gather-with-grad", "--workers", str(workers),
            "--log-every-n-steps", "1", "--warmup", "1", "--lr", "5e-4", "--seed", "0"]
    if not device_is_cuda:
        argv += ["--dist-backend", "gloo"]
    if compile:
        argv.append("--torchcompile")
    return argv


def logits_bytes(global_batch: int, world: int, precision: str) -> int:
    """What OpenCLIP's ClipLoss at --local-loss --gather-with-grad holds at once on a rank: its
    two logits matrices, local x global, in the autocast dtype (4 bytes in fp32). The features,
    the model and the softmax's own buffers come on top: a batch whose two matrices exceed the
    GPU's memory cannot run there."""
    local = global_batch // world
    return 2 * local * global_batch * (2 if precision.startswith("amp") else 4)


def launch_command(world: int, runner_args: List[str], argv: List[str], port: int) -> List[str]:
    """This module's runner under torchrun (several ranks, on 127.0.0.1) or plain python."""
    runner = ["-m", "benchmarks.open_clip_train", *runner_args, "--", *argv]
    if world == 1:
        return [sys.executable, *runner]
    return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(world), "--master_addr",
            "127.0.0.1", "--master_port", str(port), *runner]


# The lines that say why a run failed: a Python exception ("torch.OutOfMemoryError: CUDA out of
# memory. Tried to allocate ...") or CUDA's own words. Under --torchcompile the log's last lines
# are the compiler's cache statistics, printed at exit after the error; under torchrun a rank's
# out-of-memory error comes before torchrun's own ChildFailedError.
_ERROR_LINE = re.compile(r"^\S*(Error|Exception)\b")


def failure_line(output: str) -> str:
    """The line of a failed run's log that names its error: the last that says out of memory,
    else the last exception line ("" when none does)."""
    lines = [line.strip() for line in output.splitlines()]
    memory = [line for line in lines if "out of memory" in line.lower()]
    errors = [line for line in lines if _ERROR_LINE.match(line)]
    return (memory or errors or [""])[-1]


def run_open_clip_train(world: int, argv: List[str], port: int, runner_args=(), timeout_s: float = 3600,
                        log: Optional[Path] = None) -> dict:
    """Run it; returns {"step_s": [...], "samples_per_s": [...], "wall_s", "command"} read from its
    log. Raises RuntimeError naming the log's tail when it fails."""
    # The runner is this checkout's module: its root on the child's path, wherever it starts.
    env = dict(os.environ, PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join(filter(None, [str(CHECKOUT), os.environ.get("PYTHONPATH")])))
    started = time.monotonic()
    # open_clip_train writes its logs (and --save-most-recent checkpoints) under --logs; "none"
    # is not special there, so each run gets its own directory, never the caller's cwd.
    with tempfile.TemporaryDirectory(prefix="open_clip_train-") as logs:
        command = launch_command(world, list(runner_args), [*argv, "--logs", logs], port)
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s, env=env)
    output = proc.stdout + proc.stderr
    if log is not None:
        log.write_text(output)
    if proc.returncode != 0:
        raise RuntimeError(f"open_clip_train exited with {proc.returncode}: {failure_line(output) or 'no error line'}"
                           f"\n{output[-3000:]}")
    steps = [(float(a), float(b)) for a, b in STEP_LINE.findall(output)]
    return {"step_s": [s for s, _ in steps], "samples_per_s": [r for _, r in steps],
            "wall_s": time.monotonic() - started,
            "command": " ".join(launch_command(world, list(runner_args), argv, port)[1:])}


# -- the runner (inside open_clip_train's process) -------------------------------------------
class _RecordingLoss:
    """Forwards to the loss and keeps each returned value (written at exit)."""

    def __init__(self, loss, values: list):
        self.loss, self.values = loss, values

    def __call__(self, *args, **kwargs):
        out = self.loss(*args, **kwargs)
        total = sum(out.values()) if isinstance(out, dict) else out
        self.values.append(float(total.detach()))
        return out

    def __getattr__(self, name):
        return getattr(self.loss, name)


def _infcl_loss(args):
    """infcl_ds.ClipLoss with the flags open_clip's create_loss would pass to its ClipLoss."""
    from infcl_ds.losses import ClipLoss
    return ClipLoss(local_loss=args.local_loss, gather_with_grad=args.gather_with_grad, cache_labels=True,
                    rank=args.rank, world_size=args.world_size, use_horovod=args.horovod)


def runner(argv: List[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m benchmarks.open_clip_train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model-config-dir", help="open_clip model configs (JSON) to register first")
    p.add_argument("--infcl-loss", action="store_true", help="train with infcl_ds.ClipLoss instead")
    p.add_argument("--record-losses", help="write every loss value to this JSON file + .rankR, one per rank")
    # open_clip_train's arguments follow "--"; split there, since argparse's REMAINDER
    # misreads them when no option of ours comes first.
    cut = argv.index("--") if "--" in argv else len(argv)
    args, rest = p.parse_args(argv[:cut]), argv[cut + 1:]
    import open_clip
    import open_clip_train.main as octm
    if args.model_config_dir:
        open_clip.add_model_config(args.model_config_dir)
    import torch
    if not torch.cuda.is_available():
        # open_clip_train passes device_ids=[device] to DDP, which DDP refuses for CPU modules:
        # drop it there so that the trainer runs on CPU ranks (the drop-in test).
        ddp = torch.nn.parallel.DistributedDataParallel

        class CpuDistributedDataParallel(ddp):
            def __init__(self, module, device_ids=None, **kwargs):
                super().__init__(module, **kwargs)
        torch.nn.parallel.DistributedDataParallel = CpuDistributedDataParallel
    values: list = []
    make_loss = _infcl_loss if args.infcl_loss else octm.create_loss
    octm.create_loss = lambda a: _RecordingLoss(make_loss(a), values)
    octm.main(rest)
    if args.record_losses:
        Path(f"{args.record_losses}.rank{os.environ.get('RANK', '0')}").write_text(json.dumps(values))


if __name__ == "__main__":
    runner(sys.argv[1:])
