"""The models the trainer builds: open_clip's architectures plus the tiny ones shipped in
``model_configs/`` (CPU tests and the quickstart). Models are always created from scratch
(``pretrained=None``), so nothing is ever downloaded."""
import contextlib
import logging
import math
from pathlib import Path
from typing import Dict, Optional

import torch

CONFIG_DIR = Path(__file__).parent / "model_configs"


def register_tiny_configs() -> None:
    """Make open_clip know the configs in ``model_configs/``; a no-op once they are known
    (``add_model_config`` would otherwise grow open_clip's search path on every call)."""
    import open_clip
    shipped = {path.stem for path in CONFIG_DIR.glob("*.json")}
    if not shipped <= set(open_clip.list_models()):
        open_clip.add_model_config(CONFIG_DIR)


class _RandomInitWarning(logging.Filter):
    """Drops open_clip's "No pretrained weights loaded for model ... Model initialized
    randomly." (a ``logging.warning`` on the root logger, its factory's). Our models start
    random on purpose: training initialises them so, eval and export load a checkpoint into
    them right after; the line would tell a reader that the checkpoint was not used."""
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("No pretrained weights loaded for model")


@contextlib.contextmanager
def _no_random_init_warning():
    """open_clip's random-initialisation warning silenced while building a model, nothing else
    (other warnings of the build, and of other threads meanwhile, still show)."""
    quiet = _RandomInitWarning()
    logging.root.addFilter(quiet)
    try:
        yield
    finally:
        logging.root.removeFilter(quiet)


LOSSES = ("clip", "siglip")
# The sigmoid loss's initial logit scale and bias (SigLIP paper; open_clip's --siglip).
SIGLIP_INIT = {"init_logit_scale": math.log(10.0), "init_logit_bias": -10.0}


def _loss_kwargs(loss: str) -> dict:
    """The open_clip model arguments that ``loss`` adds to the architecture's config."""
    if loss not in LOSSES:
        raise ValueError(f"loss must be one of {LOSSES}, got {loss!r}")
    return dict(SIGLIP_INIT) if loss == "siglip" else {}


def create_model(name: str, *, seed: Optional[int] = None, loss: str = "clip") -> torch.nn.Module:
    """A randomly initialised open_clip model, in fp32 on the CPU. With ``seed`` the
    initialisation is reproducible and the caller's global RNG state is left untouched.
    loss="siglip": the model gets a ``logit_bias`` and SigLIP's initial scale and bias
    (log 10 and -10, as open_clip's training does with --siglip), whatever the architecture."""
    import open_clip
    kwargs = _loss_kwargs(loss)
    register_tiny_configs()
    with torch.random.fork_rng(devices=[], enabled=seed is not None):
        if seed is not None:
            torch.manual_seed(seed)
        # pretrained_text=False: an HF text tower would otherwise fetch its base weights.
        with _no_random_init_warning():
            return open_clip.create_model(name, pretrained=None, pretrained_text=False, **kwargs)


def meta_model(name: str, loss: str = "clip") -> torch.nn.Module:
    """The ``create_model`` model on the meta device: its structure, shapes and preprocessing
    config with no memory and no initialisation cost, even for the largest architectures."""
    import open_clip
    kwargs = _loss_kwargs(loss)
    register_tiny_configs()
    with _no_random_init_warning(), torch.device("meta"):
        return open_clip.create_model(name, pretrained=None, pretrained_text=False, device="meta", **kwargs)


def state_dict_shapes(name: str, loss: str = "clip") -> Dict[str, torch.Size]:
    """The shape of every state-dict entry of a fresh ``name`` model (``loss`` as for
    create_model)."""
    return {key: value.shape for key, value in meta_model(name, loss).state_dict().items()}


def model_config(name: str, loss: str = "clip") -> dict:
    """The open_clip config (a ``model_cfg``) from which open_clip alone builds what
    ``create_model(name, loss=loss)`` builds: the architecture's config, the loss's arguments
    in it. A model folder carries it, so that it loads where infcl_ds is not installed."""
    import open_clip
    kwargs = _loss_kwargs(loss)
    register_tiny_configs()
    config = open_clip.get_model_config(name)  # a copy
    if config is None:
        raise ValueError(f"open_clip has no model config {name!r}")
    return {**config, **kwargs}


def loss_of_state_dict(state_dict) -> str:
    """The loss a model was trained with, from its weights: SigLIP models carry a logit_bias."""
    return "siglip" if "logit_bias" in state_dict else "clip"


def model_info(model: torch.nn.Module) -> dict:
    """What the data pipeline needs to feed ``model``: square image size, normalisation,
    token context length, and the width of the joint embedding."""
    preprocess = model.visual.preprocess_cfg
    height, width = (preprocess["size"],) * 2 if isinstance(preprocess["size"], int) else preprocess["size"]
    if height != width:
        raise ValueError(f"only square image sizes are supported, got {preprocess['size']}")
    return {"image_size": int(height), "mean": tuple(preprocess["mean"]), "std": tuple(preprocess["std"]),
            "context_length": int(model.context_length), "embed_dim": int(model.visual.output_dim)}


def get_tokenizer(name: str):
    """open_clip's tokenizer for ``name``, padding/truncating to its config's context length."""
    import open_clip
    register_tiny_configs()
    return open_clip.get_tokenizer(name)
