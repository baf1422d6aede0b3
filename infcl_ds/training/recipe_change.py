"""Which recipe changes between a checkpoint and its resume alter the run's trajectory.

A resumed run continues exactly only with the recipe it was saved with: a new
``schedule.steps`` bends the learning-rate curve mid-run, a new batch, optimizer, model or
data order makes the saved state meaningless or silently different. Those keys are compared
at resume, and a change is refused unless ``--allow-recipe-change`` (then it is logged).
Keys that only change how the same steps are computed or reported (chunk size, workers,
logging, evaluation, checkpoint cadence, output directory, timeout) may change freely.
"""
from typing import Any, Dict, List, Optional

import yaml

from ..checkpoint.safe_load import CheckpointError
from ..config import recipe_yaml
from ..shown import shown

TRAJECTORY_KEYS = (
    "model.name", "model.seed", "model.loss", "model.float8",
    "data.source", "data.train", "data.csv_img_key", "data.csv_caption_key", "data.csv_separator",
    "data.synthetic_size", "data.augment",
    "batch.global",
    "optimizer",
    "schedule",
    "precision.dtype",
    "zero.stage",
)
# Keys newer than some checkpoints: absent from a saved recipe means the value it ran with.
ABSENT_MEANS = {"model.float8": False}


def _lookup(tree: Dict[str, Any], dotted: str):
    node = tree
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return None
        node = node[key]
    return node


def _leaves(value, prefix: str) -> Dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for key, sub in value.items():
            out.update(_leaves(sub, f"{prefix}.{key}"))
        return out
    return {prefix: value}


def trajectory_changes(saved_yaml: str, current_yaml: str, saved_from: str = "the checkpoint's recipe.yaml") -> List[str]:
    """``["schedule.steps: 12 -> 20", ...]``: the trajectory keys whose values differ. The saved
    recipe is read by the recipe's own YAML rules (no tag builds an object, no alias expands);
    one that breaks them, or is not a mapping, is a CheckpointError naming ``saved_from``."""
    try:
        saved = recipe_yaml.load(saved_yaml) or {}
    except yaml.YAMLError as err:
        raise CheckpointError(f"{saved_from} is not a recipe: {str(err).splitlines()[0][:200]}") from None
    if not isinstance(saved, dict):
        raise CheckpointError(f"{saved_from} is not a recipe: a {type(saved).__name__}, not a mapping")
    current = recipe_yaml.load(current_yaml) or {}
    changes = []
    for key in TRAJECTORY_KEYS:
        before, after = _leaves(_lookup(saved, key), key), _leaves(_lookup(current, key), key)
        for leaf in sorted(set(before) | set(after)):
            was, now = (ABSENT_MEANS.get(leaf) if v is None else v for v in (before.get(leaf), after.get(leaf)))
            if was != now:
                changes.append(f"{leaf}: {shown(was, 60)} -> {shown(now, 60)}")
    return changes


# data.decoder before `auto` was its default: a saved recipe without it ran with this.
DECODER_BEFORE_AUTO = "pil"


def decoder_change(saved_yaml: str, current_yaml: str) -> Optional[str]:
    """'pil -> hybrid' where a resume decodes with another data.decoder than the checkpoint's run
    (`auto` resolves per node, and a run resumes on any): the same rows in the same order, their
    pixels within about half a uint8 level of the other decoder's, so not a trajectory change,
    but said. A saved recipe without data.decoder ran with DECODER_BEFORE_AUTO. None where it is
    the same (both recipes already checked by trajectory_changes)."""
    was = _lookup(recipe_yaml.load(saved_yaml) or {}, "data.decoder")
    now = _lookup(recipe_yaml.load(current_yaml) or {}, "data.decoder")
    was = DECODER_BEFORE_AUTO if was is None else was
    if was == "auto" or now is None or was == now:
        return None
    return f"{was} -> {now}"


SHOWN_CHANGES = 5


def summary(changes: List[str]) -> str:
    """The changes as one line: the first SHOWN_CHANGES, then how many more (a new model or
    data list changes many leaves at once)."""
    more = len(changes) - SHOWN_CHANGES
    return "; ".join(changes[:SHOWN_CHANGES]) + (f"; and {more} more" if more > 0 else "")
