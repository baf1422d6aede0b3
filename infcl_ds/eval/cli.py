"""``infcl-ds eval --checkpoint DIR --data SPLIT_DIR [--tag TAG] [--batch-size N] [--out FILE]``:
zero-shot and retrieval metrics of a training checkpoint on an eval split."""
import json
import sys
from pathlib import Path

import torch

from ..cli_args import ArgumentParser, positive_int
from ..export import load_state_dict_from_checkpoint, resolve_tag_dir, run_model_name
from ..models import create_model, get_tokenizer, loss_of_state_dict, model_info
from ..training.safe_load import TRUST_FLAG, TRUST_HELP, CheckpointError
from . import evaluate, metric_label


def main(argv=None) -> int:
    parser = ArgumentParser(prog="infcl-ds eval", description=__doc__.split("\n", 1)[1].strip())
    parser.add_argument("--checkpoint", required=True, help="RUN/, RUN/checkpoints or RUN/checkpoints/<tag>")
    parser.add_argument("--data", required=True, help="eval split directory")
    parser.add_argument("--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    parser.add_argument("--batch-size", type=positive_int, default=256)
    parser.add_argument("--out", default=None, help="also write the metrics to this JSON file")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)

    from ..data import build_eval_data  # the data pipeline's heavier imports only for this command
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
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
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps({"model": name, "checkpoint": str(tag_dir), "data": str(args.data),
                                              "metrics": metrics}, indent=2) + "\n")
    return 0
