"""`infcl-ds bench loss`: this kernel, full B x B logits and inf-cl, side by side in one run.

Each row is the forward plus backward of the bidirectional loss (gradients to both feature
tensors and the logit scale), L2-normalised random features, s = 1/0.07, the median of a
few CUDA-event-timed repetitions after a warm-up. ``peak_mib`` is the peak allocated memory
above the inputs; ``tflops_eff`` = 8 B^2 D / time (one fused pass of useful work). inf-cl
rows above ``--inf-cl-max-batch`` are extrapolated from its largest measured batch (its
rate is flat in B), marked ``"status": "extrapolated"``.
"""
import argparse
import sys
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from infcl_ds.losses import contrastive_loss
from .common import extrapolated, fmt_row, is_oom, measure, run_identity, synchronize, time_ms, write_rows

DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SCALE = 1 / 0.07


def full_logits_loss(image, text, scale):
    """OpenCLIP's ClipLoss on one device: the B x B logits, both cross-entropies."""
    logits = scale * image @ text.T
    labels = torch.arange(image.shape[0], device=image.device)
    return (F.cross_entropy(logits, labels) + F.cross_entropy(logits.T, labels)) / 2


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
    g = torch.Generator(device=device).manual_seed(seed)
    image = F.normalize(torch.randn(B, D, device=device, generator=g), dim=1).to(dtype).requires_grad_()
    text = F.normalize(torch.randn(B, D, device=device, generator=g), dim=1).to(dtype).requires_grad_()
    scale = torch.tensor(SCALE, device=device, requires_grad=True)
    return image, text, scale


def fwd_bwd(impl, image, text, scale):
    image.grad = text.grad = scale.grad = None
    IMPLS[impl](image, text, scale).backward()


def check_against_float64(device, impls, dtypes) -> List[dict]:
    """Small awkward sizes on the benchmark's own device, before anything is timed."""
    results = []
    for name in impls:
        for dt in dtypes:
            for B, D in ((4097, 768), (1000, 640), (1, 512)):
                if name == "inf_cl" and D % 256:
                    continue  # inf-cl needs D in multiples of its 256 head width
                image, text, scale = make_inputs(B, D, DTYPES[dt], device, seed=B + D)
                fwd_bwd(name, image, text, scale)
                i64, t64, s64 = (x.detach().double().requires_grad_() for x in (image, text, scale))
                full_logits_loss(i64, t64, s64).backward()
                loss = IMPLS[name](image, text, scale).item()
                ref = full_logits_loss(i64.detach(), t64.detach(), s64.detach()).item()

                def err(x, r):
                    return ((x.double() - r).norm() / r.norm().clamp_min(1e-30)).item()
                row = {"impl": name, "dtype": dt, "B": B, "D": D, "loss_abs_err": abs(loss - ref),
                       "grad_image_rel_err": err(image.grad, i64.grad), "grad_text_rel_err": err(text.grad, t64.grad),
                       "grad_scale_rel_err": err(scale.grad, s64.grad)}
                tol = 2e-2 if dt == "bf16" else 5e-3  # fp32 runs with TF32 products
                row["ok"] = B == 1 or all(row[k] <= tol for k in ("grad_image_rel_err", "grad_text_rel_err", "grad_scale_rel_err"))
                results.append(row)
                print(f"check {name:11s} {dt} B={B} D={D}: " + " ".join(f"{k}={v:.2e}" for k, v in row.items() if k.endswith("err")),
                      "ok" if row["ok"] else "FAILED", flush=True)
    return results


def bench_row(impl, B, D, dt, device, reps) -> dict:
    row = {"impl": impl, "B": B, "D": D, "dtype": dt, "ms": None, "peak_mib": None, "tflops_eff": None}
    try:
        image, text, scale = make_inputs(B, D, DTYPES[dt], device)
        row["ms"], row["peak_mib"] = measure(lambda: fwd_bwd(impl, image, text, scale), reps)
        row["tflops_eff"] = 8 * B * B * D / (row["ms"] * 1e-3) / 1e12
        row["status"] = "measured"
    except Exception as err:  # noqa: BLE001 - record what stopped the row and go on
        if not is_oom(err):
            raise
        row["status"] = "out of memory"
    finally:
        image = text = scale = None
        synchronize()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return row


def phase_breakdown(B, D, dt, device) -> dict:
    """Time of the forward statistics and of the backward alone, each with its own rate."""
    from infcl_ds.ops import block_lse
    image, text, scale = make_inputs(B, D, DTYPES[dt], device)
    s = scale.detach().reshape(1)
    block_lse(image, text, s)
    fwd = time_ms(lambda: block_lse(image, text, s), 3)
    fwd_bwd("infcl_ds", image, text, scale)
    total = time_ms(lambda: fwd_bwd("infcl_ds", image, text, scale), 3)
    flop = 2 * B * B * D
    out = {"B": B, "D": D, "dtype": dt, "forward_ms": fwd, "forward_tflops": flop / fwd / 1e9,
           "backward_ms": total - fwd, "backward_tflops_6BBD": 3 * flop / (total - fwd) / 1e9, "total_ms": total}
    print("phases:", {k: round(v, 2) if isinstance(v, float) else v for k, v in out.items()}, flush=True)
    return out


def parse_sizes(text: str) -> List[int]:
    out = []
    for tok in text.split(","):
        tok = tok.strip().lower()
        mult = {"k": 1 << 10, "m": 1 << 20}.get(tok[-1:], 1)
        out.append(int(tok.rstrip("km")) * mult)
    return out


def main(argv=None):
    from . import siglip
    if siglip.wants_siglip(sys.argv[1:] if argv is None else argv):
        return siglip.main_loss(argv)
    p = argparse.ArgumentParser(prog="infcl-ds bench loss", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", default="16k,64k,256k,1m", help="global batch sizes (k = 1024, m = 1024^2)")
    p.add_argument("--dim", default="512,768,1024")
    p.add_argument("--dtype", default="bf16,fp32")
    p.add_argument("--impl", default="infcl_ds,full_logits,inf_cl")
    p.add_argument("--extra", default="4m:768:bf16", help="extra B:D:dtype rows (this kernel only), comma-separated")
    p.add_argument("--inf-cl-max-batch", default="256k", help="larger inf-cl rows are extrapolated")
    p.add_argument("--inf-cl-max-work", type=float, default=4e13,
                   help="skip (extrapolate) inf-cl rows with B^2*D above this (its ~17 TFLOP/s makes them minutes)")
    p.add_argument("--full-logits-max-batch", default="64k")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--long-row-seconds", type=float, default=5.0, help="rows slower than this get a single repetition")
    p.add_argument("--out", default="docs/benchmarks/loss.json")
    p.add_argument("--no-check", action="store_true")
    p.add_argument("--phases", default="", help="B:D:dtype for a forward/backward time split, e.g. 256k:768:bf16")
    p.add_argument("--loss", default="clip", choices=["clip", "siglip"],
                   help="siglip: the sigmoid loss against open_clip's SigLipLoss (benchmarks/siglip.py)")
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    impls = [x for x in args.impl.split(",") if x]
    dtypes = [x for x in args.dtype.split(",") if x]
    if "inf_cl" in impls and device.type != "cuda":
        impls.remove("inf_cl")  # a GPU-only package
    ident = run_identity()
    meta = dict(ident, scale=SCALE, argv=argv)
    meta["checks"] = [] if args.no_check else check_against_float64(device, impls, dtypes)
    if meta["checks"] and not all(c["ok"] for c in meta["checks"] if c["impl"] == "infcl_ds"):
        raise SystemExit("infcl_ds failed its float64 check on this device: not timing anything")

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
        if impl == "inf_cl" and (B > inf_cl_max or B * B * D > args.inf_cl_max_work):
            row = {"impl": impl, "B": B, "D": D, "dtype": dt, "ms": None, "peak_mib": None, "tflops_eff": None,
                   "status": "not run"}
            row.update(extrapolated(rows, B, "tflops_eff", impl=impl, D=D, dtype=dt) or {})
        elif impl == "full_logits" and B > full_max:
            row = {"impl": impl, "B": B, "D": D, "dtype": dt, "ms": None, "peak_mib": None, "tflops_eff": None,
                   "status": "not run (B x B logits exceed the GPU)"}
        else:
            # Estimate the row's time from this impl's rate so far; long rows run once.
            done = [r for r in rows if r["impl"] == impl and r.get("tflops_eff")]
            est_s = 8 * B * B * D / (min(r["tflops_eff"] for r in done) * 1e12) if done else 0
            row = bench_row(impl, B, D, dt, device, 0 if est_s > args.long_row_seconds else args.reps)
        row.update(ident)
        rows.append(row)
        print(fmt_row(row), flush=True)
    write_rows(Path(args.out), rows, meta)  # after every row: a killed run keeps what it measured
    from infcl_ds.ops import block
    from infcl_ds.ops.tuning import chosen_configs
    meta["tile_configs"] = chosen_configs()
    meta["addmm_out_dtype_fp32_accumulate"] = (block.addmm_takes_out_dtype(device, torch.bfloat16, torch.float32)
                                               if device.type == "cuda" else None)
    write_rows(Path(args.out), rows, meta)
    from .plot import plot_loss
    plot_loss(Path(args.out), Path(args.out).with_suffix(".png"))
    return rows


if __name__ == "__main__":
    main()
