"""`infcl-ds bench float8`: does `model.float8` change what a model learns?

Trains the quickstart's recipe (ds_configs/recipes/tiny-cpu.yaml: a tiny CLIP on JPEG shards of
scikit-learn's digits) on this machine's first GPU in bf16, with `model.float8` false and true,
once per seed; the runs share the GPU, all at once (the model is tiny: each run is its data
loader's and its steps' launch overheads). Writes docs/benchmarks/float8_training.json (a row per
run with its per-step losses; per setting the mean zero-shot top-1 on the held-out digits and its
difference from bf16's) and a PNG of the loss curves side by side.

    infcl-ds bench float8 --seeds 0,1 --steps 300

`--float8 emulate` runs torchao's emulation where there are no float8 tensor cores (the CPU): the
numbers' rounding, not the speed.
"""
import argparse
import sys
import tempfile
from pathlib import Path

from .common import run_identity, write_rows
from .digits_runs import train_digits_runs, zeroshot_summary

DEFAULT_OUT = Path("docs/benchmarks/float8_training.json")


def plot_float8_training(json_path: Path, png_path: Path) -> None:
    """Loss per step, bf16 and float8 side by side (one line per seed), zero-shot in the legend."""
    import json

    from .plot import pyplot, save
    data = json.loads(json_path.read_text())
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, setting in zip(axes, ("false", "true")):
        for row in (r for r in data["rows"] if r["float8"] == setting):
            ax.plot(range(1, len(row["losses"]) + 1), row["losses"], lw=1,
                    label=f"seed {row['seed']}: zero-shot {row['zeroshot_top1']:.4f}")
        ax.set_title(f"model.float8: {setting}" + (" (bf16)" if setting == "false" else " (rowwise float8 linears)"))
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_ylabel("training loss")
    summary = data["meta"]["summary"]
    fig.suptitle(f"{data['meta']['recipe']}; {data['meta']['device']}, {data['meta']['commit']}: "
                 f"zero-shot float8 - bf16 = {summary['true']['minus_bf16']:+.4f}", fontsize=9)
    save(fig, png_path)


def main(argv=None):
    p = argparse.ArgumentParser(prog="infcl-ds bench float8", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1", help="model seeds, comma-separated")
    p.add_argument("--steps", type=int, default=300, help="training steps per run")
    p.add_argument("--float8", default="true", choices=("true", "emulate"), help="model.float8's value against false")
    p.add_argument("--out", default=str(DEFAULT_OUT), help="the JSON of rows to replace (a PNG beside it)")
    args = p.parse_args(argv)
    from infcl_ds.data.commands.digits import build_digits
    work = Path(tempfile.mkdtemp(prefix="infcl-ds-float8-"))
    build_digits(work / "digits", image_format="jpg")
    seeds = [int(s) for s in args.seeds.split(",")]
    runs = {(setting, seed): (work / f"run-{setting}-{seed}",
                              ["precision.dtype=bf16", f"model.float8={setting}", f"model.seed={seed}"],
                              f"model.float8={setting} seed {seed}")
            for setting in ("false", args.float8) for seed in seeds}
    rows = []
    for (setting, seed), run in train_digits_runs(work / "digits", args.steps, runs).items():
        rows.append({"float8": "true" if setting != "false" else "false", "setting": setting, "seed": seed,
                     "steps": args.steps, **run, "final_loss": run["losses"][-1]})
        print(f"model.float8={setting:7s} seed {seed}: zero-shot top-1 {run['zeroshot_top1']:.4f}, "
              f"last loss {run['losses'][-1]:.4f} ({run['train_s']:.0f} s, all runs at once)", flush=True)
    summary = zeroshot_summary(rows, "float8", "false", "minus_bf16")
    print(f"mean zero-shot top-1: bf16 {summary['false']['mean_zeroshot_top1']:.4f}, float8 "
          f"{summary['true']['mean_zeroshot_top1']:.4f} ({summary['true']['minus_bf16']:+.4f})", flush=True)
    meta = {**run_identity(), "command": "infcl-ds bench float8 " + " ".join(argv if argv is not None else sys.argv[1:]),
            "recipe": "ds_configs/recipes/tiny-cpu.yaml, precision.dtype=bf16, on JPEG digits (quality 95), 1 GPU",
            "summary": summary}
    out = Path(args.out)
    write_rows(out, rows, meta)
    try:
        plot_float8_training(out, out.with_suffix(".png"))
    except ImportError as err:  # a GPU image without matplotlib: plot where the JSON lands
        print(f"no plot ({err}): python -c 'from benchmarks.float8_training import plot_float8_training as p; "
              f"from pathlib import Path; p(Path(\"{out}\"), Path(\"{out.with_suffix('.png')}\"))'", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
