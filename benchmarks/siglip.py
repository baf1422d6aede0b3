"""`infcl-ds bench loss --loss siglip`: the tiled sigmoid loss against open_clip's SigLipLoss,
side by side in one run.

Each row is the forward plus backward (gradients to both feature tensors, the scale and the
bias) of the sigmoid loss, L2-normalised random features, s = 10, b = -10 (SigLIP's
initialisation). Rows follow harness.py's schema, ``tflops_eff`` = 6 B^2 D / time (one logits
product and two gradient products), with ``peak_mib_budget`` the target (12 D + 16) B bytes +
64 MiB. Every shape runs once before it is timed (compilation, tile tuning, the allocator);
rows slower than --long-row-seconds are then timed once, others the median of --reps.
open_clip rows above --open-clip-max-batch are not run (B x B logits); an out-of-memory row is
recorded as such. Before anything is timed, both implementations are checked against float64
on this device (errors in meta.checks); infcl_ds must pass.
"""
import argparse
import json
from pathlib import Path
from typing import Callable, Dict, List

import torch

from .common import parse_sizes, run_identity, write_rows
from .harness import DTYPES, add_row, loss_row, random_inputs, require_passed, run_row, self_check
from tests.reference import siglip_loss_reference

SCALE, BIAS = 10.0, -10.0
FLOPS_PER_B2D = 6  # one logits product and two gradient products
CHECK_SIZES = ((4097, 768), (1000, 1152), (1, 512))
LOSS_REL_TOL = 1e-4  # the loss of every check size is far from zero


def open_clip_loss(rank=0, world=1):
    from open_clip.loss import SigLipLoss
    fn = SigLipLoss(rank=rank, world_size=world)
    return lambda i, t, s, b: fn(i, t, s, b)


def infcl_ds_loss(rank=0, world=1):
    from infcl_ds.losses import sigmoid_loss
    return lambda i, t, s, b: sigmoid_loss(i, t, s, b, allow_tf32=True)  # fp32 rows: TF32, as benchmarked


IMPLS: Dict[str, Callable] = {"infcl_ds": infcl_ds_loss, "open_clip": open_clip_loss}


def make_inputs(B, D, dtype, device, seed=0):
    return random_inputs(B, D, dtype, device, seed, SCALE, BIAS)


def siglip_row(impl, B, D, dtype, world, **fields) -> dict:
    """A row with the memory target beside the peak: (12 D + 16) B / W bytes + 64 MiB."""
    return loss_row(impl, B, D, dtype, world, FLOPS_PER_B2D,
                    peak_mib_budget=((12 * D + 16) * B / world) / 2**20 + 64, **fields)


def check_against_float64(device, impls, dtype) -> List[dict]:
    """Loss and all four gradients against float64 at small awkward sizes, on this device."""
    return [self_check(name, IMPLS[name](), make_inputs(B, D, dtype, device, seed=B + D), dtype,
                       siglip_loss_reference, LOSS_REL_TOL) for name in impls for B, D in CHECK_SIZES]


def summarise(rows: List[dict]) -> dict:
    """The issue's targets, read off this run's rows."""
    ours = [r for r in rows if r["impl"] == "infcl_ds" and r["status"] == "measured"]
    theirs = [r for r in rows if r["impl"] == "open_clip" and r["status"] == "measured"]
    out = {"min_tflops_eff_B_ge_64k": min((r["tflops_eff"] for r in ours if r["B"] >= 65536), default=None),
           "all_within_memory_budget": all(r["peak_mib"] is None or r["peak_mib"] <= r["peak_mib_budget"]
                                           for r in ours)}
    speedups = {}
    for D in sorted({r["D"] for r in theirs}):
        top = max((r for r in theirs if r["D"] == D), key=lambda r: r["B"])
        mine = next((r for r in ours if r["D"] == D and r["B"] == top["B"]), None)
        if mine:
            speedups[f"D={D},B={top['B']}"] = top["ms"] / mine["ms"]
    out["speedup_vs_open_clip_at_its_largest_B"] = speedups
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench loss --loss siglip", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="siglip", choices=["siglip"], help="this benchmark's loss (bench loss picks by it)")
    p.add_argument("--batch", default="16k,64k,256k,1m", help="global batch sizes (k = 1024, m = 1024^2)")
    p.add_argument("--dim", default="768,1152", help="feature widths D, comma-separated")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES), help="feature dtype")
    p.add_argument("--impl", default="infcl_ds,open_clip", help="implementations timed, comma-separated")
    p.add_argument("--open-clip-max-batch", default="256k", help="larger open_clip rows are not run")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per row (their median)")
    p.add_argument("--long-row-seconds", type=float, default=2.0, help="rows slower than this are timed once")
    p.add_argument("--out", default="docs/benchmarks/siglip.json", help="the JSON of rows to replace (a PNG beside it)")
    p.add_argument("--no-check", action="store_true", help="skip the float64 check before timing")
    p.add_argument("--profile", action="store_true",
                   help="one more step of each row under torch.profiler: its kernels in the row (GPU only)")
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    impls = [x for x in args.impl.split(",") if x]
    ident = run_identity()
    meta = dict(ident, scale=SCALE, bias=BIAS, argv=argv)
    meta["checks"] = [] if args.no_check else check_against_float64(device, impls, args.dtype)
    require_passed(meta["checks"], "infcl_ds")
    open_clip_max = parse_sizes(args.open_clip_max_batch)[0]
    rows: List[dict] = []
    for D in parse_sizes(args.dim):
        for B in parse_sizes(args.batch):
            for impl in impls:
                row = siglip_row(impl, B, D, args.dtype, 1, **ident)
                if impl == "open_clip" and B > open_clip_max:
                    row["status"] = "not run (B x B logits exceed the GPU)"
                else:
                    run_row(row, IMPLS[impl](), lambda: make_inputs(B, D, args.dtype, device), reps=args.reps,
                            long_row_ms=args.long_row_seconds * 1e3, profile=args.profile)
                add_row(rows, row, args.out, meta)
    from infcl_ds.ops.tuning import chosen_configs
    meta["tile_configs"] = chosen_configs()
    meta["summary"] = summarise(rows)
    print("summary:", json.dumps(meta["summary"]), flush=True)
    write_rows(Path(args.out), rows, meta)
    from .plot import plot_siglip
    plot_siglip(Path(args.out), Path(args.out).with_suffix(".png"))
    return rows
