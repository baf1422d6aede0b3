"""`infcl-ds bench decoders`: does the GPU's JPEG decoder change what a model learns?

Trains the quickstart's recipe (ds_configs/recipes/tiny-cpu.yaml: a tiny CLIP on scikit-learn's
digits, 200 steps) on this machine's first GPU from JPEG shards of the digits, once per
(data.decoder, seed), and compares the zero-shot top-1 on the held-out digits (always decoded by
PIL for evaluation). Writes docs/benchmarks/decoder_zeroshot.json: a row per run, and per decoder
the mean over seeds and its difference from PIL's.

    infcl-ds bench decoders --decoders pil,nvjpeg --seeds 0,1
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .common import run_identity, write_rows

DEFAULT_OUT = Path("docs/benchmarks/decoder_zeroshot.json")
RECIPE = Path(__file__).resolve().parents[1] / "ds_configs" / "recipes" / "tiny-cpu.yaml"


def train_once(digits: Path, decoder: str, seed: int, run_dir: Path, steps: int) -> dict:
    """One single-GPU training run; its eval.json's zero-shot top-1 and the wall time."""
    sets = [f"output_dir={run_dir}", f"data.train={digits / 'train'}", f"data.eval={digits / 'test'}",
            f"data.decoder={decoder}", f"model.seed={seed}", f"schedule.steps={steps}",
            f"schedule.warmup_steps={min(20, steps)}", f"eval.every={steps}", f"checkpoint.every={steps}",
            "logging.tensorboard=false",
            "logging.progress=false"]
    command = [sys.executable, "-m", "infcl_ds.train", "--config", str(RECIPE)]
    for item in sets:
        command += ["--set", item]
    started = time.perf_counter()
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "WORLD_SIZE": "1", "RANK": "0",
                                                                        "LOCAL_RANK": "0"})
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"training with data.decoder={decoder} seed {seed} failed:\n{done.stderr[-3000:]}")
    results = json.loads((run_dir / "eval.json").read_text())
    return {"decoder": decoder, "seed": seed, "steps": steps, "zeroshot_top1": results["zeroshot_top1"],
            "train_s": seconds}


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench decoders", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--decoders", default="pil,nvjpeg", help="data.decoder values, comma-separated")
    p.add_argument("--seeds", default="0,1", help="model seeds, comma-separated")
    p.add_argument("--steps", type=int, default=200, help="training steps per run (the recipe's: 200)")
    p.add_argument("--out", default=str(DEFAULT_OUT))
    args = p.parse_args(argv)
    from infcl_ds.data.digits import build_digits
    work = Path(tempfile.mkdtemp(prefix="infcl-ds-decoders-"))
    build_digits(work / "digits", image_format="jpg")
    rows = []
    for decoder in args.decoders.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            row = train_once(work / "digits", decoder, seed, work / f"run-{decoder}-{seed}", args.steps)
            rows.append(row)
            print(f"data.decoder={decoder:8s} seed {seed}: zero-shot top-1 {row['zeroshot_top1']:.4f} "
                  f"({row['train_s']:.0f} s)", flush=True)
    means = {d: statistics.mean(r["zeroshot_top1"] for r in rows if r["decoder"] == d) for d in args.decoders.split(",")}
    summary = {d: {"mean_zeroshot_top1": m, "minus_pil": m - means["pil"] if "pil" in means else None}
               for d, m in means.items()}
    for d, s in summary.items():
        print(f"{d:8s} mean zero-shot top-1 {s['mean_zeroshot_top1']:.4f}"
              + (f" ({s['minus_pil']:+.4f} against pil)" if s["minus_pil"] is not None else ""), flush=True)
    meta = {**run_identity(), "command": "infcl-ds bench decoders " + " ".join(argv if argv is not None else sys.argv[1:]),
            "recipe": "ds_configs/recipes/tiny-cpu.yaml on JPEG digits (quality 95), 1 GPU", "summary": summary}
    write_rows(Path(args.out), rows, meta)
    return 0


if __name__ == "__main__":
    sys.exit(main())
