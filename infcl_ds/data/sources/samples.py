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
import os
import stat
from dataclasses import dataclass
from typing import Optional, Tuple

from PIL import Image

from ...file_kind import file_kind
from ...shown import shown
from ..errors import DataError

# A run of unusable samples this long means broken data, not bad luck: fail loudly rather than
# train on copies of the few readable neighbours.
MAX_REPLACEMENT_TRIES = 100

# The largest image file read as a sample (MAX_IMAGE_BYTES): a camera's largest JPEG is a
# few tens of MiB; anything bigger is a mistake (a video, a disk image, /dev/zero's kind) that
# would fill the rank's memory before it failed to decode.
MAX_IMAGE_BYTES = 64 << 20

# The largest caption or label read as a sample's (MAX_TEXT_BYTES), in a tar member or a CSV
# cell. The tokenizer keeps 77 tokens (a few hundred bytes), so no real caption comes near it; it
# only bounds what one sample's text may cost: a 48 MB "caption" would be read, decoded and
# tokenized whole for every draw. Generous, so that captions holding a long page's text still train.
MAX_TEXT_BYTES = 256 << 10


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
    of the batch reaches the encoder (infcl_ds/data/decoding/encoded.py)."""
    image: bytes
    caption: str


def require_image_bytes(data: Optional[bytes]) -> bytes:
    """The image member's bytes; a missing or empty one is unusable. Whether they decode is
    found out later, when the chunk is decoded."""
    if not data:
        raise SkipSample("no image")
    return data


def not_a_sample_file(info: os.stat_result) -> Optional[str]:
    """Why a file with this stat cannot be a sample's image, or None: only a regular file of at
    most MAX_IMAGE_BYTES is read (a FIFO blocks its reader, a device never ends)."""
    if not stat.S_ISREG(info.st_mode):
        return f"is {file_kind(info.st_mode)}, not a regular file"
    if info.st_size > MAX_IMAGE_BYTES:
        return f"is {info.st_size / 2**20:.1f} MiB, over the {MAX_IMAGE_BYTES >> 20} MiB limit (MAX_IMAGE_BYTES)"
    return None


def read_image_file(path) -> bytes:
    """A sample's image file's bytes; SkipSample if it is missing, unreadable or not a regular
    file of at most MAX_IMAGE_BYTES. Never blocks and never reads more than the limit: the
    path is checked before opening, opened non-blocking (a FIFO swapped in after the check
    opens without waiting for a writer), checked again on the open file, and read to at most
    one byte past the limit."""
    try:
        why = not_a_sample_file(os.stat(path))
        if why is None:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
            try:
                why = not_a_sample_file(os.fstat(fd))
                if why is None:
                    data = _read_at_most(fd, MAX_IMAGE_BYTES + 1)
                    if len(data) > MAX_IMAGE_BYTES:  # grew after the check
                        why = f"is over the {MAX_IMAGE_BYTES >> 20} MiB limit (MAX_IMAGE_BYTES)"
            finally:
                os.close(fd)
    except OSError as e:
        raise SkipSample(f"cannot read image {shown(path, quote=False)}: {e}") from e
    if why is not None:
        raise SkipSample(f"image {shown(path, quote=False)} {why}")
    return data


def _read_at_most(fd: int, limit: int) -> bytes:
    parts, left = [], limit
    while left > 0:
        part = os.read(fd, min(left, 1 << 20))
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return b"".join(parts)


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
    except (ValueError, KeyError, TypeError, OverflowError) as e:  # OverflowError: 1e400 parses as inf
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
