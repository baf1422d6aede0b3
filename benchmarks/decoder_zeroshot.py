"""`infcl-ds bench decoders`: does the GPU's JPEG decoder change what a model learns?

Trains the quickstart's recipe (ds_configs/recipes/tiny-cpu.yaml: a tiny CLIP on scikit-learn's
digits, 200 steps) on this machine's first GPU from JPEG shards of the digits, once per
(data.decoder, seed), and compares the zero-shot top-1 on the held-out digits (always decoded by
PIL for evaluation). Writes docs/benchmarks/decoder_zeroshot.json: a row per run, and per decoder
the mean over seeds and its difference from PIL's.

    infcl-ds bench decoders --decoders pil,nvjpeg --seeds 0,1 [--gpu-jpeg-library nvimgcodec]
"""
import argparse
import sys
import tempfile
from pathlib import Path

from infcl_ds.data.decoding.nvimgcodec_decode import GPU_DECODERS

from .common import run_identity, write_rows
from .digits_runs import train_digits, zeroshot_summary

DEFAULT_OUT = Path("docs/benchmarks/decoder_zeroshot.json")


def train_once(digits: Path, decoder: str, seed: int, run_dir: Path, steps: int, library: str = "torchvision") -> dict:
    """One single-GPU training run; its zero-shot top-1 and the wall time. `library`: the GPU
    decoders' data.gpu_jpeg_library (nothing to the CPU decoders)."""
    library = library if decoder in GPU_DECODERS else None
    sets = [f"data.decoder={decoder}", f"model.seed={seed}"] + ([f"data.gpu_jpeg_library={library}"] if library else [])
    run = train_digits(digits, run_dir, steps, sets, f"data.decoder={decoder} seed {seed}")
    return {"decoder": decoder, "gpu_jpeg_library": library, "seed": seed, "steps": steps,
            "zeroshot_top1": run["zeroshot_top1"], "train_s": run["train_s"]}


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench decoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decoders", default="pil,nvjpeg", help="data.decoder values, comma-separated")
    p.add_argument("--seeds", default="0,1", help="model seeds, comma-separated")
    p.add_argument("--steps", type=int, default=200, help="training steps per run (the recipe's: 200)")
    p.add_argument("--gpu-jpeg-library", default="torchvision", choices=("torchvision", "nvimgcodec"),
                   help="data.gpu_jpeg_library of the GPU decoders' runs (nvimgcodec: the gpu-decode extra)")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON of rows to replace")
    args = p.parse_args(argv)
    from infcl_ds.data.commands.digits import build_digits
    work = Path(tempfile.mkdtemp(prefix="infcl-ds-decoders-"))
    build_digits(work / "digits", image_format="jpg")
    rows = []
    for decoder in args.decoders.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = train_once(work / "digits", decoder, seed, work / f"run-{decoder}-{seed}", args.steps,
                             args.gpu_jpeg_library)
            rows.append(row)
            print(f"data.decoder={decoder:8s} seed {seed}: zero-shot top-1 {row['zeroshot_top1']:.4f} "
                  f"({row['train_s']:.0f} s)", flush=True)
    summary = zeroshot_summary(rows, "decoder", "pil", "minus_pil")
    for d, s in summary.items():
        print(f"{d:8s} mean zero-shot top-1 {s['mean_zeroshot_top1']:.4f}"
              + (f" ({s['minus_pil']:+.4f} against pil)" if s["minus_pil"] is not None else ""), flush=True)
    meta = {**run_identity(), "command": "infcl-ds bench decoders " + " ".join(argv if argv is not None else sys.argv[1:]),
            "recipe": "ds_configs/recipes/tiny-cpu.yaml on JPEG digits (quality 95), 1 GPU", "summary": summary}
    write_rows(Path(args.out), rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
