"""WebDataset tar shards (img2dataset layout: {key}.jpg/png/webp, {key}.txt, optional .cls/.json)
as a random-access source."""
import glob
import os
import stat
import sys
from pathlib import Path
from typing import List, Sequence, Union

import braceexpand

from ...file_kind import file_kind
from ...shown import shown
from ..errors import DataError
from .samples import EncodedSample, Sample, decode_caption, decode_image, parse_label, require_image_bytes
from .tar_index import IMAGE, LABEL, TEXT, TarIndex, cut_short_message

ShardSpec = Union[str, Path, Sequence[Union[str, Path]]]


def expand_shards(spec: ShardSpec) -> List[Path]:
    """A shard spec -> existing tar files, in order. The spec is a directory (its *.tar, sorted),
    a brace pattern ("dir/shard-{000000..000009}.tar"), a glob ("dir/*.tar"), a file, or a
    list of files. Anything missing or empty, or a shard that is not a regular file (a FIFO
    would block its reader, a device never ends), is a DataError naming it (escaped: shown)."""
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise DataError("empty shard list")
        return [_existing_file(p) for p in spec]
    spec = str(spec)
    if Path(spec).is_dir():
        shards = [_existing_file(p) for p in sorted(Path(spec).glob("*.tar"))]
        if not shards:
            raise DataError(f"no *.tar shards in directory {shown(spec, quote=False)}")
        return shards
    paths = [p for pattern in braceexpand.braceexpand(spec)
             for p in (sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern])]
    if not paths:
        raise DataError(f"shard pattern {shown(spec, quote=False)} matches no file")
    return [_existing_file(p) for p in paths]


def _existing_file(path) -> Path:
    path = Path(path)
    try:
        mode = os.stat(path).st_mode
    except OSError:
        raise DataError(f"shard {shown(path, quote=False)} does not exist (local files only: random access needs "
                        "them)") from None
    if not stat.S_ISREG(mode):
        raise DataError(f"shard {shown(path, quote=False)} is {file_kind(mode)}, not a regular file: refused")
    return path


def shard_index(spec: ShardSpec) -> TarIndex:
    """The index of the spec's shards (expand_shards); DataError if not one of them holds a
    sample. The trainer's sources and `infcl-ds data check` both open shards here."""
    index = TarIndex(expand_shards(spec))
    if len(index) == 0:
        raise DataError(f"no samples in shards {shown(spec, quote=False)}")
    return index


class TarSource:
    """Samples of WebDataset shards, read by index through a `TarIndex`."""

    def __init__(self, shards: ShardSpec):
        self.index = shard_index(shards)
        # A shard cut short still trains on what it holds; `infcl-ds data check` refuses it.
        # Said once per job (every rank indexes the same shards), one line per shard.
        if os.environ.get("RANK", "0") == "0":
            for path, samples in self.index.cut_short:
                print(f"infcl-ds: warning: {cut_short_message(path, samples)}", file=sys.stderr, flush=True)

    def __len__(self) -> int:
        return len(self.index)

    def load(self, index: int, with_label: bool = False) -> Sample:
        roles = (IMAGE, TEXT, LABEL) if with_label else (IMAGE, TEXT)
        data = self.index.read(index, roles)
        caption = decode_caption(data[1])  # before the image: a cheaper reason to skip
        label = parse_label(data[2]) if with_label else None
        return Sample(decode_image(data[0]), caption, label)

    def load_encoded(self, index: int) -> EncodedSample:
        image, text = self.index.read(index, (IMAGE, TEXT))
        return EncodedSample(require_image_bytes(image), decode_caption(text))

    def require_labels(self) -> None:
        """DataError naming the first shard with a sample lacking a .cls/.json member."""
        missing = (self.index.spans[:, LABEL, 0] < 0).nonzero()[0]
        if len(missing):
            raise DataError(f"shard {shown(self.index.shard_of(int(missing[0])), quote=False)} has samples without a "
                            ".cls or .json label member")
