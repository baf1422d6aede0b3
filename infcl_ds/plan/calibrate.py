"""Refit the planner's measured constants from an `infcl-ds bench train` run, and check them.

    python -m infcl_ds.plan.calibrate [--train docs/benchmarks/train.json] [--fit-batch 65536]
    python -m infcl_ds.plan.calibrate --write [--loss docs/benchmarks/loss.json]
    python -m infcl_ds.plan.calibrate --check docs/benchmarks/planner_check.json

--write: write the fit into the package data the planner reads (infcl_ds/calibration/):
loss_rates.json from --loss, and the fitted row's model's entries in encoder_rates.json and
activations.json (other models' entries are kept), and the compiled towers' rates from the
compiled rows of --compiled (docs/benchmarks/vs_open_clip.json). Run from a checkout; the files ship in
the wheel.

--decode FILE: the GPU decoder's rates of benchmarks/decode.py's rows (docs/benchmarks/decode.json,
or decode_variants.json with its rows beside a compiled tower) into decode_rates.json: per
data.gpu_jpeg_library, the decodes per second beside training of the decoder the trainer builds,
on the photos shards (beside a compiled tower where the file has such a row), and how many times
longer the towers' passes took beside it. --decode-lanes FILE: how those change with several decoding threads
(data.gpu_decode_lanes), from the lanes-N rows of docs/benchmarks/decode_variants.json.

--check: the planner, with the constants in the code, against the peaks measured in
configurations it was NOT fitted on (launch/bench_planner_check.sh): allocated peak against
torch's max_memory_allocated, and the total (with the runtime reserve) against what the
device had in use.

Otherwise: the fit on one row (--fit-batch) beside the constants in the code, and the tables of
docs/planner.md (every row predicted with the constants in the code).
"""
import argparse
import json
import sys
from pathlib import Path
from typing import List

from ..config import load_recipe
from ..engine.tower_footprint import ACTIVATION_CALIBRATION
from . import memory as mem
from .plan import estimate, make_plan
from .timing import MEASURED_ENCODER_RATES, KernelRates, loss_rates_calibration

MIB = 1 << 20
# The benchmark JSON of a checkout (docs/benchmarks/), the default inputs.
BENCHMARKS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks"
TRAIN = BENCHMARKS / "train.json"
PLANNER_CHECK = BENCHMARKS / "planner_check.json"
CALIBRATION = Path(__file__).resolve().parents[1] / "calibration"


def row_recipe(row: dict, meta: dict):
    """The recipe `infcl-ds bench train` planned for this row (benchmarks/train.py's _recipe)."""
    return load_recipe(None, [f"model.name={row['model']}", f"batch.global={row['B']}", f"batch.chunk={row['chunk']}",
                              f"zero.stage={row['zero']}", f"precision.dtype={row['dtype']}",
                              f"model.grad_checkpointing={str(meta.get('grad_checkpointing', False)).lower()}",
                              f"batch.offload_features={str(meta.get('offload_features', False)).lower()}",
                              # the row's towers: eager unless it says compiled
                              f"model.compile={str(bool(row.get('compile', False))).lower()}",
                              # its inputs: a pool held decoded (nothing decoded, nothing kept)
                              "data.host_batch=decoded"])


def measured_rows(path=TRAIN):
    data = json.loads(Path(path).read_text())
    rows = [r for r in data["rows"] if r.get("impl") == "infcl_ds" and r.get("status") == "measured"]
    return rows, data.get("meta", {})


def _row_plan(row: dict, meta: dict, rates: KernelRates):
    """The plan of a row's recipe on its GPUs, memory unbounded."""
    return make_plan(row_recipe(row, meta), row["world"], 1 << 50, gpus_per_node=row["world"], rates=rates)


def fit(row: dict, meta: dict, rates: KernelRates) -> dict:
    """The constants one measured row gives."""
    plan = _row_plan(row, meta, rates)
    gpu, recipe = plan.gpu, plan.recipe
    others = sum(gpu.components[name] for name in gpu.phases[mem.ENCODER_PASS]
                 if name not in (mem.ACTIVATIONS, mem.RUNTIME))
    counted = recipe.batch.chunk * plan.model.counted_activation_bytes(mem.DTYPE_BYTES[recipe.precision.dtype],
                                                                       recipe.model.grad_checkpointing)
    activations = row["peak_mib"]["reencode"] * MIB - others
    return {"others_mib": others / MIB, "counted_mib": counted / MIB, "activations_mib": activations / MIB,
            "factor": activations / counted, "encode_s_per_sample": row["encode_s"] / row["local"],
            "reencode_s_per_sample": row["reencode_s"] / row["local"]}


def check(row: dict, meta: dict, rates: KernelRates) -> dict:
    """The planner's prediction for one row, with the constants in the code."""
    plan = _row_plan(row, meta, rates)
    t = plan.time
    return {"B": row["B"], "local": row["local"], "peak_mib": row["peak_mib_max"],
            "pred_peak_mib": plan.allocated_peak_bytes / MIB, "pred_total_gib": plan.peak_gpu_bytes / mem.GIB,
            "step_s": row["step_s"], "pred_step_s": t.total,
            "phases": {"encode": (row["encode_s"], t.encode), "loss": (row["loss_s"], t.loss),
                       "reencode": (row["reencode_s"], t.reencode)}}


def check_recorded(path=PLANNER_CHECK) -> list:
    """Each measured row of a planner-check file with today's predictions beside it."""
    data = json.loads(Path(path).read_text())
    out, rates = [], KernelRates.load()
    for row in data["rows"]:
        if row.get("status") != "measured":
            continue
        plan = _row_plan(row, {"grad_checkpointing": bool(row.get("grad_checkpointing"))}, rates)
        out.append({"config": row["config"], "allocator": row.get("allocator", "default"), "model": row["model"],
                    "B": row["B"], "chunk": row["chunk"], "zero": row["zero"],
                    "checkpointing": bool(row.get("grad_checkpointing")),
                    "allocated_mib": row["peak_mib_max"], "pred_allocated_mib": plan.allocated_peak_bytes / MIB,
                    "device_mib": row["device_used_mib"], "pred_total_mib": plan.peak_gpu_bytes / MIB})
    return out


def _write_json(path: Path, data: dict) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _encoder_entry(row: dict, where: str) -> dict:
    """An encoder_rates.json entry: a bench row's encode and re-encode seconds per GPU."""
    return {"samples": row["local"], "chunk": row["chunk"], "encode_s": row["encode_s"], "reencode_s": row["reencode_s"],
            "source": where}


def write_calibration(row: dict, meta: dict, fitted: dict, loss_path: Path, out: Path = CALIBRATION) -> None:
    """The package data the planner reads: the kernel rates of ``loss_path`` and the fitted
    row's encoder rate and activation factor (rounded to 4 decimals)."""
    _write_json(out / "loss_rates.json", loss_rates_calibration(json.loads(Path(loss_path).read_text()),
                                                                Path(loss_path).name))
    where = (f"{row['source_file']}, B={row['B']} row ({row['model']}, chunk {row['chunk']}, "
             f"{row['world']} x {meta.get('device', '?')})")
    encoders = json.loads((out / "encoder_rates.json").read_text())
    compiled = encoders["models"].get(row["model"], {}).get("compiled")
    encoders["models"][row["model"]] = {**_encoder_entry(row, where), **({"compiled": compiled} if compiled else {})}
    _write_json(out / "encoder_rates.json", encoders)
    activations = json.loads((out / "activations.json").read_text())
    checkpointing = bool(row.get("grad_checkpointing", False))
    fits = [f for f in activations["fits"] if (f["model"], f["grad_checkpointing"]) != (row["model"], checkpointing)]
    fits.append({"model": row["model"], "grad_checkpointing": checkpointing, "factor": round(fitted["factor"], 4),
                 "source": where})
    activations["fits"] = fits
    _write_json(out / "activations.json", activations)


def write_compiled_calibration(vs_path: Path, out: Path = CALIBRATION) -> List[str]:
    """The compiled towers' encoder rates (encoder_rates.json, each model's `compiled`): from
    the compiled ZeRO-0-2 rows of this engine in `vs_path` (`launch/bench_vs_open_clip.sh`'s
    vs_open_clip.json), one GPU each: a model's smallest batch, so that its larger rows (ViT-B-16
    at 256k) stay a check of the planner rather than its input. A model the file has the planner
    has no entry for (ViT-B-32) gets one: its eager rate from the eager rows the same way (a
    model already there keeps its eager rate: its fitted row's). Returns the models written."""
    data = json.loads(Path(vs_path).read_text())
    encoders = json.loads((out / "encoder_rates.json").read_text())
    models = encoders["models"]

    def rows_of(compiled: bool) -> List[dict]:
        wanted = ("infcl_ds", compiled, "measured", 1)
        return [row for row in data["rows"]
                if (row.get("impl"), bool(row.get("compile")), row.get("status"), row.get("world")) == wanted
                and row.get("zero") != 3 and not row.get("set")]

    def smallest(rows: List[dict], model: str, kind: str) -> dict:
        row = min((r for r in rows if r["model"] == model), key=lambda r: r["B"])
        return _encoder_entry(row, f"docs/benchmarks/{Path(vs_path).name}, {kind}B={row['B']} row ({model}, "
                                   f"chunk {row['chunk']}, 1 x {row.get('device', '?')})")
    eager, compiled = rows_of(False), rows_of(True)
    written = list(dict.fromkeys(row["model"] for row in compiled + eager
                                 if row["model"] in models or any(r["model"] == row["model"] for r in eager)))
    for model in written:
        entry = models.setdefault(model, smallest(eager, model, ""))
        if any(r["model"] == model for r in compiled):
            entry["compiled"] = smallest(compiled, model, "compiled ")
    _write_json(out / "encoder_rates.json", encoders)
    return written


# benchmarks/decode.py's backend row that is the decoder the trainer builds, per library
TRAINERS_BACKEND = {"torchvision": "nvjpeg", "nvimgcodec": "trainer's"}
# decode_variants.json's variants (decode.json's rows have none) that run the decoder as the
# trainer does: one lane, the towers' stream priority, in the training process.
TRAINERS_VARIANTS = (None, "none", "compiled")


def _trainers_decoder_rows(rows: List[dict], library: str) -> List[dict]:
    """`library`'s rows of the trainer's decoder beside training on the photos shards, timed,
    of every variant."""
    return [r for r in rows if r.get("kind") == "decoder" and r.get("shards") == "photos"
            and r.get("beside_training") and r.get("gpu_jpeg_library") == library
            and r.get("backend") == TRAINERS_BACKEND[library] and r.get("images_per_s")]


def _trainers_rows(rows: List[dict], library: str) -> List[dict]:
    """_trainers_decoder_rows run as the trainer runs them (TRAINERS_VARIANTS), those beside a
    compiled tower first: the trainer compiles its towers on a GPU (model.compile: auto), and
    beside them the decoder is slower (2,526 photos/s against 2,993 through nvImageCodec,
    decode_variants.json)."""
    rows = [r for r in _trainers_decoder_rows(rows, library) if r.get("variant") in TRAINERS_VARIANTS]
    return sorted(rows, key=lambda r: not r.get("towers_compiled"))


def write_decode_calibration(decode_path: Path, out: Path = CALIBRATION) -> List[str]:
    """decode_rates.json's `<key>_per_gpu`, `<key>_towers_slowdown` and `<key>_source` for each
    library with a row of the trainer's decoder beside training on the photos shards in
    `decode_path` (footprint.GPU_DECODER_KEYS); the other entries are kept. Returns the libraries."""
    from ..data.footprint import GPU_DECODER_KEYS
    data = json.loads(Path(decode_path).read_text())
    rates = json.loads((out / "decode_rates.json").read_text())
    written = []
    for library, key in GPU_DECODER_KEYS.items():
        row = next(iter(_trainers_rows(data["rows"], library)), None)
        if row is None:
            continue
        rates[f"{key}_per_gpu"] = round(row["images_per_s"], 1)
        rates.pop(f"{key}_towers_slowdown", None)  # the rate's own run, or none: never an older run's
        if row.get("towers_slowdown"):
            # below 1 is noise: a decoder beside the towers does not speed them up
            rates[f"{key}_towers_slowdown"] = round(max(1.0, row["towers_slowdown"]), 4)
        rates[f"{key}_source"] = (
            f"docs/benchmarks/{Path(decode_path).name}, commit {row.get('commit')}, {row.get('device')}: the "
            f"trainer's piece decoder through {library} on the photos shards ({row['bytes_per_image']:,.0f} B a JPEG), "
            f"{row['images']:,} images in pieces of {row['piece']:,} beside a {row.get('towers_model')} tower "
            f"({'compiled' if row.get('towers_compiled') else 'eager'}) training on the same GPU, whose passes took "
            f"x{row.get('towers_slowdown') or 1:.3f} as long beside it")
        written.append(library)
    _write_json(out / "decode_rates.json", rates)
    return written


def write_decode_lanes_calibration(variants_path: Path, out: Path = CALIBRATION) -> List[str]:
    """decode_rates.json's `<key>_lanes_gain` and `<key>_lanes_slowdown` per library: for each
    lane count N of benchmarks/decode.py's `lanes-N` rows (decode_variants.json), the decoder's
    photos/s beside training and the towers' slowdown over one lane's (`lanes-1`), all of one
    run, so that a rate measured with one lane carries over (footprint.gpu_decode_rate). A
    library without a lanes-1 row keeps what it had. Returns the libraries written."""
    import re

    from ..data.footprint import GPU_DECODER_KEYS
    data = json.loads(Path(variants_path).read_text())
    rates = json.loads((out / "decode_rates.json").read_text())
    written = []
    for library, key in GPU_DECODER_KEYS.items():
        rows = {int(m.group(1)): r for r in _trainers_decoder_rows(data["rows"], library)
                if (m := re.fullmatch(r"lanes-(\d+)", str(r.get("variant"))))}
        one = rows.get(1)
        if one is None or len(rows) < 2:
            continue
        more = sorted(n for n in rows if n > 1)
        # a gain below 1 is planned as 1: the lanes beyond the first then wait their turn
        rates[f"{key}_lanes_gain"] = {str(n): round(max(1.0, rows[n]["images_per_s"] / one["images_per_s"]), 3)
                                      for n in more}
        rates[f"{key}_lanes_per_gpu"] = {str(n): round(rows[n]["images_per_s"], 1) for n in more}
        rates[f"{key}_lanes_slowdown"] = {
            str(n): round(max(1.0, (rows[n].get("towers_slowdown") or 1) / (one.get("towers_slowdown") or 1)), 3)
            for n in more}
        rates[f"{key}_lanes_source"] = (
            f"docs/benchmarks/{Path(variants_path).name}, commit {one.get('commit')}, {one.get('device')}: "
            f"the {library} decoder with 1, {', '.join(map(str, more))} lanes (threads, each with a piece decoder "
            f"of its own) beside a {one.get('towers_model')} tower on the same GPU, photos shards "
            f"({one.get('bytes_per_image') or 0:,.0f} B a JPEG; larger photos gain less): "
            + "; ".join(f"{n} lane{'s' * (n > 1)} {rows[n]['images_per_s']:,.0f}/s, towers "
                        f"x{rows[n].get('towers_slowdown') or 1:.3f}" for n in sorted(rows)))
        written.append(library)
    _write_json(out / "decode_rates.json", rates)
    return written


def print_check(path) -> None:
    print("| configuration | allocator | B | measured allocated | predicted | error | device in use | "
          "predicted total | error |")
    print("|---|---|---|---|---|---|---|---|---|")
    for c in check_recorded(path):
        what = (f"{c['model']}, chunk {c['chunk']}, ZeRO-{c['zero']}"
                + (", checkpointing" if c["checkpointing"] else ""))
        print(f"| {what} | {c['allocator']} | {c['B']:,} | {c['allocated_mib']:,.0f} MiB | "
              f"{c['pred_allocated_mib']:,.0f} MiB | {c['pred_allocated_mib'] / c['allocated_mib'] - 1:+.1%} | "
              f"{c['device_mib']:,.0f} MiB | {c['pred_total_mib']:,.0f} MiB | "
              f"{c['pred_total_mib'] / c['device_mib'] - 1:+.1%} |")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m infcl_ds.plan.calibrate", description=__doc__.split("\n\n")[0])
    p.add_argument("--train", default=str(TRAIN), help="train.json of `infcl-ds bench train`")
    p.add_argument("--fit-batch", type=int, default=65536, help="the global batch of the row fitted")
    p.add_argument("--check", default=None, metavar="FILE", help="compare with a planner-check run instead")
    p.add_argument("--write", action="store_true", help="write the fit into infcl_ds/calibration/")
    p.add_argument("--loss", default=str(BENCHMARKS / "loss.json"), help="loss.json of `infcl-ds bench loss` (--write)")
    p.add_argument("--compiled", default=str(BENCHMARKS / "vs_open_clip.json"),
                   help="vs_open_clip.json whose compiled rows give the compiled encoder rates, and a model "
                        "without an entry its eager ones too (--write)")
    p.add_argument("--out", default=str(CALIBRATION), help=argparse.SUPPRESS)
    p.add_argument("--decode", default=None, metavar="FILE",
                   help="write the GPU decoder's rates of decode.json (benchmarks/decode.py) instead")
    p.add_argument("--decode-lanes", default=None, metavar="FILE",
                   help="write the GPU decoder's rates with several lanes, from the lanes-N rows of "
                        "decode_variants.json (benchmarks/decode.py), instead")
    args = p.parse_args(argv)
    if args.decode_lanes:
        written = write_decode_lanes_calibration(Path(args.decode_lanes), Path(args.out))
        print(f"lane gains of {', '.join(written) or 'no library'} from {args.decode_lanes} into "
              f"{args.out}/decode_rates.json")
        return 0 if written else 2
    if args.decode:
        written = write_decode_calibration(Path(args.decode), Path(args.out))
        print(f"decode rates of {', '.join(written) or 'no library'} from {args.decode} into {args.out}/decode_rates.json")
        return 0 if written else 2
    if args.check:
        print_check(args.check)
        return 0
    rates = KernelRates.load()
    rows, meta = measured_rows(args.train)
    fitted = [r for r in rows if r["B"] == args.fit_batch]
    if not fitted:
        print(f"no measured infcl_ds row with B={args.fit_batch} in {args.train}", file=sys.stderr)
        return 2
    train = Path(args.train).resolve()
    shown = train.relative_to(BENCHMARKS.parents[1]) if train.is_relative_to(BENCHMARKS.parents[1]) else train.name
    row = dict(fitted[0], source_file=str(shown))
    f = fit(row, meta, rates)
    if args.write:
        write_calibration(row, meta, f, Path(args.loss), Path(args.out))
        if Path(args.compiled).is_file():
            models = write_compiled_calibration(Path(args.compiled), Path(args.out))
            print(f"compiled encoder rates of {', '.join(models) or 'no model'} from {args.compiled}")
        print(f"wrote {args.out}/loss_rates.json, encoder_rates.json, activations.json")
    model = row["model"]
    in_code = MEASURED_ENCODER_RATES.get(model)
    print(f"fit on B={row['B']:,} ({model}, chunk {row['chunk']}, {row['world']} x {meta.get('device', '?')}):")
    print(f"  activation factor {f['factor']:.4f} = ({row['peak_mib']['reencode']:,.1f} MiB measured - "
          f"{f['others_mib']:,.1f} MiB other components) / {f['counted_mib']:,.1f} MiB counted; "
          f"in the code: {ACTIVATION_CALIBRATION.get((model, False))}")
    print(f"  encode {f['encode_s_per_sample'] * 1e6:.3f} us/sample, re-encode {f['reencode_s_per_sample'] * 1e6:.3f} "
          f"us/sample; in the code: "
          + (f"{in_code.forward * 1e6:.3f}, {in_code.forward_backward * 1e6:.3f}" if in_code else "none"))
    flops = estimate(model).forward_flops()
    effective = 4 * flops / (f["encode_s_per_sample"] + f["reencode_s_per_sample"])
    print(f"  effective encoder rate {effective / 1e12:.1f} TFLOP/s per GPU (4 x {flops / 1e9:.2f} GFLOP per sample)")
    print()
    print("| global B | per GPU | role | measured peak | predicted peak | error | measured step | predicted step "
          "| error |")
    print("|---|---|---|---|---|---|---|---|---|")
    checks = [check(r, meta, rates) for r in sorted(rows, key=lambda r: r["B"])]
    for c in checks:
        role = "fit" if c["B"] == row["B"] else "check"
        print(f"| {c['B']:,} | {c['local']:,} | {role} | {c['peak_mib']:,.0f} MiB | {c['pred_peak_mib']:,.0f} MiB | "
              f"{c['pred_peak_mib'] / c['peak_mib'] - 1:+.2%} | {c['step_s']:.2f} s | {c['pred_step_s']:.2f} s | "
              f"{c['pred_step_s'] / c['step_s'] - 1:+.1%} |")
    print()
    print("| global B | encode measured / predicted | loss | re-encode |")
    print("|---|---|---|---|")
    for c in checks:
        cells = " | ".join(f"{m:.2f} / {p:.2f} s" for m, p in c["phases"].values())
        print(f"| {c['B']:,} | {cells} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
