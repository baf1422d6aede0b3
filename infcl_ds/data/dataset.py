"""The training dataset: (epoch, index) -> a transformed sample, with unusable samples replaced.

Replacement rule: an unusable sample (undecodable image, empty or missing caption) is replaced
by the next usable sample in storage order (index + 1, + 2, ... wrapping around). This keeps every
rank's batch at exactly `local_batch` rows, needs no communication, and is deterministic, so a
resume or a different worker count yields the same batch. The cost: the replacement is seen
twice in that epoch (usually a neighbour in the same shard, so it is also a cheap read). The
replaced slot counts as one skipped sample, whatever number of unusable neighbours had to be
stepped over, so summed over ranks `skipped` is the number of unusable samples the epoch drew.
"""
from typing import List, Tuple

import torch
from torch.utils.data import Dataset

from .errors import DataError
from .samples import Sample, SkipSample, Source
from .transforms import sample_seed, seeded_cpu_generator

# A run of unusable samples this long means broken data, not bad luck: fail loudly rather than
# train on copies of the few readable neighbours.
MAX_REPLACEMENT_TRIES = 100


class TrainDataset(Dataset):
    """Map-style dataset over a source; an item is (epoch, index), as RankBatchSampler yields.

    Returns (uint8 image [3, H, W], caption, skipped), skipped being 0 or 1.
    """

    def __init__(self, source: Source, transform, seed: int):
        self.source, self.transform, self.seed = source, transform, seed

    def __getitem__(self, item: Tuple[int, int]):
        epoch, index = item
        sample, skipped = load_or_replace(self.source.load, len(self.source), index)
        return transform_image(self.transform, sample.image, self.seed, epoch, index), sample.caption, skipped


def transform_image(transform, image, seed: int, epoch: int, index: int) -> torch.Tensor:
    """The slot's augmented uint8 image. Seeded by the slot (epoch, index): the crop depends on
    nothing a resume, a worker count or a second decode of the same bytes could change."""
    with seeded_cpu_generator(sample_seed(seed, epoch, index)):  # torchvision draws from it
        return transform(image)


def load_or_replace(load, n: int, index: int) -> Tuple[Sample, int]:
    """`load(index)`, or the next usable sample in storage order (the module's rule)."""
    tries = min(MAX_REPLACEMENT_TRIES, n)
    for offset in range(tries):
        try:
            return load((index + offset) % n), int(offset > 0)
        except SkipSample as e:
            reason = e
    raise DataError(f"{tries} samples from index {index} on (of {n}) are all unusable, "
                    f"the last because: {reason}")


class Collate:
    """Samples -> (images uint8 [n, 3, H, W], texts int64 [n, ctx], skipped count).

    Tokenizing the whole batch in one call, inside the worker, is the cheap place for it.
    """

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer

    def __call__(self, items: List[tuple]):
        images, captions, skipped = zip(*items)
        texts = self.tokenizer(list(captions)).to(torch.int64)
        return torch.stack(images), texts, sum(skipped)
