"""The input side of a plan with encoded host batches: bytes per stored image, and whether the
decode processes keep up with the step.

An encoded local batch is decoded once per engine pass, twice per step (less the chunks kept
decoded on the GPU between the passes, data.keep_decoded_gib), so a rank needs up to
2 x local batch / step decodes per second from its data.decode_workers processes.
"""
from dataclasses import dataclass
from typing import Tuple

from ..config import Recipe
from ..resources import read_json
from .memory import DEFAULT_IMAGE_BYTES

# Decodes per second per decode process while a step trains, per data.decoder (open_clip's train
# transform, JPEG shards of 256-384 px): measured, with their source, in calibration/decode_rates.json.
_RATES = read_json("calibration", "decode_rates.json")
DECODE_RATES_PER_WORKER = {"pil": float(_RATES["pil_per_process"]),
                           "torchvision": float(_RATES["torchvision_per_process"])}
# Shards read to measure the stored image size (their headers only: a few ms each).
SHARDS_SAMPLED = 4


def image_bytes_per_sample(recipe: Recipe) -> Tuple[int, str]:
    """(mean stored bytes of an image, where the figure comes from): data.image_bytes, else the
    image members of the first shards when they are readable here, else DEFAULT_IMAGE_BYTES."""
    if recipe.data.image_bytes:
        return recipe.data.image_bytes, "data.image_bytes"
    if recipe.data.source == "webdataset" and recipe.data.train:
        from ..data.errors import DataError
        from ..data.tar_index import IMAGE, TarIndex
        from ..data.webdataset_source import expand_shards
        try:
            shards = expand_shards(recipe.data.train)[:SHARDS_SAMPLED]
            sizes = TarIndex(shards).spans[:, IMAGE, 1]
        except (DataError, OSError):
            pass
        else:
            sizes = sizes[sizes > 0]
            if len(sizes):
                return int(sizes.mean()), f"measured on {len(shards)} shard(s)"
    return DEFAULT_IMAGE_BYTES, "assumed; set data.image_bytes"


@dataclass(frozen=True)
class InputRate:
    needed: float       # decodes per second per rank for the planned step
    available: float    # what the rank's decode processes deliver
    workers: int
    per_worker: float   # decodes per second of one process with the recipe's data.decoder

    @property
    def binds(self) -> bool:
        return self.needed > self.available

    def step_seconds(self, compute_s: float) -> float:
        """The step when decoding binds: every sample decoded twice at the available rate."""
        return max(compute_s, compute_s * self.needed / self.available) if self.available else float("inf")

    def workers_needed(self) -> int:
        return int(-(-self.needed // self.per_worker))


def input_rate(recipe: Recipe, local_batch: int, compute_s: float, kept_rows: int = 0) -> InputRate:
    """Decodes a step needs: every row in the first pass, and again in the second unless its
    chunk was kept decoded on the GPU (`kept_rows`, data.keep_decoded_gib)."""
    workers = recipe.data.decode_workers
    per_worker = DECODE_RATES_PER_WORKER[recipe.data.decoder]
    # 0 workers: decoding runs in the training process, between the chunks (nothing overlaps).
    available = max(workers, 1) * per_worker
    decodes = 2 * local_batch - kept_rows
    return InputRate(needed=decodes / compute_s if compute_s > 0 else 0.0, available=available, workers=workers,
                     per_worker=per_worker)
