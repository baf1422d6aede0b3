"""A CSV/TSV of image paths and captions (OpenCLIP's `--dataset-type csv`) as a source."""
import csv
from pathlib import Path

from .errors import DataError
from .samples import EncodedSample, Sample, SkipSample, decode_caption, decode_image, require_image_bytes


class CsvSource:
    """Rows of `img_key` (image path; relative paths are relative to the CSV's directory) and
    `caption_key`. A missing or undecodable image file skips its row at load time: checking
    millions of files at build time would be slow."""

    def __init__(self, path, img_key: str = "filepath", caption_key: str = "title", separator=None):
        path = Path(path)
        if not path.is_file():
            raise DataError(f"CSV file {path} does not exist")
        if separator is None:
            separator = "\t" if path.suffix.lower() == ".tsv" else ","
        with open(path, newline="", encoding="utf-8") as f:
            reader = csv.DictReader(f, delimiter=separator)
            missing = [k for k in (img_key, caption_key) if k not in (reader.fieldnames or [])]
            if missing:
                raise DataError(f"CSV {path} lacks column(s) {missing} (has {reader.fieldnames}, "
                                f"separator {separator!r})")
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
        try:
            data = (self.root / self.images[index]).read_bytes()
        except OSError as e:
            raise SkipSample(f"cannot read image {self.images[index]}: {e}") from e
        return EncodedSample(require_image_bytes(data), caption)
