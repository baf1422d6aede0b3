"""The recipe's `data` section -> a source (samples.py says what a source is): WebDataset shards
(webdataset_source.py), a CSV of image paths and captions, or synthetic samples."""
import csv
import io
from pathlib import Path

import numpy as np
from PIL import Image

from ..config.recipe import DataSection
from ..shown import shown
from .errors import DataError
from .samples import EncodedSample, Sample, SkipSample, decode_caption, decode_image, read_image_file, require_image_bytes
from .webdataset_source import TarSource

def build_source(data: DataSection, image_size: int):
    """Open the data section's source (its keys and choices checked by the recipe); a problem
    with its files is a DataError naming the path."""
    if data.source == "synthetic":
        return SyntheticSource(data.synthetic_size, image_size)
    if data.source == "webdataset":
        return TarSource(data.train)
    return CsvSource(data.train, img_key=data.csv_img_key, caption_key=data.csv_caption_key,
                     separator=data.csv_separator)


def csv_separator(path: Path, separator=None) -> str:
    """DataError if the CSV does not exist; else `separator`, by default a tab for .tsv, a comma otherwise."""
    if not path.is_file():
        raise DataError(f"CSV file {path} does not exist")
    if separator is None:
        separator = "\t" if path.suffix.lower() == ".tsv" else ","
    return separator


# Python's csv module refuses a field over 131,072 characters by default: a long caption (a
# scraped page) would pass the header check and then stop the trainer mid-read. Captions are
# cut to the tokenizer's context anyway; this bounds what one field may hold in memory.
MAX_CSV_FIELD_CHARS = 1 << 20
# A UTF-8 byte order mark (Excel's "CSV UTF-8") is not part of the first column's name.
CSV_ENCODING = "utf-8-sig"


def csv_rows(path: Path, separator: str):
    """(reader, rows) of a CSV read as the trainer and `data check` both read it: UTF-8 with
    or without a byte order mark, fields of up to MAX_CSV_FIELD_CHARS; a malformed row is a
    DataError naming the file and line. A context manager: ``with csv_rows(p, sep) as rows``."""
    return _CsvRows(Path(path), separator)


class _CsvRows:
    def __init__(self, path: Path, separator: str):
        self.path, self.separator = path, separator

    def __enter__(self):
        csv.field_size_limit(MAX_CSV_FIELD_CHARS)
        self._file = open(self.path, newline="", encoding=CSV_ENCODING)
        self.reader = csv.DictReader(self._file, delimiter=self.separator)
        return self

    def __exit__(self, *exc):
        self._file.close()

    def __iter__(self):
        try:
            yield from self.reader
        except csv.Error as err:
            why = str(err)
            if "field larger than field limit" in why:
                why = (f"a field is longer than {MAX_CSV_FIELD_CHARS:,} characters (captions are cut to the "
                       "tokenizer's context anyway: shorten it)")
            # The csv reader's own count: DictReader's is updated only after a row is read whole.
            raise DataError(f"CSV {self.path} line {self.reader.reader.line_num}: {why}") from None


def require_columns(path: Path, fields, keys, separator: str, hint: str = "") -> None:
    """DataError naming the `keys` missing from the CSV's header `fields`."""
    missing = [key for key in keys if key not in (fields or [])]
    if missing:
        raise DataError(f"CSV {path} lacks column(s) {missing} (has {shown(fields)}, separator {shown(separator)}){hint}")


class CsvSource:
    """A CSV/TSV (OpenCLIP's `--dataset-type csv`): rows of `img_key` (image path; relative paths
    are relative to the CSV's directory) and `caption_key`. A missing or undecodable image file,
    or one that is not a regular file of at most MAX_IMAGE_BYTES, skips its row at load time:
    checking millions of files at build time would be slow."""

    def __init__(self, path, img_key: str, caption_key: str, separator=None):
        path = Path(path)
        separator = csv_separator(path, separator)
        with csv_rows(path, separator) as reader:
            require_columns(path, reader.reader.fieldnames, (img_key, caption_key), separator)
            rows = [(row[img_key], row[caption_key]) for row in reader]
        if not rows:
            raise DataError(f"CSV {path} has no rows")
        self.root = path.parent
        self.images, self.captions = (list(col) for col in zip(*rows))

    def __len__(self) -> int:
        return len(self.images)

    def load(self, index: int) -> Sample:
        sample = self.load_encoded(index)
        return Sample(decode_image(sample.image), sample.caption)

    def load_encoded(self, index: int) -> EncodedSample:
        caption = decode_caption(self.captions[index])
        if not self.images[index]:  # empty cell, or None from a short row
            raise SkipSample("no image path")
        return EncodedSample(require_image_bytes(read_image_file(self.root / self.images[index])), caption)


class SyntheticSource:
    """`size` samples (no files), for throughput runs and tests: uniform-noise RGB images
    (`image_size` square) with captions of random lowercase "words", which the tokenizer turns
    into random token ids of random length. Sample `index` is a pure function of the index, so
    any order or resume sees the same data."""

    def __init__(self, size: int, image_size: int):
        if not isinstance(size, int) or size <= 0:
            raise DataError(f"synthetic_size must be a positive int, got {shown(size)}")
        self.size, self.image_size = size, image_size

    def __len__(self) -> int:
        return self.size

    def load(self, index: int) -> Sample:
        rng = np.random.default_rng(index)
        pixels = rng.integers(0, 256, (self.image_size, self.image_size, 3), dtype=np.uint8)
        words = ("".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 9)))
                 for _ in range(rng.integers(3, 12)))
        return Sample(Image.fromarray(pixels), " ".join(words))

    def load_encoded(self, index: int) -> EncodedSample:
        """The same sample as PNG bytes: lossless, so it decodes to `load`'s pixels."""
        sample = self.load(index)
        buf = io.BytesIO()
        sample.image.save(buf, format="PNG", compress_level=1)
        return EncodedSample(buf.getvalue(), sample.caption)
