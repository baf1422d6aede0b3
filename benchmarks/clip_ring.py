"""`infcl-ds bench ring` (`--loss clip`, the default): the ring across the GPUs of one host, side
by side in one run with inf-cl's ring (once per direction, as its training code calls it) and
OpenCLIP's local-loss + gather-with-grad (full logits per rank, where it fits); plus this code on
one GPU with the same per-GPU work (global B / sqrt(W)) for the weak-scaling efficiency.

Rows follow harness.py's schema: ``ms`` the slowest rank's median, ``peak_mib`` the largest
per-rank peak above the inputs, ``tflops_eff`` per GPU, 8 B^2 D / W / time; the ring's rows add
``weak_scaling_efficiency``, the one-GPU rows ``same_work_as_B``. inf-cl rows above
--inf-cl-max-batch are extrapolated (time ~ B^2) from its largest measured batch. Before any
timing, the ring is checked against float64 of the gathered batch (meta.checks).
"""
import argparse
import math
from pathlib import Path

import torch

from infcl_ds import contrastive_loss
from infcl_ds.training.distributed import leave_distributed
from .clip import FLOPS_PER_B2D, make_inputs
from .common import free_port, join_ranks, parse_sizes, run_identity
from .harness import (DTYPES, add_row, estimated_s, extrapolated, loss_row, require_passed, ring_check, run_row,
                      same_work_rows, timing, UNWARMED_ROW_SECONDS)
from tests.reference import clip_loss_reference


def _loss_fn(impl, rank, world):
    if impl == "infcl_ds":
        return lambda i, t, s: contrastive_loss(i, t, s, allow_tf32=True)  # fp32 rows: TF32, as benchmarked
    if impl == "inf_cl":
        from inf_cl import cal_inf_loss
        return lambda i, t, s: (cal_inf_loss(s * i, t) + cal_inf_loss(s * t, i)) / 2
    if impl == "open_clip":
        from open_clip.loss import ClipLoss
        fn = ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world)
        return lambda i, t, s: fn(i, t, s)
    raise ValueError(impl)


def _check(rank, world, device):
    """This ring against a float64 reference of the gathered batch, before any timing."""
    return [row for dt in ("bf16", "fp32")
            for row in ring_check(_loss_fn("infcl_ds", rank, world), make_inputs(2053, 768, dt, device, seed=7 + rank),
                                  dt, clip_loss_reference, rank, world)]


def _single_gpu_rows(rows, args, device, group, ident):
    """This code on one GPU (a group of one rank) at the ring's per-GPU work, beside each
    measured ring row: global B / sqrt(W) samples; the ring's weak-scaling efficiency."""
    def measure_one(r):
        b1 = int(r["B"] / math.sqrt(args.world)) // 256 * 256
        one = loss_row("infcl_ds_1gpu", b1, r["D"], args.dtype, 1, FLOPS_PER_B2D, same_work_as_B=r["B"], **ident)
        at_ring_rate_s = FLOPS_PER_B2D * b1 * b1 * r["D"] / (r["tflops_eff"] * 1e12)
        return run_row(one, lambda i, t, s: contrastive_loss(i, t, s, group=group, allow_tf32=True),
                       lambda: make_inputs(b1, r["D"], args.dtype, device, seed=3),
                       **timing(at_ring_rate_s, args.reps, args.long_row_seconds,
                                args.unwarmed_row_seconds))
    same_work_rows(rows, measure_one, args.out, args.meta, key="weak_scaling_efficiency")


def _worker(rank, world, args, port, ident):
    import torch.distributed as torch_dist
    device, group_max = join_ranks(rank, world, port)
    args.world = world
    args.meta = dict(ident, world=world, argv=args.argv, checks=_check(rank, world, device))
    require_passed(args.meta["checks"], "the ring")
    rows = []
    inf_cl_max = parse_sizes(args.inf_cl_max_batch)[0]
    for D in parse_sizes(args.dim):
        for B in parse_sizes(args.batch):
            for impl in args.impl.split(","):
                row = loss_row(impl, B, D, args.dtype, world, FLOPS_PER_B2D)
                if impl == "inf_cl" and B > inf_cl_max:
                    row.update(extrapolated(rows, B, impl=impl, D=D) or {"status": "not run"})
                else:
                    run_row(row, _loss_fn(impl, rank, world),
                            lambda: make_inputs(B // world, D, args.dtype, device, seed=rank), group_max,
                            **timing(estimated_s(rows, row), args.reps, args.long_row_seconds,
                                     args.unwarmed_row_seconds))
                    torch_dist.barrier()
                row.update(ident)
                add_row(rows, row, args.out, args.meta, rank)
    # A group of one rank gives the single-device loss (new_group is collective: all ranks).
    solo = [torch_dist.new_group([r]) for r in range(world)][rank]
    torch_dist.barrier()
    if rank == 0 and args.single:
        _single_gpu_rows(rows, args, device, solo, ident)
    if rank == 0:
        from .plot import plot_ring
        plot_ring(Path(args.out), Path(args.out).with_suffix(".png"))
    leave_distributed()  # torn down before exit: a gloo rank left to the exit can abort


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench ring", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="clip", choices=["clip", "siglip"],
                   help="siglip: the sigmoid loss against open_clip's SigLipLoss (benchmarks/siglip_ring.py)")
    p.add_argument("--world", type=int, default=0, help="ranks (default: all GPUs; 2 gloo ranks on CPU)")
    p.add_argument("--batch", default="64k,256k,1m,2m", help="global batch sizes")
    p.add_argument("--dim", default="512,768", help="feature widths D, comma-separated")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="feature dtype")
    p.add_argument("--impl", default="infcl_ds,inf_cl,open_clip", help="implementations timed, comma-separated")
    p.add_argument("--inf-cl-max-batch", default="512k", help="global batch; larger inf-cl rows are not run")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per row (their median)")
    p.add_argument("--long-row-seconds", type=float, default=5.0, help="rows slower than this are timed once")
    p.add_argument("--unwarmed-row-seconds", type=float, default=UNWARMED_ROW_SECONDS,
                   help="rows expected slower than this are timed once without a warm-up (an earlier row of "
                        "their D and dtype compiled and tuned the kernels)")
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the 1-GPU same-work rows")
    p.add_argument("--out", default="docs/benchmarks/ring.json", help="the JSON of rows to replace (a PNG beside it)")
    args = p.parse_args(argv)
    args.argv = argv
    world = args.world or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    if "inf_cl" in args.impl and not torch.cuda.is_available():
        args.impl = ",".join(x for x in args.impl.split(",") if x != "inf_cl")  # a GPU-only package
    import torch.multiprocessing as mp
    mp.spawn(_worker, args=(world, args, free_port(), run_identity()), nprocs=world, join=True)
