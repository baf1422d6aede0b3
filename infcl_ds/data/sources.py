"""The recipe's `data` section -> a source (see samples.Source)."""
from .csv_source import CsvSource
from .errors import DataError
from .samples import Source
from .synthetic import SyntheticSource
from .webdataset_source import TarSource

SOURCES = ("webdataset", "csv", "synthetic")


def build_source(spec: dict, image_size: int) -> Source:
    """Check the spec and open its source; every problem is a DataError naming the key or path."""
    kind = spec.get("source")
    if kind not in SOURCES:
        raise DataError(f"data.source must be one of {SOURCES}, got {kind!r}")
    if kind != "synthetic" and spec.get("train") is None:
        raise DataError(f"data.train is required for source {kind!r}")
    if kind == "synthetic":
        return SyntheticSource(spec.get("synthetic_size"), image_size)
    if kind == "webdataset":
        return TarSource(spec["train"])
    return CsvSource(spec["train"], img_key=spec.get("csv_img_key", "filepath"),
                     caption_key=spec.get("csv_caption_key", "title"),
                     separator=spec.get("csv_separator"))
