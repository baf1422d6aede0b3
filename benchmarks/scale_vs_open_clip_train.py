"""`python -m benchmarks.scale_vs_open_clip_train`: OpenCLIP's trainer beside this engine in
docs/benchmarks/scale.json, from the same JPEG shards on the same GPUs.

    python -m benchmarks.scale_vs_open_clip_train --rows open_clip_train_4gpu.json --out docs/benchmarks/scale.json

`--rows`: the rows of `infcl-ds bench train --impl open_clip_train --data jpeg --world W` (torchrun,
--torchcompile --local-loss --gather-with-grad --accum-freq). Each measured row becomes a scale
row, `impl` open_clip_train, named after the scale part of this engine with its model, batch and
ranks (`four-gpu-128k-open-clip-train`); where that part's row is from the same run (card and
commit), both rows get `vs_open_clip_train`: this engine's samples/s over OpenCLIP's trainer's.
"""
import argparse
import json
from pathlib import Path
from typing import List, Optional

from .common import write_rows
from .scale import PARTS, same_run

ROW_KEYS = ("model", "B", "world", "data", "samples_per_s", "step_s", "first_step_s", "steps_s", "command",
            "device", "torch", "triton", "commit", "decode_workers")


def engine_part(row: dict) -> Optional[str]:
    """The scale part that trains this engine at the row's model, global batch and ranks."""
    return next((name for name, part in PARTS.items() if (part.model, part.batch, part.gpus, part.nodes) ==
                 (row["model"], row["B"], row["world"], 1) and not part.resumes), None)


def with_open_clip_train(scale_rows: List[dict], trainer_rows: List[dict]) -> List[dict]:
    """`scale_rows` with each measured open_clip_train row of `trainer_rows` in (replacing its
    earlier one), and the ratio where the engine's row is of the same run."""
    out = list(scale_rows)
    for row in trainer_rows:
        if row.get("impl") != "open_clip_train" or row.get("status") != "measured" or row.get("data") != "jpeg":
            continue
        part = engine_part(row)
        if part is None:
            raise SystemExit(f"no scale part trains {row['model']} at B={row['B']:,} on {row['world']} GPUs of one node")
        new = {"part": f"{part}-open-clip-train", "impl": "open_clip_train", "nodes": 1, "accelerator": "cuda",
               **{k: row.get(k) for k in ROW_KEYS}}
        out = [r for r in out if r.get("part") != new["part"]] + [new]
        engine = next((r for r in out if r.get("part") == part and "samples_per_s" in r), None)
        if engine is not None and same_run(engine, new):
            ratio = engine["samples_per_s"] / new["samples_per_s"]
            engine["vs_open_clip_train"] = new["vs_open_clip_train"] = ratio
        else:  # a ratio needs both rows of one run: the engine's earlier one has lost its counterpart
            new["vs_open_clip_train"] = None
            if engine is not None:
                engine.pop("vs_open_clip_train", None)
    return out


def main(argv=None) -> List[dict]:
    p = argparse.ArgumentParser(prog="python -m benchmarks.scale_vs_open_clip_train", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=Path, required=True, help="bench train's JSON with the open_clip_train rows")
    p.add_argument("--out", type=Path, default=Path("docs/benchmarks/scale.json"))
    args = p.parse_args(argv)
    scale = json.loads(args.out.read_text()) if args.out.is_file() else {"meta": {}, "rows": []}
    rows = with_open_clip_train(scale["rows"], json.loads(args.rows.read_text())["rows"])
    write_rows(args.out, rows, scale["meta"])
    for row in (r for r in rows if r.get("impl") == "open_clip_train"):
        ratio = row.get("vs_open_clip_train")
        print(f"{row['part']}: {row['samples_per_s']:,.0f} samples/s; this engine "
              + ("not measured in the same run" if ratio is None else f"{ratio:.2f}x"), flush=True)
    return rows


if __name__ == "__main__":
    main()
