"""The recipe's `data` section -> a source (samples.py says what a source is): WebDataset shards
(webdataset_source.py), a CSV of image paths and captions (csv_source.py), or synthetic samples
(synthetic_source.py)."""
from ...config.recipe import DataSection
from .csv_source import CsvSource
from .synthetic_source import SyntheticSource
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
