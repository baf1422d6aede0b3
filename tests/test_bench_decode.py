"""`python -m benchmarks.decode` on CPU: the machinery of the GPU decoder's rows (each library's
CPU decoder through the trainer's piece decoder, a tiny tower beside it) on small photo shards:
every row key of docs/benchmarks/decode.json, rows alone and beside training, and nvImageCodec's
count of the images it decoded itself."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from infcl_ds.data.commands.photos import make_photo_shards

ROOT = Path(__file__).resolve().parents[1]
ROW_KEYS = {"decoder", "gpu_jpeg_library", "backend", "images_per_s", "beside_training", "host_us_per_image",
            "device", "commit", "shards", "bytes_per_image", "decoded_by_backend"}


def test_decoder_rows_alone_and_beside_a_tower(tmp_path):
    pytest.importorskip("nvidia.nvimgcodec")
    make_photo_shards(tmp_path / "photos", 48, 24, workers=1)
    out = tmp_path / "decode.json"
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-m", "benchmarks.decode", "--shards", f"photos={tmp_path / 'photos'}",
                           "--images", "40", "--model", "infcl-tiny", "--chunk", "4", "--seconds", "1",
                           "--out", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert {(r["gpu_jpeg_library"], r["beside_training"]) for r in rows} == {
        (library, beside) for library in ("nvimgcodec", "torchvision") for beside in (False, True)}
    for row in rows:
        assert ROW_KEYS <= set(row), ROW_KEYS - set(row)
        assert row["images"] == 40 and row["images_per_s"] > 0 and row["host_us_per_image"] >= 0
        assert 20_000 < row["bytes_per_image"] < 60_000
    nvimgcodec = [r for r in rows if r["gpu_jpeg_library"] == "nvimgcodec"]
    assert all(r["decoded_by_backend"] == 40 for r in nvimgcodec)  # its CPU backend decodes every photo
    beside = [r for r in rows if r["beside_training"]]
    assert all(r["towers_samples_per_s_alone"] > 0 and r["towers_slowdown"] > 0 for r in beside)
    assert (tmp_path / "decode.png").is_file()
