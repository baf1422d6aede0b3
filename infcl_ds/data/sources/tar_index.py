"""Random access into WebDataset tar shards: where each sample's members lie in its shard.

A shard is indexed by walking its tar headers (tarfile seeks over the member data, nothing is
decoded), grouping members by WebDataset key (the name up to the first dot of the basename, as
`webdataset` groups them). Each sample gets a byte span (offset, size) for three roles: image
(jpg, jpeg, png, webp: first present), text (txt) and label (cls, json); -1 marks a missing
member. The spans are cached per shard under $INFCL_DS_CACHE (default ~/.cache/infcl_ds), keyed
by the shard's real path, size and mtime, so a restart does not rescan. A cache file is plain
integers behind a header that lets it verify itself (cache_header); one that does not (cut, edited,
another version's, another shard's), or whose spans do not lie inside the shard (a file forged
with a checksum to match), is rebuilt without a word: it is a cache, never an input.

Reading a member is bounded by its role's limit (MAX_IMAGE_BYTES, MAX_TEXT_BYTES): a sample with
a larger one is skipped, and its member never read.
"""
import hashlib
import os
import struct
import tarfile
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
from webdataset.tariterators import base_plus_ext

from ...shown import shown
from ..errors import DataError
from .samples import MAX_IMAGE_BYTES, MAX_TEXT_BYTES, SkipSample

IMAGE, TEXT, LABEL = range(3)
ROLE_EXTENSIONS = (("jpg", "jpeg", "png", "webp"), ("txt",), ("cls", "json"))
# Per role: its name in a message, the most bytes read of its member, that limit's name.
ROLE_LIMITS = (("image", MAX_IMAGE_BYTES, "MAX_IMAGE_BYTES"), ("caption", MAX_TEXT_BYTES, "MAX_TEXT_BYTES"),
               ("label", MAX_TEXT_BYTES, "MAX_TEXT_BYTES"))


def scan_shard(path: Path) -> Tuple[np.ndarray, bool]:
    """(int64 [samples, 3 roles, (offset, size)] for one uncompressed tar, in member order;
    whether the shard is cut short). tarfile stops without a word at a header cut off by the
    end of the file (a copy that did not finish), so a shard counts as cut short unless its
    last member is followed by the end-of-archive block of zeros; a member whose data runs
    past the end is left out."""
    members = {}  # key -> {ext: (offset, size)}; dicts keep first-seen order
    try:
        with tarfile.open(path, mode="r:") as tar:
            file_size = os.fstat(tar.fileobj.fileno()).st_size
            cut = False
            for info in tar:
                if info.isfile() and info.offset_data + info.size > file_size:
                    cut = True
                    continue
                key, ext = base_plus_ext(info.name) if info.isfile() else (None, None)
                if key is not None:
                    members.setdefault(key, {})[ext.lower()] = (info.offset_data, info.size)
            tar.fileobj.seek(tar.offset)
            cut = cut or tar.fileobj.read(512) != bytes(512)
    except (tarfile.TarError, OSError) as e:
        raise DataError(f"cannot index tar shard {shown(path, quote=False)}: {shown(str(e), quote=False)}") from e
    spans = np.full((len(members), len(ROLE_EXTENSIONS), 2), -1, dtype=np.int64)
    for row, by_ext in enumerate(members.values()):
        for role, extensions in enumerate(ROLE_EXTENSIONS):
            found = next((by_ext[e] for e in extensions if e in by_ext), None)
            if found is not None:
                spans[row, role] = found
    return spans, cut


def cut_short_message(path: Path, samples: int) -> str:
    return (f"shard {shown(path, quote=False)} is cut short (it ends inside a tar member or header, or holds no "
            f"end-of-archive block): {samples} sample(s) read from it, the rest are lost; copy it again or leave it "
            "out")


def _cache_file(path: Path, stat: os.stat_result) -> Path:
    ident = f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()
    root = Path(os.environ.get("INFCL_DS_CACHE", Path.home() / ".cache" / "infcl_ds"))
    return root / "tar-index" / f"{hashlib.sha1(ident).hexdigest()}.idx"


# A cache file: CACHE_HEADER (magic, format version, the shard's size and mtime, the number of
# samples, the payload's SHA-256), then the spans as little-endian int64. The name already
# encodes the shard's path, size and mtime; the header repeats them so that a file copied or
# renamed onto another name does not verify, and the checksum catches a cut or edited payload.
CACHE_MAGIC, CACHE_VERSION = b"INFCLTIX", 1
CACHE_HEADER = struct.Struct("<8sIQqQ32s")
SPAN_DTYPE = np.dtype("<i8")
ROW_BYTES = len(ROLE_EXTENSIONS) * 2 * SPAN_DTYPE.itemsize


def cache_header(stat: os.stat_result, payload: bytes) -> bytes:
    return CACHE_HEADER.pack(CACHE_MAGIC, CACHE_VERSION, stat.st_size, stat.st_mtime_ns, len(payload) // ROW_BYTES,
                             hashlib.sha256(payload).digest())


def read_cache(cache: Path, stat: os.stat_result) -> Optional[np.ndarray]:
    """The spans cached for a shard with this stat, or None if the file is absent, does not
    verify or holds a span outside the shard. Reads only a file of the size its header announces."""
    try:
        with open(cache, "rb") as f:
            header = f.read(CACHE_HEADER.size)
            if len(header) != CACHE_HEADER.size:
                return None
            rows = CACHE_HEADER.unpack(header)[4]
            if os.fstat(f.fileno()).st_size != CACHE_HEADER.size + rows * ROW_BYTES:
                return None
            payload = f.read(rows * ROW_BYTES)
    except OSError:
        return None
    if header != cache_header(stat, payload):
        return None
    spans = np.frombuffer(payload, SPAN_DTYPE).astype(np.int64).reshape(rows, len(ROLE_EXTENSIONS), 2)
    return spans if spans_inside(spans, stat.st_size) else None


def spans_inside(spans: np.ndarray, file_size: int) -> bool:
    """Whether every span is a missing member (-1, -1) or lies inside a file of `file_size`
    bytes, as scan_shard writes them. The checksum proves a payload whole, not honest: a span
    past the end would be sought at read time (an OSError past the file system's largest
    offset, or a short read)."""
    offsets, sizes = spans[..., 0], spans[..., 1]
    missing = (offsets == -1) & (sizes == -1)
    # sizes <= file_size - offsets, where offsets lie in [0, file_size]: no int64 overflow
    inside = (offsets >= 0) & (offsets <= file_size) & (sizes >= 0) & (sizes <= file_size - offsets)
    return bool((missing | inside).all())


def write_cache(cache: Path, stat: os.stat_result, spans: np.ndarray) -> None:
    """Atomically (ranks may index the same shard at once); a failure only costs a rescan."""
    payload = np.ascontiguousarray(spans, dtype=SPAN_DTYPE).tobytes()
    tmp = cache.with_suffix(f".{os.getpid()}.tmp")
    try:
        cache.parent.mkdir(parents=True, exist_ok=True)
        with open(tmp, "wb") as f:
            f.write(cache_header(stat, payload) + payload)
        os.replace(tmp, cache)
    except OSError:
        tmp.unlink(missing_ok=True)


def shard_spans(path: Path) -> Tuple[np.ndarray, bool]:
    """`scan_shard`, through the cache. A shard cut short is not cached: it is scanned, and
    reported, at every start until it is replaced."""
    stat = path.stat()
    cache = _cache_file(path, stat)
    spans = read_cache(cache, stat)
    if spans is not None:
        return spans, False
    spans, cut = scan_shard(path)
    if not cut:
        write_cache(cache, stat, spans)
    return spans, cut


class TarIndex:
    """All samples of a list of shards, numbered in shard order then member order."""

    def __init__(self, shards: List[Path]):
        self.shards = list(shards)
        scans = [shard_spans(p) for p in self.shards]
        per_shard = [spans for spans, _ in scans]
        # (shard, samples read from it) for each shard that is cut short
        self.cut_short = [(path, len(spans)) for path, (spans, cut) in zip(self.shards, scans) if cut]
        # starts[s] = global number of shard s's first sample: a binary search finds the shard.
        self.starts = np.cumsum([0] + [len(s) for s in per_shard])[:-1]
        self.spans = np.concatenate(per_shard) if per_shard else np.empty((0, 3, 2), np.int64)

    def __len__(self) -> int:
        return len(self.spans)

    def shard_of(self, index: int) -> Path:
        return self.shards[int(np.searchsorted(self.starts, index, side="right")) - 1]

    def read(self, index: int, roles) -> List[Optional[bytes]]:
        """The bytes of the given roles' members of sample `index` (None where missing);
        SkipSample, before anything is read, if one is over its role's limit."""
        spans = self.spans[index]
        for role in roles:
            name, limit, limit_name = ROLE_LIMITS[role]
            if spans[role, 1] > limit:
                raise SkipSample(f"{name} member of {int(spans[role, 1]):,} bytes, over the limit of {limit:,} "
                                 f"({limit_name}), in shard {shown(self.shard_of(index), quote=False)}")
        with open(self.shard_of(index), "rb") as f:
            return [_read_span(f, *spans[role]) for role in roles]


def _read_span(f, offset: int, size: int) -> Optional[bytes]:
    """`size` bytes at `offset` (at most the role's limit: TarIndex.read checked it)."""
    if offset < 0:
        return None
    f.seek(offset)
    return f.read(size)
