"""What the loss benchmarks share (clip.py, clip_ring.py, siglip.py, siglip_ring.py): their
inputs, the step they time, how a row is timed and its memory measured, the float64 self-check,
and the one row schema.

A row: {impl, B, D, dtype, world, ms, peak_mib, tflops_eff, flops_per_B2D, status, device, ...}.
``ms`` is the median of CUDA-event timings after a warm-up (the slowest rank's over a ring);
``peak_mib`` the peak allocated memory above the inputs, their gradients included (the largest
rank's; GPU only); ``tflops_eff`` = flops_per_B2D x B^2 D / W / time, per GPU, where
``flops_per_B2D`` is the loss's useful work: 8 for the CLIP loss (2 B^2 D for the forward's
statistics, 6 for the backward), 6 for the sigmoid loss (one logits product and two gradient
products). Files written before this schema use other names for some fields (OLD_NAMES).
"""
import math
import statistics
import time
from pathlib import Path
from typing import Callable, List, Optional, Sequence, Tuple

import torch
import torch.nn.functional as F

from .common import is_oom, write_rows
from tests.reference import rel_err

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
GRAD_NAMES = ("image", "text", "scale", "bias")

# Field names of rows written before the one schema: the sigmoid loss's files (siglip.json,
# siglip_ring.json) and the CLIP ring's (ring.json).
OLD_NAMES = {"eff_tflops": "tflops_eff", "tflops_eff_per_gpu": "tflops_eff", "extra_mib": "peak_mib",
             "extra_mib_budget": "peak_mib_budget"}


def as_current(row: dict) -> dict:
    """A row of any benchmark file with this schema's field names."""
    return {OLD_NAMES.get(key, key): value for key, value in row.items()}


def random_inputs(B: int, D: int, dtype: str, device, seed: int, *scalars: float) -> Tuple[torch.Tensor, ...]:
    """L2-normalised random image and text features [B, D] in ``dtype`` and the loss's scalars
    (scale, bias), all requiring gradients."""
    g = torch.Generator(device=device).manual_seed(seed)
    image = F.normalize(torch.randn(B, D, device=device, generator=g), dim=1).to(DTYPES[dtype]).requires_grad_()
    text = F.normalize(torch.randn(B, D, device=device, generator=g), dim=1).to(DTYPES[dtype]).requires_grad_()
    return (image, text, *(torch.tensor(value, device=device, requires_grad=True) for value in scalars))


def drop_grads(inputs: Sequence[torch.Tensor]) -> None:
    for x in inputs:
        x.grad = None


def fwd_bwd(loss_fn: Callable, inputs: Sequence[torch.Tensor]) -> torch.Tensor:
    """The timed step: forward and backward of ``loss_fn`` on ``inputs``, the previous step's
    gradients dropped first. Returns the loss, detached."""
    drop_grads(inputs)
    loss = loss_fn(*inputs)
    loss.backward()
    return loss.detach()


def synchronize() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def time_ms(fn: Callable[[], object], reps: int) -> float:
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


def timed_peak(fn: Callable[[], object]) -> Tuple[float, Optional[float]]:
    """(ms, peak MiB allocated during ``fn`` above what was allocated before it) of one call;
    no peak off the GPU."""
    if not torch.cuda.is_available():
        return time_ms(fn, 1), None
    synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    ms = time_ms(fn, 1)
    return ms, (torch.cuda.max_memory_allocated() - base) / 2**20


def measure(loss_fn: Callable, inputs: Sequence[torch.Tensor], reps: int, warm_up: bool = True,
            long_row_ms: float = math.inf) -> Tuple[float, Optional[float]]:
    """(ms, peak MiB above the inputs) of the step: a warm-up run first (compilation, tile tuning
    and the allocator stay out of the figures; a row of many seconds whose kernels were compiled
    and tuned at a smaller size may skip it), its gradients dropped so that the peak is above the
    inputs alone; then one run gives the peak and a time, and a row faster than ``long_row_ms``
    takes the median of ``reps`` more."""
    def step():
        fwd_bwd(loss_fn, inputs)
    if warm_up:
        step()
        drop_grads(inputs)
    ms, peak = timed_peak(step)
    if reps > 1 and ms < long_row_ms:
        ms = time_ms(step, reps)
    return ms, peak


def loss_row(impl: str, B: int, D: int, dtype: str, world: int, flops_per_B2D: int, **fields) -> dict:
    """A row of the schema above, not measured yet."""
    return dict(impl=impl, B=B, D=D, dtype=dtype, world=world, ms=None, peak_mib=None, tflops_eff=None,
                flops_per_B2D=flops_per_B2D, status="", **fields)


def work_per_gpu(row: dict) -> float:
    """The row's effective FLOPs per GPU."""
    return row["flops_per_B2D"] * row["B"] * row["B"] * row["D"] / row["world"]


def record(row: dict, ms: float, peak_mib: Optional[float]) -> dict:
    row.update(ms=ms, peak_mib=peak_mib, status="measured", tflops_eff=work_per_gpu(row) / (ms * 1e-3) / 1e12)
    return row


def estimated_s(rows: List[dict], row: dict) -> float:
    """The row's seconds at the slowest rate its impl has had in this run at its D and dtype (0
    before any: the first row of a shape class is the one its kernels are compiled and tuned on)."""
    rates = [r["tflops_eff"] for r in rows
             if all(r[k] == row[k] for k in ("impl", "D", "dtype")) and r.get("tflops_eff")]
    return work_per_gpu(row) / (min(rates) * 1e12) if rates else 0.0


UNWARMED_ROW_SECONDS = 30.0


def timing(seconds: float, reps: int, long_row_seconds: float,
           unwarmed_row_seconds: float = UNWARMED_ROW_SECONDS) -> dict:
    """``measure``'s policy for a row expected to take ``seconds`` (0: nothing of its shape class
    measured yet, estimated_s): past ``long_row_seconds`` one timed run after the warm-up, past
    ``unwarmed_row_seconds`` one without it. A first call costs more than compilation and
    tuning, which an earlier row of the class has done: the sigmoid loss's first sliced G tile
    (512k rows at D = 768 on an H200) took 1.8 s more than the next, so only a row that dwarfs
    that goes unwarmed."""
    if seconds > unwarmed_row_seconds:
        return {"reps": 1, "warm_up": False}
    return {"reps": 1 if seconds > long_row_seconds else reps, "warm_up": True}


def run_row(row: dict, loss_fn: Callable, make_inputs: Callable[[], Sequence[torch.Tensor]],
            group_max: Optional[Callable[[float], float]] = None, profile: bool = False, **how) -> dict:
    """Measure ``row`` (``measure(**how)``) on ``make_inputs()``; out of memory is the row's
    status. Over a ring, ``group_max`` gives the slowest rank's time and the largest peak.
    ``profile`` (on a GPU): one more step under torch.profiler, its kernels by kind and name in
    ``row["profile"]`` (benchmarks/profile.py), after the timed ones."""
    inputs = None
    try:
        inputs = make_inputs()
        ms, peak = measure(loss_fn, inputs, **how)
        if group_max is not None:
            ms, peak = group_max(ms), None if peak is None else group_max(peak)
        record(row, ms, peak)
        if profile and torch.cuda.is_available():
            from .profile import format_table, profile_step
            row["profile"] = profile_step(lambda: fwd_bwd(loss_fn, inputs))
            print(format_table(row["profile"]), flush=True)
    except Exception as err:  # noqa: BLE001 - record what stopped the row and go on
        if not is_oom(err):
            raise
        row["status"] = "out of memory"
    finally:
        inputs = None
        synchronize()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return row


def extrapolated(rows: List[dict], B: int, **match) -> Optional[dict]:
    """Fields of a row at batch B extrapolated from the largest measured row matching
    ``match``: time ~ B^2 at a flat rate, memory ~ B. None if nothing was measured."""
    base = max((r for r in rows if r.get("status") == "measured" and all(r[k] == v for k, v in match.items())),
               key=lambda r: r["B"], default=None)
    if base is None:
        return None
    f = B / base["B"]
    return {"ms": base["ms"] * f * f, "peak_mib": base["peak_mib"] * f if base["peak_mib"] else None,
            "tflops_eff": base["tflops_eff"], "status": "extrapolated", "extrapolated_from_B": base["B"]}


def fmt_row(row: dict) -> str:
    ms = "-" if row.get("ms") is None else f"{row['ms']:10.1f}"
    peak = "-" if row.get("peak_mib") is None else f"{row['peak_mib']:9.0f}"
    if row.get("peak_mib_budget") is not None:
        peak += f"/{row['peak_mib_budget']:.0f}"
    rate = "-" if row.get("tflops_eff") is None else f"{row['tflops_eff']:7.1f}"
    return (f"{row['impl']:13s} W={row['world']} B={row['B']:>8d} D={row['D']:>5d} {row['dtype']:5s} ms={ms} "
            f"peak_mib={peak} TFLOP/s/GPU={rate} {row.get('status', '')}")


def add_row(rows: List[dict], row: dict, out: str, meta: dict, rank: int = 0, note: str = "") -> None:
    """Keep ``row``; rank 0 prints it and rewrites ``out`` after every row, so that a killed run
    keeps what it measured."""
    rows.append(row)
    if rank == 0:
        print(fmt_row(row), note, flush=True)
        write_rows(Path(out), rows, meta)


def same_work_rows(rows: List[dict], measure_one: Callable[[dict], dict], out: str, meta: dict,
                   key: str = "efficiency") -> None:
    """Beside each measured ring row of this code, ``measure_one(ring_row)``: this code on one
    GPU at the ring row's work per GPU (global B / sqrt(W) samples), measured; the ring row
    gets ``key``, its weak-scaling efficiency (rate per GPU over the one GPU's rate)."""
    for ring_row in [r for r in rows if r["impl"] == "infcl_ds" and r.get("status") == "measured"]:
        one = measure_one(ring_row)
        note = ""
        if one["status"] == "measured":
            ring_row[key] = ring_row["tflops_eff"] / one["tflops_eff"]
            note = f"-> ring efficiency at B={ring_row['B']} D={ring_row['D']}: {ring_row[key]:.3f}"
        add_row(rows, one, out, meta, note=note)


# -- the float64 self-check --------------------------------------------------------------------

def tolerance(dtype: str) -> float:
    """Relative gradient error a dtype passes with: bf16/fp16 round G and the gradients to the
    input dtype (~2^-9 each); fp32 runs with TF32 products."""
    return 5e-3 if dtype == "fp32" else 2e-2


def compare_with_float64(dtype: str, reference: Callable, inputs: Sequence[torch.Tensor],
                         grads: Sequence[torch.Tensor], loss: Optional[torch.Tensor] = None,
                         loss_rel_tol: Optional[float] = None) -> dict:
    """Errors of the gradients to ``inputs`` (image, text, scale[, bias]) and of the loss, if
    given, against ``reference`` in float64 on the same rounded inputs; ``ok``: every gradient
    within the dtype's tolerance where its reference is not zero (the CLIP loss of a batch of one
    is constant), and the loss within ``loss_rel_tol`` if given."""
    ref_loss, *ref_grads = reference(*inputs)
    row = {}
    if loss is not None:
        row["loss_abs_err"] = abs(loss.item() - ref_loss.item())
        if ref_loss.item() != 0:  # the CLIP loss of a batch of one is zero: its absolute error alone
            row["loss_rel_err"] = row["loss_abs_err"] / abs(ref_loss.item())
    judged = []
    for name, grad, ref in zip(GRAD_NAMES, grads, ref_grads):
        row[f"grad_{name}_rel_err"] = rel_err(grad, ref)
        if ref.abs().max() > 0:
            judged.append(row[f"grad_{name}_rel_err"])
    row["ok"] = (all(err <= tolerance(dtype) for err in judged)
                 and (loss_rel_tol is None or row.get("loss_rel_err", row.get("loss_abs_err")) < loss_rel_tol))
    return row


def self_check(impl: str, loss_fn: Callable, inputs: Sequence[torch.Tensor], dtype: str, reference: Callable,
               loss_rel_tol: Optional[float] = None) -> dict:
    """One device's check row of ``impl`` on ``inputs`` (printed)."""
    loss = fwd_bwd(loss_fn, inputs)
    B, D = inputs[0].shape
    row = {"impl": impl, "dtype": dtype, "B": B, "D": D,
           **compare_with_float64(dtype, reference, inputs, [x.grad for x in inputs], loss, loss_rel_tol)}
    print(f"check {impl:11s} {dtype} B={B} D={D}: "
          + " ".join(f"{k}={v:.2e}" for k, v in row.items() if k.endswith("err")),
          "ok" if row["ok"] else "FAILED" if impl == "infcl_ds" else "outside the tolerance (for comparison)",
          flush=True)
    return row


def ring_check(loss_fn: Callable, inputs: Sequence[torch.Tensor], dtype: str, reference: Callable, rank: int,
               world: int) -> List[dict]:
    """The ring's gradients against float64 of the gathered batch: the features and their
    gradients gathered from every rank, the scalars' (the same on every rank) from rank 0.
    One row on rank 0 (printed), none on the others."""
    import torch.distributed as torch_dist
    fwd_bwd(loss_fn, inputs)
    image, text, *scalars = inputs
    local = (image, text, image.grad, text.grad)
    gathered = [[torch.empty_like(x) for _ in range(world)] for x in local]
    for dst, x in zip(gathered, local):
        torch_dist.all_gather(dst, x.detach().contiguous())
    if rank != 0:
        return []
    full_image, full_text, grad_image, grad_text = (torch.cat(g) for g in gathered)
    row = {"dtype": dtype, "B": full_image.shape[0], "D": full_image.shape[1],
           **compare_with_float64(dtype, reference, [full_image, full_text, *scalars],
                                  [grad_image, grad_text, *(s.grad for s in scalars)])}
    print("check ring", row, flush=True)
    return [row]


def require_passed(checks: List[dict], what: str) -> None:
    """Refuse to time anything when this code failed its check (other impls are listed for
    comparison only)."""
    if not all(c["ok"] for c in checks if c.get("impl", "infcl_ds") == "infcl_ds"):
        raise SystemExit(f"{what} failed its float64 check on this device: not timing anything")


def by_loss(argv, **mains: Callable):
    """Run the benchmark of the loss that ``--loss`` names (the first of ``mains`` by default)
    on the whole command line; each benchmark's own parser lists and accepts ``--loss``."""
    import argparse
    pick = argparse.ArgumentParser(add_help=False)
    pick.add_argument("--loss", choices=list(mains), default=next(iter(mains)),
                      help="which loss's benchmark runs (its own --help lists its options)")
    chosen, _ = pick.parse_known_args(argv)
    return mains[chosen.loss](argv)
