"""`infcl-ds bench ring --loss siglip`: the sigmoid loss over a ring of this host's GPUs against
open_clip's SigLipLoss over the same ranks, side by side in one run.

Rows as siglip.py's, per GPU over W ranks: ``ms`` the slowest rank's, ``peak_mib`` the largest
rank's, ``tflops_eff`` = 6 B^2 D / W / time, ``peak_mib_budget`` (12 D + 16) B / W bytes + 64 MiB.
Before any timing, the ring is checked against float64 of the gathered batch (meta.checks).
open_clip's SigLipLoss runs with each of its ``dist_impl`` exchanges (``open_clip_bidir``, ...).
Beside each ring row of this code, the same code on one GPU at the same work per GPU (global
B / sqrt(W) samples, ``infcl_ds_1gpu``) gives the ring's weak-scaling efficiency.
"""
import argparse
import math
from pathlib import Path

import torch

from infcl_ds.training.distributed import leave_distributed

from .common import free_port, join_ranks, parse_sizes, run_identity, write_rows
from .harness import (DTYPES, add_row, estimated_s, require_passed, ring_check, run_row, same_work_rows,
                      timing, UNWARMED_ROW_SECONDS)
from tests.reference import siglip_loss_reference
from .siglip import infcl_ds_loss, make_inputs, siglip_row

OPEN_CLIP_EXCHANGES = ("bidir", "shift", "reduce", "gather")  # open_clip's SigLipLoss(dist_impl=...)


def _loss_fn(impl: str, rank: int, world: int):
    if impl == "infcl_ds":
        return infcl_ds_loss(rank, world)
    if impl.startswith("open_clip_") and impl[len("open_clip_"):] in OPEN_CLIP_EXCHANGES:
        from open_clip.loss import SigLipLoss
        fn = SigLipLoss(rank=rank, world_size=world, dist_impl=impl[len("open_clip_"):])
        return lambda i, t, s, b: fn(i, t, s, b)
    raise ValueError(f"--impl: infcl_ds or open_clip_{{{','.join(OPEN_CLIP_EXCHANGES)}}}, got {impl!r}")


def _single_gpu_rows(rows, args, meta, device, group):
    """This code on one GPU (a group of one rank) at each measured ring row's work per GPU:
    global B / sqrt(W) samples; the ring's weak-scaling efficiency beside it."""
    from infcl_ds.losses import sigmoid_loss

    def measure_one(r):
        b1 = max(1, round(r["B"] / math.sqrt(meta["world"])))  # the same 6 B^2 D / W work as the ring row
        one = siglip_row("infcl_ds_1gpu", b1, r["D"], args.dtype, 1, same_work_as_B=r["B"],
                         **{k: meta[k] for k in ("device", "torch", "triton", "commit")})
        return run_row(one, lambda i, t, s, b: sigmoid_loss(i, t, s, b, group=group, allow_tf32=True),
                       lambda: make_inputs(b1, r["D"], args.dtype, device, seed=3),
                       **timing(r["ms"] * 1e-3, args.reps, args.long_row_seconds,
                                args.unwarmed_row_seconds))  # the ring row's work
    same_work_rows(rows, measure_one, args.out, meta)


def _worker(rank, world, args, port, ident):
    import torch.distributed as torch_dist
    device, group_max = join_ranks(rank, world, port)
    checks = ring_check(infcl_ds_loss(), make_inputs(args.check_rows, 768, args.dtype, device, seed=7 + rank), args.dtype,
                        siglip_loss_reference, rank, world)
    meta = dict(ident, world=world, argv=args.argv, checks=checks)
    require_passed(checks, "the sigmoid ring")
    rows = []
    open_clip_max = parse_sizes(args.open_clip_max_batch)[0]
    for D in parse_sizes(args.dim):
        for B in parse_sizes(args.batch):
            for impl in args.impl.split(","):
                row = siglip_row(impl, B, D, args.dtype, world, **ident)
                if impl.startswith("open_clip") and B > open_clip_max:
                    row["status"] = "not run (local B x B logits exceed the GPU)"
                else:
                    run_row(row, _loss_fn(impl, rank, world),
                            lambda: make_inputs(B // world, D, args.dtype, device, seed=rank), group_max,
                            profile=args.profile,  # reps by timing() alone: the same on every rank
                            **timing(estimated_s(rows, row), args.reps, args.long_row_seconds,
                                     args.unwarmed_row_seconds))
                    torch_dist.barrier()
                add_row(rows, row, args.out, meta, rank)
    # A group of one rank gives the single-GPU loss (new_group is collective: all ranks).
    solo = [torch_dist.new_group([r]) for r in range(world)][rank]
    torch_dist.barrier()
    if rank == 0 and args.single:
        _single_gpu_rows(rows, args, meta, device, solo)
    torch_dist.barrier()
    if rank == 0:
        from infcl_ds.ops.tuning import chosen_configs
        meta["tile_configs"] = chosen_configs()  # rank 0's, the single-GPU rows' included
        write_rows(Path(args.out), rows, meta)
        from .plot import plot_siglip
        plot_siglip(Path(args.out), Path(args.out).with_suffix(".png"))
    leave_distributed()  # torn down before exit: a gloo rank left to the exit can abort


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench ring --loss siglip", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="siglip", choices=["siglip"], help="this benchmark's loss (bench ring picks by it)")
    p.add_argument("--world", type=int, default=0, help="ranks (default: all GPUs; 2 gloo ranks on CPU)")
    p.add_argument("--batch", default="64k,256k,1m", help="global batch sizes (k = 1024, m = 1024^2)")
    p.add_argument("--dim", default="768,1152", help="feature widths D, comma-separated")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="feature dtype")
    p.add_argument("--impl", default="infcl_ds," + ",".join(f"open_clip_{x}" for x in OPEN_CLIP_EXCHANGES),
                   help="infcl_ds and open_clip's SigLipLoss with each dist_impl (open_clip_bidir, ...)")
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the 1-GPU same-work rows")
    p.add_argument("--check-rows", type=int, default=1031, help="rows per rank of the float64 check (D=768)")
    p.add_argument("--open-clip-max-batch", default="256k", help="global batch; larger open_clip rows are not run")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per row (their median)")
    p.add_argument("--long-row-seconds", type=float, default=2.0, help="rows slower than this are timed once")
    p.add_argument("--unwarmed-row-seconds", type=float, default=UNWARMED_ROW_SECONDS,
                   help="rows expected slower than this are timed once without a warm-up (an earlier row of "
                        "their D and dtype compiled and tuned the kernels)")
    p.add_argument("--profile", action="store_true",
                   help="one more step of each ring row under torch.profiler (every rank): rank 0's kernels in the row")
    p.add_argument("--out", default="docs/benchmarks/siglip_ring.json", help="the JSON of rows to replace (a PNG beside it)")
    args = p.parse_args(argv)
    args.argv = argv
    world = args.world or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    import torch.multiprocessing as mp
    mp.spawn(_worker, args=(world, args, free_port(), run_identity()), nprocs=world, join=True)
