"""`infcl-ds bench train`: whole engine steps of an open_clip model (ViT-B-16 at 224 px by
default) across this host's GPUs, with this project's loss, inf-cl's, or OpenCLIP's
local-loss + gather (full logits per rank, where it fits) swapped into the same engine; or
OpenCLIP's own trainer, open_clip_train, run as a subprocess on the same GPUs and model
(`--impl open_clip_train`, eager and/or `--torchcompile`: open_clip_train.py).

Per row: step time, samples/s, time and peak memory per phase (encode without grad, loss,
re-encode with grad, optimizer step), the loss+ring share of the step, the planner's
prediction where available. Inputs are uint8 images and token ids in pinned host memory,
moved to the GPU one chunk at a time as in training; a pool of distinct samples is cycled,
so host memory stays bounded at any batch (the per-chunk transfer is what is measured).
The slope of peak memory against the local batch is written to the JSON's meta.

Each impl is best run as its own command under 10 minutes; ``--append`` merges rows into
the JSON of an earlier command of the same commit and device (a row of the same impl, model,
batch, world, compile and ZeRO stage is replaced). Every row's figures are the mean of
``--steps`` steps after an untimed one of the same shapes (its time: ``first_step_s``).
"""
import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch

from infcl_ds.config.recipe import DataSection
from infcl_ds.training.build import build_engine
from infcl_ds.training.distributed import leave_distributed
from infcl_ds.training.resolve import agree_on_chunk, resolve_recipe
from .common import free_port, is_oom, join_ranks, parse_sizes, run_identity, write_rows


class CyclingHostBatch:
    """A local batch of ``n`` samples drawn cyclically from a pinned host pool (chunk API)."""

    def __init__(self, n, pool_images, pool_texts):
        from infcl_ds.data import HostBatch
        self.n, self.pool = n, HostBatch(pool_images, pool_texts)

    def __len__(self):
        return self.n

    def chunk(self, lo, hi, device, dtype):
        start = lo % len(self.pool)
        return self.pool.chunk(start, start + (hi - lo), device, dtype)


def _loss_fn(impl, rank, world):
    from infcl_ds.loss import contrastive_loss
    if impl == "infcl_ds":
        return contrastive_loss
    if impl == "inf_cl":  # as its training code calls it: once per direction, over the world
        from inf_cl import cal_inf_loss
        # inf-cl computes in fp32 only: the bf16 features are cast, as its users must.
        return lambda i, t, s, group: (cal_inf_loss(s * i.float(), t.float()) + cal_inf_loss(s * t.float(), i.float())) / 2
    if impl == "open_clip":
        from open_clip.loss import ClipLoss
        fn = ClipLoss(local_loss=True, gather_with_grad=True, rank=rank, world_size=world)
        return lambda i, t, s, group: fn(i, t, s.to(i.dtype))
    raise ValueError(f"unknown impl {impl!r}")


def _engine(args, impl, rank, world, device):
    """The trainer's built engine (training/build.py) for this configuration, `impl`'s loss swapped in;
    --chunk auto resolved as the trainer resolves `batch.chunk: auto` (args.chunk set to it)."""
    recipe = _recipe(args, world, args_batch=parse_sizes(args.batch)[0])
    resolution = agree_on_chunk(recipe, resolve_recipe(recipe, world, device, rank), world, device, rank)
    engine = build_engine(resolution.recipe, world, device, loss_fn=_loss_fn(impl, rank, world), time_phases=True)
    args.chunk = engine.settings.chunk_size
    return engine


def _recipe(args, world, args_batch, data="synthetic", decoder=None):
    from infcl_ds.config import load_recipe
    # Synthetic: the pool is held decoded, so the plan has no decoding to wait for. JPEG: the
    # trainer's encoded host batches from the shards, decoded by the recipe's pool.
    inputs = (["data.host_batch=decoded"] if data == "synthetic" else
              ["data.source=webdataset", f"data.train={args.shards}", "data.host_batch=encoded",
               f"data.decode_workers={args.decode_workers}", f"data.decoder={decoder or args.decoder.split(',')[0]}",
               f"data.workers={args.read_workers}", f"data.keep_decoded_gib={args.keep_decoded_gib}",
               f"data.decode_window_gib={args.decode_window_gib}",
               f"data.keep_decoded_host_gib={args.keep_decoded_host_gib}"])
    return load_recipe(None, [f"model.name={args.model}", f"batch.global={args_batch}", f"batch.chunk={args.chunk}",
                              f"zero.stage={args.zero}", "precision.dtype=bf16",
                              f"model.grad_checkpointing={str(args.grad_checkpointing).lower()}",
                              f"batch.offload_features={str(args.offload_features).lower()}",
                              *inputs, f"model.compile={str(args.compile).lower()}", *args.set])


def _prediction(args, B, world, data="synthetic", decoder=None):
    """The planner's per-GPU peak for this configuration, with its runtime reserve and
    without (what torch allocates), and its step time; {} if it cannot say."""
    from infcl_ds.plan import make_plan
    total = torch.cuda.mem_get_info()[1] if torch.cuda.is_available() else 80 * 2**30
    try:
        plan = make_plan(_recipe(args, world, B, data, decoder), world, total, gpus_per_node=world)
    except ValueError as err:  # PlanError: e.g. no rates for this model
        print(f"planner: {err}", flush=True)
        return {}
    return {"plan_peak_mib": plan.peak_gpu_bytes / 2**20, "plan_allocated_mib": plan.allocated_peak_bytes / 2**20,
            "plan_step_s": plan.step_seconds}


def _pool(args, info, device):
    size = info["image_size"]
    n = max(args.chunk, args.pool // args.chunk * args.chunk)
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=g)
    texts = torch.randint(1, 49407, (n, info["context_length"]), generator=g)
    if device.type == "cuda":
        images, texts = images.pin_memory(), texts.pin_memory()
    return images, texts


def _timed_steps(engine, next_batch, steps, device):
    """`steps` + 1 steps, each on `next_batch()`; the first (compilation, tile tuning, allocator
    growth at this shape) is untimed for the figures. Returns (first step's seconds, the timed
    ones', last loss, the seconds each timed step waited for decoded pixels)."""
    times, waits = [], []
    for i in range(steps + 1):
        batch = next_batch()
        if device.type == "cuda":
            torch.cuda.synchronize()
            if i == 1:  # the phases' peaks of the steady steps, not the first's
                torch.cuda.reset_peak_memory_stats()
        start = time.perf_counter()
        loss = engine.train_step(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
        waits.append(getattr(batch, "decode_wait_s", 0.0))
        print(f"  step {i + 1}/{steps + 1} of {len(batch)} samples: {times[-1]:.2f} s"
              + (f", waited {waits[-1]:.2f} s for decoding" if waits[-1] else "")
              + (" (untimed)" if i == 0 else ""), flush=True)
        del batch  # as the trainer: the next one is assembled meanwhile, a third is never held
    return times[0], times[1:], float(loss), waits[1:]


class _JpegBatches:
    """This rank's local batches from JPEG shards, as the trainer builds them (encoded host
    batches, the decode pool, keep_decoded_gib resolved for this GPU)."""

    def __init__(self, args, B, world, rank, info, device, decoder):
        from open_clip import get_tokenizer
        from infcl_ds.data import build_train_data
        resolution = resolve_recipe(_recipe(args, world, B, "jpeg", decoder), world, device, rank)
        recipe = resolution.recipe
        self.keep_decoded_gib, self.gpu_decode_share = recipe.data.keep_decoded_gib, recipe.data.gpu_decode_share
        # what the rank's plan made of the `auto` values (the decoder and why, the decode processes)
        self.resolved = {"decoder_resolved": recipe.data.decoder, "decode_workers": recipe.data.decode_workers,
                         "gpu_jpeg_library": recipe.data.gpu_jpeg_library, "auto_line": resolution.line()}
        self.data = build_train_data(recipe.data, rank=rank, world_size=world, local_batch=B // world,
                                     seed=0, image_size=info["image_size"], tokenizer=get_tokenizer(args.model),
                                     mean=info["mean"], std=info["std"])
        self._batches = self._forever()

    def _forever(self):
        while True:  # epoch after epoch, as the trainer reads them
            yield from self.data
            self.data.set_epoch(self.data.epoch + 1)

    def next(self):
        return next(self._batches)

    def close(self):
        self._batches.close()
        self.data.close()


def _profiled_step(engine, batch, rank):
    """One step under the profiler; a failure (out of memory under the profiler's own
    buffers) is recorded in the row, not put in place of the measured figures."""
    from .profile import format_table, profile_step
    try:
        table = profile_step(lambda: engine.train_step(batch))
    except Exception as err:  # noqa: BLE001
        if not is_oom(err):
            raise
        return {"error": f"out of memory under the profiler: {err}"[:300]}
    if rank == 0:
        print(format_table(table), flush=True)
    return table


# bf16 keeps 8 bits: a chunk's features or gradients computed in another order differ by ~1e-2 of
# their largest value (measured 1.3e-2 to 2.5e-2); a wrong kernel or a wrong function is far beyond.
COMPILE_CHECK_TOL = 5e-2


def compiled_gradient_check(model_name, pool, n, device, gelu_epilogue):
    """The engine's compiled towers (fast forwards, engine/towers.py, then compiled) against
    open_clip's own eager ones on one chunk of `n` pool samples, bf16 on `device`: the largest
    difference of the features with grad (the re-encode pass), of the features without (the
    encode pass, which the loss sees) and of the parameter gradients, each relative to the eager
    tensor's largest magnitude; `within_bf16_noise`: all three within COMPILE_CHECK_TOL.
    `gelu_epilogue`: the engine's setting (EngineSettings.gelu_epilogue)."""
    import copy
    from infcl_ds.engine.compile import compile_encoders
    from infcl_ds.engine.towers import fast_tower_modules
    from infcl_ds.models import create_model, model_info
    torch.manual_seed(0)
    eager = create_model(model_name).to(device=device, dtype=torch.bfloat16)
    compiled = copy.deepcopy(eager)
    fast_tower_modules(compiled, mlp_epilogue=gelu_epilogue)  # as the engine's (model.gelu_epilogue)
    compile_encoders(compiled)
    mean = torch.tensor(model_info(eager)["mean"], device=device).view(1, 3, 1, 1)
    std = torch.tensor(model_info(eager)["std"], device=device).view(1, 3, 1, 1)
    images = ((pool[0][:n].to(device).float() / 255 - mean) / std).to(torch.bfloat16)
    texts = pool[1][:n].to(device)
    out, encoded = {}, {}
    for name, model in (("eager", eager), ("compiled", compiled)):
        with torch.no_grad():  # the engine's encode pass: the features the loss sees
            encoded[name] = torch.cat([model.encode_image(images, normalize=True),
                                       model.encode_text(texts, normalize=True)]).float()
        image_f, text_f = model.encode_image(images, normalize=True), model.encode_text(texts, normalize=True)
        g = torch.Generator(device=device).manual_seed(1)
        weights = torch.randn(image_f.shape, device=device, generator=g, dtype=image_f.dtype)
        ((image_f * weights).sum() + (text_f * weights).sum()).float().backward()
        out[name] = (torch.cat([image_f.detach().float(), text_f.detach().float()]),
                     {k: p.grad.float() for k, p in model.named_parameters() if p.grad is not None})
    (fe, ge), (fc, gc) = out["eager"], out["compiled"]
    rel = lambda a, b: float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))  # noqa: E731
    # nn.Module.compile compiles in place: both models name their parameters alike.
    worst = max(ge, key=lambda k: rel(gc[k], ge[k]))
    check = {"samples": n, "features_rel_diff": rel(fc, fe),
             "nograd_features_rel_diff": rel(encoded["compiled"], encoded["eager"]),
             "gradient_rel_diff": rel(gc[worst], ge[worst]), "worst_parameter": worst}
    return dict(check, within_bf16_noise=max(check[k] for k in check if k.endswith("_rel_diff")) <= COMPILE_CHECK_TOL)


def _worker(rank, world, args, port, ident):
    device, group_max = join_ranks(rank, world, port)
    cuda = device.type == "cuda"
    from infcl_ds.models import model_info
    out = Path(args.out)
    rows, meta = [], dict(ident, world=world, argv=args.argv, model=args.model, chunk=args.chunk, zero=args.zero)
    if args.append and out.is_file():
        old = json.loads(out.read_text())
        rows = old["rows"]  # a row of this run replaces its configuration's earlier one (row_key)
        meta = {**old["meta"], **{k: v for k, v in meta.items() if k != "argv"}}
    for impl in args.impl.split(","):
        engine = _engine(args, impl, rank, world, device)
        meta["chunk"] = args.chunk  # --chunk auto: the chunk chosen
        info = model_info(engine.model)
        pool = _pool(args, info, device)
        check = (compiled_gradient_check(args.model, pool, min(args.chunk, 64), device,
                                         engine.settings.gelu_epilogue)
                 if args.compile and cuda and impl == "infcl_ds" else None)
        if check and rank == 0:
            print(f"compiled vs eager (bf16, {check['samples']} samples): features {check['features_rel_diff']:.2e} "
                  f"(no grad {check['nograd_features_rel_diff']:.2e}), "
                  f"gradients {check['gradient_rel_diff']:.2e} ({check['worst_parameter']}): "
                  f"{'within' if check['within_bf16_noise'] else 'BEYOND'} bf16 noise ({COMPILE_CHECK_TOL})", flush=True)
        # JPEG data once per decoder (--decoder pil,nvjpeg,hybrid), with the model compiled once.
        cases = [(data, decoder) for data in args.data.split(",")
                 for decoder in (args.decoder.split(",") if data == "jpeg" else [None])]
        for B, (data, decoder) in ((B, case) for B in parse_sizes(args.batch) for case in cases):
            local = B // world
            row = {"impl": impl, "world": world, "model": args.model, "B": B, "local": local, "chunk": args.chunk,
                   "D": info["embed_dim"], "dtype": "bf16", "zero": args.zero, "compile": args.compile,
                   "data": data, "status": "measured", **({"compile_check": check} if check else {}),
                   **({"set": args.set} if args.set else {})}
            if impl == "open_clip" and B > parse_sizes(args.open_clip_max_batch)[0]:
                # Its B/W x B logits per rank: 64 GiB in bf16 at 256k on 2 GPUs, before softmax.
                row.update(ident, status="not run: full logits exceed GPU memory")
                rows.append(row)
                continue
            try:
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.reset_peak_memory_stats()
                if data == "jpeg":
                    batches = _JpegBatches(args, B, world, rank, info, device, decoder)
                    try:
                        first, timed, loss, waits = _timed_steps(engine, batches.next, args.steps, device)
                    finally:
                        batches.close()
                    wait = group_max(sum(waits) / len(waits))
                    row.update(decoder=decoder, **batches.resolved,
                               keep_decoded_gib=batches.keep_decoded_gib, gpu_decode_share=batches.gpu_decode_share,
                               decode_wait_s=wait,
                               decode_wait_share=wait / group_max(sum(timed) / len(timed)))
                else:
                    batch = CyclingHostBatch(local, *pool)
                    first, timed, loss, _ = _timed_steps(engine, lambda: batch, args.steps, device)
                seconds = group_max(sum(timed) / len(timed))
                phases = engine.phases.last
                row.update(step_s=seconds, first_step_s=group_max(first), steps_s=timed, loss=loss,
                           samples_per_s=B / seconds, command=_command(args),
                           **{f"{k}_s": group_max(v["s"]) for k, v in phases.items()},
                           peak_mib={k: group_max(v["peak_mib"]) for k, v in phases.items()} if cuda else None)
                row["loss_share"] = row["loss_s"] / row["step_s"]
                row["peak_mib_max"] = max(row["peak_mib"].values()) if cuda else None
                if cuda:
                    # Beside the allocated peak: what the allocator reserved, and what the
                    # device had in use after the step (the reserve, the CUDA context, NCCL),
                    # the figure the planner's runtime reserve stands for.
                    row["reserved_mib_max"] = group_max(max(v["reserved_mib"] for v in phases.values()))
                    free, total = torch.cuda.mem_get_info()
                    row["device_used_mib"] = group_max((total - free) / 2**20)
                if impl == "infcl_ds":
                    row.update(_prediction(args, B, world, data, decoder))
                if args.profile and cuda and data == "synthetic":  # one more step, after the timed ones: nothing compiles in it
                    row["profile"] = _profiled_step(engine, batch, rank)
            except Exception as err:  # noqa: BLE001
                if not is_oom(err):
                    raise
                row["status"] = "out of memory"
                group_max(0)
            row.update(ident)
            rows = [r for r in rows if row_key(r) != row_key(row)] + [row]
            if rank == 0:
                print(_fmt(row), flush=True)
                meta["memory_slope"] = _memory_slope(rows, args.model, args.zero)
                write_rows(out, rows, meta)
        del engine
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0:
        plot_train_rows(out)
    leave_distributed()  # torn down before exit: a gloo rank left to the exit can abort


def row_key(row):
    """What a row measured: a later run of the same configuration replaces it (--append)."""
    return (row.get("impl"), row.get("model"), row.get("B"), row.get("world"), bool(row.get("compile")), row.get("zero"),
            tuple(row.get("set", ())), row.get("data", "synthetic"), row.get("decoder"))


def plot_train_rows(out: Path) -> None:
    """The plot beside the JSON: engine phases and memory by batch, or, when the file compares
    trainers or compiled and eager runs, samples/s per configuration."""
    from .plot import plot_train, plot_train_configurations
    rows = json.loads(out.read_text())["rows"]
    if any(r["impl"] == "open_clip_train" or r.get("compile") for r in rows):
        plot_train_configurations(out, out.with_suffix(".png"))
    else:
        plot_train(out, out.with_suffix(".png"))


def _memory_slope(rows, model, zero):
    """Least-squares slopes against the local batch (bytes per sample), per impl, of the
    step's peak and of each phase's peak, beside the bound 24 D bytes per sample (bf16
    features and their gradients, ring blocks and partial gradients). The step's peak is the
    re-encode phase until the loss phase outgrows one chunk's activations, so the loss
    phase's own slope is the one that decides at the largest batches."""
    out = {}
    for impl in {r["impl"] for r in rows}:
        # One curve: an --append file also holds rows of other models, worlds, chunks and settings.
        mine = [r for r in rows if r["impl"] == impl and r.get("peak_mib_max") and r["status"] == "measured"
                and r.get("model") == model and not r.get("compile") and r.get("zero") == zero]
        mine = [r for r in mine if _curve(r) == _curve(mine[-1])] if mine else mine
        if len({r["local"] for r in mine}) < 2:  # a slope needs two local batches
            continue
        D = mine[0]["D"]
        out[impl] = {"bytes_per_sample": _slope([(r["local"], r["peak_mib_max"] * 2**20) for r in mine]),
                     "phases": {k: _slope([(r["local"], r["peak_mib"][k] * 2**20) for r in mine])
                                for k in mine[0]["peak_mib"]},
                     "bound_24D": 24 * D, "points": len(mine)}
    return out


def _curve(row):
    """What a row shares with the other points of its memory curve: all but the batch."""
    return row.get("world"), row.get("chunk"), tuple(row.get("set", ())), bool(row.get("grad_checkpointing"))


def _slope(points):
    mx, my = sum(p[0] for p in points) / len(points), sum(p[1] for p in points) / len(points)
    return sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)


def _fmt(row):
    if row["status"] != "measured":
        return f"{row['impl']:10s} B={row['B']:>8d} {row['status']}"
    peak = row["peak_mib_max"]
    return (f"{row['impl']:10s} B={row['B']:>8d} step={row['step_s']:8.2f}s samples/s={row['samples_per_s']:8.0f} "
            f"loss share={row['loss_share']:.3f} encode={row['encode_s']:.2f}s loss={row['loss_s']:.2f}s "
            f"reencode={row['reencode_s']:.2f}s optimizer={row['optimizer_s']:.2f}s peak={'-' if peak is None else f'{peak:.0f}'}MiB"
            + (f" reserved={row['reserved_mib_max']:.0f}MiB device={row['device_used_mib']:.0f}MiB"
               if row.get("reserved_mib_max") else "")
            + (f" plan={row['plan_allocated_mib']:.0f}MiB(+reserve {row['plan_peak_mib']:.0f})"
               if row.get("plan_peak_mib") else ""))


def _count_or_auto(text: str):
    """--decode-workers: a count, or "auto"."""
    return text if text == "auto" else int(text)


def _command(args):
    import shlex
    return "infcl-ds bench train " + " ".join(shlex.quote(a) for a in (args.argv or []))


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="ViT-B-16", help="open_clip architecture (model.name)")
    p.add_argument("--batch", default="64k,256k", help="global batch sizes")
    p.add_argument("--chunk", default="256", help="samples per encoder chunk, or auto (the planner's choice)")
    p.add_argument("--zero", type=int, default=2, help="ZeRO stage 0-3 (zero.stage)")
    p.add_argument("--impl", default="infcl_ds", help="comma list of infcl_ds, inf_cl, open_clip, open_clip_train")
    p.add_argument("--open-clip-train-batch-size", type=int, default=1024,
                   help="open_clip_train's --batch-size per rank (its --accum-freq makes up the global batch)")
    p.add_argument("--open-clip-train-modes", default="eager,compile", help="eager and/or compile (--torchcompile)")
    p.add_argument("--open-clip-max-batch", default="64k", help="largest B for OpenCLIP's full logits")
    p.add_argument("--steps", type=int, default=2,
                   help="timed steps per row (their mean), after one untimed step of the same shape")
    p.add_argument("--pool", type=int, default=4096, help="distinct host samples cycled through")
    p.add_argument("--grad-checkpointing", action="store_true", help="activation checkpointing (model.grad_checkpointing)")
    p.add_argument("--compile", action="store_true", help="torch.compile the encoders (model.compile)")
    p.add_argument("--offload-features", action="store_true", help="cached features in host memory (batch.offload_features)")
    p.add_argument("--profile", action="store_true",
                   help="one more step under torch.profiler (CUDA): GPU time per kernel kind in the row")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="recipe keys for this engine's rows, e.g. zero.overrides={...} (repeatable)")
    p.add_argument("--data", default="synthetic",
                   help="comma list: synthetic (a pinned pool of random pixels) and/or jpeg (--shards, decoded "
                        "as the trainer decodes them; open_clip_train reads the same shards)")
    p.add_argument("--shards", help="JPEG WebDataset shards for --data jpeg (a brace pattern or a directory; "
                                    "e.g. from infcl-ds data photos)")
    p.add_argument("--decode-workers", type=_count_or_auto, default=14,
                   help="--data jpeg: data.decode_workers (a count, or auto: the rank's plan)")
    p.add_argument("--read-workers", type=int, default=2, help="--data jpeg: data.workers (shard readers)")
    p.add_argument("--decoder", default="pil",
                   help="--data jpeg: data.decoder, or several comma-separated (a row each): pil,nvjpeg,hybrid")
    p.add_argument("--keep-decoded-gib", default="auto", help="--data jpeg: data.keep_decoded_gib")
    p.add_argument("--keep-decoded-host-gib", default="auto", help="--data jpeg: data.keep_decoded_host_gib")
    p.add_argument("--decode-window-gib", default=DataSection.model_fields["decode_window_gib"].default,
                   help="--data jpeg: data.decode_window_gib (auto, or GiB)")
    p.add_argument("--open-clip-train-workers", type=int, default=None,
                   help="open_clip_train's --workers (default: 12 on CUDA, 1 on CPU)")
    p.add_argument("--world", type=int, default=0, help="ranks (default: all GPUs; 2 gloo ranks on CPU)")
    p.add_argument("--append", action="store_true", help="merge into --out instead of replacing it")
    p.add_argument("--out", default="docs/benchmarks/train.json", help="the JSON of rows to write (a PNG beside it)")
    args = p.parse_args(argv)
    if "jpeg" in args.data.split(",") and not args.shards:
        p.error("--data jpeg needs --shards (e.g. made by: infcl-ds data photos --out DIR)")
    if args.profile and not torch.cuda.is_available():
        print("bench train: --profile times CUDA kernels; on this machine (no CUDA) it is ignored", file=sys.stderr)
    args.argv = argv
    world = args.world or (torch.cuda.device_count() if torch.cuda.is_available() else 2)
    impls = args.impl.split(",")
    if "open_clip_train" in impls:
        open_clip_train_rows(args, world)
        args.impl = ",".join(i for i in impls if i != "open_clip_train")
        args.append = True
    if args.impl:
        import torch.multiprocessing as mp
        # cores: what this process may run on (taskset), the whole share of its ranks and decode processes
        ident = {**run_identity(), "cores": len(os.sched_getaffinity(0))}
        mp.spawn(_worker, args=(world, args, free_port(), ident), nprocs=world, join=True)


def open_clip_train_rows(args, world: int) -> None:
    """OpenCLIP's trainer at each batch, eager and compiled: its steady samples/s (steps after
    the first, two for a compiled run, are the untimed warm-up) into --out beside this engine's."""
    from .open_clip_train import logits_bytes, open_clip_train_args, run_open_clip_train
    from infcl_ds.models import CONFIG_DIR
    ident, out = run_identity(), Path(args.out)
    cuda = torch.cuda.is_available()
    # This project's own model configs (infcl-tiny, ...) registered with open_clip there too.
    runner_args = ["--model-config-dir", str(CONFIG_DIR)]
    old = json.loads(out.read_text()) if args.append and out.is_file() else {"meta": {}, "rows": []}
    rows = old["rows"]
    workers = args.open_clip_train_workers or (12 if cuda else 1)
    for B, data, mode in ((B, d, m) for B in parse_sizes(args.batch) for d in args.data.split(",")
                          for m in args.open_clip_train_modes.split(",")):
        compiled, warm = mode == "compile", 2 if mode == "compile" else 1
        source = None if data == "synthetic" else open_clip_train_shards(args.shards)
        argv = open_clip_train_args(args.model, B, world, args.open_clip_train_batch_size, warm + args.steps,
                                    compiled, "amp_bf16" if cuda else "fp32", workers, cuda, data=source)
        row = {"impl": "open_clip_train", "model": args.model, "B": B, "world": world, "compile": compiled,
               "zero": None, "data": data, "decode_workers": workers if data == "jpeg" else None, **ident}
        need = logits_bytes(B, world, "amp_bf16" if cuda else "fp32")
        device_bytes = torch.cuda.get_device_properties(0).total_memory if cuda else None
        if device_bytes is not None and need > device_bytes:  # not run: it cannot fit
            row.update(status="does not fit", reason=f"its two {B // world:,} x {B:,} logits matrices need "
                       f"{need / 2**30:,.0f} GiB of the GPU's {device_bytes / 2**30:,.1f} GiB")
        else:
            row.update(_open_clip_train_run(run_open_clip_train, world, argv, runner_args, warm, B))
        rows = [r for r in rows if row_key(r) != row_key(row)] + [row]
        print(f"open_clip_train {mode:7s} {data:9s} B={B:>8d}: {row.get('samples_per_s', row['status'])} "
              f"{row.get('reason', '')}", flush=True)
        write_rows(out, rows, {**old["meta"], **ident})
    plot_train_rows(out)


def open_clip_train_shards(shards: str) -> list:
    """open_clip_train's data arguments for the same shards: its WebDataset loader takes a brace
    pattern (a directory is listed as one)."""
    from infcl_ds.data.sources.webdataset_source import expand_shards
    paths = expand_shards(shards)
    pattern = shards if "{" in shards else "::".join(str(p) for p in paths)
    return ["--dataset-type", "webdataset", "--train-data", pattern]


def _open_clip_train_run(run_open_clip_train, world, argv, runner_args, warm: int, B: int) -> dict:
    """One open_clip_train run -> its row's status and figures (steps after `warm` timed)."""
    try:
        run = run_open_clip_train(world, argv, free_port(), runner_args, timeout_s=1800)
    except RuntimeError as err:
        # The message's first line names the error (open_clip_train.failure_line), its tail the log.
        error = str(err).splitlines()[0]
        if "out of memory" not in error.lower():
            return {"status": "failed", "error": error, "log_tail": str(err)[-500:]}
        per_rank = argv[argv.index("--batch-size") + 1]
        return {"status": "out of memory", "error": error,
                "reason": f"open_clip_train at --batch-size {per_rank} does not fit this GPU "
                          f"(a smaller --open-clip-train-batch-size may)"}
    timed = run["step_s"][warm:]
    return {"status": "measured", "step_s": sum(timed) / len(timed), "samples_per_s": B * len(timed) / sum(timed),
            "first_step_s": run["step_s"][0], "steps_s": run["step_s"], "command": run["command"]}


if __name__ == "__main__":
    main()
