"""`infcl-ds bench data`: decode + transform throughput of encoded host batches.

An encoded local batch is decoded twice per step (once per engine pass), so a rank needs
2 x local batch / step time decodes per second. This measures what a pool of decode processes
delivers on this machine, at 1..N processes, on JPEG shards (`infcl-ds data photos`), through
the trainer's own path (EncodedBatch.decoded, open_clip's train transform), and writes rows
beside what each recipe's planned step needs.

    infcl-ds data photos --out data/photos --samples 50000
    infcl-ds bench data --shards data/photos --workers 1,4,8,14 --samples 8192
"""
import argparse
import os
import time
from pathlib import Path

from infcl_ds.data import DataError

from .common import run_identity, write_rows

DEFAULT_OUT = Path("docs/benchmarks/data.json")


def host_rss_gib() -> float:
    """Resident memory of this process and its children (decode and data workers), GiB."""
    import psutil
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0
    for p in procs:
        try:
            total += p.memory_info().rss
        except psutil.Error:
            pass
    return total / 2 ** 30


def encoded_batch(shards, samples: int, image_size: int, decode_workers: int, seed: int = 0, decoder: str = "pil",
                  gpu_jpeg_library: str = "torchvision"):
    from open_clip import get_tokenizer

    from infcl_ds.config.recipe import DataSection
    from infcl_ds.data import build_train_data
    section = DataSection(source="webdataset", train=str(shards), workers=min(8, os.cpu_count() or 1), worker_batch=512,
                          host_batch="encoded", decode_workers=decode_workers, decoder=decoder, augment=True,
                          keep_decoded_gib=0.0, keep_decoded_host_gib=0.0, gpu_jpeg_library=gpu_jpeg_library,
                          # room for the whole pass: the rows decode as fast as the decoder goes
                          decode_window_gib=samples * 3 * image_size ** 2 / 2 ** 30)
    data = build_train_data(section, rank=0, world_size=1, local_batch=samples, seed=seed, image_size=image_size,
                            tokenizer=get_tokenizer("ViT-B-32"))
    return data


def one_pass(batch, chunk: int):
    """`batch`'s chunks, announced as the order they will be asked in (else nothing decodes ahead)."""
    chunks = [(lo, min(lo + chunk, len(batch))) for lo in range(0, len(batch), chunk)]
    batch.announce_passes([chunks])
    return chunks


def time_decode(batch, chunk: int) -> float:
    """Seconds to decode one pass of `batch` in chunks, as the engine's first pass asks."""
    chunks = one_pass(batch, chunk)
    started = time.perf_counter()
    for lo, hi in chunks:
        batch.decoded(lo, hi)
    return time.perf_counter() - started


def decode_rows(shards, workers_list, samples: int, image_size: int, chunk: int, command: str,
                decoders=("pil",)):
    rows = []
    for decoder, workers in ((d, w) for d in decoders for w in workers_list):
        data = encoded_batch(shards, samples, image_size, workers, decoder=decoder)
        batches = iter(data)
        warm = next(batches)
        time_decode(warm, chunk)  # starts the pool; first-call costs stay out of the timing
        batch = next(batches)
        seconds = time_decode(batch, chunk)
        rows.append({"what": "decode", "impl": decoder, "workers": workers, "image_size": image_size,
                     "samples": len(batch), "samples_per_s": len(batch) / seconds,
                     "per_worker": len(batch) / seconds / max(workers, 1),
                     "bytes_per_sample": batch.nbytes / len(batch), "decoded_bytes_per_sample": 3 * image_size ** 2,
                     "host_rss_gib": host_rss_gib(), "command": command})
        print(f"decode {decoder} workers={workers:3d}: {rows[-1]['samples_per_s']:8.0f} samples/s "
              f"({rows[-1]['per_worker']:.0f} per worker), {rows[-1]['bytes_per_sample']:,.0f} B/sample held",
              flush=True)
        batches.close()
        data.close()
        del batch, warm, batches, data
    return rows


def device_rows(shards, samples: int, image_size: int, chunk: int, command: str, device: str = "cuda",
                library: str = "torchvision"):
    """data.decoder=nvjpeg on this GPU with data.gpu_jpeg_library=`library` (or the same code with
    the library's CPU decoder for `device="cpu"`), and how far its pixels are from the PIL path's
    on the same rows (same crops)."""
    import torch
    data = encoded_batch(shards, samples, image_size, 0, decoder="nvjpeg", gpu_jpeg_library=library)
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    batches = iter(data)
    warm = next(batches)
    for lo, hi in one_pass(warm, chunk):  # warm: the decoder's handles, every buffer size
        warm.decoded(lo, hi, device)
    batch = next(batches)
    chunks = one_pass(batch, chunk)
    sync()
    started = time.perf_counter()
    for lo, hi in chunks:
        batch.decoded(lo, hi, device)
    sync()
    seconds = time.perf_counter() - started
    # The same rows of the same batch through PIL, in this process.
    rows = min(len(batch), 2048)
    got = batch.decoded(0, rows)[0].float()
    pil = batch.decoder.pieces  # the PIL pieces that decode a chunk nobody announced
    want = torch.cat([pil[batch.request(lo, min(lo + 256, rows))][1] for lo in range(0, rows, 256)]).float()
    diff = (got - want).abs()
    row = {"what": "decode", "impl": "nvjpeg", "gpu_jpeg_library": library, "workers": 0, "image_size": image_size, "samples": len(batch),
           "samples_per_s": len(batch) / seconds, "per_worker": None, "bytes_per_sample": batch.nbytes / len(batch),
           "decoded_bytes_per_sample": 3 * image_size ** 2, "host_rss_gib": host_rss_gib(),
           "mean_abs_diff_vs_pil": diff.mean().item(), "max_abs_diff_vs_pil": diff.max().item(),
           "share_pixels_equal": (diff == 0).float().mean().item(), "command": command}
    print(f"decode nvjpeg ({library}): {row['samples_per_s']:8.0f} samples/s; pixels vs PIL: mean |diff| "
          f"{row['mean_abs_diff_vs_pil']:.2f} levels, max {row['max_abs_diff_vs_pil']:.0f}", flush=True)
    batches.close()
    data.close()
    return [row]


def needed_rows(rate_per_worker: float, recipes: Path):
    """What each recipe's planned step needs from its decoders, per rank."""
    from infcl_ds.config import load_recipe
    from infcl_ds.plan.plan import make_plan
    rows = []
    for path in sorted(Path(recipes).glob("*.yaml")):
        recipe = load_recipe(path)
        if recipe.data.source != "webdataset" or "cpu" in path.name:
            continue
        gpus = int(path.stem.rsplit("-", 1)[-1].rstrip("gpu"))
        plan = make_plan(recipe, gpus, 80 * 2 ** 30)
        # The planner's count: one decode a sample per pass, less the rows kept decoded between them.
        need = plan.decoding.needed if plan.decoding is not None else 0.0
        rows.append({"what": "needed", "recipe": path.name, "gpus": gpus, "model": recipe.model.name,
                     "local_batch": recipe.local_batch(gpus), "plan_step_s": plan.time.total,
                     "decodes_per_s_per_rank": need, "workers_per_rank": need / rate_per_worker})
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench data", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shards", required=True, help="WebDataset shards (a directory, pattern or file)")
    p.add_argument("--workers", default="1,4,8", help="decode processes, comma-separated")
    p.add_argument("--samples", type=int, default=4096, help="samples per timed batch")
    p.add_argument("--image-size", type=int, default=224, help="decoded image side in pixels")
    p.add_argument("--chunk", type=int, default=256, help="samples per chunk, asked in order as the engine asks")
    p.add_argument("--decoders", default="pil,torchvision", help="data.decoder values, comma-separated")
    p.add_argument("--gpu-jpeg-libraries", default="torchvision,nvimgcodec",
                   help="on a GPU: data.decoder=nvjpeg with each data.gpu_jpeg_library (nvimgcodec: if installed)")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the JSON of rows to replace (a PNG beside it)")
    p.add_argument("--recipes", type=Path, default=Path("ds_configs/recipes"), help="recipes to set the needs beside")
    args = p.parse_args(argv)
    command = "infcl-ds bench data " + " ".join(argv if argv is not None else [])
    identity = {**run_identity(), "cpus": os.cpu_count()}
    rows = decode_rows(args.shards, [int(w) for w in args.workers.split(",")], args.samples, args.image_size,
                       args.chunk, command, args.decoders.split(","))
    import torch
    if torch.cuda.is_available():
        for library in args.gpu_jpeg_libraries.split(","):
            if library == "nvimgcodec":
                from infcl_ds.data.decoding.nvimgcodec_decode import nvimgcodec_module
                try:
                    nvimgcodec_module()
                except DataError as err:
                    print(f"no nvimgcodec row: {err}", flush=True)
                    continue
            rows += device_rows(args.shards, args.samples, args.image_size, args.chunk, command, library=library)
    best = max((r for r in rows if r["impl"] == "pil"), key=lambda r: r["samples_per_s"])
    rows += needed_rows(best["per_worker"], args.recipes)
    for row in rows:
        row.update(identity)
    write_rows(args.out, rows, identity)
    from .plot_data import plot_data
    plot_data(args.out, args.out.with_suffix(".png"))
    return rows


if __name__ == "__main__":
    main()
