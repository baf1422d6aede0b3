"""Turn a training run's DeepSpeed checkpoint into a plain open_clip state dict.

A run directory holds ``recipe.yaml`` (the model name at ``model: {name: ...}``) and
``checkpoints/<tag>/`` written by ``engine.save_checkpoint(RUN / "checkpoints", tag=...)``,
with ``checkpoints/latest`` naming the newest tag. Inside DeepSpeed the 0-dim parameters
(``logit_scale``) have shape [1] (``engine/params.py``); the export gives them back
open_clip's shapes, so ``open_clip.create_model(name).load_state_dict(sd, strict=True)`` works.

The tag's manifest is verified and every file is read with ``weights_only=True``
(``training/safe_load.py``); ``--trust-checkpoint`` lifts the latter for a checkpoint whose
origin you trust. ``--out`` is checked first (``outputs.py``): outside the checkpoints read,
and an existing file only if it is an earlier export (``is_export_output``). Problems are one
line on stderr, exit status 2.
"""
import contextlib
import sys
from pathlib import Path
from typing import Dict, Optional

import torch

from .cli_args import ArgumentParser
from .models import CONFIG_DIR, create_model, loss_of_state_dict, state_dict_shapes
from .outputs import check_out_file, replace_file
from .training.atomic import atomic_write_bytes
from .training.checkpoint import LATEST, resolve_tag
from .training.manifest import MANIFEST, verify
from .training.safe_load import (TRUST_FLAG, TRUST_HELP, CheckpointError, deepspeed_reads_weights_only,
                                 load_weights_only)

CHECKPOINTS = "checkpoints"
RECIPE = "recipe.yaml"


def _is_tag_dir(path: Path) -> bool:
    return (path / MANIFEST).is_file() or any(path.glob("*model_states.pt"))


def checkpoints_of(checkpoint_dir) -> Path:
    """The checkpoints that ``--checkpoint`` (as ``resolve_tag_dir`` takes it) reads, which no
    output may go into: RUN/checkpoints for a run; for a tag, the run's ``checkpoints`` it lies
    in, or the tag alone when it was copied elsewhere; the path itself otherwise."""
    path = Path(checkpoint_dir)
    if (path / CHECKPOINTS).is_dir():
        return path / CHECKPOINTS
    if path.is_dir() and _is_tag_dir(path) and path.resolve().parent.name == CHECKPOINTS:
        return path.parent
    return path


def resolve_tag_dir(checkpoint_dir, tag: Optional[str] = None) -> Path:
    """The verified ``<tag>`` directory from RUN/, RUN/checkpoints or RUN/checkpoints/<tag>;
    without ``tag``, the one named by ``latest``. A tag must lie inside the checkpoints
    directory and its manifest must verify (CheckpointError naming the problem otherwise)."""
    path = Path(checkpoint_dir)
    if not path.is_dir():
        raise CheckpointError(f"no checkpoint directory {path}")
    if (path / CHECKPOINTS).is_dir():
        path = path / CHECKPOINTS
    if _is_tag_dir(path):  # already a tag directory
        if tag is not None and tag != path.name:
            raise ValueError(f"{path} is the checkpoint of tag {path.name!r}, not {tag!r}")
        verify(path)
        return path
    return resolve_tag(path, tag or LATEST, flag="--tag")


def run_model_name(checkpoint_dir) -> str:
    """The model name in the run's recipe (``model: {name: ...}`` in RUN/recipe.yaml)."""
    import yaml

    from .config import recipe_yaml
    path = Path(checkpoint_dir).resolve()
    for run_dir in (path, path.parent, path.parent.parent):
        if (run_dir / RECIPE).is_file():
            try:  # the recipe's own YAML rules: no tag builds an object, no alias expands
                name = recipe_yaml.load((run_dir / RECIPE).read_text())["model"]["name"]
            except (yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{run_dir / RECIPE} is not a recipe with model.name "
                                 f"({type(err).__name__}: {str(err).splitlines()[0][:160]})") from None
            if not isinstance(name, str):
                raise ValueError(f"{run_dir / RECIPE}: model.name is not a name: {name!r:.80}")
            return name
    raise FileNotFoundError(f"no {RECIPE} in {path} or the two directories above it")


def _raw_state_dict(tag_dir: Path, trust: bool = False) -> Dict[str, torch.Tensor]:
    """The checkpoint's weights as DeepSpeed holds them, in fp32 (files read weights-only
    unless ``trust``)."""
    if any(tag_dir.glob("*zero_pp_rank_*_optim_states.pt")):
        # ZeRO 1-3: the fp32 master weights are partitioned over the optimizer states.
        from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
        # Its progress chatter stays off stdout.
        with contextlib.redirect_stdout(sys.stderr), deepspeed_reads_weights_only(trust):
            state_dict = get_fp32_state_dict_from_zero_checkpoint(str(tag_dir.parent), tag=tag_dir.name)
    else:
        # ZeRO 0: the whole module, in the training dtype, is in the model states.
        path = tag_dir / "mp_rank_00_model_states.pt"
        states = torch.load(path, map_location="cpu", weights_only=False) if trust else load_weights_only(path)
        state_dict = states["module"]
    return {key: value.float() for key, value in state_dict.items()}


def load_state_dict_from_checkpoint(checkpoint_dir, tag: Optional[str] = None,
                                    trust: bool = False) -> Dict[str, torch.Tensor]:
    """The fp32 state dict of a checkpoint (see ``resolve_tag_dir``), in the shapes of the
    run's open_clip model: a tensor whose element count matches a fresh model's entry is
    reshaped to it, which undoes DeepSpeed's [1]-shaped scalars."""
    tag_dir = resolve_tag_dir(checkpoint_dir, tag)
    raw = _raw_state_dict(tag_dir, trust)
    shapes = state_dict_shapes(run_model_name(tag_dir), loss=loss_of_state_dict(raw))
    state_dict = {}
    for key, value in raw.items():
        shape = shapes.get(key)
        state_dict[key] = value.reshape(shape) if shape is not None and shape.numel() == value.numel() else value
    return state_dict


def is_export_output(path) -> bool:
    """A file ``export`` wrote: torch's weights-only reader finds a flat dict of names to
    tensors in it (mapped, not read: only the pickle's few kilobytes are). A DeepSpeed or
    client state is nested; anything else does not load."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - whatever a file makes the reader raise: not ours
        return False
    return isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                           for k, v in state.items())


def check_out(out_path, checkpoint_dir) -> Path:
    """``--out`` of an export of ``checkpoint_dir`` (outputs.py's rules), before it is read."""
    return check_out_file(out_path, checkpoints_of(checkpoint_dir), "infcl-ds export", is_export_output,
                          example="model.pt")


def export(checkpoint_dir, out_path, tag: Optional[str] = None, trust: bool = False) -> Dict[str, torch.Tensor]:
    """Write the checkpoint's state dict to ``out_path`` with ``torch.save``; return it. Written
    to a temporary file beside it, then renamed: a failed write leaves no partial file."""
    out_path = check_out(out_path, checkpoint_dir)
    state_dict = load_state_dict_from_checkpoint(checkpoint_dir, tag, trust)
    replace_file(out_path, lambda partial: torch.save(state_dict, partial))
    return state_dict


def load_exported(path, name: str) -> torch.nn.Module:
    """The ``name`` open_clip model with an exported state dict loaded (strict), in eval mode."""
    state_dict = torch.load(path, map_location="cpu", weights_only=True)
    model = create_model(name, loss=loss_of_state_dict(state_dict))
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def main(argv=None) -> int:
    """``infcl-ds export --checkpoint DIR --out model.pt [--tag TAG]``."""
    parser = ArgumentParser(prog="infcl-ds export",
                                     description="DeepSpeed checkpoint -> open_clip state dict (torch.save)")
    parser.add_argument("--checkpoint", required=True, help="RUN/, RUN/checkpoints or RUN/checkpoints/<tag>")
    parser.add_argument("--out", required=True, help="output file, e.g. model.pt")
    parser.add_argument("--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    try:
        check_out(args.out, args.checkpoint)  # before the checkpoint is read: a bad --out costs no time
        tag_dir = resolve_tag_dir(args.checkpoint, args.tag)
        state_dict = export(tag_dir, args.out, trust=args.trust_checkpoint)
    except (CheckpointError, FileNotFoundError, ValueError, OSError) as err:
        print(f"infcl-ds export: {err}", file=sys.stderr)
        return 2
    params = sum(value.numel() for value in state_dict.values())
    name = run_model_name(tag_dir)
    try:
        config = write_config_beside(name, args.out)
    except OSError as err:
        print(f"infcl-ds export: writing the config of {name} beside --out failed: {err}", file=sys.stderr)
        return 2
    how = "" if config is None else (f"; open_clip does not ship {name}: call open_clip.add_model_config"
                                     f"({str(config)!r}) before open_clip.create_model({name!r})")
    print(f"exported {name} ({params / 1e6:.2f}M parameters) from {tag_dir} to {args.out}{how}")
    return 0


def write_config_beside(name: str, out_path) -> Optional[Path]:
    """For an architecture of this project (model_configs/, unknown to a plain open_clip), its
    config as ``<name>.json`` beside the exported file, so that the state dict loads in a
    process that never imports infcl_ds; None for open_clip's own architectures."""
    shipped = CONFIG_DIR / f"{name}.json"
    if not shipped.is_file():
        return None
    target = Path(out_path).parent / shipped.name
    atomic_write_bytes(target, shipped.read_bytes())
    return target
