"""`build_eval_data`: a labelled WebDataset split (the `digits` layout) for zero-shot
classification and retrieval, in a fixed order, every usable sample once."""
import json
import string
from pathlib import Path
from typing import List, Optional, Tuple

import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from torch.utils.data import DataLoader, Dataset

from ..shown import shown
from .decoding.batch import normalize
from .decoding.transforms import uint8_image_transform
from .errors import DataError
from .sources.samples import SkipSample
from .sources.webdataset_source import TarSource


def labelled_split(spec) -> Tuple[TarSource, dict]:
    """An evaluation split's samples, every one with a label member (TarSource.require_labels),
    and its zero-shot prompts (find_zeroshot): what evaluation and `infcl-ds data check` open."""
    source = TarSource(spec)
    source.require_labels()
    return source, find_zeroshot(source.index.shards)


def find_zeroshot(shards: List[Path]) -> dict:
    """zeroshot.json beside the first shard or one level up (DIR/test/.. = DIR), checked
    (check_prompts)."""
    folder = shards[0].parent
    path = next((p for p in (folder / "zeroshot.json", folder.parent / "zeroshot.json") if p.is_file()), None)
    if path is None:
        raise DataError(f"no zeroshot.json in {shown(folder, quote=False)} or {shown(folder.parent, quote=False)}")
    try:
        prompts = json.loads(path.read_bytes())
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError; nesting too deep recurses
        why = shown(str(e), quote=False) or type(e).__name__
        raise DataError(f"{shown(path, quote=False)} is not valid JSON: {why}") from None
    check_prompts(path, prompts)
    return prompts


def check_prompts(path: Path, prompts) -> None:
    """DataError naming the file and key unless `prompts` is {"classnames": a non-empty list of
    non-empty strings, "templates": a non-empty list of strings with one "{}" slot each}.
    Anything looser evaluates silently wrong: a string of class names is iterated as its
    letters, and open_clip's classifier fills a template with `template.format(classname)`."""
    if not isinstance(prompts, dict):
        raise DataError(f"{shown(path, quote=False)}: the top level must be an object with 'classnames' and "
                        f"'templates', not {_kind(prompts)}")
    for key, why in (("classnames", _classnames_problem), ("templates", _templates_problem)):
        problem = why(prompts.get(key))
        if problem:
            raise DataError(f"{shown(path, quote=False)}: '{key}' {problem}")


def _classnames_problem(names) -> Optional[str]:
    if not isinstance(names, list) or not names:
        return f"must be a non-empty list of class names, not {_kind(names)}"
    for i, name in enumerate(names):
        if not isinstance(name, str) or not name.strip():
            return f"must hold non-empty strings: item {i} is {_kind(name)}"
    return None


def _templates_problem(templates) -> Optional[str]:
    if not isinstance(templates, list) or not templates:
        return "must be a non-empty list of templates such as \"a photo of a {}.\", not " + _kind(templates)
    for i, template in enumerate(templates):
        if not isinstance(template, str):
            return f"must hold strings: item {i} is {_kind(template)}"
        slots = _slots(template)
        if slots != ["{}"]:
            found = shown(", ".join(slots), quote=False) if slots else "none"
            return f"must each hold exactly one '{{}}' slot: item {i} {shown(template)} has {found}"
    return None


def _slots(template: str) -> List[str]:
    """The replacement fields of a str.format template as written ("{}", "{name}", "{0:>3}"),
    or the parse error: a lone brace."""
    try:
        parsed = list(string.Formatter().parse(template))
    except ValueError as e:
        return [f"a stray brace ({e})"]
    return ["{" + name + (f"!{conv}" if conv else "") + (f":{spec}" if spec else "") + "}"
            for _, name, spec, conv in parsed if name is not None]


def _kind(value) -> str:
    """A JSON value for a message: a string or number shown (bounded), else its JSON type."""
    if isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return f"{'a string' if isinstance(value, str) else 'a number'} {shown(value)}"
    return {dict: "an object", list: "an empty list" if value == [] else "a list", bool: "a boolean",
            type(None): "missing or null"}.get(type(value), type(value).__name__)


class EvalDataset(Dataset):
    """index -> (uint8 image, caption, label), or None for an unusable sample (dropped, not
    replaced: evaluation has no fixed batch size to keep). A label that is none of the
    `classes` zero-shot classes makes a sample unusable too: it could only count as a miss."""

    def __init__(self, source: TarSource, transform, classes: int):
        self.source, self.transform, self.classes = source, transform, classes

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        try:
            sample = self.source.load(index, with_label=True)
        except SkipSample:
            return None
        if not 0 <= sample.label < self.classes:
            return None
        return self.transform(sample.image), sample.caption, sample.label


class EvalCollate:
    """Usable samples -> (normalised float images, int64 labels, int64 texts, dropped count)."""

    def __init__(self, tokenizer, mean, std):
        self.tokenizer, self.mean, self.std = tokenizer, mean, std

    def __call__(self, items):
        usable = [item for item in items if item is not None]
        dropped = len(items) - len(usable)
        if not usable:
            return None, None, None, dropped
        images, captions, labels = zip(*usable)
        return (normalize(torch.stack(images), self.mean, self.std), torch.tensor(labels, dtype=torch.int64),
                self.tokenizer(list(captions)).to(torch.int64), dropped)


class EvalData:
    """Iterate for (images [n, 3, H, W] float normalised, labels [n], texts [n, ctx]) on the CPU;
    `skipped` counts the unusable samples dropped by the latest pass."""

    def __init__(self, source: TarSource, prompts: dict, transform, collate: EvalCollate,
                 batch_size: int, workers: int):
        self.classnames: List[str] = list(prompts["classnames"])
        self.templates: List[str] = list(prompts["templates"])
        self.num_samples = len(source)
        self.skipped = 0
        self._loader_args = dict(dataset=EvalDataset(source, transform, len(self.classnames)), batch_size=batch_size,
                                 shuffle=False, collate_fn=collate, num_workers=workers)

    def __iter__(self):
        self.skipped = 0
        for images, labels, texts, dropped in DataLoader(**self._loader_args):
            self.skipped += dropped
            if images is not None:
                yield images, labels, texts


def build_eval_data(spec_or_path, *, image_size: int, tokenizer, batch_size: int = 256, workers: int = 2,
                    mean=OPENAI_DATASET_MEAN, std=OPENAI_DATASET_STD) -> EvalData:
    """A split directory / shard spec, or a dict {"path": ..., "workers": ...} -> EvalData.
    Samples need a .cls or .json ("label") member; zeroshot.json lies beside or above them.
    Images are normalised with mean/std (the model's; OpenAI CLIP's by default)."""
    if isinstance(spec_or_path, dict):
        if spec_or_path.get("path") is None:
            raise DataError("eval data spec needs a 'path' (a split directory or shard spec)")
        workers = spec_or_path.get("workers", workers)
        spec_or_path = spec_or_path["path"]
    source, prompts = labelled_split(spec_or_path)
    return EvalData(source, prompts, uint8_image_transform(image_size, augment=False),
                    EvalCollate(tokenizer, mean, std), batch_size, workers)
