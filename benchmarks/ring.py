"""`infcl-ds bench ring`: the ring across the GPUs of one host, side by side in one run with
inf-cl's ring (once per direction, as its training code calls it) and OpenCLIP's local-loss
+ gather-with-grad (full logits per rank, where it fits); plus this code on one GPU with
the same per-GPU work (global B / sqrt(W)) for the weak-scaling efficiency.

Rows: {impl, world, B, D, dtype, ms, peak_mib, tflops_eff_per_gpu, ...}; ms is the slowest
rank's median; peak_mib the largest per-rank peak above the inputs; the per-GPU effective
rate counts 8 B^2 D / W per GPU. inf-cl rows above --inf-cl-max-batch are extrapolated
(time ~ B^2) from its largest measured batch.
"""
import argparse
import sys
import math
from pathlib import Path

import torch

from .common import extrapolated, fmt_row, free_port, is_oom, join_ranks, measure, run_identity, write_rows
from .loss import DTYPES, full_logits_loss, make_inputs, parse_sizes


def _loss_fn(impl, rank, world):
    from infcl_ds import contrastive_loss
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
    import torch.distributed as torch_dist

    from infcl_ds import contrastive_loss
    out = []
    for dt in ("bf16", "fp32"):
        b, D = 2053, 768
        image, text, scale = make_inputs(b, D, DTYPES[dt], device, seed=7 + rank)
        contrastive_loss(image, text, scale, allow_tf32=True).backward()
        gathered = [[torch.empty_like(x) for _ in range(world)] for x in (image, text, image.grad, text.grad)]
        for dst, x in zip(gathered, (image, text, image.grad, text.grad)):
            torch_dist.all_gather(dst, x.detach().contiguous())
        if rank == 0:
            I, T = (torch.cat(g).double().requires_grad_() for g in gathered[:2])
            s = scale.detach().double().requires_grad_()
            full_logits_loss(I, T, s).backward()
            err = lambda x, r: ((x.double() - r).norm() / r.norm()).item()  # noqa: E731
            row = {"dtype": dt, "B": b * world, "D": D, "grad_image_rel_err": err(torch.cat(gathered[2]), I.grad),
                   "grad_text_rel_err": err(torch.cat(gathered[3]), T.grad), "grad_scale_rel_err": err(scale.grad, s.grad)}
            row["ok"] = max(v for k, v in row.items() if k.endswith("err")) < (2e-2 if dt == "bf16" else 5e-3)
            print("check ring", row, flush=True)
            out.append(row)
    return out


def _measure(fn, image, text, scale, reps, group_max):
    def step():
        image.grad = text.grad = scale.grad = None
        fn(image, text, scale).backward()
    ms, peak = measure(step, reps)
    return group_max(ms), group_max(peak)


def _worker(rank, world, args, port, ident):
    import torch.distributed as torch_dist
    device, group_max = join_ranks(rank, world, port)
    cuda = device.type == "cuda"
    meta = dict(ident, world=world, argv=args.argv, checks=_check(rank, world, device))
    if rank == 0 and not all(c["ok"] for c in meta["checks"]):
        raise SystemExit("the ring failed its float64 check: not timing anything")
    rows = []
    inf_cl_max = parse_sizes(args.inf_cl_max_batch)[0]
    for D in parse_sizes(args.dim):
        for B in parse_sizes(args.batch):
            for impl in args.impl.split(","):
                row = {"impl": impl, "world": world, "B": B, "D": D, "dtype": args.dtype, "ms": None,
                       "peak_mib": None, "tflops_eff_per_gpu": None}
                per_gpu = 8 * B * B * D / world
                if impl == "inf_cl" and B > inf_cl_max:
                    row.update(extrapolated(rows, B, "tflops_eff_per_gpu", impl=impl, D=D) or {"status": "not run"})
                else:
                    done = [r for r in rows if r["impl"] == impl and r.get("tflops_eff_per_gpu")]
                    est = per_gpu / (min(r["tflops_eff_per_gpu"] for r in done) * 1e12) if done else 0
                    try:
                        image, text, scale = make_inputs(B // world, D, DTYPES[args.dtype], device, seed=rank)
                        ms, peak = _measure(_loss_fn(impl, rank, world), image, text, scale,
                                            0 if est > args.long_row_seconds else args.reps, group_max)
                        row.update(ms=ms, peak_mib=peak if cuda else None, status="measured",
                                   tflops_eff_per_gpu=per_gpu / (ms * 1e-3) / 1e12)
                    except Exception as err:  # noqa: BLE001
                        if not is_oom(err):
                            raise
                        row["status"] = "out of memory"
                    image = text = scale = None
                    if cuda:
                        torch.cuda.empty_cache()
                    torch_dist.barrier()
                row.update(ident)
                rows.append(row)
                if rank == 0:
                    print(fmt_row(dict(row, tflops_eff=row["tflops_eff_per_gpu"])), flush=True)
                    write_rows(Path(args.out), rows, meta)
    # The same per-GPU work on one GPU: global B / sqrt(W), for the weak-scaling efficiency.
    # A group of one rank gives the single-device loss (new_group is collective: all ranks).
    solo = [torch_dist.new_group([r]) for r in range(world)][rank]
    torch_dist.barrier()
    if rank == 0 and args.single:
        from infcl_ds import contrastive_loss
        ring_rows = [r for r in rows if r["impl"] == "infcl_ds" and r.get("status") == "measured"]
        for r in ring_rows:
            b1 = int(r["B"] / math.sqrt(world)) // 256 * 256
            image, text, scale = make_inputs(b1, r["D"], DTYPES[args.dtype], device, seed=3)
            est = 8 * b1 * b1 * r["D"] / (r["tflops_eff_per_gpu"] * 1e12)
            ms, peak = _measure(lambda i, t, s: contrastive_loss(i, t, s, group=solo, allow_tf32=True), image, text, scale,
                                0 if est > args.long_row_seconds else args.reps, lambda x: x)
            one = dict(impl="infcl_ds_1gpu", world=1, B=b1, D=r["D"], dtype=args.dtype, ms=ms,
                       peak_mib=peak, tflops_eff_per_gpu=8 * b1 * b1 * r["D"] / (ms * 1e-3) / 1e12,
                       status="measured", same_work_as_B=r["B"], **ident)
            r["weak_scaling_efficiency"] = r["tflops_eff_per_gpu"] / one["tflops_eff_per_gpu"]
            rows.append(one)
            print(fmt_row(dict(one, tflops_eff=one["tflops_eff_per_gpu"])),
                  f"-> ring efficiency at B={r['B']} D={r['D']}: {r['weak_scaling_efficiency']:.3f}", flush=True)
            write_rows(Path(args.out), rows, meta)
            image = text = scale = None
            torch.cuda.empty_cache() if cuda else None
    if rank == 0:
        from .plot import plot_ring
        plot_ring(Path(args.out), Path(args.out).with_suffix(".png"))
    torch_dist.barrier()


def main(argv=None):
    from . import siglip
    if siglip.wants_siglip(sys.argv[1:] if argv is None else argv):
        return siglip.main_ring(argv)
    p = argparse.ArgumentParser(prog="infcl-ds bench ring", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--world", type=int, default=0, help="ranks (default: all GPUs; 2 gloo ranks on CPU)")
    p.add_argument("--batch", default="64k,256k,1m,2m", help="global batch sizes")
    p.add_argument("--dim", default="512,768")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--impl", default="infcl_ds,inf_cl,open_clip")
    p.add_argument("--inf-cl-max-batch", default="512k")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--long-row-seconds", type=float, default=5.0)
    p.add_argument("--no-single", dest="single", action="store_false", help="skip the 1-GPU same-work rows")
    p.add_argument("--out", default="docs/benchmarks/ring.json")
    p.add_argument("--loss", default="clip", choices=["clip", "siglip"],
                   help="siglip: the sigmoid loss against open_clip's SigLipLoss (benchmarks/siglip.py)")
    args = p.parse_args(argv)
    args.argv = argv
    world = args.world or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    if "inf_cl" in args.impl and not torch.cuda.is_available():
        args.impl = ",".join(x for x in args.impl.split(",") if x != "inf_cl")  # a GPU-only package
    import torch.multiprocessing as mp
    mp.spawn(_worker, args=(world, args, free_port(), run_identity()), nprocs=world, join=True)


if __name__ == "__main__":
    main()
