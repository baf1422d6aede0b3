"""What every source returns, the decoding shared by the file-backed sources, and the rule that
replaces unusable samples.

A source is a map-style table of samples: `len(source)`, `source.load(index)` returning a
`Sample` and `source.load_encoded(index)` an `EncodedSample`, or raising `SkipSample` when the
sample cannot be used (undecodable image, empty or missing caption).

Replacement rule: an unusable sample is replaced by the next usable sample in storage order
(index + 1, + 2, ... wrapping around). This keeps every rank's batch at exactly `local_batch`
rows, needs no communication, and is deterministic, so a resume or a different worker count
yields the same batch. The cost: the replacement is seen twice in that epoch (usually a
neighbour in the same shard, so it is also a cheap read). The replaced slot counts as one
skipped sample, whatever number of unusable neighbours had to be stepped over, so summed over
ranks `skipped` is the number of unusable samples the epoch drew.
"""
import io
import json
from dataclasses import dataclass
from typing import Optional, Tuple

from PIL import Image

from .errors import DataError

# A run of unusable samples this long means broken data, not bad luck: fail loudly rather than
# train on copies of the few readable neighbours.
MAX_REPLACEMENT_TRIES = 100


class SkipSample(Exception):
    """This sample is unusable; the message says why."""


@dataclass
class Sample:
    image: Image.Image
    caption: str
    label: Optional[int] = None


@dataclass
class EncodedSample:
    """A sample as stored: the image's file bytes (JPEG/PNG/WebP), decoded only when a chunk
    of the batch reaches the encoder (infcl_ds/data/encoded.py)."""
    image: bytes
    caption: str


def require_image_bytes(data: Optional[bytes]) -> bytes:
    """The image member's bytes; a missing or empty one is unusable. Whether they decode is
    found out later, when the chunk is decoded."""
    if not data:
        raise SkipSample("no image")
    return data


def decode_image(data: Optional[bytes]) -> Image.Image:
    """Encoded bytes (None: no image member) -> a fully decoded RGB PIL image."""
    if data is None:
        raise SkipSample("no image")
    try:
        image = Image.open(io.BytesIO(data))
        return image.convert("RGB")  # forces the decode inside the try
    except Exception as e:  # PIL raises many types on corrupt input (OSError, SyntaxError, zlib.error, ...)
        raise SkipSample(f"undecodable image: {type(e).__name__}: {e}") from e


def decode_caption(data) -> str:
    """bytes or str (None: no caption) -> the stripped caption; empty is unusable."""
    if data is None:
        raise SkipSample("no caption")
    if isinstance(data, bytes):
        try:
            data = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise SkipSample(f"caption is not UTF-8: {e}") from e
    caption = data.strip()
    if not caption:
        raise SkipSample("empty caption")
    return caption


def parse_label(data: Optional[bytes]) -> int:
    """A `.cls` member ("7") or a `.json` member ({"label": 7}) -> 7. Both parse as JSON."""
    if data is None:
        raise SkipSample("no label")
    try:
        value = json.loads(data)
        return int(value["label"] if isinstance(value, dict) else value)
    except (ValueError, KeyError, TypeError) as e:
        raise SkipSample(f"bad label: {e}") from e


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
