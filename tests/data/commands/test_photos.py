"""`infcl-ds data photos`: JPEG shards of photographs made on the machine, their shorter side
drawn from --shorter (larger photos for decoder benchmarks), and a bad range refused in one line."""
import io
import json
import tarfile

import pytest
from PIL import Image

from infcl_ds.data.commands.photos import main as photos


def _sides(shard_dir):
    sides = []
    for shard in sorted(shard_dir.glob("shard-*.tar")):
        with tarfile.open(shard) as tar:
            for member in tar:
                if member.name.endswith(".jpg"):
                    sides.append(Image.open(io.BytesIO(tar.extractfile(member).read())).size)
    return sides


def test_the_shorter_side_is_drawn_from_the_range_asked(tmp_path):
    assert photos(["--out", str(tmp_path / "big"), "--samples", "12", "--shard-size", "6", "--workers", "1",
                   "--shorter", "300,310"]) == 0
    sides = _sides(tmp_path / "big")
    assert len(sides) == 12 and all(300 <= min(w, h) <= 310 for w, h in sides), sides
    summary = json.loads((tmp_path / "big" / "photos.json").read_text())
    assert summary["shorter_side"] == [300, 310] and summary["samples"] == 12


def test_a_bad_range_is_refused_naming_the_option(tmp_path, capsys):
    with pytest.raises(SystemExit):
        photos(["--out", str(tmp_path / "x"), "--shorter", "310,300"])
    assert "--shorter: expected 16 <= MIN <= MAX <= 8192, got '310,300'" in capsys.readouterr().err
