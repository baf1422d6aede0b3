"""What every source returns, and the decoding shared by the file-backed sources.

A source is a map-style table of samples: `len(source)` and `source.load(index)` returning a
`Sample`, or raising `SkipSample` when the sample cannot be used (undecodable image, empty or
missing caption). Skipping is decided here, replacing is decided by the dataset.
"""
import io
import json
from dataclasses import dataclass
from typing import Optional, Protocol

from PIL import Image


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


class Source(Protocol):
    def __len__(self) -> int: ...

    def load(self, index: int) -> Sample: ...

    def load_encoded(self, index: int) -> EncodedSample: ...


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
