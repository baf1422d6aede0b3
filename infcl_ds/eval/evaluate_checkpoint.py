"""``infcl-ds eval --checkpoint DIR --data SPLIT_DIR [--tag TAG] [--batch-size N] [--out FILE]``:
zero-shot and retrieval metrics of a training checkpoint on an eval split.

``--out`` is checked before any work (``outputs.py``: outside the checkpoints read, writable,
and an existing file only if an earlier ``eval`` wrote it: a JSON object whose ``written_by``
is ``WRITTEN_BY``)."""
import json
import sys
from pathlib import Path
from typing import Optional

import torch

from ..checkpoint.safe_load import TRUST_FLAG, TRUST_HELP, CheckpointError
from ..cli_args import ArgumentParser, positive_int
from ..export import checkpoints_of, load_state_dict_from_checkpoint, resolve_tag_dir, run_model_name
from ..models import create_model, get_tokenizer, loss_of_state_dict, model_info
from ..outputs import check_out_file, replace_file
from . import evaluate, metric_label

WRITTEN_BY = "infcl-ds eval"
_MAX_OUT_BYTES = 1 << 20  # an eval's JSON is a few hundred bytes: a larger file is someone else's


def is_eval_output(path) -> bool:
    """A file an earlier ``eval --out`` wrote: a JSON object with ``"written_by": WRITTEN_BY``."""
    try:
        with open(path, "rb") as f:
            text = f.read(_MAX_OUT_BYTES + 1)
        data = json.loads(text) if len(text) <= _MAX_OUT_BYTES else None
    except (OSError, ValueError, RecursionError):
        return False
    return isinstance(data, dict) and data.get("written_by") == WRITTEN_BY


def _check_out(out, checkpoint) -> Optional[Path]:
    if out is None:
        return None
    return check_out_file(out, checkpoints_of(checkpoint), WRITTEN_BY, is_eval_output, example="metrics.json")


def main(argv=None) -> int:
    parser = ArgumentParser(prog="infcl-ds eval", description=__doc__.split("\n", 1)[1].strip())
    parser.add_argument("--checkpoint", required=True, help="RUN/, RUN/checkpoints or RUN/checkpoints/<tag>")
    parser.add_argument("--data", required=True, help="eval split directory")
    parser.add_argument("--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    parser.add_argument("--batch-size", type=positive_int, default=256, help="samples per forward pass (default 256)")
    parser.add_argument("--out", default=None, help="also write the metrics to this JSON file")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)

    from ..data import build_eval_data  # the data pipeline's heavier imports only for this command
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        out = _check_out(args.out, args.checkpoint)  # before any work: a bad --out costs no evaluation
        tag_dir = resolve_tag_dir(args.checkpoint, args.tag)
        name = run_model_name(tag_dir)
        state_dict = load_state_dict_from_checkpoint(tag_dir, trust=args.trust_checkpoint)
        model = create_model(name, loss=loss_of_state_dict(state_dict))
        model.load_state_dict(state_dict, strict=True)
        model.to(device)
        tokenizer = get_tokenizer(name)
        info = model_info(model)
        data = build_eval_data(args.data, image_size=info["image_size"], tokenizer=tokenizer,
                               batch_size=args.batch_size, mean=info["mean"], std=info["std"])
    except (CheckpointError, FileNotFoundError, ValueError) as err:  # DataError is a ValueError
        print(f"infcl-ds eval: {err}", file=sys.stderr)
        return 2
    metrics = evaluate(model, data, tokenizer, device)

    print(f"{name} at {tag_dir} on {args.data}")
    for metric, value in metrics.items():
        print(f"{metric_label(metric)}: {value:.4f}")
    if out is not None:
        text = json.dumps({"written_by": WRITTEN_BY, "model": name, "checkpoint": str(tag_dir), "data": str(args.data),
                           "metrics": metrics}, indent=2) + "\n"
        try:
            replace_file(out, lambda partial: partial.write_text(text))
        except OSError as err:  # checked writable before, so a disk that filled or a path changed since
            print(f"infcl-ds eval: {err}", file=sys.stderr)
            return 2
    return 0
