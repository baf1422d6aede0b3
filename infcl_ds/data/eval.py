"""`build_eval_data`: a labelled WebDataset split (the `digits` layout) for zero-shot
classification and retrieval, in a fixed order, every usable sample once."""
import json
from pathlib import Path
from typing import List

import torch
from open_clip.constants import OPENAI_DATASET_MEAN, OPENAI_DATASET_STD
from torch.utils.data import DataLoader, Dataset

from .batch import normalize
from .errors import DataError
from .samples import SkipSample
from .transforms import uint8_image_transform
from .webdataset_source import TarSource


def find_zeroshot(shards: List[Path]) -> dict:
    """zeroshot.json beside the first shard or one level up (DIR/test/.. = DIR)."""
    folder = shards[0].parent
    path = next((p for p in (folder / "zeroshot.json", folder.parent / "zeroshot.json") if p.is_file()), None)
    if path is None:
        raise DataError(f"no zeroshot.json in {folder} or {folder.parent}")
    try:
        prompts = json.loads(path.read_text())
    except ValueError as e:
        raise DataError(f"{path} is not valid JSON: {e}") from e
    templates = prompts.get("templates") or []
    if not prompts.get("classnames") or not templates or any("{}" not in t for t in templates):
        raise DataError(f"{path} needs non-empty 'classnames' and 'templates', each template with '{{}}'")
    return prompts


class EvalDataset(Dataset):
    """index -> (uint8 image, caption, label), or None for an unusable sample (dropped, not
    replaced: evaluation has no fixed batch size to keep)."""

    def __init__(self, source: TarSource, transform):
        self.source, self.transform = source, transform

    def __len__(self) -> int:
        return len(self.source)

    def __getitem__(self, index: int):
        try:
            sample = self.source.load(index, with_label=True)
        except SkipSample:
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
        self._loader_args = dict(dataset=EvalDataset(source, transform), batch_size=batch_size,
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
    source = TarSource(spec_or_path)
    source.require_labels()
    prompts = find_zeroshot(source.index.shards)
    return EvalData(source, prompts, uint8_image_transform(image_size, augment=False),
                    EvalCollate(tokenizer, mean, std), batch_size, workers)
