"""Turn a training run's DeepSpeed checkpoint into open_clip weights.

A run directory holds ``recipe.yaml`` (the model name at ``model: {name: ...}``) and
``checkpoints/<tag>/`` written by ``engine.save_checkpoint(RUN / "checkpoints", tag=...)``,
with ``checkpoints/latest`` naming the newest tag. Inside DeepSpeed the 0-dim parameters
(``logit_scale``) have shape [1] (``engine/params.py``); the export gives them back
open_clip's shapes, so the weights load into open_clip's model with ``strict=True``.

Two formats (``--format``):

- ``open_clip`` (the default): the folder open_clip and the Hugging Face Hub use,
  ``open_clip_config.json`` (``model_cfg``: the architecture and the loss's arguments;
  ``preprocess_cfg``: the size, mean and std the run trained with) and
  ``open_clip_model.safetensors``, plus the tokenizer's files for a Hugging Face tokenizer.
  ``open_clip.create_model_and_transforms("local-dir:DIR")`` and
  ``open_clip.get_tokenizer("local-dir:DIR")`` load it with nothing else, the tiny models of
  ``model_configs/`` included; uploaded as it is, it loads as ``hf-hub:USER/REPO``.
- ``pt``: a ``torch.save`` state dict file; for a tiny model, its config ``<name>.json``
  beside it (``open_clip.add_model_config`` takes it). The default when ``--out`` ends in .pt
  or .pth: a folder with a file's name would surprise.

The tag's manifest is verified and every file is read with ``weights_only=True``
(``checkpoint/safe_load.py``); ``--trust-checkpoint`` lifts the latter for a checkpoint whose
origin you trust. ``--out`` is checked first (``outputs.py``): outside the checkpoints read,
and an existing file or folder only if an earlier export wrote it (``is_export_output``,
``export_folder_files``). Problems are one line on stderr, exit status 2.
"""
import contextlib
import json
import os
import stat
import sys
from pathlib import Path
from typing import Dict, Optional, Set

import torch

from .checkpoint.atomic import atomic_write_bytes
from .checkpoint.manifest import MANIFEST, verify
from .checkpoint.safe_load import (TRUST_FLAG, TRUST_HELP, CheckpointError, deepspeed_reads_weights_only,
                                   load_weights_only)
from .checkpoint.tags import LATEST, resolve_tag
from .cli_args import ArgumentParser
from .models import (CONFIG_DIR, create_model, get_tokenizer, loss_of_state_dict, meta_model, model_config,
                     state_dict_shapes)
from .outputs import OutPathError, check_out_file, check_out_folder, refuse_inside, replace_file, replace_folder
from .run_dir import CHECKPOINTS, RECIPE

WRITTEN_BY = "infcl-ds export"
FORMATS = ("open_clip", "pt")
FILE_SUFFIXES = (".pt", ".pth")  # torch's file names: --out named so is the pt format by default


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
    return _state_dict_of_tag(resolve_tag_dir(checkpoint_dir, tag), trust)


def _state_dict_of_tag(tag_dir: Path, trust: bool) -> Dict[str, torch.Tensor]:
    """``load_state_dict_from_checkpoint`` of a tag directory already resolved and verified."""
    raw = _raw_state_dict(tag_dir, trust)
    shapes = state_dict_shapes(run_model_name(tag_dir), loss=loss_of_state_dict(raw))
    state_dict = {}
    for key, value in raw.items():
        shape = shapes.get(key)
        state_dict[key] = value.reshape(shape) if shape is not None and shape.numel() == value.numel() else value
    return state_dict


def is_export_output(path) -> bool:
    """A file ``export --format pt`` wrote: torch's weights-only reader finds a flat dict of
    names to tensors in it (mapped, not read: only the pickle's few kilobytes are). A DeepSpeed
    or client state is nested; anything else does not load."""
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001 - whatever a file makes the reader raise: not ours
        return False
    return isinstance(state, dict) and all(isinstance(k, str) and isinstance(v, torch.Tensor)
                                           for k, v in state.items())


def _folder_names():
    """open_clip's names for a model folder's config and weights (its constants own them)."""
    from open_clip.constants import HF_CONFIG_NAME, HF_SAFE_WEIGHTS_NAME
    return HF_CONFIG_NAME, HF_SAFE_WEIGHTS_NAME


def export_folder_files(folder) -> Optional[Set[str]]:
    """The files an earlier ``export`` wrote in ``folder``, as its weights' metadata lists
    them (only the safetensors header is read); None when ``folder`` is not such a folder."""
    from safetensors import safe_open
    config, weights = _folder_names()
    path = Path(folder) / weights
    if not path.is_file():  # a FIFO there would block the open
        return None
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
        files = json.loads(metadata.get("files", "null"))
    except Exception:  # noqa: BLE001 - whatever a damaged or foreign file raises: not ours
        return None
    if metadata.get("written_by") != WRITTEN_BY or not isinstance(files, list) \
            or not all(isinstance(name, str) for name in files) or not {config, weights} <= set(files):
        return None
    return set(files)


def out_format(out_path, fmt: Optional[str] = None) -> str:
    """``--format`` as given; without it ``pt`` for an ``--out`` ending in .pt or .pth,
    ``open_clip`` otherwise."""
    if fmt is not None:
        if fmt not in FORMATS:
            raise ValueError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
        return fmt
    return "pt" if Path(out_path).suffix in FILE_SUFFIXES else "open_clip"


def check_out(out_path, checkpoint_dir, fmt: Optional[str] = None) -> Path:
    """``--out`` of an export of ``checkpoint_dir`` (outputs.py's rules), before it is read."""
    protected = checkpoints_of(checkpoint_dir)
    if out_format(out_path, fmt) == "pt":
        return check_out_file(out_path, protected, WRITTEN_BY, is_export_output, example="model.pt")
    out = Path(out_path)
    refuse_inside(out, protected)
    if out.is_file() and is_export_output(out):  # ours, but a file: a folder does not replace it unasked
        raise OutPathError(f"--out {out} is a state dict file from {WRITTEN_BY} --format pt: pass --format pt to "
                           f"replace it, or name a folder for the open_clip format")
    return check_out_folder(out, protected, WRITTEN_BY, export_folder_files)


def config_beside(name: str, out_path) -> Optional[Path]:
    """Where ``--format pt`` puts the config of a model of this project (model_configs/,
    unknown to a plain open_clip): ``<name>.json`` beside ``--out``; None for open_clip's own
    architectures."""
    shipped = CONFIG_DIR / f"{name}.json"
    return Path(out_path).parent / shipped.name if shipped.is_file() else None


def check_config_beside(name: str, out_path) -> None:
    """The config beside ``--out`` replaces only a file holding that same config: what an
    earlier export wrote, or an identical copy; any other file of that name is kept."""
    target = config_beside(name, out_path)
    if target is None or not os.path.lexists(target):
        return
    if not (target.is_file() and target.read_bytes() == (CONFIG_DIR / target.name).read_bytes()):
        raise OutPathError(f"{target} exists and was not written by {WRITTEN_BY}: not replaced (--format pt writes "
                           f"the config of {name} there, beside --out); remove it or write --out elsewhere")


def write_config_beside(name: str, out_path) -> Optional[Path]:
    """For an architecture of this project, its config as ``config_beside`` names it, so that
    the state dict loads in a process that never imports infcl_ds; None for open_clip's own."""
    target = config_beside(name, out_path)
    if target is not None:
        atomic_write_bytes(target, (CONFIG_DIR / target.name).read_bytes())
    return target


def write_model_folder(folder: Path, state_dict: Dict[str, torch.Tensor], name: str, source: Path) -> None:
    """Fill ``folder`` as open_clip's ``save_for_hf`` lays a model out: its
    ``save_config_for_hf`` writes the config, with the image size added to the preprocessing;
    a Hugging Face tokenizer saves its files (``local-dir:`` loads it from the folder); the
    weights go last, their metadata naming the writer and every file (``export_folder_files``)."""
    from open_clip.push_to_hf_hub import save_config_for_hf
    from safetensors import SafetensorError
    from safetensors.torch import save_file
    config_name, weights_name = _folder_names()
    loss = loss_of_state_dict(state_dict)
    model = meta_model(name, loss)  # its preprocessing config is the one the run trained with
    model.load_state_dict(state_dict, strict=True, assign=True)  # keys and shapes as open_clip builds them
    save_config_for_hf(model, folder / config_name, model_config=model_config(name, loss))
    _add_image_size(folder / config_name, model.visual.preprocess_cfg["size"])
    tokenizer = get_tokenizer(name)
    if hasattr(tokenizer, "save_pretrained"):  # open_clip's SimpleTokenizer has no files to save
        tokenizer.save_pretrained(str(folder))
    metadata = {"format": "pt", "written_by": WRITTEN_BY, "model": name, "checkpoint": str(source),
                "files": json.dumps(sorted(os.listdir(folder)) + [weights_name])}
    try:
        save_file({key: value.contiguous() for key, value in state_dict.items()}, folder / weights_name,
                  metadata=metadata)
    except SafetensorError as err:  # a full disk is one of these: the same one line as an OSError
        raise OSError(str(err)) from None
    # safetensors writes through a private temporary file (mode 0600): the weights get the
    # config's mode, which the umask set, so whoever can read the folder can load it.
    os.chmod(folder / weights_name, stat.S_IMODE((folder / config_name).stat().st_mode))


def _add_image_size(config_path: Path, size) -> None:
    """open_clip reads ``preprocess_cfg.size`` but its writer leaves it out; the folder states
    the size the run trained with."""
    config = json.loads(config_path.read_text())
    config["preprocess_cfg"]["size"] = size
    config_path.write_text(json.dumps(config, indent=2))


def export(checkpoint_dir, out_path, tag: Optional[str] = None, trust: bool = False,
           fmt: Optional[str] = None) -> Dict[str, torch.Tensor]:
    """Write the checkpoint's state dict to ``out_path`` in ``fmt`` (``out_format``); return
    it. Everything is checked before the checkpoint is read, then written beside ``out_path``
    and renamed into place: a failed write leaves no partial file or folder."""
    return _export(checkpoint_dir, out_path, tag, trust, fmt)[2]


def _export(checkpoint_dir, out_path, tag, trust, fmt):
    """``export``, returning (the tag directory, the model name, the state dict)."""
    fmt = out_format(out_path, fmt)
    out = check_out(out_path, checkpoint_dir, fmt)  # first: a bad --out costs no time
    tag_dir = resolve_tag_dir(checkpoint_dir, tag)  # verified once: its digests read every file
    name = run_model_name(tag_dir)
    if fmt == "pt":
        check_config_beside(name, out)
    state_dict = _state_dict_of_tag(tag_dir, trust)
    if fmt == "open_clip":
        replace_folder(out, lambda partial: write_model_folder(partial, state_dict, name, tag_dir))
        return tag_dir, name, state_dict
    replace_file(out, lambda partial: torch.save(state_dict, partial))
    try:
        write_config_beside(name, out)
    except OSError as err:
        raise OSError(f"writing the config of {name} beside --out failed: {err}") from None
    return tag_dir, name, state_dict


def load_exported(path, name: Optional[str] = None) -> torch.nn.Module:
    """An exported model in eval mode, its weights loaded strictly: a folder through open_clip's
    ``local-dir:``; a state dict file into the ``name`` model."""
    if Path(path).is_dir():
        import open_clip
        return open_clip.create_model(f"local-dir:{path}").eval()
    state_dict = torch.load(path, map_location="cpu", weights_only=True)
    model = create_model(name, loss=loss_of_state_dict(state_dict))
    model.load_state_dict(state_dict, strict=True)
    return model.eval()


def _loads_how(fmt: str, name: str, out) -> str:
    if fmt == "open_clip":
        return f": open_clip.create_model_and_transforms('local-dir:{out}') loads it"
    config = config_beside(name, out)
    return "" if config is None else (f"; open_clip does not ship {name}: call open_clip.add_model_config"
                                      f"({str(config)!r}) before open_clip.create_model({name!r})")


def main(argv=None) -> int:
    """``infcl-ds export --checkpoint DIR --out DIR|model.pt [--format open_clip|pt] [--tag TAG]``."""
    parser = ArgumentParser(prog="infcl-ds export",
                            description="DeepSpeed checkpoint -> an open_clip model folder (or a state dict file)")
    parser.add_argument("--checkpoint", required=True, help="RUN/, RUN/checkpoints or RUN/checkpoints/<tag>")
    parser.add_argument("--out", required=True, help="the folder to write (a file with --format pt)")
    parser.add_argument("--format", choices=FORMATS, default=None,
                        help="open_clip: the folder open_clip loads as local-dir:/hf-hub: (the default); pt: a "
                             "torch.save state dict, a tiny model's config beside it (the default for an --out "
                             "ending in .pt or .pth)")
    parser.add_argument("--tag", default=None, help="checkpoint tag (default: the one in 'latest')")
    parser.add_argument(TRUST_FLAG, action="store_true", help=TRUST_HELP)
    args = parser.parse_args(argv)
    fmt = out_format(args.out, args.format)
    try:
        tag_dir, name, state_dict = _export(args.checkpoint, args.out, args.tag, args.trust_checkpoint, fmt)
    except (CheckpointError, FileNotFoundError, ValueError, OSError) as err:
        print(f"infcl-ds export: {err}", file=sys.stderr)
        return 2
    params = sum(value.numel() for value in state_dict.values())
    print(f"exported {name} ({params / 1e6:.2f}M parameters) from {tag_dir} to {args.out}"
          f"{_loads_how(fmt, name, args.out)}")
    return 0
