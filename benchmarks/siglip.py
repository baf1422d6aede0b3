"""`infcl-ds bench loss --loss siglip` and `infcl-ds bench ring --loss siglip`: the tiled
sigmoid loss against open_clip's SigLipLoss, side by side in one run.

Each row is the forward plus backward (gradients to both feature tensors, the scale and the
bias) of the sigmoid loss, L2-normalised random features, s = 10, b = -10 (SigLIP's
initialisation). Rows: {impl, B, D, dtype, world, ms, eff_tflops, extra_mib, status,
device, ...}: ``eff_tflops`` = 6 B^2 D / time (one logits product and two gradient
products; per GPU for the ring: / W), ``extra_mib`` the peak allocated memory above the
inputs (the largest rank's for the ring), ``extra_mib_budget`` the target (12 D + 16) B
bytes + 64 MiB. Every shape runs once before it is timed (compilation, tile tuning, the
allocator); rows slower than --long-row-seconds are then timed once, others the median of
--reps. open_clip rows above --open-clip-max-batch are not run (B x B logits); an
out-of-memory row is recorded as such. Before anything is timed, both implementations are
checked against float64 on this device (errors in meta.checks).
"""
import argparse
import json
from pathlib import Path
from typing import Callable, Dict, List

import torch
import torch.nn.functional as F

from .common import free_port, is_oom, join_ranks, peak_mib_above_current, run_identity, synchronize, time_ms, write_rows

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SCALE, BIAS = 10.0, -10.0


def parse_sizes(text: str) -> List[int]:
    from .loss import parse_sizes as parse
    return parse(text)


def open_clip_loss(rank=0, world=1):
    from open_clip.loss import SigLipLoss
    fn = SigLipLoss(rank=rank, world_size=world)
    return lambda i, t, s, b: fn(i, t, s, b)


def infcl_ds_loss(rank=0, world=1):
    from infcl_ds.losses import sigmoid_loss
    return lambda i, t, s, b: sigmoid_loss(i, t, s, b, allow_tf32=True)  # fp32 rows: TF32, as benchmarked


IMPLS: Dict[str, Callable] = {"infcl_ds": infcl_ds_loss, "open_clip": open_clip_loss}


def reference_float64(image, text, scale, bias):
    logits = scale * image @ text.T + bias
    z = 2 * torch.eye(image.shape[0], device=image.device, dtype=logits.dtype) - 1
    return -F.logsigmoid(z * logits).sum() / image.shape[0]


def make_inputs(B, D, dtype, device, seed=0):
    g = torch.Generator(device=device).manual_seed(seed)
    image = F.normalize(torch.randn(B, D, device=device, generator=g), dim=1).to(dtype).requires_grad_()
    text = F.normalize(torch.randn(B, D, device=device, generator=g), dim=1).to(dtype).requires_grad_()
    scale = torch.tensor(SCALE, device=device, requires_grad=True)
    bias = torch.tensor(BIAS, device=device, requires_grad=True)
    return image, text, scale, bias


def clear_grads(tensors):
    for x in tensors:
        x.grad = None


def fwd_bwd(fn, tensors):
    clear_grads(tensors)
    fn(*tensors).backward()


def check_against_float64(device, impls, dtype_name) -> List[dict]:
    """Loss and all four gradients against float64 at small awkward sizes, on this device."""
    out = []
    for name in impls:
        for B, D in ((4097, 768), (1000, 1152), (1, 512)):
            tensors = make_inputs(B, D, DTYPES[dtype_name], device, seed=B + D)
            fwd_bwd(IMPLS[name](), tensors)
            ref = [x.detach().double().requires_grad_() for x in tensors]
            ref_loss = reference_float64(*ref)
            ref_loss.backward()
            with torch.no_grad():
                loss = IMPLS[name]()(*tensors).item()

            def err(x, r):
                return ((x.double() - r).norm() / r.norm().clamp_min(1e-30)).item()
            row = {"impl": name, "dtype": dtype_name, "B": B, "D": D,
                   "loss_rel_err": abs(loss - ref_loss.item()) / abs(ref_loss.item())}
            for key, x, r in zip(("image", "text", "scale", "bias"), tensors, ref):
                row[f"grad_{key}_rel_err"] = err(x.grad, r.grad)
            # bf16/fp16: G and the gradients are rounded to the input dtype (~2^-9 each).
            tol = 2e-2 if dtype_name != "fp32" else 5e-3
            row["ok"] = row["loss_rel_err"] < 1e-4 and all(row[k] <= tol for k in row if k.startswith("grad_"))
            out.append(row)
            print(f"check {name:9s} {dtype_name} B={B} D={D}: " + " ".join(
                f"{k}={v:.2e}" for k, v in row.items() if k.endswith("err")),
                  ("ok" if row["ok"] else "FAILED") if name == "infcl_ds" else "(for comparison)", flush=True)
    return out


def measure_shape(step, tensors, reps, long_row_seconds):
    """(ms, extra MiB): a warm-up run, then a run that measures the peak (and its time);
    shorter rows then take the median of ``reps`` more."""
    step()
    clear_grads(tensors)  # the warm-up's gradients are not part of the measured step
    box = {}
    peak = peak_mib_above_current(lambda: box.setdefault("ms", time_ms(step, 1)))
    ms = box["ms"] if "ms" in box else time_ms(step, 1)  # CPU: no peak measured
    if ms < long_row_seconds * 1e3 and reps > 1:
        ms = time_ms(step, reps)
    return ms, peak


def base_row(impl, B, D, dt, world, ident):
    return dict(impl=impl, B=B, D=D, dtype=dt, world=world, ms=None, eff_tflops=None, extra_mib=None,
                extra_mib_budget=((12 * D + 16) * B / world) / 2**20 + 64, status="", **ident)


def bench_row(impl, B, D, dt, device, args, ident) -> dict:
    row = base_row(impl, B, D, dt, 1, ident)
    tensors = None
    try:
        tensors = make_inputs(B, D, DTYPES[dt], device)
        fn = IMPLS[impl]()
        row["ms"], row["extra_mib"] = measure_shape(lambda: fwd_bwd(fn, tensors), tensors, args.reps,
                                                    args.long_row_seconds)
        row["eff_tflops"] = 6 * B * B * D / (row["ms"] * 1e-3) / 1e12
        row["status"] = "measured"
    except Exception as err:  # noqa: BLE001 - record what stopped the row and go on
        if not is_oom(err):
            raise
        row["status"] = "out of memory"
    finally:
        tensors = None
        synchronize()
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return row


def summarise(rows: List[dict]) -> dict:
    """The issue's targets, read off this run's rows."""
    ours = [r for r in rows if r["impl"] == "infcl_ds" and r["status"] == "measured"]
    theirs = [r for r in rows if r["impl"] == "open_clip" and r["status"] == "measured"]
    out = {"min_eff_tflops_B_ge_64k": min((r["eff_tflops"] for r in ours if r["B"] >= 65536), default=None),
           "all_within_memory_budget": all(r["extra_mib"] is None or r["extra_mib"] <= r["extra_mib_budget"]
                                           for r in ours)}
    speedups = {}
    for D in sorted({r["D"] for r in theirs}):
        top = max((r for r in theirs if r["D"] == D), key=lambda r: r["B"])
        mine = next((r for r in ours if r["D"] == D and r["B"] == top["B"]), None)
        if mine:
            speedups[f"D={D},B={top['B']}"] = top["ms"] / mine["ms"]
    out["speedup_vs_open_clip_at_its_largest_B"] = speedups
    return out


def main_loss(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench loss --loss siglip", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="siglip", choices=["siglip"])
    p.add_argument("--batch", default="16k,64k,256k,1m", help="global batch sizes (k = 1024, m = 1024^2)")
    p.add_argument("--dim", default="768,1152")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--impl", default="infcl_ds,open_clip")
    p.add_argument("--open-clip-max-batch", default="256k", help="larger open_clip rows are not run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--long-row-seconds", type=float, default=2.0, help="rows slower than this are timed once")
    p.add_argument("--out", default="docs/benchmarks/siglip.json")
    p.add_argument("--no-check", action="store_true")
    args = p.parse_args(argv)

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    impls = [x for x in args.impl.split(",") if x]
    ident = run_identity()
    meta = dict(ident, scale=SCALE, bias=BIAS, argv=argv)
    meta["checks"] = [] if args.no_check else check_against_float64(device, impls, args.dtype)
    if meta["checks"] and not all(c["ok"] for c in meta["checks"] if c["impl"] == "infcl_ds"):
        write_rows(Path(args.out), [], meta)
        raise SystemExit("infcl_ds failed its float64 check on this device: not timing anything")
    open_clip_max = parse_sizes(args.open_clip_max_batch)[0]
    rows: List[dict] = []
    for D in parse_sizes(args.dim):
        for B in parse_sizes(args.batch):
            for impl in impls:
                if impl == "open_clip" and B > open_clip_max:
                    row = base_row(impl, B, D, args.dtype, 1, ident)
                    row["status"] = "not run (B x B logits exceed the GPU)"
                else:
                    row = bench_row(impl, B, D, args.dtype, device, args, ident)
                rows.append(row)
                print(fmt(row), flush=True)
                write_rows(Path(args.out), rows, meta)  # after every row: a killed run keeps what it measured
    from infcl_ds.ops.tuning import chosen_configs
    meta["tile_configs"] = chosen_configs()
    meta["summary"] = summarise(rows)
    print("summary:", json.dumps(meta["summary"]), flush=True)
    write_rows(Path(args.out), rows, meta)
    plot(Path(args.out), Path(args.out).with_suffix(".png"))
    return rows


def fmt(row: dict) -> str:
    ms = "-" if row["ms"] is None else f"{row['ms']:10.2f}"
    rate = "-" if row["eff_tflops"] is None else f"{row['eff_tflops']:6.1f}"
    mem = "-" if row["extra_mib"] is None else f"{row['extra_mib']:8.0f}/{row['extra_mib_budget']:.0f}"
    return (f"{row['impl']:9s} W={row['world']} B={row['B']:>8d} D={row['D']:>5d} {row['dtype']} ms={ms} "
            f"eff_TFLOP/s={rate} extra_MiB/budget={mem} {row['status']}")


def plot(json_path: Path, png_path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = json.loads(Path(json_path).read_text())
    rows = [r for r in data["rows"] if r.get("ms")]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    colors = {"infcl_ds": "tab:blue", "open_clip": "tab:orange"}
    for k, D in enumerate(sorted({r["D"] for r in rows})):
        for impl, color in colors.items():
            pts = sorted((r for r in rows if r["impl"] == impl and r["D"] == D), key=lambda r: r["B"])
            if pts:
                style = ["-", "--", ":"][k % 3]
                axes[0].plot([r["B"] for r in pts], [r["eff_tflops"] for r in pts], style, color=color, marker="o",
                             label=f"{impl} D={D}")
                axes[1].plot([r["B"] for r in pts], [(r["extra_mib"] or 0) / 1024 for r in pts], style, color=color,
                             marker="o", label=f"{impl} D={D}")
    for ax, title in zip(axes, ("effective rate 6 B^2 D / time (TFLOP/s)", "peak memory above inputs (GiB)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("batch B")
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if ax.has_data():
            ax.legend(fontsize=8)
    if any(r.get("extra_mib") for r in rows):
        axes[1].set_yscale("log")
    device = data["meta"].get("device", "")
    fig.suptitle(f"sigmoid (SigLIP) loss, forward + backward, {rows[0]['dtype'] if rows else ''} on {device}")
    fig.tight_layout()
    fig.savefig(png_path, dpi=110)
    plt.close(fig)


# ---- the ring ------------------------------------------------------------------------------

def _ring_worker(rank, world, args, port, ident):
    import torch.distributed as torch_dist
    device, group_max = join_ranks(rank, world, port)
    meta = dict(ident, world=world, argv=args.argv, checks=_ring_check(rank, world, device, args.dtype))
    if rank == 0 and not all(c["ok"] for c in meta["checks"]):
        raise SystemExit("the sigmoid ring failed its float64 check: not timing anything")
    rows = []
    open_clip_max = parse_sizes(args.open_clip_max_batch)[0]
    for D in parse_sizes(args.dim):
        for B in parse_sizes(args.batch):
            for impl in args.impl.split(","):
                row = base_row(impl, B, D, args.dtype, world, ident)
                if impl == "open_clip" and B > open_clip_max:
                    row["status"] = "not run (local B x B logits exceed the GPU)"
                else:
                    tensors = None
                    try:
                        tensors = make_inputs(B // world, D, DTYPES[args.dtype], device, seed=rank)
                        fn = IMPLS[impl](rank, world)
                        ms, peak = measure_shape(lambda: fwd_bwd(fn, tensors), tensors, args.reps,
                                                 args.long_row_seconds)
                        row.update(ms=group_max(ms), extra_mib=group_max(peak) if device.type == "cuda" else None,
                                   status="measured")
                        row["eff_tflops"] = 6 * B * B * D / world / (row["ms"] * 1e-3) / 1e12
                    except Exception as err:  # noqa: BLE001
                        if not is_oom(err):
                            raise
                        row["status"] = "out of memory"
                    tensors = None
                    if device.type == "cuda":
                        torch.cuda.empty_cache()
                    torch_dist.barrier()
                rows.append(row)
                if rank == 0:
                    print(fmt(row), flush=True)
                    write_rows(Path(args.out), rows, meta)
    if rank == 0:
        plot(Path(args.out), Path(args.out).with_suffix(".png"))
    torch_dist.barrier()


def _ring_check(rank, world, device, dt):
    """The sigmoid ring against float64 of the gathered batch, before any timing."""
    import torch.distributed as torch_dist
    b, D = 1031, 768
    tensors = make_inputs(b, D, DTYPES[dt], device, seed=7 + rank)
    fwd_bwd(infcl_ds_loss(), tensors)
    image, text = tensors[0], tensors[1]
    gathered = [[torch.empty_like(x) for _ in range(world)] for x in (image, text, image.grad, text.grad)]
    for dst, x in zip(gathered, (image, text, image.grad, text.grad)):
        torch_dist.all_gather(dst, x.detach().contiguous())
    if rank != 0:
        return []
    ref = [torch.cat(gathered[0]), torch.cat(gathered[1]), tensors[2], tensors[3]]
    ref = [x.detach().double().requires_grad_() for x in ref]
    reference_float64(*ref).backward()
    err = lambda x, r: ((x.double() - r).norm() / r.norm()).item()  # noqa: E731
    row = {"dtype": dt, "B": b * world, "D": D, "grad_image_rel_err": err(torch.cat(gathered[2]), ref[0].grad),
           "grad_text_rel_err": err(torch.cat(gathered[3]), ref[1].grad),
           "grad_scale_rel_err": err(tensors[2].grad, ref[2].grad), "grad_bias_rel_err": err(tensors[3].grad, ref[3].grad)}
    row["ok"] = max(v for k, v in row.items() if k.endswith("err")) < (2e-2 if dt != "fp32" else 5e-3)
    print("check sigmoid ring", row, flush=True)
    return [row]


def main_ring(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench ring --loss siglip", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--loss", default="siglip", choices=["siglip"])
    p.add_argument("--world", type=int, default=0, help="ranks (default: all GPUs; 2 gloo ranks on CPU)")
    p.add_argument("--batch", default="64k,256k,1m")
    p.add_argument("--dim", default="768,1152")
    p.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    p.add_argument("--impl", default="infcl_ds,open_clip")
    p.add_argument("--open-clip-max-batch", default="256k", help="global batch; larger open_clip rows are not run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--long-row-seconds", type=float, default=2.0)
    p.add_argument("--out", default="docs/benchmarks/siglip_ring.json")
    args = p.parse_args(argv)
    args.argv = argv
    world = args.world or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    import torch.multiprocessing as mp
    mp.spawn(_ring_worker, args=(world, args, free_port(), run_identity()), nprocs=world, join=True)


def wants_siglip(argv) -> bool:
    """Whether a `bench loss` / `bench ring` command line asks for the sigmoid loss."""
    argv = list(argv or [])
    for k, tok in enumerate(argv):
        if tok == "--loss" and k + 1 < len(argv):
            return argv[k + 1] == "siglip"
        if tok.startswith("--loss="):
            return tok.split("=", 1)[1] == "siglip"
    return False

