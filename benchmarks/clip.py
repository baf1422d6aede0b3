"""`infcl-ds bench loss` (`--loss clip`, the default): this kernel, full B x B logits and inf-cl,
side by side in one run.

Each row is the forward plus backward of the bidirectional loss (gradients to both feature
tensors and the logit scale), L2-normalised random features, s = 1/0.07, the median of a
few CUDA-event-timed repetitions after a warm-up; rows estimated above --long-row-seconds run
once, without a warm-up (their kernels were compiled and tuned at a smaller batch). Rows follow
harness.py's schema, ``tflops_eff`` = 8 B^2 D / time. inf-cl rows above ``--inf-cl-max-batch``
are extrapolated from its largest measured batch (its rate is flat in B), marked ``"status":
"extrapolated"``. Before anything is timed, every implementation is checked against float64 on
this device (errors in meta.checks); infcl_ds must pass.
"""
import argparse
from pathlib import Path
from typing import Callable, Dict, List

import torch

from infcl_ds.losses import contrastive_loss
from .common import parse_sizes, run_identity, write_rows
from .harness import (add_row, estimated_s, extrapolated, fwd_bwd, loss_row, random_inputs, require_passed,
                      run_row, self_check, time_ms, timing, UNWARMED_ROW_SECONDS)
from tests.reference import clip_loss_reference, full_logits_loss

SCALE = 1 / 0.07
FLOPS_PER_B2D = 8  # 2 B^2 D for the forward's statistics, 6 for the backward
CHECK_SIZES = ((4097, 768), (1000, 640), (1, 512))


def inf_cl_loss(image, text, scale):
    """The public inf-cl package as its training code calls it: once per direction (fp32)."""
    from inf_cl import cal_inf_loss
    # Its own `scale=` argument all-reduces the scale's gradient, which needs a process
    # group; multiplying the queries by s first is the same computation.
    return (cal_inf_loss(scale * image, text) + cal_inf_loss(scale * text, image)) / 2


IMPLS: Dict[str, Callable] = {
    "infcl_ds": lambda i, t, s: contrastive_loss(i, t, s, allow_tf32=True),  # fp32 rows: TF32, as benchmarked
    "full_logits": full_logits_loss,
    "inf_cl": inf_cl_loss,
}


def make_inputs(B, D, dtype, device, seed=0):
    return random_inputs(B, D, dtype, device, seed, SCALE)


def check_against_float64(device, impls, dtypes) -> List[dict]:
    """Small awkward sizes on the benchmark's own device, before anything is timed."""
    return [self_check(name, IMPLS[name], make_inputs(B, D, dt, device, seed=B + D), dt, clip_loss_reference)
            for name in impls for dt in dtypes for B, D in CHECK_SIZES
            if not (name == "inf_cl" and D % 256)]  # inf-cl needs D in multiples of its 256 head width


def phase_breakdown(B, D, dt, device) -> dict:
    """Time of the forward statistics and of the backward alone, each with its own rate."""
    from infcl_ds.ops import block_lse
    inputs = make_inputs(B, D, dt, device)
    image, text, scale = inputs
    s = scale.detach().reshape(1)
    block_lse(image, text, s)
    fwd = time_ms(lambda: block_lse(image, text, s), 3)
    fwd_bwd(IMPLS["infcl_ds"], inputs)
    total = time_ms(lambda: fwd_bwd(IMPLS["infcl_ds"], inputs), 3)
    flop = 2 * B * B * D
    out = {"B": B, "D": D, "dtype": dt, "forward_ms": fwd, "forward_tflops": flop / fwd / 1e9,
           "backward_ms": total - fwd, "backward_tflops_6BBD": 3 * flop / (total - fwd) / 1e9, "total_ms": total}
    print("phases:", {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}, flush=True)
    return out


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench loss", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="clip", choices=["clip", "siglip"],
                   help="siglip: the sigmoid loss against open_clip's SigLipLoss (benchmarks/siglip.py)")
    p.add_argument("--batch", default="16k,64k,256k,1m", help="global batch sizes (k = 1024, m = 1024^2)")
    p.add_argument("--dim", default="512,768,1024", help="feature widths D, comma-separated")
    p.add_argument("--dtype", default="bf16,fp32", help="feature dtypes, comma-separated")
    p.add_argument("--impl", default="infcl_ds,full_logits,inf_cl", help="implementations timed, comma-separated")
    p.add_argument("--extra", default="4m:768:bf16", help="extra B:D:dtype rows (this kernel only), comma-separated")
    p.add_argument("--inf-cl-max-batch", default="256k", help="larger inf-cl rows are extrapolated")
    p.add_argument("--inf-cl-max-work", type=float, default=4e13,
                   help="skip (extrapolate) inf-cl rows with B^2*D above this (its ~17 TFLOP/s makes them minutes)")
    p.add_argument("--full-logits-max-batch", default="64k", help="larger full-logits rows are not run (out of memory)")
    p.add_argument("--reps", type=int, default=3, help="timed repetitions per row (their median)")
    p.add_argument("--long-row-seconds", type=float, default=5.0, help="rows slower than this get a single repetition")
    p.add_argument("--unwarmed-row-seconds", type=float, default=UNWARMED_ROW_SECONDS,
                   help="rows expected slower than this are timed once without a warm-up (an earlier row of "
                        "their D and dtype compiled and tuned the kernels)")
    p.add_argument("--out", default="docs/benchmarks/loss.json", help="the JSON of rows to replace (a PNG beside it)")
    p.add_argument("--no-check", action="store_true", help="skip the float64 check before timing")
    p.add_argument("--phases", default="", help="B:D:dtype for a forward/backward time split, e.g. 256k:768:bf16")
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    impls = [x for x in args.impl.split(",") if x]
    dtypes = [x for x in args.dtype.split(",") if x]
    if "inf_cl" in impls and device.type != "cuda":
        impls.remove("inf_cl")  # a GPU-only package
    ident = run_identity()
    meta = dict(ident, scale=SCALE, argv=argv)
    meta["checks"] = [] if args.no_check else check_against_float64(device, impls, dtypes)
    require_passed(meta["checks"], "infcl_ds")

    if args.phases:
        b, d, dt = args.phases.split(":")
        meta["phases"] = phase_breakdown(parse_sizes(b)[0], int(d), dt, device)
    rows: List[dict] = []
    inf_cl_max = parse_sizes(args.inf_cl_max_batch)[0]
    full_max = parse_sizes(args.full_logits_max_batch)[0]
    plan = [(impl, B, D, dt) for dt in dtypes for D in parse_sizes(args.dim) for B in parse_sizes(args.batch) for impl in impls]
    for extra in filter(None, args.extra.split(",")):
        b, d, dt = extra.split(":")
        plan.append(("infcl_ds", parse_sizes(b)[0], int(d), dt))
    for impl, B, D, dt in plan:
        if impl == "inf_cl" and dt != "bf16" and "bf16" in dtypes:
            continue  # inf-cl upcasts every input to fp32: its bf16 row is its fp32 row
        row = loss_row(impl, B, D, dt, 1, FLOPS_PER_B2D)
        if impl == "inf_cl" and (B > inf_cl_max or B * B * D > args.inf_cl_max_work):
            row["status"] = "not run"
            row.update(extrapolated(rows, B, impl=impl, D=D, dtype=dt) or {})
        elif impl == "full_logits" and B > full_max:
            row["status"] = "not run (B x B logits exceed the GPU)"
        else:
            run_row(row, IMPLS[impl], lambda: make_inputs(B, D, dt, device),
                    **timing(estimated_s(rows, row), args.reps, args.long_row_seconds,
                             args.unwarmed_row_seconds))
        row.update(ident)
        add_row(rows, row, args.out, meta)
    from infcl_ds.ops import g_tiles
    from infcl_ds.ops.tuning import chosen_configs
    meta["tile_configs"] = chosen_configs()
    meta["addmm_out_dtype_fp32_accumulate"] = (g_tiles.addmm_takes_out_dtype(device, torch.bfloat16, torch.float32)
                                               if device.type == "cuda" else None)
    write_rows(Path(args.out), rows, meta)
    from .plot import plot_loss
    plot_loss(Path(args.out), Path(args.out).with_suffix(".png"))
    return rows
