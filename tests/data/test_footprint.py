"""data/footprint.py's readings of the shards: the share of JPEGs among the first shard's images
(what `data.decoder: auto` asks before it considers the GPU decoder), from a mixed shard, and
None where it cannot be known here."""
import io
import tarfile

from PIL import Image

from infcl_ds.config.recipe import DataSection
from infcl_ds.data.footprint import IMAGES_SNIFFED, jpeg_share


def _image(fmt: str) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (8, 8), (10, 20, 30)).save(buf, format=fmt)
    return buf.getvalue()


def _shard(path, formats):
    with tarfile.open(path, "w") as tar:
        for i, (ext, fmt) in enumerate(formats):
            for name, data in ((f"{i:06d}.{ext}", _image(fmt)), (f"{i:06d}.txt", b"a caption")):
                info = tarfile.TarInfo(name)
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return path


def test_the_share_of_jpegs_among_the_first_images(tmp_path):
    # three JPEGs to one PNG, then past the sniffed images only PNGs (not read)
    formats = [("jpg", "JPEG"), ("jpg", "JPEG"), ("jpg", "JPEG"), ("png", "PNG")] * (IMAGES_SNIFFED // 4)
    shard = _shard(tmp_path / "mixed.tar", formats + [("png", "PNG")] * 20)
    assert jpeg_share(DataSection(source="webdataset", train=str(shard))) == 0.75


def test_unknown_where_the_shards_cannot_be_read_here(tmp_path):
    assert jpeg_share(DataSection(source="webdataset", train=str(tmp_path / "absent-{0..3}.tar"))) is None
    assert jpeg_share(DataSection(source="synthetic")) is None
    empty = _shard(tmp_path / "captions-only.tar", [])
    assert jpeg_share(DataSection(source="webdataset", train=str(empty))) is None
